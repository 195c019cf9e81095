"""Whether the committed result tables still hold: their values, and a cell of each rerun.

Do the committed result tables still hold? Two checks of every table under `results/`:

1. its committed values, every row: the .csv has the columns compared, each run's
   `final_accuracy` and `max_accuracy` are finite numbers in [0, 1] (the max not below the
   final), each (setting, algorithm) has one row for each seed the header lists, and the .md's
   summary cells (mean ± std over seeds) are those of the .csv's rows, its per-seed
   diagnostics those of the rows in seed order, and each row is its run's where the folder
   keeps the runs (`committed_tables.per_seed_problems`, `run_output_problems`). A table that
   fails is reported MALFORMED, naming the file and what is wrong, and the other tables are
   checked (a compare.py table whose .csv is missing, a folder or not UTF-8 too);
2. a sample of its cells rerun with the command written in its .md file, comparing the final
   and max accuracy with the committed .csv: its first row's algorithm and setting, the lowest
   seed committed for it, or with --all_seeds every seed committed for it (one compare.py run).
   Each line says which cell and seeds were rerun.

  python binaries/check_results.py                  # the tables that need no data (digits)
  python binaries/check_results.py --all_seeds      # every seed of each sampled cell
  python binaries/check_results.py --with_data --data_root=DIR   # also the real-data tables

A table's command names its data as `--data_dir=DATA/mnist` (likewise --tfds_dir and
--glove_path): DATA stands for the folder holding the datasets on whichever machine reruns it,
`--data_root` here (default $TFF_CLUSTERED_DATA, else ../shared/data next to the repository when
it exists). A command with a machine's own absolute data path is reported (NOT PORTABLE) and
fails the check, since it reruns on that machine only.

A table whose cell moved ("DRIFT") no longer comes from its command with today's code on this
machine: rerun it, or withdraw it (docs/changelog.md). TensorFlow's CPU kernels round
differently by CPU and numerics setting. A cell is rerun with TensorFlow's numerics variables
(TF_ENABLE_ONEDNN_OPTS, the thread counts) as the committed table's `- numerics:` header line
records them, and each rerun line is followed by the committed table's CPU and numerics
settings (`- cpu:` / `- numerics:`; "not recorded" in tables written before they were) where
they differ from this machine's: a drift of a test image or two is then expected
(docs/reproducibility.md, "On another machine").

Exit code 1 when a table is malformed or a cell drifted, failed or is not portable, 0
otherwise; 2 for bad flags (a --tolerance above MAX_TOLERANCE among them), for --with_data
without a data root or with one that lacks a dataset folder some table needs (checked before
any table runs), and when no cell was rerun and none failed (a missing --results folder, or
every table skipped), since a check that compared nothing must not pass.
"""

from __future__ import annotations

import glob
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import NamedTuple, Optional, Union

from absl import app, flags

from tff_clustered.cli import exits
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.cli.table_commands import (
    Cell,
    data_paths,
    missing_data,
    named_data_root,
    rerun_arguments,
    rerun_environment,
    resolve_data_path,
    sampled_cell,
    table_command,
    with_data_root,
)
from tff_clustered.comparison.committed_tables import (
    COMPARED,
    committed_problems,
    problems_text,
    read_csv,
    read_table_file,
    run_output_problems,
)
from tff_clustered.comparison.numerics import (
    MACHINE_FIELDS,
    machine_fields,
)
from tff_clustered.run_folder import (
    COMPARISON_CSV,
    ComparisonFolder,
)

