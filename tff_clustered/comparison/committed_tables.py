"""A committed comparison table's values, checked without rerunning anything.

The committed values of a comparison table (`table_writer.write_tables`: comparison.csv
and comparison.md), checked without rerunning anything (`binaries/check_results.py`): the
.csv has the columns compared, each run's `final_accuracy` and `max_accuracy` is a finite
number in [0, 1] with the max not below the final, each (setting, algorithm) has one row per
seed the .md header lists, and each summary cell of the .md (mean ± sample std over seeds, in
%) is the mean and std of its .csv rows to the decimals shown. `committed_problems` names
every problem found; none: the table is sound.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from collections.abc import Iterator, Sequence

from tff_clustered.comparison.table_format import CLIENT_MEAN, SEEDS, SUMMARY_COLUMNS
from tff_clustered.run_folder import ComparisonFolder

COMPARED = ("final_accuracy", "max_accuracy")
REQUIRED_COLUMNS = ("setting", "algorithm", "seed", *COMPARED)
# The .md's summary cells: the table with a row per algorithm shows `SUMMARY_COLUMNS` (one
# decimal); the tables with a row per setting show `final_accuracy`, or
# `final_client_mean_accuracy` when their caption says CLIENT_MEAN (two decimals).
# How many of a table's problems `problems_text` names (then "and N more").
PROBLEMS_SHOWN = 3


def read_table_file(path: str) -> str:
    """A table's file as text (a byte-order mark, as spreadsheets save UTF-8, left out); one
    that is not a file (a folder), cannot be read or is not UTF-8 is a ValueError of one line
    naming `path` and the fix."""
    if not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "missing"
        raise ValueError(f"{path} is {what}, not a file: restore the table's file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): restore the "
            "table's file as compare.py wrote it"
        ) from None
    except OSError as error:
        raise ValueError(f"{path} cannot be read ({error.strerror}): fix its permissions") from None


def read_csv(text: str) -> tuple[list[dict[str, str]], list[str]]:
    """A table's .csv rows (each column's text, "" where absent), and what is wrong with
    its form: unreadable, no header, a column compared missing, no rows, a row of the wrong
    length."""
    try:
        reader = csv.DictReader(io.StringIO(text))
        columns = reader.fieldnames or []
        rows = list(reader)
    except csv.Error as error:
        return [], [f"not a readable CSV ({error})"]
    if not columns:
        return [], ["empty: no header and no rows"]
    problems = [f"no {c} column" for c in REQUIRED_COLUMNS if c not in columns]
    if not rows:
        problems.append("a header and no rows")
    for line, row in enumerate(rows, start=2):
        if None in row or None in row.values():
            more = "more" if None in row else "fewer"
            problems.append(f"line {line} has {more} fields than the header")
    return [{k: v or "" for k, v in r.items() if k is not None} for r in rows], problems


def row_problems(line: int, row: dict[str, str]) -> Iterator[str]:
    """What is wrong with one committed row: its seed not a whole number, a compared accuracy
    not a finite number in [0, 1], its max below its final accuracy."""
    where = f"line {line} ({row['setting']} / {row['algorithm']} / seed {row['seed']})"
    if not row["seed"].isdigit():
        yield f"{where}: the seed is not a whole number"
    values = {}
    for name in COMPARED:
        try:
            values[name] = float(row[name])
        except ValueError:
            yield f"{where}: {name} {row[name]!r} is not a number"
            continue
        if not math.isfinite(values[name]):
            yield f"{where}: {name} is {row[name]}, not a finite accuracy (it compares nothing)"
        elif not 0.0 <= values[name] <= 1.0:
            yield f"{where}: {name} {row[name]} is not in [0, 1]"
    if len(values) == 2 and values["max_accuracy"] < values["final_accuracy"] - 1e-6:
        yield (
            f"{where}: max_accuracy {row['max_accuracy']} is below final_accuracy "
            + row["final_accuracy"]
        )


def seeds_problems(rows: Sequence[dict[str, str]], markdown: str) -> Iterator[str]:
    """Each (setting, algorithm) must have one row per seed the .md header lists (`- seeds:`),
    no more and no fewer."""
    found = SEEDS.search(markdown)
    if not found:
        return
    listed = sorted(int(s) for s in found.group(1).replace(" ", "").split(",") if s)
    groups: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        groups.setdefault((row["setting"], row["algorithm"]), []).append(int(row["seed"]))
    for (setting, algorithm), seeds in groups.items():
        if sorted(seeds) != listed:
            yield (
                f"{setting} / {algorithm} has rows of seeds {', '.join(map(str, sorted(seeds)))}; "
                f"the header lists {', '.join(map(str, listed))}"
            )


def markdown_tables(markdown: str) -> Iterator[tuple[str, list[list[str]]]]:
    """Each markdown table of `markdown` as (the paragraph just above it, its rows of cells
    with the header first and the |---| line left out)."""
    above, rows = "", []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            yield above, rows
            above, rows = line, []
        elif line.strip():
            above = line


def summary_cells(markdown: str) -> Iterator[tuple[str, str, str, int, str]]:
    """(setting, algorithm, .csv column, decimals, text) of every summary cell of a table's
    .md: the table with a row per setting and a column per algorithm, or the one with a row
    per algorithm and a column per figure (`SUMMARY_COLUMNS`). A ValueError names a row
    whose number of cells is not its header's."""
    for above, (header, *rows) in markdown_tables(markdown):
        for row in rows:
            if header[0] == "setting" and len(row) != len(header):
                raise ValueError(
                    f"the .md's table row {' | '.join(row)!r} has {len(row)} cells, its header "
                    f"{len(header)}"
                )
        if header[:2] == ["setting", "algorithm"]:
            for j, title in enumerate(header):
                if title in SUMMARY_COLUMNS:
                    for row in rows:
                        yield row[0], row[1], SUMMARY_COLUMNS[title], 1, row[j]
        elif header[0] == "setting" and len(header) > 1:
            column = "final_client_mean_accuracy" if CLIENT_MEAN in above else "final_accuracy"
            for row in rows:
                for algorithm, text in zip(header[1:], row[1:]):
                    yield row[0], algorithm, column, 2, text


