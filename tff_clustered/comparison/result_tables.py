"""Comparison tables of several algorithms over seeds (`binaries/compare.py`).

Every run gives one row (`run_row`: setting, algorithm, seed, its accuracies and what its
clustering did). `write_tables` aggregates them per (setting, algorithm) over the seeds into
mean ± std cells (the sample standard deviation, ddof = 1, so one seed shows no spread), with
the per-setting diagnostics that say whether an algorithm did what it is for (clusters formed,
FedTSDP's triggers, CFL's splits, UA-PDFL's regimes), the command that made the table and its
date, and keeps every run's figures in long form in `comparison.csv`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from tff_clustered.algorithms import algorithm_class
from tff_clustered.algorithms.base import Algorithm, per_seed_text
from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.report.reporting import csv_cell, summarize
from tff_clustered.run_folder import ComparisonFolder

RUN_COLUMNS = (
    "setting",
    "algorithm",
    "method",
    "seed",
    "max_accuracy",
    "max_accuracy_round",
    "final_accuracy",
    "final_client_mean_accuracy",
    "rounds_to_target",
    "mean_discrepancy",
    "floats_per_round",
    "train_seconds",
    "server_seconds",
    "eval_seconds",
    "checkpoint_seconds",
    "clusters",
    "cluster_sizes",
)


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


def mean_std(values: Sequence[Optional[float]], scale: float = 1.0, digits: int = 2) -> str:
    """`mean ± std` of the known values (sample std, ddof = 1; no ± for a single value), '-'
    when none is known."""
    known = [scale * float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not known:
        return "-"
    if len(known) == 1:
        return f"{known[0]:.{digits}f}"
    return f"{np.mean(known):.{digits}f} ± {np.std(known, ddof=1):.{digits}f}"


def _groups(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["setting"], row["algorithm"]), []).append(row)
    return groups


def diagnostics_text(runs: Sequence[Mapping[str, Any]]) -> str:
    """Per-seed diagnostics of one table cell, e.g. `clusters 3/3/2; triggers 2/3/2; sizes
    9+6+5 / 10+6+4 / 12+8`: the clusters formed, a private run's epsilon and rounds, the
    algorithm's own (`figures_text`), then the sizes where some seed formed more than one
    cluster."""
    parts = per_seed_text(runs, "clusters", "clusters", "{:.0f}")
    parts += per_seed_text(runs, "epsilon", "epsilon", "{:.2f}")
    parts += per_seed_text(runs, "rounds_trained", "rounds", "{:.0f}")
    if any(compressed(r) for r in runs):
        megabits = [dict(megabits=float(r["bits_per_round"]) / 1e6) for r in runs]
        parts += per_seed_text(megabits, "megabits", "Mbit/round", "{:.2f}")
    if runs and runs[0].get("method"):
        parts += algorithm_class(str(runs[0]["method"])).figures_text(runs)
    sizes = [str(r.get("cluster_sizes") or "-") for r in runs]
    if any("+" in size for size in sizes):  # some seed formed more than one cluster
        parts.append(f"sizes {' / '.join(sizes)}")
    return "; ".join(parts)


def compressed(run: Mapping[str, Any]) -> bool:
    """Whether a run sent fewer bits than 32 a value (its aggregator quantized)."""
    bits = float(run.get("bits_per_round", math.nan))
    return bits < 32 * float(run.get("floats_per_round", math.nan))


def _header(
    title: str, command: str, date: str, seeds: Sequence[int], defaults_taken: Sequence[str]
) -> list[str]:
    """The title, the command, the date, the seeds and, when the command left some of the
    table's flags to its defaults, those values with where each came from."""
    taken = ["- defaults of the flags not given:", *(f"  - {line}" for line in defaults_taken)]
    return [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- date: {date}",
        f"- seeds: {', '.join(str(s) for s in seeds)} (cells: mean ± sample std over seeds)",
        *(taken if defaults_taken else []),
        "",
    ]


