"""What each aggregator declares is what users and the loop see.

The flags (names, defaults, bounds) and `AggregatorConfig` come from the declared settings, a
flag of another aggregator is refused naming it, and the loop's questions are the
declarations' answers."""

from __future__ import annotations

import pytest
from absl import flags

from tff_clustered.cli.aggregator_flags import aggregator_config_from_flags, define_aggregator_flags
from tff_clustered.federated.aggregators import AGGREGATORS, NAMED, declared_options
from tff_clustered.federated.cluster_aggregators import ClusterMean
from tff_clustered.federated.cluster_dp import ClusterDP
from tff_clustered.federated.cluster_encodings import ClusterCompression
from tff_clustered.loop.config import AggregatorConfig


def parsed(*argv: str) -> flags.FlagValues:
    flag_values = flags.FlagValues()
    define_aggregator_flags(flag_values)
    flag_values(["train.py", *argv])
    return flag_values


def test_every_declared_setting_is_a_flag_of_its_name_default_and_bounds() -> None:
    """The flags users' command lines and flagfiles use, with their defaults and bounds."""
    flag_values = parsed()
    expected = {
        "dp_noise_multiplier": None,
        "dp_clip": 1.0,
        "dp_clipping": "fixed",
        "dp_target_quantile": 0.5,
        "dp_clip_learning_rate": 0.2,
        "dp_count_stddev": None,
        "dp_noise": "seeded",
        "dp_cold_start": "private",
        "dp_cold_start_share": 0.1,
        "dp_cold_start_noise_multiplier": None,
        "dp_delta": 1e-5,
        "target_epsilon": 0.0,
        "robust_zeroing": True,
        "robust_clipping": True,
        "quantization_bits": 8,
        "quantization_threshold": 20000,
    }
    assert {o.flag: o.default for o in declared_options().values()} == expected
    assert {name: flag_values[name].default for name in expected} == expected
    assert flag_values["aggregator"].parser.enum_values == list(NAMED)
    assert NAMED == ("mean", "dp", "robust", "compression", "secure")
    for bounded in (
        "dp_noise_multiplier",
        "dp_count_stddev",
        "dp_cold_start_noise_multiplier",
        "target_epsilon",
    ):
        with pytest.raises(flags.IllegalFlagValueError):
            parsed(f"--{bounded}=-1")
    assert "--aggregator=robust/compression/secure:" in flag_values["robust_zeroing"].help


def test_the_flags_make_the_settings_and_refuse_another_aggregators() -> None:
    flag_values = parsed("--aggregator=dp", "--dp_noise_multiplier=1", "--dp_clipping=adaptive")
    assert aggregator_config_from_flags(flag_values) == AggregatorConfig(
        "dp", noise_multiplier=1.0, clipping="adaptive"
    )
    assert aggregator_config_from_flags(parsed()) == AggregatorConfig()
    with pytest.raises(ValueError, match="--quantization_bits set with --aggregator=robust"):
        aggregator_config_from_flags(parsed("--aggregator=robust", "--quantization_bits=4"))
    with pytest.raises(TypeError, match="takes no setting 'zeroing'"):
        AggregatorConfig("robust", zeroing=False)  # the flag's setting is robust_zeroing


def test_a_setting_the_chosen_mode_does_not_read_is_refused() -> None:
    """A cold-start setting with the raw cold start, an adaptive one with the fixed clip:
    refused naming the flag and the mode, in code as on the command line (issue 64, item 12)."""
    for settings, message in (
        (
            {"cold_start_release": "raw", "cold_start_noise_multiplier": 2.0},
            "--dp_cold_start_noise_multiplier set with --dp_cold_start=raw, which does not",
        ),
        (
            {"cold_start_release": "raw", "cold_start_share": 0.5},
            "--dp_cold_start_share set with --dp_cold_start=raw",
        ),
        ({"target_quantile": 0.7}, "--dp_target_quantile set with --dp_clipping=fixed"),
        (
            {"noise_multiplier": 0.0, "cold_start_noise_multiplier": 2.0},
            "--dp_cold_start_noise_multiplier set with --dp_noise_multiplier=0, which does not",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            AggregatorConfig("dp", **{"noise_multiplier": 1.0, **settings})
    flag_values = parsed("--aggregator=dp", "--dp_noise_multiplier=1", "--dp_cold_start=raw")
    assert aggregator_config_from_flags(flag_values).options.cold_start_release == "raw"
    with pytest.raises(ValueError, match="--dp_cold_start_share set with --dp_cold_start=raw"):
        ClusterDP(1.0, cold_start_release="raw", cold_start_share=0.5).options()


def test_what_the_loop_reads_is_declared() -> None:
    """Noise and its account, uniform weights, what individual updates void, the executions
    and bits: each a declaration of the aggregator, the mean's the plain answers."""
    mean, dp = ClusterMean(), ClusterDP(1.0, adaptive=True)
    assert mean.round_event() is None and ClusterDP(0.0).round_event() is None
    assert dp.round_event() is not None and dp.uniform_weights and dp.private
    assert not mean.voided_by_individual_updates and dp.voided_by_individual_updates
    budget = AggregatorConfig("dp", target_epsilon=8.0, delta=1e-6).privacy_budget()
    assert (budget.delta, budget.target_epsilon, budget.calibrate) == (1e-6, 8.0, True)
    assert AggregatorConfig("robust").privacy_budget() is None
    calibrated = AggregatorConfig("dp", target_epsilon=8.0).with_noise_multiplier(1.5)
    assert calibrated.build() == ClusterDP(1.5) and not calibrated.privacy_budget().calibrate
    assert ClusterCompression(quantization_bits=8, quantization_threshold=10).upload_bits(
        [100]
    ) < mean.upload_bits([100])
    assert AGGREGATORS["tff_factory"].tff_computation_only and not AGGREGATORS["tff_factory"].named
    for name in NAMED:
        config = AggregatorConfig.of(AggregatorConfig(name, **defaults_of(name)).build())
        assert config.name == name
        assert list(config.settings())[:2] == ["name", "noise_multiplier"]


def defaults_of(name: str) -> dict:
    return {"noise_multiplier": 1.0} if name == "dp" else {}
