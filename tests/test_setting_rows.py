"""The rows of a comparison table: partitions and privacy levels (`setting_rows.py`)."""

from __future__ import annotations

import pytest

from tff_clustered.comparison.setting_rows import parse_setting
from tff_clustered.data.spec import DataSpec
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.runs.run_spec import RunSpec


def test_privacy_levels_set_each_rows_aggregator() -> None:
    spec = RunSpec("fedavg")
    private = parse_setting("epsilon:4")(spec).training.aggregator
    settings = private.options
    assert (private.name, settings.target_epsilon, settings.noise_multiplier) == ("dp", 4.0, None)
    assert settings.clipping == "adaptive"  # the table's own choice without --aggregator=dp
    clip = parse_setting("clip")(spec).training.aggregator
    settings = clip.options
    assert (clip.name, settings.noise_multiplier, settings.target_epsilon) == ("dp", 0.0, 0.0)
    # The private rows keep the command line's dp settings; `mean` drops them all.
    given = AggregatorConfig("dp", noise_multiplier=1.0, clip=0.3, clipping="fixed", delta=1e-6)
    dp_spec = RunSpec("fedavg", training=TrainingConfig(aggregator=given))
    kept = parse_setting("epsilon:8")(dp_spec).training.aggregator
    settings = kept.options
    assert (settings.clip, settings.clipping, settings.delta, settings.noise_multiplier) == (
        0.3,
        "fixed",
        1e-6,
        None,
    )
    assert parse_setting("mean")(dp_spec).training.aggregator == AggregatorConfig()
    # Only the aggregator changes.
    assert parse_setting("epsilon:4")(spec).data == spec.data


def test_each_row_takes_the_command_lines_settings_of_its_aggregator() -> None:
    """Settings given on the command line without naming the row's aggregator (`--dp_noise=
    secure`, `--dp_clip=0.3`, `--robust_zeroing=false`) go to the rows of the aggregators that
    take them, over the rows' defaults; a row's own setting (epsilon:E) wins."""
    given = {"noise": "secure", "clip": 0.3, "target_epsilon": 2.0, "robust_zeroing": False}
    spec = RunSpec("fedavg")
    private = parse_setting("epsilon:4", given)(spec).training.aggregator.options
    assert (private.noise, private.clip, private.clipping) == ("secure", 0.3, "adaptive")
    assert (private.target_epsilon, private.noise_multiplier) == (4.0, None)
    assert parse_setting("clip", given)(spec).training.aggregator.options.noise == "secure"
    assert parse_setting("mean", given)(spec).training.aggregator == AggregatorConfig()
    robust = parse_setting("robust", given)(spec).training.aggregator
    assert robust == AggregatorConfig("robust", robust_zeroing=False)


def test_robust_aggregator_rows() -> None:
    spec = RunSpec("ifca")
    compression = parse_setting("compression:4:1000")(spec).training.aggregator
    assert (compression.name, compression.options.quantization_bits) == ("compression", 4)
    assert compression.options.quantization_threshold == 1000
    default = parse_setting("compression")(spec).training.aggregator
    assert (default.options.quantization_bits, default.options.quantization_threshold) == (8, 20000)
    assert parse_setting("secure")(spec).training.aggregator == AggregatorConfig("secure")
    # The command line's settings of the row's own aggregator are kept.
    given = AggregatorConfig("robust", robust_zeroing=False)
    spec = RunSpec("ifca", training=TrainingConfig(aggregator=given))
    assert parse_setting("robust")(spec).training.aggregator == given
    with pytest.raises(ValueError, match="compression:17.*quantization_bits"):
        parse_setting("compression:17")(spec)


def test_partition_settings_change_the_data_only() -> None:
    spec = RunSpec("fedavg", data=DataSpec(dataset="digits_dirichlet"))
    changed = parse_setting("dirichlet:0.3")(spec)
    assert (changed.data.partition, changed.data.dirichlet_beta) == ("dirichlet", 0.3)
    assert changed.training == spec.training
    assert parse_setting("natural")(spec) == spec


@pytest.mark.parametrize(
    "setting, message",
    [
        ("epsilon", "use one of"),
        ("epsilon:x", "must be finite numbers"),
        ("epsilon:inf", "must be finite numbers"),
        ("compression:8:inf", "must be finite numbers"),
        ("compression:nan", "must be finite numbers"),
        ("secure:", "a value after ':'"),
        ("iid:", "a value after ':'"),
        ("epsilon:1:2", "use one of"),
        ("compression:4:10:3", "use one of"),
        ("compression:4.5", "whole numbers"),
        ("robust:1", "use one of"),
        ("epsilon:0", "E must be > 0"),
        ("clip:3", "use one of"),
        ("mean:1", "use one of"),
        ("dirichlet", "use one of"),
        ("dirichlet:b", "BETA must be a number"),
        ("private", "use one of"),
    ],
)
def test_bad_settings_are_named(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_setting(setting)


def test_a_private_row_for_an_algorithm_that_cannot_be_private_is_refused() -> None:
    with pytest.raises(ValueError, match="cfl reads individual clients"):
        parse_setting("epsilon:8")(RunSpec("cfl"))


def test_an_infinite_target_epsilon_is_refused() -> None:
    with pytest.raises(ValueError, match="--target_epsilon must be finite"):
        AggregatorConfig("dp", target_epsilon=float("inf"))