ROOT = REPOSITORY
FLAGS = flags.FLAGS
flags.DEFINE_bool("with_data", False, "Also the tables that read data (DATA/... in --data_root).")
flags.DEFINE_string("results", os.path.join(ROOT, "results"), "The folder of result tables.")
flags.DEFINE_bool(
    "all_seeds",
    False,
    "Rerun every seed committed for each table's sampled cell (its first row's setting and "
    "algorithm), not only its lowest.",
)
# The largest accuracy difference --tolerance may count as the same: 0.01 (one point), above
# the largest drift measured between CPUs or oneDNN settings in the committed tables' cells
# (0.0074: two digits test images of a CNN's best round; 0.0058: a LeNet cell on
# Fashion-MNIST; docs/reproducibility.md, "On another machine"). A cell that moved by more
# than that did not move by rounding, and a larger tolerance would pass it.
MAX_TOLERANCE = 0.01
# A finite number in [0, MAX_TOLERANCE] (`exits.parse_flags` refuses nan and inf, absl the
# negative ones, `main` the larger): a nan tolerance would pass every cell, a negative one fail
# every cell.
flags.DEFINE_float(
    "tolerance",
    1e-6,
    f"Largest accuracy difference counted as the same, at most {MAX_TOLERANCE}.",
    lower_bound=0.0,
)


def data_root_of_flags(with_data: bool, data_root: Optional[str]) -> Optional[str]:
    """The folder DATA stands for (`table_commands.named_data_root`); None without
    --with_data, and a usage error for a --data_root without it."""
    if not with_data:
        if data_root is not None:
            raise exits.usage_error("--data_root is read with --with_data only; add --with_data")
        return None
    return named_data_root(data_root)


def compare_cell(committed: dict, now: dict, tolerance: float) -> list[str]:
    """The compared values that moved, as `name committed -> now`; a value that is not a
    finite number on either side counts as moved (it compares nothing)."""
    moved = []
    for name in COMPARED:
        a, b = accuracy(committed.get(name)), accuracy(now.get(name))
        if not (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tolerance):
            moved.append(f"{name} {a:.6f} -> {b:.6f}")
    return moved


def accuracy(text: object) -> float:
    """A .csv cell as a number (nan when it is none)."""
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


class TableCheck(NamedTuple):
    """One table's outcome: its status (ok, DRIFT, FAILED, NOT PORTABLE, MALFORMED, or
    skipped with the reason), the detail printed after it, the cell rerun (None when none
    was), what differs between the committed table's machine and this one's
    (`machine_notes`), and this machine's `MACHINE_FIELDS` as the rerun recorded them."""

    status: str
    detail: str
    rerun: Optional[Cell] = None
    notes: tuple[str, ...] = ()
    here: tuple[str, ...] = ()


FAILURES = ("DRIFT", "FAILED", "NOT PORTABLE", "MALFORMED")


def machine_notes(committed: str, rerun: str) -> tuple[str, ...]:
    """The `MACHINE_FIELDS` header lines the committed table's .md does not record, and each
    it records that differs from the rerun's (this machine's), with both values: a cell may
    then drift by a test image or two without any change of the code
    (docs/reproducibility.md)."""
    then, now = machine_fields(committed), machine_fields(rerun)
    missing = [field for field in MACHINE_FIELDS if field not in then]
    notes = [f"{' and '.join(missing)} not recorded in the committed table"] if missing else []
    return tuple(notes) + tuple(
        f"{field}: committed {then[field]}; here {now.get(field, 'not known')}"
        for field in MACHINE_FIELDS
        if field in then and then[field] != now.get(field)
    )


def machine_text(markdown: str) -> tuple[str, ...]:
    """A table's `MACHINE_FIELDS` header lines, as `field: value`."""
    return tuple(f"{field}: {value}" for field, value in machine_fields(markdown).items())


