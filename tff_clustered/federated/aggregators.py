"""The aggregators by name: the one list of those the flags and `tff_clustered.run` name.

Each aggregator is a `cluster_aggregators.ClusterAggregator` subclass in its own file that
declares what users and the loop see of it: its `name` and `summary`, its settings
(`Options`, a dataclass of `options.option(...)` fields: the flags, the Python API and
docs/options.md come from them), and what the loop reads (`uniform_weights`, `private`,
`round_event`, `privacy_budget`, `upload_bits`, `check_workers`,
`voided_by_individual_updates`). A new aggregator named on the command line is its file and
its line here; one given to `tff_clustered.run` as an object (`examples/norm_bounded_mean.py`)
is its file only.

The order is the settings' order in every run's record (`loop.config.AggregatorConfig.
settings`: summary.json and checkpoints hold it), and the command line's choices' order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tff_clustered.federated.cluster_aggregators import ClusterAggregator, ClusterMean
from tff_clustered.federated.cluster_dp import ClusterDP
from tff_clustered.federated.cluster_encodings import ClusterCompression, ClusterSecure
from tff_clustered.federated.cluster_robust import ClusterRobust
from tff_clustered.federated.tff_factory_aggregator import TffFactoryPerCluster
from tff_clustered.options import flag_name

AGGREGATORS: dict[str, type[ClusterAggregator]] = {
    cls.name: cls
    for cls in (
        ClusterMean,
        ClusterDP,
        ClusterRobust,
        ClusterCompression,
        ClusterSecure,
        TffFactoryPerCluster,
    )
}
# The aggregators built from their settings alone: the flags' `--aggregator` choices.
NAMED = tuple(name for name, cls in AGGREGATORS.items() if cls.named)


@dataclasses.dataclass(frozen=True)
class DeclaredOption:
    """One setting the aggregators declare: its `flag`, its `default` and the aggregators
    that take it (`users`, in the registry's order)."""

    flag: str
    default: Any
    users: tuple[str, ...]


def aggregator_class(name: str) -> type[ClusterAggregator]:
    """The aggregator of `name`; another name is refused with the choices."""
    if name not in AGGREGATORS:
        raise ValueError(f"aggregator must be one of {NAMED}, got {name!r}")
    return AGGREGATORS[name]


def declared_options() -> dict[str, DeclaredOption]:
    """Every setting of the named aggregators, by its field name, in the registry's order."""
    declared: dict[str, DeclaredOption] = {}
    for name in NAMED:
        for field in dataclasses.fields(AGGREGATORS[name].options_type()):
            known = declared.get(field.name)
            users = (*known.users, name) if known else (name,)
            declared[field.name] = DeclaredOption(flag_name(field), field.default, users)
    return declared


def options_classes() -> dict[str, type]:
    """Each named aggregator's settings' dataclass, for `options.define_flags`."""
    return {name: AGGREGATORS[name].options_type() for name in NAMED}
