"""The command line's aggregator flags and the settings they give, from the declarations.

`--aggregator` (the named aggregators, `federated.aggregators.NAMED`) and each setting they
declare (`--dp_clip`, `--robust_zeroing`, ...: `options.define_flags`), and the
`AggregatorConfig` they describe."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from absl import flags

from tff_clustered import options as options_lib
from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.federated.aggregators import (
    AGGREGATORS,
    NAMED,
    declared_options,
    options_classes,
)
from tff_clustered.loop.config import AggregatorConfig, refuse_unused_settings

FLAGS = flags.FLAGS


def aggregator_help() -> str:
    """`--aggregator`'s help: each named aggregator's summary, where none but the mean can run
    (`loop.aggregation.check_aggregator`'s rule, from the algorithms' declarations), and what a
    private run's epsilon covers and leaves out (their `Releases`)."""
    each = ", ".join(f"{name} ({AGGREGATORS[name].summary})" for name in NAMED)
    refused = [
        name + (f" unless {cls.private_mode}" if cls.private_mode else "")
        for name, cls in ALGORITHMS.items()
        if not cls.models_from_aggregate and not cls.distribution.decentralized
    ]
    cold_start = [name for name, cls in ALGORITHMS.items() if cls.releases.cold_start]
    beside = [name for name, cls in ALGORITHMS.items() if cls.releases.outside]
    return (
        f"What each cluster does with its clients' updates: {each}. Only the mean for "
        "decentralized algorithms (no server aggregates) and for those whose cluster models "
        f"are set from individual clients' models or updates ({', '.join(refused)}). With dp, "
        "epsilon covers the cluster models and, unless --dp_cold_start=raw, a cold start's "
        f"reads of clients' own updates ({', '.join(cold_start)}); what an algorithm sends "
        f"beside the aggregate ({', '.join(beside)}: cluster picks, personal models), exact "
        "training metrics and evaluation are not covered: each private run lists them "
        "(summary.json's privacy.not_covered, docs/privacy.md)."
    )


def define_aggregator_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """`--aggregator` and every setting the named aggregators declare, as flags."""
    flags.DEFINE_enum("aggregator", "mean", list(NAMED), aggregator_help(), flag_values=flag_values)
    options_lib.define_flags(options_classes(), flag_values, owners_prefix="--aggregator=")


define_aggregator_flags()


def given_settings(flag_values: flags.FlagValues = FLAGS) -> dict[str, Any]:
    """The aggregator settings the flags set (given, or set to another value than their
    default), by field name, whichever aggregators declare them."""
    settings = {}
    for field, declared in declared_options().items():
        flag = flag_values[declared.flag]
        if flag.present or flag.value != flag.default:
            settings[field] = flag.value
    return settings


def aggregator_config_from_flags(
    flag_values: flags.FlagValues = FLAGS, rows: Collection[str] = ()
) -> AggregatorConfig:
    """The aggregator settings the flags give (`given_settings`) for `--aggregator`. A setting
    of another aggregator is refused, naming its flag, unless one of `rows` declares it: the
    aggregators a comparison table's rows run (`setting_rows.row_aggregator`), which take it
    (`setting_rows.parse_setting`); given on the command line, also at its default value."""
    declared = declared_options()
    chosen = flag_values.aggregator
    settings = {
        field: value
        for field, value in given_settings(flag_values).items()
        if chosen in declared[field].users or not set(declared[field].users) & set(rows)
    }
    present = [field for field in settings if flag_values[declared[field].flag].present]
    refuse_unused_settings(AGGREGATORS[chosen], settings, present)
    return AggregatorConfig(chosen, **settings)


def cold_start_flags() -> list[str]:
    """The flags of the named aggregators' settings that only a cold start reading clients'
    updates uses (their `cold_start_settings`: `--dp_cold_start`, ...)."""
    declared = declared_options()
    names = {n for name in NAMED for n in AGGREGATORS[name].cold_start_settings}
    return [declared[n].flag for n in declared if n in names]
