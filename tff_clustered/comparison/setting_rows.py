"""The settings of a comparison table with a row per setting, as changes to its runs.

The rows of a comparison table with a row per setting (`table_defaults.SETTING_TABLES`):
each setting is a change to every run of its row.

* A partition (`iid`, `pathological`, `shards`, `dirichlet:BETA`, `fedac_dirichlet[:BETA]`,
  `fedac_pathological`, `natural`): how the dataset is dealt to clients.
* An aggregator (the privacy and aggregation tables' rows), each cluster's updates aggregated
  as: `mean`, the example-weighted mean with no clipping and no noise (today's runs); `clip`,
  differentially private FedAvg's clipping and uniform weights with no noise (what clipping
  alone costs); `epsilon:E`, noise calibrated so that the run's rounds take every client to
  epsilon E at the run's delta (`--target_epsilon=E`, the noise multiplier unset); `robust`,
  TFF's robust aggregator (adaptive zeroing and clipping); `compression[:BITS[:THRESHOLD]]`,
  robust with the tensors of more than THRESHOLD values quantized to BITS bits (TFF's 8 and
  20000 unset); `secure`, robust with TFF's bounded integer sum. A row takes the command
  line's settings of its aggregator when the command line names it (`--aggregator=dp` and its
  `--dp_*` flags for the private rows), else its defaults, over which it takes the settings
  of its aggregator the command line gives without naming it (`--dp_noise=secure` alone: every
  private row's noise secure). The private rows' defaults: adaptive clipping toward the median
  update norm (Andrew et al., NeurIPS 2021, TFF's `tff.learning.dp_aggregator`).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any, Callable, Optional

from tff_clustered.loop.config import AggregatorConfig, named_at_defaults
from tff_clustered.runs.run_spec import RunSpec

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
# The aggregator rows: DP-FedAvg's clipping alone and its calibrated noise, and every aggregator
# taken by name at its defaults (`loop.config.named_at_defaults`), the mean first; the rows
# that take numbers, with their form.
AGGREGATOR_ROWS = ("mean", "clip", "epsilon", *(n for n in named_at_defaults() if n != "mean"))
ROW_FORMS = {"epsilon": "epsilon:E", "compression": "compression[:BITS[:THRESHOLD]]"}
SETTINGS_HELP = (
    "iid, pathological, shards, dirichlet:BETA, fedac_dirichlet[:BETA], fedac_pathological, "
    "natural (e.g. dirichlet:0.5), or an aggregator: "
    f"{', '.join(ROW_FORMS.get(row, row) for row in AGGREGATOR_ROWS)} (e.g. epsilon:8, "
    "compression:4:1000)"
)
SpecChange = Callable[[RunSpec], RunSpec]
EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def row_aggregator(setting: str) -> Optional[str]:
    """The aggregator the row of `setting` runs (`clip` and `epsilon:E`: dp), None for a
    partition."""
    name = setting.partition(":")[0]
    if name not in AGGREGATOR_ROWS:
        return None
    return "dp" if name in ("clip", "epsilon") else name


def parse_setting(setting: str, command_line: Mapping[str, Any] = EMPTY) -> SpecChange:
    """The change `setting` makes to each run of its row; an unknown setting, or a value where
    none belongs (or none where one must be), is an error naming the choices.
    `command_line`: the aggregator settings the command line gives, by field name
    (`aggregator_flags.given_settings`), which an aggregator row takes over its defaults."""
    name, colon, value = setting.partition(":")
    if colon and not value:
        raise ValueError(
            f"setting {setting!r}: a value after ':', or no ':'; use one of {SETTINGS_HELP}"
        )
    if name in AGGREGATOR_ROWS:
        return aggregator_change(setting, name, value, command_line)
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


def aggregator_change(
    setting: str, name: str, value: str, command_line: Mapping[str, Any]
) -> SpecChange:
    """An aggregator row -> the change of each run's aggregator (see the module docstring)."""
    numbers = parse_numbers(setting, value)
    takes = {"epsilon": (1, 1), "compression": (0, 2)}.get(name, (0, 0))
    if not takes[0] <= len(numbers) <= takes[1]:
        raise ValueError(f"setting {setting!r}: use one of {SETTINGS_HELP}")
    if name == "epsilon" and not numbers[0] > 0:
        raise ValueError(f"setting {setting!r}: E must be > 0")
    config = row_aggregator(setting)
    assert config is not None
    taken = AggregatorConfig.taken_by(config)
    given_here = {k: v for k, v in command_line.items() if k in taken}
    changes: dict[str, Any] = {}
    if name == "clip":
        changes = dict(noise_multiplier=0.0, target_epsilon=0.0)
    elif name == "epsilon":
        changes = dict(noise_multiplier=None, target_epsilon=numbers[0])
    elif name == "compression":
        if any(number != round(number) for number in numbers):
            raise ValueError(f"setting {setting!r}: BITS and THRESHOLD must be whole numbers")
        fields = ("quantization_bits", "quantization_threshold")
        changes = {field: int(number) for field, number in zip(fields, numbers)}

    def change(spec: RunSpec) -> RunSpec:
        given = spec.training.aggregator
        try:
            if given.name == config:
                aggregator = given.with_settings(**changes)
            else:
                own = dict(noise_multiplier=0.0, clipping="adaptive") if config == "dp" else {}
                aggregator = AggregatorConfig(config, **{**own, **given_here, **changes})
        except ValueError as e:
            raise ValueError(f"setting {setting!r}: {e}") from None
        return dataclasses.replace(
            spec, training=dataclasses.replace(spec.training, aggregator=aggregator)
        )

    return change


def parse_numbers(setting: str, value: str) -> list[float]:
    """The numbers after a setting's name (`epsilon:8` -> [8.0]), each a number or an error
    naming the setting."""
    if not value:
        return []
    try:
        numbers = [float(part) for part in value.split(":")]
    except ValueError:
        numbers = [math.nan]
    if not all(math.isfinite(number) for number in numbers):
        raise ValueError(f"setting {setting!r}: its values must be finite numbers")
    return numbers
