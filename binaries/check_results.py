"""Do the committed result tables still reproduce? Reruns one cell of each table under
`results/` (its first row's algorithm and setting, seed 0) with the command written in the
table's .md file, and compares the final and max accuracy with the committed .csv.

  python binaries/check_results.py                  # the tables that need no data (digits)
  python binaries/check_results.py --with_data --data_root=DIR   # also the real-data tables

A table's command names its data as `--data_dir=DATA/mnist` (likewise --tfds_dir and
--glove_path): DATA stands for the folder holding the datasets on whichever machine reruns it,
`--data_root` here (default $TFF_CLUSTERED_DATA, else ../shared/data next to the repository when
it exists). A command with a machine's own absolute data path is reported (NOT PORTABLE) and
fails the check, since it reruns on that machine only.

A table whose cell moved ("DRIFT") no longer comes from its command with today's code: rerun
it, or withdraw it (docs/changelog.md). Exit code 1 when a cell drifted, failed or is not
portable, 0 otherwise; 2 for bad flags, for --with_data without a data root or with one that
lacks a dataset folder some table needs (checked before any table runs), and when no table was
checked (a missing --results folder, or every table skipped), since a check that compared
nothing must not pass.
"""

from __future__ import annotations

import csv
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Optional

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tff_clustered import cli, logs  # noqa: E402 - light; quiets TensorFlow before its import
from tff_clustered.run_folder import ComparisonFolder  # noqa: E402 - the standard library only

cli.stop_at_once_on_signals("check_results.py")
logs.quiet_tensorflow(sys.argv)  # the algorithms' options load TensorFlow (`rerun_arguments`)
FLAGS = flags.FLAGS
flags.DEFINE_bool("with_data", False, "Also the tables that read data (DATA/... in --data_root).")
flags.DEFINE_string(
    "data_root",
    None,
    "The folder DATA stands for in the tables' data paths (--data_dir=DATA/mnist), read with "
    "--with_data; default $TFF_CLUSTERED_DATA, else ../shared/data next to the repository.",
)
flags.DEFINE_string("results", os.path.join(ROOT, "results"), "The folder of result tables.")
# A finite number >= 0 (`cli.parse_flags` refuses nan and inf, absl the negative ones): a nan
# tolerance would pass every cell, a negative one fail every cell.
flags.DEFINE_float(
    "tolerance", 1e-6, "Largest accuracy difference counted as the same.", lower_bound=0.0
)
COMMAND = re.compile(r"^- command: `python binaries/compare\.py (.*)`\s*$", re.MULTILINE)
COMPARED = ("final_accuracy", "max_accuracy")
# A recorded data path's stand-in for the folder of datasets (`--data_dir=DATA/mnist`), and
# the compare.py flags that carry a data path.
DATA = "DATA"
DATA_FLAGS = ("data_dir", "tfds_dir", "glove_path")
DATA_ROOT_VARIABLE = "TFF_CLUSTERED_DATA"
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


def table_command(markdown: str) -> Optional[list[str]]:
    """The compare.py arguments written in a table's .md file, its flagfiles expanded
    (`expand_flagfiles`), without its --output_dir."""
    found = COMMAND.search(markdown)
    if not found:
        return None
    command = expand_flagfiles(shlex.split(found.group(1)))
    return [a for a in command if not a.startswith("--output_dir=")]


def first_cell(rows: list[dict]) -> dict:
    """The committed row the check reruns: the first of seed 0."""
    return next(r for r in rows if r["seed"] == "0")