def check_table(
    markdown_path: str, data_root: Optional[str], tolerance: float, all_seeds: bool = False
) -> TableCheck:
    """One table: its committed rows (`committed_problems`: MALFORMED when any), then its
    sampled cell (`sampled_cell`) rerun: ok, DRIFT, FAILED, NOT PORTABLE (a data path of one
    machine), or skipped with the reason (no .csv or command; no `data_root` for the tables
    that read data). A table written by compare.py (its .md names the command) whose .csv is
    missing is MALFORMED: its rows cannot be checked; another .md without one is skipped."""
    csv_path = markdown_path[: -len(".md")] + ".csv"
    try:
        markdown = read_table_file(markdown_path)
    except ValueError as error:
        return TableCheck("MALFORMED", str(error))
    if not os.path.lexists(csv_path):
        if table_command(markdown) is None:
            return TableCheck("skipped", "no .csv beside it")
        return TableCheck(
            "MALFORMED",
            f"{os.path.basename(csv_path)}, the rows of this compare.py table, is missing: "
            "restore it, or remove the table",
        )
    try:
        rows, problems = committed_problems(read_table_file(csv_path), markdown)
    except ValueError as error:
        return TableCheck("MALFORMED", str(error))
    if not problems:
        problems = run_output_problems(rows, os.path.dirname(markdown_path))
    if problems:
        return TableCheck("MALFORMED", f"{os.path.basename(csv_path)}: {problems_text(problems)}")
    sound = f"its {len(rows)} committed rows sound"
    command = table_command(markdown)
    if command is None:
        return TableCheck("skipped", f"no compare.py command in it ({sound})")
    recorded = data_paths(command)
    try:
        for path in recorded:
            resolve_data_path(path, data_root)
    except ValueError as error:
        return TableCheck("NOT PORTABLE", str(error))
    if recorded and data_root is None:
        return TableCheck("skipped", f"needs {', '.join(recorded)} (--with_data); {sound}")
    if "--dp_noise=secure" in command:
        return TableCheck(
            "skipped",
            f"its noise is secure (--dp_noise=secure: drawn from the operating system, never "
            f"recorded), so no rerun can repeat it; {sound}",
        )
    if data_root is not None:
        command = with_data_root(command, data_root)
    cell = sampled_cell(rows, all_seeds)
    rerun = rerun_cell(command, cell, markdown)
    if isinstance(rerun, TableCheck):
        return rerun
    rerun_rows, rerun_markdown = rerun
    notes, here = machine_notes(markdown, rerun_markdown), machine_text(rerun_markdown)
    moved = cell_moves(rows, rerun_rows, cell, tolerance)
    if moved:
        return TableCheck("DRIFT", f"{cell}: {' | '.join(moved)}", cell, notes, here)
    return TableCheck("ok", f"{cell} ({sound})", cell, notes, here)


def rerun_cell(
    command: list[str], cell: Cell, markdown: str
) -> Union[TableCheck, tuple[list[dict[str, str]], str]]:
    """`cell` rerun with the table's `command` (`rerun_arguments`) in a temporary folder, under
    the numerics the table's .md records: the rerun's .csv rows and .md, or the FAILED check
    when it exits with an error or writes no .csv."""
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = [*rerun_arguments(command, cell), f"--output_dir={output_dir}"]
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "binaries", "compare.py"), *arguments],
            cwd=ROOT,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=rerun_environment(markdown),
        )
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
            return TableCheck("FAILED", f"{cell}: {last}", cell)
        folder = ComparisonFolder(output_dir)
        if not os.path.exists(folder.comparison_csv):
            return TableCheck("FAILED", f"{cell}: the rerun wrote no {COMPARISON_CSV}", cell)
        with open(folder.comparison_csv) as f:
            rerun_rows, _ = read_csv(f.read())
        with open(folder.comparison_md) as f:
            return rerun_rows, f.read()


