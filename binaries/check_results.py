"""Do the committed result tables still reproduce? Reruns one cell of each table under
`results/` (its first row's algorithm and setting, seed 0) with the command written in the
table's .md file, and compares the final and max accuracy with the committed .csv.

  python binaries/check_results.py                  # the tables that need no data (digits)
  python binaries/check_results.py --with_data      # also those whose --data_dir exists here

A table whose cell moved ("DRIFT") no longer comes from its command with today's code: rerun
it, or withdraw it (docs/changelog.md). Exit code 1 when a cell drifted, 0 otherwise; 2 for
bad flags and when no table was checked (a missing --results folder, or every table skipped),
since a check that compared nothing must not pass.
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads (the registry)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tff_clustered import cli  # noqa: E402 - light (absl only)
from tff_clustered.run_folder import ComparisonFolder  # noqa: E402 - the standard library only

cli.stop_at_once_on_signals("check_results.py")
FLAGS = flags.FLAGS
flags.DEFINE_bool("with_data", False, "Also tables whose --data_dir exists on this machine.")
flags.DEFINE_string("results", os.path.join(ROOT, "results"), "The folder of result tables.")
# A finite number >= 0 (`cli.parse_flags` refuses nan and inf, absl the negative ones): a nan
# tolerance would pass every cell, a negative one fail every cell.
flags.DEFINE_float(
    "tolerance", 1e-6, "Largest accuracy difference counted as the same.", lower_bound=0.0
)
COMMAND = re.compile(r"^- command: `python binaries/compare\.py (.*)`\s*$", re.MULTILINE)
COMPARED = ("final_accuracy", "max_accuracy")


def table_command(markdown: str) -> Optional[list[str]]:
    """The compare.py arguments written in a table's .md file, without its --output_dir."""
    found = COMMAND.search(markdown)
    if not found:
        return None
    return [a for a in shlex.split(found.group(1)) if not a.startswith("--output_dir=")]


def first_cell(rows: list[dict]) -> dict:
    """The committed row the check reruns: the first of seed 0."""
    return next(r for r in rows if r["seed"] == "0")


def rerun_arguments(command: list[str], cell: dict) -> list[str]:
    """`command` narrowed to `cell`: its algorithm (without the other algorithms' options,
    which its run never reads and compare.py refuses for it), its setting when the table has
    setting rows (the setting is then a partition, not the dataset's name), seed 0."""
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


def needs_data(command: list[str]) -> Optional[str]:
    for a in command:
        if a.startswith("--data_dir="):
            return os.path.expanduser(a.split("=", 1)[1])
    return None


def compare_cell(committed: dict, now: dict, tolerance: float) -> list[str]:
    """The compared values that moved, as `name committed -> now`."""
    moved = []
    for name in COMPARED:
        a, b = float(committed[name]), float(now[name])
        if abs(a - b) > tolerance:
            moved.append(f"{name} {a:.6f} -> {b:.6f}")
    return moved


def check_table(markdown_path: str, with_data: bool, tolerance: float) -> tuple[str, str]:
    """(status, detail) for one table: ok, DRIFT, or skipped with the reason."""
    csv_path = markdown_path[: -len(".md")] + ".csv"
    if not os.path.exists(csv_path):
        return "skipped", "no .csv beside it"
    with open(markdown_path) as f:
        command = table_command(f.read())
    if command is None:
        return "skipped", "no compare.py command in it"
    data_dir = needs_data(command)
    if data_dir and not (with_data and os.path.exists(data_dir)):
        return "skipped", f"needs {data_dir} (--with_data)"
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
    tables = sorted(glob.glob(os.path.join(FLAGS.results, "**", "*.md"), recursive=True))
    drifted, checked = False, 0
    for path in tables:
        status, detail = check_table(path, FLAGS.with_data, FLAGS.tolerance)
        drifted = drifted or status in ("DRIFT", "FAILED")
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
        "--with_data where their data is, or --results=DIR of tables with a .csv and a "
        "compare.py command"
    )


if __name__ == "__main__":
    cli.run_main("check_results.py", main)
