"""Columns of a committed comparison table replaced by a rerun's rows, the others kept.

`compare.py --replace_columns=A,B --committed_table=DIR` reruns columns of a committed table
with the table's own command; `replaced_table` splices the rerun's rows into the committed
files. comparison.csv keeps every row of the other columns byte for byte, in place (a column
the rerun writes and the table lacks is appended, empty in the other rows), and each row of a
replaced column takes the rerun's row of the same setting and seed. tuning.csv (a tuned table)
is spliced the same way, trial by trial. comparison.md keeps its header (the command, the date,
the seeds, the machine the table was written on) and gains a line saying which columns were
rerun, when and at which commit; in its tables, the rows (or, in a table with a column per
algorithm, the cells) of the replaced columns are written from the spliced .csv
(`table_writer.body_lines`), as check_results.py recomputes them, and every other line stays
as committed, byte for byte (the standings too, unless a replaced column is a baseline they are
measured against).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

from tff_clustered.comparison import table_writer
from tff_clustered.comparison.standings import REFERENCES
from tff_clustered.comparison.table_format import RUN_COLUMNS

RUN_KEY = ("setting", "algorithm", "seed")
TRIAL_KEY = ("setting", "algorithm", "trial")
# The .csv columns the writer reads as numbers in every row: one that is empty (or that an old
# table lacks) is an unknown number, nan.
NUMBERS = ("max_accuracy", "final_accuracy", "final_client_mean_accuracy", "floats_per_round")


@dataclasses.dataclass(frozen=True)
class TableFiles:
    """A comparison table's texts: comparison.csv, comparison.md, and tuning.csv when tuned."""

    csv_text: str
    markdown: str
    tuning_csv: Optional[str] = None