def cell_moves(
    rows: Sequence[dict[str, str]],
    rerun_rows: Sequence[dict[str, str]],
    cell: Cell,
    tolerance: float,
) -> list[str]:
    """What moved of each seed of `cell` between the committed rows and the rerun's
    (`compare_cell`), prefixed by the seed when there are several; none: the cell holds."""
    moved = []
    for seed in cell.seeds:
        key = (cell.setting, cell.algorithm, str(seed))
        committed = next(r for r in rows if (r["setting"], r["algorithm"], r["seed"]) == key)
        now = [r for r in rerun_rows if (r["setting"], r["algorithm"], r["seed"]) == key]
        prefix = f"seed {seed}: " if len(cell.seeds) > 1 else ""
        if not now:
            moved.append(f"{prefix}the rerun wrote no row of it")
        elif changed := compare_cell(committed, now[0], tolerance):
            moved.append(prefix + "; ".join(changed))
    return moved


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.tolerance > MAX_TOLERANCE:
        raise exits.usage_error(
            f"--tolerance={FLAGS.tolerance:g} would count cells that moved by more than "
            f"{MAX_TOLERANCE} (one point) as the same; give at most {MAX_TOLERANCE}, the "
            "largest drift measured between CPUs or oneDNN settings is 0.0074 "
            "(docs/reproducibility.md)"
        )
    if not os.path.isdir(FLAGS.results):
        raise exits.usage_error(
            f"--results={FLAGS.results} is not a folder; pass the folder of result tables "
            f"(default {os.path.join(ROOT, 'results')})"
        )
    data_root = data_root_of_flags(FLAGS.with_data, FLAGS.data_root)
    tables = table_files(FLAGS.results)
    if data_root is not None and (missing := missing_data(tables, data_root)):
        _, recorded, table = missing[0]
        raise exits.usage_error(
            f"no dataset folder {', '.join(dict.fromkeys(m[0] for m in missing))} "
            f"({os.path.relpath(table, ROOT)} names {recorded}); pass --data_root=DIR holding "
            "the tables' dataset folders, or --results=DIR of the tables whose data is there"
        )
    checks = []
    for path in tables:
        check = check_table(path, data_root, FLAGS.tolerance, FLAGS.all_seeds)
        checks.append(check)
        print(f"{check.status:8} {os.path.relpath(path, ROOT)}: {check.detail}", flush=True)
        for note in check.notes:
            print(f"{'':8} {note}: a drift of a test image or two is expected", flush=True)
    rerun = [c.rerun for c in checks if c.rerun is not None]
    if tables:
        print(sample_summary(len(tables), rerun, FLAGS.all_seeds), flush=True)
    for line in next((c.here for c in checks if c.here), ()):
        print(f"this machine's {line}", flush=True)
    failed = any(c.status in FAILURES for c in checks)
    if not rerun and not failed:
        raise exits.usage_error(nothing_checked_message(FLAGS.results, len(tables)))
    return 1 if failed else 0


def table_files(results: str) -> list[str]:
    """Every .md table under `results`, and the comparison.md a compare.py table's rows
    (comparison.csv) are found without: checked too, so reported MALFORMED, not passed over."""
    found = set(glob.glob(os.path.join(results, "**", "*.md"), recursive=True))
    rows = glob.glob(os.path.join(results, "**", "comparison.csv"), recursive=True)
    return sorted(found | {path[: -len(".csv")] + ".md" for path in rows})


def sample_summary(tables: int, rerun: Sequence[Cell], all_seeds: bool) -> str:
    """What was checked: every table's committed rows, and the cells and seeds rerun."""
    seeds = "every seed committed for it" if all_seeds else "its lowest seed (--all_seeds: all)"
    return (
        f"checked the committed rows of {tables} tables; reran {len(rerun)} cells "
        f"({sum(len(c.seeds) for c in rerun)} runs): each table's first cell, {seeds}"
    )


def nothing_checked_message(results: str, tables: int) -> str:
    """Why no cell was rerun, and what to pass."""
    if not tables:
        return (
            f"no table checked: {results} holds no .md table; pass --results=DIR of tables "
            "written by binaries/compare.py"
        )
    return (
        f"no cell rerun: all {tables} tables under {results} were skipped (above), so "
        "nothing was compared; pass --with_data (and --data_root=DIR) where their "
        "data is, or --results=DIR of tables with a sound .csv and a compare.py command"
    )


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    exits.run_main("check_results.py", main)
