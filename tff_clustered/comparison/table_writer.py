"""A comparison table's files written (`write_tables`: comparison.md and comparison.csv).

Every run gives one row (`run_rows.run_row`). `write_tables` aggregates them per (setting,
algorithm) over the seeds into mean ± std cells (the sample standard deviation, ddof = 1, so
one seed shows no spread), with the per-setting diagnostics that say whether an algorithm did
what it is for (clusters formed, FedTSDP's triggers, CFL's splits, UA-PDFL's regimes), the
command that made the table and its date, each paper's method against the baselines
(`standings`), and keeps every run's figures in long form in `comparison.csv`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.algorithms import algorithm_class
from tff_clustered.algorithms.base import per_seed_text
from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.comparison.run_rows import cell_runs
from tff_clustered.comparison.standings import Standing, standing_table, standings
from tff_clustered.comparison.table_format import (
    CLIENT_MEAN,
    POOLED,
    RUN_COLUMNS,
    SEEDS_LINE,
    SETTING_CAPTION,
    SUMMARY_COLUMNS,
)
from tff_clustered.report.reporting import csv_cell
from tff_clustered.run_folder import ComparisonFolder


def mean_std(values: Sequence[Optional[float]], scale: float = 1.0, digits: int = 2) -> str:
    """`mean ± std` of the known values (sample std, ddof = 1; no ± for a single value), '-'
    when none is known."""
    known = [scale * float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not known:
        return "-"
    if len(known) == 1:
        return f"{known[0]:.{digits}f}"
    return f"{np.mean(known):.{digits}f} ± {np.std(known, ddof=1):.{digits}f}"


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


def header(
    title: str,
    command: str,
    date: str,
    seeds: Sequence[int],
    defaults_taken: Sequence[str],
    machine: Sequence[str],
) -> list[str]:
    """The title, the command, the date, the seeds, when the command left some of the table's
    flags to its defaults those values with where each came from, then the `machine` lines,
    and a blank line."""
    taken = ["- defaults of the flags not given:", *(f"  - {line}" for line in defaults_taken)]
    return [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- date: {date}",
        SEEDS_LINE.format(seeds=", ".join(str(s) for s in seeds)),
        *(taken if defaults_taken else []),
        *machine,
        "",
    ]


def setting_table(rows: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    """Markdown: one row per setting, one column per algorithm, `key` in % as mean ± std; the
    best mean of each row in bold."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    groups = cell_runs(rows)
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
        "| setting | algorithm | "
        + "".join(f"{title} | " for title in SUMMARY_COLUMNS)
        + f"rounds to {target_accuracy:.0%} | mean discrepancy (Eq. 4) | values sent per round "
        "| train s | server s | eval s | checkpoint s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (setting, algorithm), runs in cell_runs(rows).items():
        col = {k: [r[k] for r in runs] for k in RUN_COLUMNS}
        reached = [v for v in col["rounds_to_target"] if v is not None]
        lines.append(
            f"| {setting} | {algorithm} | "
            + "".join(f"{mean_std(col[k], 100, 1)} | " for k in SUMMARY_COLUMNS.values())
            + f"{'/'.join(str(v) for v in reached) if reached else '-'} | "
            f"{mean_std(col['mean_discrepancy'], 1, 3)} | "
            f"{mean_std(col['floats_per_round'], 1, 0)} | {mean_std(col['train_seconds'], 1, 1)} | "
            f"{mean_std(col['server_seconds'], 1, 1)} | {mean_std(col['eval_seconds'], 1, 1)} | "
            f"{mean_std(col['checkpoint_seconds'], 1, 1)} |"
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
    tuning: Sequence[str] = (),
) -> str:
    """comparison.md (the table, then each cell's diagnostics per seed) and comparison.csv
    (every run in long form). `defaults_taken`: the table's defaults the command took, one
    line per source (written under the command); `machine`: the header's last lines, what the
    numbers depend on besides the command (`numerics.machine_lines`); `tuning`: a tuned table's
    section (`comparison.tuning.tuning_lines`), under the table. Returns the markdown."""
    folder = ComparisonFolder(output_dir)
    atomic_write_bytes(folder.comparison_csv, long_form_csv(rows).encode())
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = header(title, command, date, seeds, defaults_taken, machine)
    lines += body_lines(
        rows,
        by_setting=by_setting,
        client_mean=client_mean,
        target_accuracy=target_accuracy,
        tuning=tuning,
    )
    markdown = "\n".join(lines) + "\n"
    atomic_write_bytes(folder.comparison_md, markdown.encode())
    return markdown


def body_lines(
    rows: Sequence[Mapping[str, Any]],
    *,
    by_setting: bool,
    client_mean: bool,
    target_accuracy: float,
    tuning: Sequence[str] = (),
) -> list[str]:
    """comparison.md under its header: the table, the `tuning` section, each cell's
    diagnostics and each paper method's standing, all from `rows`."""
    seeds = sorted({int(r["seed"]) for r in rows})
    key = "final_client_mean_accuracy" if client_mean else "final_accuracy"
    if by_setting:
        lines = [
            SETTING_CAPTION.format(mean=CLIENT_MEAN if client_mean else POOLED),
            "",
            *setting_table(rows, key),
        ]
    else:
        lines = algorithm_table(rows, target_accuracy)
    lines += list(tuning)
    lines += diagnostics_section(rows, seeds)
    lines += standings_section(standings(rows, key if by_setting else "max_accuracy"))
    return lines


def long_form_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """comparison.csv's text: a line per run, the generic columns (`RUN_COLUMNS`) then every
    algorithm figure (`run_figures`) some row has; an unknown value is empty."""
    columns = list(RUN_COLUMNS) + list(
        dict.fromkeys(k for r in rows for k in r if k not in RUN_COLUMNS)
    )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else csv_cell(row[k]) for k in columns})
    return buffer.getvalue()


def diagnostics_section(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> list[str]:
    """The .md's lines of each cell's diagnostics per seed (`diagnostics_text`); none when no
    cell has any."""
    notes = [
        (setting, algorithm, diagnostics_text(runs))
        for (setting, algorithm), runs in cell_runs(rows).items()
    ]
    notes = [n for n in notes if n[2]]
    if not notes:
        return []
    return [
        "",
        f"Diagnostics per seed ({'/'.join(str(s) for s in seeds)}): clusters in use at the "
        "end, FedTSDP's re-clustering triggers, UA-PDFL's regimes (each seed's shares of "
        "peer-rounds after round 1), neighbours mixed (each seed's mean per round).",
        "",
        "| setting | algorithm | diagnostics |",
        "|---|---|---|",
        *[f"| {s} | {a} | {text} |" for s, a, text in notes],
    ]


def standings_section(found: Sequence[Standing]) -> list[str]:
    """The .md's lines of each paper's method against the table's baselines; none without."""
    if not found:
        return []
    return [
        "",
        "Each paper's method against the baselines in this table: its mean minus the better "
        "of FedAvg and FedPer (FedAvg-DFL and FedPer-DFL), then minus FedAvg, in points, "
        "with the larger std of the two cells.",
        "",
        *standing_table(found),
    ]
