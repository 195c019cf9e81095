"""One run's row of a comparison table, and the rows grouped into the table's cells.

A row (`run_row`): setting, algorithm, seed, its accuracies, what it sent and spent, and what
its clustering did (`diagnostics`); a cell's runs: `cell_runs`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.algorithms.base import Algorithm
from tff_clustered.report.reporting import summarize


def cell_runs(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The runs of each cell of a table: its rows grouped by (setting, algorithm), in order."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["setting"], row["algorithm"]), []).append(row)
    return groups


def _last(history: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """The last row's columns that start with `prefix` (e.g. every `cluster_size_k`)."""
    for row in reversed(history):
        found = {k: float(v) for k, v in row.items() if k.startswith(prefix)}
        if found:
            return found
    return {}


def _mean(values: Sequence[float]) -> Optional[float]:
    return float(np.mean(values)) if len(values) else None


def diagnostics(history: Sequence[Mapping[str, Any]], method: type[Algorithm]) -> dict[str, Any]:
    """What a run's clustering did: clusters in use at the end (clients assigned to them; None
    for decentralized peers, which each keep their own model) and their sizes, largest first
    (`70+28+5`), a private run's final epsilon and the rounds it trained (it stops at a target
    epsilon), then the algorithm's own figures (`Algorithm.run_figures`: FedTSDP's triggers,
    UA-PDFL's regimes, ...)."""
    trained = [r for r in history if r["round"] > 0]
    sizes = _last(history, "cluster_size_")
    decentralized = method.distribution.decentralized
    epsilons = [r["epsilon"] for r in trained if not math.isnan(r.get("epsilon", math.nan))]
    return {
        "epsilon": epsilons[-1] if epsilons else None,
        "rounds_trained": trained[-1]["round"] if epsilons else None,
        "clusters": None if decentralized or not sizes else sum(v > 0 for v in sizes.values()),
        "cluster_sizes": None
        if decentralized or not sizes
        else "+".join(str(round(v)) for v in sorted(sizes.values(), reverse=True) if v > 0),
        **method.run_figures(trained),
    }


def run_row(
    setting: str,
    algorithm: str,
    seed: int,
    history: Sequence[dict[str, Any]],
    target_accuracy: float,
    method: type[Algorithm],
) -> dict[str, Any]:
    """One run's figures: max and final accuracy (fractions, pooled over clients), the final
    unweighted client mean, the first round reaching `target_accuracy` (None if never), the
    mean Eq. 4 discrepancy of FedGroup, the mean values communicated per round, the training
    seconds, and its `diagnostics`. `algorithm` is the table's column label; `method` the
    algorithm class that ran."""
    results = summarize(history)
    trained = [r for r in history if r["round"] > 0]
    reached = [
        r["round"]
        for r in history
        if not math.isnan(r.get("accuracy", math.nan)) and r["accuracy"] >= target_accuracy
    ]
    discrepancy = [r["discrepancy"] for r in trained if "discrepancy" in r]
    evaluated = [r for r in history if "client_accuracy_mean" in r]
    return dict(
        setting=setting,
        algorithm=algorithm,
        method=method.name,
        seed=seed,
        max_accuracy=results.get("max_accuracy", math.nan),
        max_accuracy_round=results.get("max_accuracy_round"),
        final_accuracy=results.get("final_accuracy", math.nan),
        final_client_mean_accuracy=evaluated[-1]["client_accuracy_mean"] if evaluated else math.nan,
        rounds_to_target=reached[0] if reached else None,
        mean_discrepancy=_mean(discrepancy),
        floats_per_round=_mean_of(trained, "floats_communicated"),
        bits_per_round=_mean_of(trained, "bits_communicated"),
        train_seconds=results.get("total_train_seconds", 0.0),
        server_seconds=results.get("total_server_seconds", 0.0),
        eval_seconds=results.get("total_eval_seconds", 0.0),
        checkpoint_seconds=results.get("total_checkpoint_seconds", 0.0),
        **diagnostics(history, method),
    )


def _mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    """The mean of `key` over `rows` (0 without rows; a run written before `key` existed: NaN)."""
    if not rows:
        return 0.0
    return sum(float(r.get(key, math.nan)) for r in rows) / len(rows)
