"""The rows of a comparison table with a row per setting (`comparison_tables.SETTING_TABLES`):
each setting is a change to every run of its row.

* A partition (`iid`, `pathological`, `shards`, `dirichlet:BETA`, `fedac_dirichlet[:BETA]`,
  `fedac_pathological`, `natural`): how the dataset is dealt to clients.
* A privacy level (the privacy table's rows): `mean`, the example-weighted mean per cluster
  with no clipping and no noise (today's runs); `clip`, differentially private FedAvg's
  clipping and uniform weights with no noise (what clipping alone costs); `epsilon:E`, noise
  calibrated so that the run's rounds take every client to epsilon E at the run's delta
  (`--target_epsilon=E` with the noise multiplier unset). The private rows take the command
  line's `--dp_*` settings when it gives `--aggregator=dp`, else adaptive clipping toward the
  median update norm (Andrew et al., NeurIPS 2021, TFF's `tff.learning.dp_aggregator`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tff_clustered.loop.config import AggregatorConfig
from tff_clustered.run_spec import RunSpec

# A partition setting: whether it needs a Dirichlet concentration (`dirichlet:BETA`), takes
# one (`fedac_dirichlet`, FedAC's 0.1 unset) or has none. `natural` keeps a dataset's own
# clients (writers, LEAF users).
SETTING_PARTITIONS = {
    "iid": "none",
    "pathological": "none",
    "shards": "none",
    "dirichlet": "required",
    "fedac_dirichlet": "optional",
    "fedac_pathological": "none",
    "natural": "none",
}
PRIVACY_LEVELS = ("mean", "clip", "epsilon")
SETTINGS_HELP = (
    "iid, pathological, shards, dirichlet:BETA, fedac_dirichlet[:BETA], fedac_pathological, "
    "natural (e.g. dirichlet:0.5), or a privacy level: mean, clip, epsilon:E (e.g. epsilon:8)"
)
SpecChange = Callable[[RunSpec], RunSpec]


def parse_setting(setting: str) -> SpecChange:
    """The change `setting` makes to each run of its row; an unknown setting, or a value where
    none belongs (or none where one must be), is an error naming the choices."""
    name, _, value = setting.partition(":")
    if name in PRIVACY_LEVELS:
        return privacy_change(setting, name, value)
    partition = parse_partition(setting, name, value)
    return lambda spec: dataclasses.replace(spec, data=dataclasses.replace(spec.data, **partition))


def parse_partition(setting: str, name: str, beta: str) -> dict[str, Any]:
    """A partition setting -> the data's partition fields."""
    takes = SETTING_PARTITIONS.get(name)
    if takes is None or (takes == "required" and not beta) or (takes == "none" and beta):
        raise ValueError(f"setting {setting!r}: use one of {SETTINGS_HELP}")
    if name == "natural":
        return {}
    try:
        return dict(partition=name, dirichlet_beta=float(beta) if beta else None)
    except ValueError:
        raise ValueError(f"setting {setting!r}: BETA must be a number") from None


def privacy_change(setting: str, name: str, value: str) -> SpecChange:
    """A privacy level -> the change of each run's aggregator (see the module docstring)."""
    if (name == "epsilon") != bool(value):
        raise ValueError(f"setting {setting!r}: use one of {SETTINGS_HELP}")
    epsilon = 0.0
    if name == "epsilon":
        try:
            epsilon = float(value)
        except ValueError:
            raise ValueError(f"setting {setting!r}: E must be a number, e.g. epsilon:8") from None
        if not epsilon > 0:
            raise ValueError(f"setting {setting!r}: E must be > 0")

    def change(spec: RunSpec) -> RunSpec:
        given = spec.training.aggregator
        if name == "mean":
            aggregator = AggregatorConfig()
        else:
            private = (
                given if given.name == "dp" else AggregatorConfig("dp", 0.0, clipping="adaptive")
            )
            aggregator = dataclasses.replace(
                private,
                noise_multiplier=None if epsilon else 0.0,
                target_epsilon=epsilon,
            )
        return dataclasses.replace(
            spec, training=dataclasses.replace(spec.training, aggregator=aggregator)
        )

    return change
