"""Summarises CFL's split statistics in a run's metrics.csv, per cluster and window of rounds.

Summarises CFL's split statistics in a run's metrics.csv: per cluster, how often each test
decided (the `cfl_decision_{k}` codes of `tff_clustered.algorithms.cfl.SplitDecision`), the
rounds it split, and per window of rounds the ranges of the norm ratio, the nearest-neighbour
gap, the cosine spread and the two update norms, so one reads how near a split came.

    .venv/bin/python scripts/cfl_split_summary.py RUN_DIR/metrics.csv [--window=20]
"""

from __future__ import annotations

import argparse
import csv
import sys

import numpy as np

from tff_clustered.algorithms.cfl import SplitDecision

STATISTICS = ("norm_ratio", "separation_gap", "cosine_spread", "mean_norm", "max_norm")


def value_range(values: np.ndarray) -> str:
    finite = values[np.isfinite(values)]
    text = f"{finite.min():.3f}..{finite.max():.3f}" if finite.size else "-"
    others = values.size - finite.size
    return f"{text} (+{others} non-finite)" if others else text


def ranges(logged: list[dict[str, str]], k: int, selected: np.ndarray) -> str:
    """The ranges of cluster k's statistics over the `selected` rows of `logged`, and the
    largest gap minus spread (the relative test splits when it is above 0)."""
    values = {
        name: np.array([float(r[f"cfl_{name}_{k}"]) for r in logged])[selected]
        for name in STATISTICS
    }
    margin = values["separation_gap"] - values["cosine_spread"]
    texts = [f"{name} {value_range(v)}" for name, v in values.items()]
    return "; ".join([*texts, f"max(gap - spread) {margin.max():.3f}"])


def summarise(rows: list[dict[str, str]], window: int) -> list[str]:
    columns = rows[0].keys() if rows else ()
    clusters = sorted(int(c.rsplit("_", 1)[1]) for c in columns if c.startswith("cfl_decision_"))
    if not clusters:
        raise ValueError("no cfl_decision_{k} column: not a CFL run's metrics.csv")
    lines = []
    for k in clusters:
        logged = [r for r in rows if r.get(f"cfl_decision_{k}")]
        rounds = np.array([int(r["round"]) for r in logged])
        decisions = np.array([int(float(r[f"cfl_decision_{k}"])) for r in logged])
        counts = ", ".join(
            f"{d.name.lower()} {int((decisions == d).sum())}"
            for d in SplitDecision
            if (decisions == d).any()
        )
        split_rounds = rounds[decisions == SplitDecision.SPLIT].tolist()
        lines.append(f"cluster {k}: {len(logged)} rounds; {counts}; split in rounds {split_rounds}")
        for start in range(1, int(rounds.max()) + 1, window):
            in_window = (rounds >= start) & (rounds < start + window)
            if in_window.any():
                first, last = rounds[in_window].min(), rounds[in_window].max()
                lines.append(f"  rounds {first}-{last}: {ranges(logged, k, in_window)}")
        after_warmup = decisions != SplitDecision.WARMUP
        if after_warmup.any():
            lines.append(f"  after the warm-up: {ranges(logged, k, after_warmup)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics_csv")
    parser.add_argument("--window", type=int, default=20, help="rounds per line")
    args = parser.parse_args()
    if args.window < 1:
        sys.exit("--window must be >= 1")
    try:
        with open(args.metrics_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        print("\n".join(summarise(rows, args.window)))
    except (OSError, ValueError) as e:
        sys.exit(f"{args.metrics_csv}: {e}")


if __name__ == "__main__":
    main()