def expand_flagfiles(command: list[str]) -> list[str]:
    """`command` with each flagfile replaced, in place, by the flags it holds (paths relative
    to the repository, where compare.py runs): absl's own expansion
    (`FlagValues.read_flags_from_files`), so that narrowing and the data paths see every
    option. A missing flagfile is a usage error naming it."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return flags.FlagValues().read_flags_from_files(command, force_gnu=True)
    except flags.CantOpenFlagFileError as error:
        raise cli.usage_error(
            f"a table's command reads a flagfile that cannot be opened ({error}); restore the "
            "file or withdraw the table"
        ) from None
    finally:
        os.chdir(here)


def rerun_arguments(command: list[str], cell: dict) -> list[str]:
    """`command` (flagfiles expanded: `table_command`) narrowed to `cell`: its
    algorithm (without the other algorithms' options, which its run never reads and
    compare.py refuses for it), its setting when the table has setting rows (the setting is
    then a partition, not the dataset's name), seed 0."""
    from tff_clustered import options as options_lib
    from tff_clustered.algorithms import ALGORITHMS, algorithm_class

    every_option = set().union(*(options_lib.names(c.Options) for c in ALGORITHMS.values()))
    own = options_lib.names(algorithm_class(cell["algorithm"].split(":")[0]).Options)

    def kept(argument: str) -> bool:
        name = argument[2:].split("=", 1)[0]
        return not argument.startswith("--") or name not in every_option or name in own

    narrowed = [a for a in command if kept(a)]
    narrowed += [f"--algorithms={cell['algorithm']}", "--seeds=0"]
    if any(a.startswith("--settings=") for a in command) or ":" in cell["setting"]:
        narrowed.append(f"--settings={cell['setting']}")
    return narrowed


def data_flag(argument: str) -> Optional[tuple[str, str]]:
    """(flag, path as written) when `argument` gives a data flag a path: `--data_dir=DATA/mnist`
    is ("data_dir", "DATA/mnist")."""
    name, _, value = argument[2:].partition("=")
    return (name, value) if argument.startswith("--") and name in DATA_FLAGS and value else None


def data_paths(command: list[str]) -> list[str]:
    """The data paths `command` records, as written (`DATA/mnist`)."""
    return [found[1] for a in command if (found := data_flag(a))]


def resolve_data_path(recorded: str, data_root: Optional[str]) -> Optional[str]:
    """The path a recorded data path names on this machine: DATA replaced by `data_root` (None
    without one), a path relative to the repository joined to it. A machine's own absolute
    path (or `~`) raises ValueError: the table would rerun on that machine only."""
    if recorded == DATA or recorded.startswith(DATA + "/"):
        return None if data_root is None else data_root + recorded[len(DATA) :]
    if os.path.isabs(os.path.expanduser(recorded)):
        raise ValueError(
            f"{recorded} is one machine's path; write it as {DATA}/<dataset folder> "
            "(docs/reproducibility.md)"
        )
    return os.path.join(ROOT, recorded)


def with_data_root(command: list[str], data_root: str) -> list[str]:
    """`command` with each data flag's path resolved (`resolve_data_path`)."""

    def resolved(argument: str) -> str:
        found = data_flag(argument)
        return f"--{found[0]}={resolve_data_path(found[1], data_root)}" if found else argument

    return [resolved(a) for a in command]


def data_root_of_flags(with_data: bool, data_root: Optional[str]) -> Optional[str]:
    """The folder DATA stands for: --data_root, else $TFF_CLUSTERED_DATA, else ../shared/data
    next to the repository when it exists; None without --with_data. A usage error when there
    is none or the one named is not a folder."""
    if not with_data:
        if data_root is not None:
            raise cli.usage_error("--data_root is read with --with_data only; add --with_data")
        return None
    named = data_root or os.environ.get(DATA_ROOT_VARIABLE)
    if named:
        source = f"--data_root={named}" if data_root else f"${DATA_ROOT_VARIABLE}={named}"
        if not os.path.isdir(os.path.expanduser(named)):
            raise cli.usage_error(
                f"{source} is not a folder; pass --data_root=DIR, the folder holding the "
                f"dataset folders the tables name as {DATA}/<folder>"
            )
        return os.path.abspath(os.path.expanduser(named))
    if os.path.isdir(SHARED_DATA):
        return SHARED_DATA
    raise cli.usage_error(
        f"--with_data needs the folder {DATA} stands for in the tables' commands "
        f"(--data_dir={DATA}/mnist): pass --data_root=DIR (or set ${DATA_ROOT_VARIABLE}); "
        f"there is no {SHARED_DATA}"
    )


def missing_data(tables: list[str], data_root: str) -> list[tuple[str, str, str]]:
    """(path here, path as recorded, table) for each data path a table's command names that
    is not on this machine; a path that is not portable is left to `check_table`."""
    missing = []
    for path in tables:
        with open(path) as f:
            command = table_command(f.read()) or []
        for recorded in data_paths(command):
            try:
                here = resolve_data_path(recorded, data_root)
            except ValueError:
                continue
            if here is not None and not os.path.exists(here):
                missing.append((here, recorded, path))
    return missing


def compare_cell(committed: dict, now: dict, tolerance: float) -> list[str]:
    """The compared values that moved, as `name committed -> now`."""
    moved = []
    for name in COMPARED:
        a, b = float(committed[name]), float(now[name])
        if abs(a - b) > tolerance:
            moved.append(f"{name} {a:.6f} -> {b:.6f}")
    return moved


def check_table(markdown_path: str, data_root: Optional[str], tolerance: float) -> tuple[str, str]:
    """(status, detail) for one table: ok, DRIFT, FAILED, NOT PORTABLE (a data path of one
    machine), or skipped with the reason (no `data_root`: the tables that read data)."""
    csv_path = markdown_path[: -len(".md")] + ".csv"
    if not os.path.exists(csv_path):
        return "skipped", "no .csv beside it"
    with open(markdown_path) as f:
        command = table_command(f.read())
    if command is None:
        return "skipped", "no compare.py command in it"
    recorded = data_paths(command)
    try:
        for path in recorded:
            resolve_data_path(path, data_root)
    except ValueError as error:
        return "NOT PORTABLE", str(error)
    if recorded and data_root is None:
        return "skipped", f"needs {', '.join(recorded)} (--with_data)"
    if data_root is not None:
        command = with_data_root(command, data_root)
    with open(csv_path) as f:
        cell = first_cell(list(csv.DictReader(f)))
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = [*rerun_arguments(command, cell), f"--output_dir={output_dir}"]
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "binaries", "compare.py"), *arguments],
            cwd=ROOT,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            return "FAILED", done.stderr.strip().splitlines()[-1] if done.stderr else "no output"
        (now_csv,) = glob.glob(ComparisonFolder(output_dir).comparison_csv)
        with open(now_csv) as f:
            now = first_cell(list(csv.DictReader(f)))
    where = f"{cell['setting']} / {cell['algorithm']} / seed 0"
    moved = compare_cell(cell, now, tolerance)
    return ("DRIFT", f"{where}: {'; '.join(moved)}") if moved else ("ok", where)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not os.path.isdir(FLAGS.results):
        raise cli.usage_error(
            f"--results={FLAGS.results} is not a folder; pass the folder of result tables "
            f"(default {os.path.join(ROOT, 'results')})"
        )
    data_root = data_root_of_flags(FLAGS.with_data, FLAGS.data_root)
    tables = sorted(glob.glob(os.path.join(FLAGS.results, "**", "*.md"), recursive=True))
    if data_root is not None and (missing := missing_data(tables, data_root)):
        _, recorded, table = missing[0]
        raise cli.usage_error(
            f"no dataset folder {', '.join(dict.fromkeys(m[0] for m in missing))} "
            f"({os.path.relpath(table, ROOT)} names {recorded}); pass --data_root=DIR holding "
            "the tables' dataset folders, or --results=DIR of the tables whose data is there"
        )
    drifted, checked = False, 0
    for path in tables:
        status, detail = check_table(path, data_root, FLAGS.tolerance)
        drifted = drifted or status not in ("ok", "skipped")
        checked += status != "skipped"
        print(f"{status:8} {os.path.relpath(path, ROOT)}: {detail}", flush=True)
    if not checked:
        raise cli.usage_error(nothing_checked_message(FLAGS.results, len(tables)))
    return 1 if drifted else 0


def nothing_checked_message(results: str, tables: int) -> str:
    """Why no table was checked, and what to pass."""
    if not tables:
        return (
            f"no table checked: {results} holds no .md table; pass --results=DIR of tables "
            "written by binaries/compare.py"
        )
    return (
        f"no table checked: all {tables} tables under {results} were skipped (above); pass "
        "--with_data (and --data_root=DIR) where their data is, or --results=DIR of tables "
        "with a .csv and a compare.py command"
    )


if __name__ == "__main__":
    cli.run_main("check_results.py", main)