def read_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """A .csv's header and rows, each cell as written."""
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def csv_text(columns: Sequence[str], rows: Sequence[Mapping[str, str]]) -> str:
    """Rows written back as the table's writer writes them (`\\n` line ends, minimal quoting):
    a row read and written again is the same bytes."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def spliced_csv(
    committed: str, rerun: str, columns: Sequence[str], key: Sequence[str] = RUN_KEY
) -> str:
    """`committed` with each row of `columns` replaced, in place, by the `rerun` row of the same
    `key`; a committed row the rerun lacks, or a rerun row the table lacks, is a ValueError
    naming it (the rerun did not run the table's command)."""
    header, rows = read_rows(committed)
    rerun_header, rerun_rows = read_rows(rerun)

    def key_of(row: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(row[k] for k in key)

    fresh = {key_of(r): r for r in rerun_rows if r["algorithm"] in columns}
    replaced = [key_of(r) for r in rows if r["algorithm"] in columns]
    missing = [" / ".join(k) for k in replaced if k not in fresh]
    extra = [" / ".join(k) for k in fresh if k not in replaced]
    if missing or extra:
        found = [f"no rerun row of {', '.join(missing)}"] * bool(missing)
        found += [f"rerun rows the table has not: {', '.join(extra)}"] * bool(extra)
        raise ValueError(
            f"the rerun's rows are not the table's: {'; '.join(found)} (was the table written "
            "by another command?)"
        )
    spliced = [fresh[key_of(r)] if r["algorithm"] in columns else r for r in rows]
    return csv_text([*header, *(c for c in rerun_header if c not in header)], spliced)


def writer_rows(text: str) -> list[dict[str, Any]]:
    """A committed .csv's rows as `table_writer` takes them: an empty cell unknown (None; one
    of `NUMBERS` nan), a column the table predates unknown, each row's method its column's
    algorithm when the .csv has none."""
    rows = []
    for row in read_rows(text)[1]:
        cells: dict[str, Any] = {k: v for k, v in row.items() if v != ""}
        for name in RUN_COLUMNS:
            cells.setdefault(name, "nan" if name in NUMBERS else None)
        cells["method"] = cells["method"] or row["algorithm"].partition(":")[0]
        rows.append(cells)
    return rows


def header_lines(markdown: str) -> tuple[list[str], list[str]]:
    """A table's .md split after its header (title, blank, `- ` lines): (header, the rest)."""
    lines = markdown.splitlines()
    end = next((i for i in range(2, len(lines)) if not lines[i].strip()), len(lines))
    return lines[:end], lines[end:]


def cells_of(line: str) -> list[str]:
    """A markdown table line's cells."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_lines(lines: Sequence[str]) -> Iterator[tuple[int, list[str], list[str]]]:
    """(index, its table's header cells, its cells) of each row line of the markdown tables
    in `lines` (not their header and |---| lines)."""
    header: list[str] = []
    for index, line in enumerate(lines):
        if not line.startswith("|"):
            header = []
        elif not header:
            header = cells_of(line)
        elif not set(line) <= set("|-: "):
            yield index, header, cells_of(line)


def row_key(header: Sequence[str], cells: Sequence[str]) -> tuple[str, ...]:
    """A table row's key: which table (its third title for the tables with a row per
    algorithm: the summary, the diagnostics, the standings; `by setting` for the table with a
    column per algorithm), its setting, its algorithm."""
    if len(header) > 2 and header[1] == "algorithm":
        return (header[2], cells[0], cells[1])
    return ("by setting", cells[0])


def bold(text: str, on: bool) -> str:
    """A cell's text in bold (the row's best mean) or plain."""
    plain = text.strip("*")
    return f"**{plain}**" if on else plain


def spliced_line(
    header: Sequence[str], cells: Sequence[str], fresh: Mapping[str, str], columns: Sequence[str]
) -> str:
    """A committed row with the cells of `columns` taken from `fresh` (the same row written
    from the spliced .csv, by title): a whole row of a replaced column, or, in the table with
    a column per algorithm, the replaced columns' cells, the row's bold (its best mean) then
    as `fresh` has it."""
    if header[1] == "algorithm":
        out = [fresh.get(title, cell) for title, cell in zip(header, cells)]
    else:
        out = [cells[0]] + [
            bold(fresh[t] if t in columns else c, fresh.get(t, c).startswith("**"))
            for t, c in zip(header[1:], cells[1:])
        ]
    return "| " + " | ".join(out) + " |"


def spliced_markdown(committed: str, fresh: str, columns: Sequence[str]) -> list[str]:
    """The committed .md's lines with the rows (cells) of `columns` taken from `fresh`, the
    .md written from the spliced .csv; the standings too where a replaced column is a
    baseline they are measured against; every other line as committed."""
    index = {row_key(h, c): dict(zip(h, c)) for _, h, c in table_lines(fresh.splitlines())}
    baselines = {name for names in REFERENCES.values() for name in names}
    standings_move = any(column in baselines for column in columns)
    lines = committed.splitlines()
    for i, header, cells in table_lines(lines):
        key = row_key(header, cells)
        if key not in index:
            continue
        by_algorithm = key[0] != "by setting"
        replaced = cells[1] in columns if by_algorithm else any(c in columns for c in header)
        if replaced or (by_algorithm and header[2].startswith("vs ") and standings_move):
            lines[i] = spliced_line(header, cells, index[key], columns)
    fresh_tuning = {line.split(": ", 1)[0]: line for line in fresh.splitlines()}
    for i, line in enumerate(lines):
        if tuning_line_column(line) in columns:
            lines[i] = fresh_tuning.get(line.split(": ", 1)[0], line)
    return lines


def tuning_line_column(line: str) -> Optional[str]:
    """The column of a Tuning line (`- SETTING COLUMN: trialNN of ...`, or `...: no trial of
    N chosen: ...` when every trial diverged), None for another."""
    found = re.match(r"^- (?:\S+ )?(\S+): (?:trial\d+|no trial) of ", line)
    return found.group(1) if found else None


def replaced_table(
    committed: TableFiles,
    rerun: TableFiles,
    columns: Sequence[str],
    rerun_line: str,
    layout: Mapping[str, Any],
) -> TableFiles:
    """The committed table with `columns` replaced by the rerun's rows (module docstring):
    `rerun_line` is added to the .md's header; `layout` is the writer's `by_setting`,
    `client_mean` and `target_accuracy` of the table's command."""
    csv_out = spliced_csv(committed.csv_text, rerun.csv_text, columns)
    tuning_csv = committed.tuning_csv
    if tuning_csv is not None and rerun.tuning_csv is not None:
        tuning_csv = spliced_csv(tuning_csv, rerun.tuning_csv, columns, TRIAL_KEY)
    fresh_tuning = [line for line in rerun.markdown.splitlines() if tuning_line_column(line)]
    fresh = table_writer.body_lines(writer_rows(csv_out), tuning=fresh_tuning, **layout)
    header, body = header_lines(committed.markdown)
    lines = spliced_markdown("\n".join(body), "\n".join(fresh), columns)
    markdown = "\n".join([*header, rerun_line, *lines]) + "\n"
    return TableFiles(csv_out, markdown, tuning_csv)
