"""Each paper's method against the baselines of its comparison table.

Its gap (`standings`) to the better of FedAvg and FedPer and to FedAvg, in points, with the
larger std of the two cells."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from tff_clustered.comparison.run_rows import cell_runs

# The papers' own methods, and the baselines each must at least equal: within a table, the
# better of the single-model and the personal-head baseline present (FedAvg and FedPer, or
# their decentralized versions for UA-PDFL); FedAvg (or FedAvg-DFL) is the one to beat.
PAPER_METHODS = (
    "fedgroup",
    "fedgrouprox",
    "fesem",
    "fedac",
    "fedtsdp",
    "uapdfl",
)  # fmt: skip
REFERENCES = {"fedavg": ("fedavg", "fedper"), "fedavg_dfl": ("fedavg_dfl", "fedper_dfl")}


class Standing(NamedTuple):
    """One paper method against its table's baselines in one setting, in points (%)."""

    setting: str
    algorithm: str
    best_reference: str
    gap_to_best: float  # method mean minus the better reference's mean
    std_best: float  # the larger std of the two cells
    gap_to_single: float  # method mean minus FedAvg's (FedAvg-DFL's)
    std_single: float

    @property
    def level_with_best(self) -> bool:
        """At least the better baseline within one std."""
        return self.gap_to_best >= -self.std_best

    @property
    def above_single(self) -> bool:
        """Above FedAvg by more than one std."""
        return self.gap_to_single > self.std_single


def _cell(runs: Sequence[Mapping[str, Any]], key: str) -> tuple[float, float]:
    values = [100.0 * float(r[key]) for r in runs if not math.isnan(float(r[key]))]
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def standings(rows: Sequence[Mapping[str, Any]], key: str) -> list[Standing]:
    """Each paper method's gap, per setting, to the better of FedAvg and FedPer (where both
    ran, else the one that did) and to FedAvg, with the larger std of the two cells: the
    project's check "at least the better baseline within one std, above FedAvg by more than
    one std". Tables without FedAvg (or FedAvg-DFL) give none."""
    groups = cell_runs(rows)
    out = []
    for (setting, algorithm), runs in groups.items():
        if algorithm.partition(":")[0] not in PAPER_METHODS:  # fesem:4 is FeSEM with K = 4
            continue
        for single, references in REFERENCES.items():
            if (setting, single) not in groups:
                continue
            mean, std = _cell(runs, key)
            present = [a for a in references if (setting, a) in groups]
            cells = {a: _cell(groups[(setting, a)], key) for a in present}
            best = max(cells, key=lambda a: cells[a][0])
            out.append(
                Standing(
                    setting,
                    algorithm,
                    best,
                    mean - cells[best][0],
                    max(std, cells[best][1]),
                    mean - cells[single][0],
                    max(std, cells[single][1]),
                )
            )
    return out


def standing_table(found: Sequence[Standing]) -> list[str]:
    """Markdown lines of `standings`."""
    lines = [
        "| setting | algorithm | vs the better baseline (points, larger std) | vs FedAvg or "
        "FedAvg-DFL (points, larger std) |",
        "|---|---|---|---|",
    ]
    for s in found:
        level = "level or above" if s.level_with_best else "**below by more than one std**"
        above = "above by more than one std" if s.above_single else "**not above by one std**"
        lines.append(
            f"| {s.setting} | {s.algorithm} | {s.gap_to_best:+.2f} vs {s.best_reference} "
            f"({s.std_best:.2f}): {level} | {s.gap_to_single:+.2f} ({s.std_single:.2f}): "
            f"{above} |"
        )
    return lines