def summary_problems(rows: Sequence[dict[str, str]], markdown: str) -> Iterator[str]:
    """Each summary cell of the .md (mean ± sample std over seeds, in %) must be the mean and
    std of the .csv rows of its setting and algorithm, to the decimals shown: a row changed
    in the .csv (a seed's accuracy set to 0) shows here."""
    for setting, algorithm, column, decimals, text in summary_cells(markdown):
        values = []
        for row in rows:
            if (row["setting"], row["algorithm"]) == (setting, algorithm):
                try:
                    values.append(100 * float(row.get(column, "")))
                except ValueError:
                    continue
        known = [v for v in values if math.isfinite(v)]
        shown = text.strip("*").split("±")
        try:
            numbers = [float(t) for t in shown] if text.strip("*") != "-" else []
        except ValueError:
            yield f"the .md's {setting} / {algorithm} cell {text!r} is not mean ± std"
            continue
        recomputed = [statistics.fmean(known)] if known else []
        if len(known) > 1:
            recomputed.append(statistics.stdev(known))
        # Half the last decimal shown, and the .csv's rounding (6 significant digits).
        slack = 0.5 * 10**-decimals + 1e-3
        if len(numbers) != len(recomputed) or any(
            abs(a - b) > slack for a, b in zip(numbers, recomputed)
        ):
            now = " ± ".join(f"{v:.{decimals}f}" for v in recomputed) or "-"
            yield (
                f"the .md says {text.strip('*')} for {setting} / {algorithm} ({column}, %), "
                f"its .csv rows give {now}"
            )


# The .md's per-seed diagnostics (`table_writer.diagnostics_text`) that are .csv columns: the
# label, the column and how each seed's value is shown.
PER_SEED_COLUMNS = {
    "clusters": ("clusters", "{:.0f}"),
    "epsilon": ("epsilon", "{:.2f}"),
    "rounds": ("rounds_trained", "{:.0f}"),
}


