"""Runs with `--aggregator=robust`, `compression` and `secure` on the embedded digits: the TFF
round and the in-process round give the same run (the quantization's rounding is stateless
from each client's seed), and a compressed run resumed from a checkpoint ends where the
uninterrupted one does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import checkpoint_round_trip
from test_cluster_dp_runs import assert_same_runs, experiment, run

from tff_clustered.loop.config import AggregatorConfig

pytestmark = pytest.mark.usefixtures("tff_context")
# The MLP's 64 x 16 kernel (1024 values) is above this threshold: it is quantized.
COMPRESSION = AggregatorConfig("compression", quantization_bits=4, quantization_threshold=500)
RUNS = {
    "robust": ("fedavg", AggregatorConfig("robust")),
    "compression": ("ifca", COMPRESSION),
    "secure": ("fedavg", AggregatorConfig("secure")),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_robust_run_is_the_same_on_both_executions(name: str) -> None:
    """Each aggregator on both executions: the same run; its estimates moved from TFF's
    starts and are reported per cluster; the bits per round are 32 a value except for the
    quantized kernel's upload."""
    algorithm, aggregator = RUNS[name]
    tff_run, local_run = run(algorithm, "tff", aggregator), run(algorithm, "in_process", aggregator)
    assert_same_runs(local_run, tff_run)
    built = aggregator.build()
    initial = built.initial_state(tff_run.num_clusters)
    for key, value in tff_run.state.aggregator_state.items():
        assert not np.allclose(value, initial[key]), key  # the clusters' estimates moved
    trained = tff_run.state.history[1:]
    for row in trained:
        assert "clipping_norm_cluster_0" in row and "zeroed_count_cluster_0" in row
        floats, bits = row["floats_communicated"], row["bits_communicated"]
        if name == "compression":  # IFCA: every cluster down, the quantized kernel up
            saved = row["num_sampled"] * (32 * 1024 - (32 * np.ceil(1024 * 4 / 28) + 64))
            assert bits == 32 * floats - saved
        else:
            assert bits == 32 * floats
    if name == "secure":
        assert "secure_bound_cluster_0" in trained[0]


def test_a_resumed_compressed_run_ends_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """IFCA with compression, in process: a run restored from the checkpoint after round 2 of
    4 ends with the uninterrupted run's models, estimates and metrics, bit for bit (the
    rounding's draws come from the seed and the round, the estimates from the checkpoint)."""
    straight = experiment("ifca", "in_process", COMPRESSION, rounds=4)
    list(straight.rounds())
    first = experiment("ifca", "in_process", COMPRESSION, rounds=4)
    rounds = first.rounds()
    for _ in range(3):  # rounds 0, 1, 2
        next(rounds)
    saved = checkpoint_round_trip(first.snapshot(), tmp_path)
    resumed = experiment("ifca", "in_process", COMPRESSION, rounds=4)
    resumed.restore(saved)
    list(resumed.rounds())
    np.testing.assert_array_equal(resumed.state.cluster_models, straight.state.cluster_models)
    for key, value in straight.state.aggregator_state.items():
        np.testing.assert_array_equal(resumed.state.aggregator_state[key], value)
    assert resumed.state.history[-1] == straight.state.history[-1] | {
        k: v for k, v in resumed.state.history[-1].items() if k.endswith("_seconds")
    }