def setting_table(rows: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    """Markdown: one row per setting, one column per algorithm, `key` in % as mean ± std; the
    best mean of each row in bold."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    groups = _groups(rows)
    lines = ["| setting | " + " | ".join(algorithms) + " |", "|---|" + "---|" * len(algorithms)]
    for setting in settings:
        means = {
            a: np.mean([float(r[key]) for r in groups.get((setting, a), [])] or [np.nan])
            for a in algorithms
        }
        best = max((m for m in means.values() if not math.isnan(m)), default=None)
        cells = []
        for a in algorithms:
            text = mean_std([r[key] for r in groups.get((setting, a), [])], 100.0)
            cells.append(f"**{text}**" if best is not None and means[a] == best else text)
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return lines


def algorithm_table(rows: Sequence[Mapping[str, Any]], target_accuracy: float) -> list[str]:
    """Markdown, FedGroup's Table III shape: one row per algorithm (per setting)."""
    lines = [
        "| setting | algorithm | max accuracy (%) | final accuracy (%) | client mean (%) | "
        f"rounds to {target_accuracy:.0%} | mean discrepancy (Eq. 4) | values sent per round "
        "| train s | server s | eval s | checkpoint s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (setting, algorithm), runs in _groups(rows).items():
        col = {k: [r[k] for r in runs] for k in RUN_COLUMNS}
        reached = [v for v in col["rounds_to_target"] if v is not None]
        lines.append(
            f"| {setting} | {algorithm} | {mean_std(col['max_accuracy'], 100, 1)} | "
            f"{mean_std(col['final_accuracy'], 100, 1)} | "
            f"{mean_std(col['final_client_mean_accuracy'], 100, 1)} | "
            f"{'/'.join(str(v) for v in reached) if reached else '-'} | "
            f"{mean_std(col['mean_discrepancy'], 1, 3)} | "
            f"{mean_std(col['floats_per_round'], 1, 0)} | {mean_std(col['train_seconds'], 1, 1)} | "
            f"{mean_std(col['server_seconds'], 1, 1)} | {mean_std(col['eval_seconds'], 1, 1)} | "
            f"{mean_std(col['checkpoint_seconds'], 1, 1)} |"
        )
    return lines


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
    groups = _groups(rows)
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


def write_tables(
    output_dir: str,
    rows: Sequence[Mapping[str, Any]],
    title: str,
    *,
    by_setting: bool,
    client_mean: bool,
    target_accuracy: float,
    command: str,
    date: str,
    defaults_taken: Sequence[str] = (),
    machine: Sequence[str] = (),
) -> str:
    """comparison.md (the table, then each cell's diagnostics per seed) and comparison.csv
    (every run in long form). `defaults_taken`: the table's defaults the command took, one
    line per source (written under the command); `machine`: the header's last lines, what the
    numbers depend on besides the command (`numerics.machine_lines`). Returns the markdown."""
    seeds = sorted({int(r["seed"]) for r in rows})
    # the generic columns, then every algorithm figure (`run_figures`) some row has
    columns = list(RUN_COLUMNS) + list(
        dict.fromkeys(k for r in rows for k in r if k not in RUN_COLUMNS)
    )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else csv_cell(row[k]) for k in columns})
    folder = ComparisonFolder(output_dir)
    atomic_write_bytes(folder.comparison_csv, buffer.getvalue().encode())
    key = "final_client_mean_accuracy" if client_mean else "final_accuracy"
    lines = [*_header(title, command, date, seeds, defaults_taken)[:-1], *machine, ""]
    if by_setting:
        lines += [
            "Final test accuracy (%), each client with the model it uses, "
            + ("unweighted mean over clients." if client_mean else "pooled over clients."),
            "",
            *setting_table(rows, key),
        ]
    else:
        lines += algorithm_table(rows, target_accuracy)
    notes = [
        (setting, algorithm, diagnostics_text(runs))
        for (setting, algorithm), runs in _groups(rows).items()
    ]
    notes = [n for n in notes if n[2]]
    if notes:
        lines += [
            "",
            f"Diagnostics per seed ({'/'.join(str(s) for s in seeds)}): clusters in use at the "
            "end, FedTSDP's re-clustering triggers, UA-PDFL's regimes (each seed's shares of "
            "peer-rounds after round 1), neighbours mixed (each seed's mean per round).",
            "",
            "| setting | algorithm | diagnostics |",
            "|---|---|---|",
            *[f"| {s} | {a} | {text} |" for s, a, text in notes],
        ]
    found = standings(rows, key if by_setting else "max_accuracy")
    if found:
        lines += [
            "",
            "Each paper's method against the baselines in this table: its mean minus the better "
            "of FedAvg and FedPer (FedAvg-DFL and FedPer-DFL), then minus FedAvg, in points, "
            "with the larger std of the two cells.",
            "",
            *standing_table(found),
        ]
    markdown = "\n".join(lines) + "\n"
    atomic_write_bytes(folder.comparison_md, markdown.encode())
    return markdown