def per_seed_problems(rows: Sequence[dict[str, str]], markdown: str) -> Iterator[str]:
    """Each cell's per-seed diagnostics in the .md (`clusters 4/3/3; sizes 20+20 / ...`, one
    value per seed in the seeds' order) must be its .csv rows' values in the order of their
    seeds: rows whose seeds were swapped keep every mean and std but not this order."""
    for _, (header, *table_rows) in markdown_tables(markdown):
        if header != ["setting", "algorithm", "diagnostics"]:
            continue
        for setting, algorithm, text in (r[:3] for r in table_rows if len(r) >= 3):
            cell = [r for r in rows if (r["setting"], r["algorithm"]) == (setting, algorithm)]
            cell.sort(key=lambda r: int(r["seed"]) if r["seed"].isdigit() else -1)
            for part in text.split("; "):
                label, _, shown = part.partition(" ")
                if label == "sizes":
                    values = [r.get("cluster_sizes") or "-" for r in cell]
                    expected = " / ".join(values)
                elif label in PER_SEED_COLUMNS:
                    column, fmt = PER_SEED_COLUMNS[label]
                    expected = "/".join(per_seed_value(r.get(column, ""), fmt) for r in cell)
                else:
                    continue
                if shown != expected:
                    seeds = "/".join(r["seed"] for r in cell)
                    yield (
                        f"the .md's diagnostics of {setting} / {algorithm} say {label} {shown}, "
                        f"its .csv rows of seeds {seeds} give {expected} (rows of other seeds?)"
                    )


def per_seed_value(text: str, fmt: str) -> str:
    """A .csv cell as the .md's diagnostics show it (`-` when it has none)."""
    try:
        return fmt.format(float(text))
    except ValueError:
        return "-"


def committed_problems(csv_text: str, markdown: str) -> tuple[list[dict[str, str]], list[str]]:
    """A table's committed rows and every problem `read_csv`, `row_problems`,
    `seeds_problems` and `summary_problems` find (none: the rows are sound)."""
    rows, problems = read_csv(csv_text)
    if problems:
        return rows, problems
    for line, row in enumerate(rows, start=2):
        problems += row_problems(line, row)
    seen: dict[tuple[str, str, str], int] = {}
    for line, row in enumerate(rows, start=2):
        key = (row["setting"], row["algorithm"], row["seed"])
        if key in seen:
            problems.append(
                f"{' / '.join(key[:2])} / seed {key[2]} is on lines {seen[key]} and {line}"
            )
        seen.setdefault(key, line)
    if not problems:
        problems += seeds_problems(rows, markdown)
        problems += per_seed_problems(rows, markdown)
        try:
            problems += summary_problems(rows, markdown)
        except ValueError as error:
            problems.append(str(error))
    return rows, problems


def problems_text(problems: Sequence[str]) -> str:
    """The first `PROBLEMS_SHOWN` problems, and how many more."""
    more = len(problems) - PROBLEMS_SHOWN
    return "; ".join(problems[:PROBLEMS_SHOWN]) + (f"; and {more} more" if more > 0 else "")


def run_output_problems(rows: Sequence[dict[str, str]], folder: str) -> list[str]:
    """Each row against its run's own outputs where the table's folder holds them (compare.py's
    output folder: `[sSEED/][SETTING/]ALGORITHM/summary.json`; a committed table keeps none):
    the run's seed and its final and max accuracy must be the row's. A row of seed 1 that
    holds seed 2's figures (and back) keeps every mean and std, not this."""
    several = len({r["seed"] for r in rows}) > 1
    problems = []
    for row in rows:
        algorithm, _, k = row["algorithm"].partition(":")
        column = f"{algorithm}_k{k}" if k else algorithm
        seed = int(row["seed"]) if several else None
        places = [ComparisonFolder(folder).run(seed, s, column) for s in (row["setting"], None)]
        found = [p.summary_json for p in places if os.path.isfile(p.summary_json)]
        if not found:
            continue
        where = f"{row['setting']} / {row['algorithm']} / seed {row['seed']}"
        try:
            summary = json.loads(read_table_file(found[0]))
            ran = {
                "seed": str(summary["config"]["training"]["seed"]),
                **{name: float(summary["results"][name]) for name in COMPARED},
            }
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"{where}: its run's {found[0]} cannot be read ({error})")
            continue
        moved = [
            f"{name} {row[name]} (its run's {ran[name]:.6g})"
            for name in COMPARED
            if not abs(float(row[name]) - ran[name]) <= 1e-5
        ]
        if ran["seed"] != row["seed"]:
            moved.insert(0, f"seed {row['seed']} (its run's {ran['seed']})")
        if moved:
            problems.append(f"{where} has {', '.join(moved)}, from {found[0]}")
    return problems
