"""The command line's aggregator flags and the settings they give, from the declarations.

`--aggregator` (the named aggregators, `federated.aggregators.NAMED`) and each setting they
declare (`--dp_clip`, `--robust_zeroing`, ...: `options.define_flags`), and the
`AggregatorConfig` they describe."""

from __future__ import annotations

from absl import flags

from tff_clustered import options as options_lib
from tff_clustered.federated.aggregators import (
    AGGREGATORS,
    NAMED,
    declared_options,
    options_classes,
)
from tff_clustered.loop.config import AggregatorConfig

FLAGS = flags.FLAGS


def aggregator_help() -> str:
    """`--aggregator`'s help: each named aggregator's summary, then where none but the mean
    can run."""
    each = ", ".join(f"{name} ({AGGREGATORS[name].summary})" for name in NAMED)
    return (
        f"What each cluster does with its clients' updates: {each}. Not for decentralized "
        "algorithms, nor dp for those that read individual clients' updates (cfl, fesem, "
        "fedac, cgpfl, flhc, fedtsdp)."
    )


def define_aggregator_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """`--aggregator` and every setting the named aggregators declare, as flags."""
    flags.DEFINE_enum("aggregator", "mean", list(NAMED), aggregator_help(), flag_values=flag_values)
    options_lib.define_flags(options_classes(), flag_values, owners_prefix="--aggregator=")


define_aggregator_flags()


def aggregator_config_from_flags(flag_values: flags.FlagValues = FLAGS) -> AggregatorConfig:
    """The aggregator settings the flags give: each setting a flag sets (given, or set to
    another value than its default); one of another aggregator is refused, naming its flag."""
    settings = {}
    for field, declared in declared_options().items():
        flag = flag_values[declared.flag]
        if flag.present or flag.value != flag.default:
            settings[field] = flag.value
    return AggregatorConfig(flag_values.aggregator, **settings)
