"""The named random streams of `tff_clustered.seeds`: one name per stream, and the generators
the committed result tables were made with."""

from __future__ import annotations

import numpy as np
import pytest

from tff_clustered import seeds
from tff_clustered.seeds import DataStream, data_rng


def test_no_two_data_streams_share_an_id() -> None:
    values = [stream.value for stream in DataStream.__members__.values()]  # aliases included
    assert len(values) == len(set(values)), values
    # Each is the seed alone or one id after it, so no stream with parts is another stream.
    assert all(len(value) <= 1 for value in values), values


def test_no_two_run_time_streams_share_an_id() -> None:
    names = ["SAMPLING", "SHUFFLE", "PRETRAIN_SHUFFLE", "ALGORITHM", "DROPOUT", "PUBLIC_BATCH"]
    ids = [
        getattr(seeds, name) for name in [*names, "FINE_TUNE_SHUFFLE", "EVAL_SAMPLE", "DP_NOISE"]
    ]
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_a_data_stream_is_the_generator_of_its_id(seed: int) -> None:
    assert data_rng(seed, DataStream.CLIENT_EXAMPLES).random(4).tolist() == (
        np.random.default_rng([seed, 4]).random(4).tolist()
    )
    assert data_rng(seed, DataStream.TFF_CLIENT_HOLDOUT, 3).random(4).tolist() == (
        np.random.default_rng([seed, 12, 3]).random(4).tolist()
    )
    assert data_rng(seed, DataStream.LOADER).random(4).tolist() == (
        np.random.default_rng(seed).random(4).tolist()
    )


def test_the_seed_alone_takes_no_parts() -> None:
    with pytest.raises(ValueError, match="no parts"):
        data_rng(0, DataStream.LOADER, 4)
