"""compare.py --replace_columns: columns of a committed table rerun with its own command.

`compare.py --replace_columns=fesem --committed_table=results/fedgroup-mnist` reads the
table's command from its comparison.md (flagfiles expanded, `DATA/...` resolved under
--data_root), runs it for those columns only, in a compare.py process of its own under the
numerics the table records (`table_commands.rerun_environment`), with `--table_columns` naming
the table's columns so that the whole command is accepted (a flag of a column not rerun, such
as FedGroup's --pretrain_scale beside FeSEM), then splices the rerun's rows into the committed
files (`comparison.column_replacement`). The runs stay in --output_dir (default
runs/replace-TABLE-COLUMNS), so a stopped replacement resumes; the committed files change
only once the rerun has finished.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Optional

from absl import flags

from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.cli import table_commands
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.comparison import column_replacement
from tff_clustered.comparison.committed_tables import (
    committed_problems,
    problems_text,
    read_table_file,
)
from tff_clustered.comparison.numerics import machine_fields
from tff_clustered.comparison.table_defaults import SETTING_TABLES
from tff_clustered.run_folder import ComparisonFolder

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "replace_columns",
    None,
    "Rerun these columns (e.g. fesem) of the committed table --committed_table with the "
    "table's own command, written in its comparison.md, and splice their rows into its "
    "comparison.csv and comparison.md (and tuning.csv); every other column's rows are kept "
    "(docs/evaluation.md).",
)
flags.DEFINE_string(
    "committed_table",
    None,
    "The folder of the committed table whose --replace_columns are rerun (e.g. "
    "results/fedgroup-mnist).",
)
# The flags a replacement reads; every other flag comes from the table's command.
OWN_FLAGS = ("replace_columns", "committed_table", "output_dir", "data_root")
TUNING_CSV = "tuning.csv"


def refuse_other_flags() -> None:
    """A flag besides `OWN_FLAGS` is a usage error: the columns rerun with the table's command."""
    given = sorted(n for n in FLAGS if FLAGS[n].present and n not in OWN_FLAGS)
    if given:
        raise ValueError(
            f"--replace_columns reruns the columns with the table's own command (its "
            f"comparison.md); drop --{', --'.join(given)}, or give only "
            f"--{', --'.join(OWN_FLAGS[1:])}"
        )
    if not FLAGS.replace_columns:
        raise ValueError(
            "--committed_table is read with --replace_columns=COLUMNS, the columns to rerun"
        )
    if not FLAGS.committed_table:
        raise ValueError(
            "--replace_columns needs --committed_table=DIR, the folder of the table whose "
            "columns are rerun (e.g. results/fedgroup-mnist)"
        )


def read_table(folder: str, name: str) -> column_replacement.TableFiles:
    """A table folder's comparison.csv, comparison.md and tuning.csv (when present); a missing
    file is a ValueError naming it."""
    files = ComparisonFolder(folder)
    texts = []
    for path in (files.comparison_csv, files.comparison_md):
        if not os.path.exists(path):
            raise ValueError(f"{name} has no {path}: give the folder of a compare.py table")
        texts.append(read_table_file(path))
    tuning = os.path.join(folder, TUNING_CSV)
    tuning_csv = read_table_file(tuning) if os.path.exists(tuning) else None
    return column_replacement.TableFiles(texts[0], texts[1], tuning_csv)


def table_columns(committed: column_replacement.TableFiles, replaced: Sequence[str]) -> list[str]:
    """The committed table's columns, once its rows are sound; a column to replace that it
    has not is a ValueError naming its columns."""
    rows, problems = committed_problems(committed.csv_text, committed.markdown)
    if problems:
        raise ValueError(
            f"--committed_table={FLAGS.committed_table} is not sound ({problems_text(problems)});"
            " fix it (binaries/check_results.py names what is wrong) before replacing columns"
        )
    columns = list(dict.fromkeys(r["algorithm"] for r in rows))
    unknown = [c for c in replaced if c not in columns]
    if unknown:
        raise ValueError(
            f"--replace_columns={','.join(replaced)}: the table has no column "
            f"{', '.join(unknown)}; its columns are {', '.join(columns)}"
        )
    return columns


def command_value(command: Sequence[str], name: str) -> Any:
    """A flag's value in a table's command (the last one given), else compare.py's default."""
    given = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
    return given[-1] if given else FLAGS[name].default


def layout_of(command: Sequence[str]) -> dict[str, Any]:
    """How the table's writer lays its .md out, from its command: a row per setting (and the
    client mean) or a row per algorithm, and the accuracy of its rounds-to-target column."""
    table = command_value(command, "table")
    return dict(
        by_setting=table in SETTING_TABLES,
        client_mean=SETTING_TABLES.get(table, False),
        target_accuracy=float(command_value(command, "target_accuracy")),
    )


def source_commit() -> str:
    """The repository's commit (`git rev-parse --short HEAD`), with a note when the package
    has uncommitted changes; `unknown` outside a git checkout."""

    def git(*arguments: str) -> Optional[str]:
        done = subprocess.run(
            ["git", "-C", REPOSITORY, *arguments], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--", "tff_clustered", "binaries", "configs")
    return commit + (" with uncommitted changes to the code" if changed else "")


def rerun_line(
    replaced: Sequence[str], committed: str, rerun: str, command: Sequence[str], date: str
) -> str:
    """The .md header's line saying which columns were rerun, when, at which commit, with
    which command, from which date the other rows are, and on which CPU when it is not the
    table's."""
    found = re.search(r"^- date: (.*)$", committed, re.MULTILINE)
    names = ", ".join(replaced)
    plural = len(replaced) > 1
    then, now = machine_fields(committed).get("cpu"), machine_fields(rerun).get("cpu")
    cpu = f", on cpu: {now}" if now and now != then else ""
    return (
        f"- {names}: {'their' if plural else 'its'} rows rerun on {date} at commit "
        f"{source_commit()}{cpu}, with the command above and `--algorithms={','.join(replaced)}`"
        f" (`{shlex.join(['python', 'binaries/compare.py', *command])}`); the other "
        f"columns' rows are from {found.group(1) if found else 'the date above'}; "
        f"comparison.png still draws the earlier curve{'s' if plural else ''} of {names}"
    )


def kept_header_line(line: str, replaced: Sequence[str]) -> bool:
    """Whether a header line stays: an earlier rerun line of columns all rerun again goes."""
    found = re.match(r"^- ([\w:, ]+): (?:its|their) rows rerun on ", line)
    return not (found and set(found.group(1).split(", ")) <= set(replaced))


def run() -> int:
    """The replacement (module docstring): 0 when the table is rewritten; the rerun's exit
    code, the committed files untouched, when it fails."""
    refuse_other_flags()
    replaced = list(FLAGS.replace_columns)
    name = FLAGS.committed_table
    folder = os.path.abspath(name)
    committed = read_table(folder, f"--committed_table={name}")
    columns = table_columns(committed, replaced)
    command = table_commands.table_command(committed.markdown)
    if command is None:
        raise ValueError(f"{name}'s comparison.md names no compare.py command to rerun with")
    if table_commands.data_paths(command):
        root = table_commands.named_data_root(FLAGS.data_root)
        command = table_commands.with_data_root(command, root)
    output_dir = os.path.abspath(
        FLAGS.output_dir
        or os.path.join("runs", f"replace-{os.path.basename(folder)}-{'-'.join(replaced)}")
    )
    arguments = [
        *command,
        f"--algorithms={','.join(replaced)}",
        f"--table_columns={','.join(columns)}",
        f"--output_dir={output_dir}",
    ]
    print(f"rerunning {', '.join(replaced)} of {name} into {output_dir}", flush=True)
    done = subprocess.run(
        [sys.executable, os.path.join("binaries", "compare.py"), *arguments],
        cwd=REPOSITORY,
        stdin=subprocess.DEVNULL,
        env=table_commands.rerun_environment(committed.markdown),
        check=False,
    )
    if done.returncode:
        print(f"the rerun failed; {name} is unchanged", file=sys.stderr)
        return done.returncode
    rerun = read_table(output_dir, "the rerun")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kept = [x for x in committed.markdown.splitlines() if kept_header_line(x, replaced)]
    own = [f"--replace_columns={','.join(replaced)}", f"--committed_table={name}"]
    line = rerun_line(replaced, committed.markdown, rerun.markdown, own, date)
    table = column_replacement.replaced_table(
        column_replacement.TableFiles(
            committed.csv_text, "\n".join(kept) + "\n", committed.tuning_csv
        ),
        rerun,
        replaced,
        line,
        layout_of(command),
    )
    write_table(folder, table)
    print(f"{name}: the rows of {', '.join(replaced)} replaced ({line[2:]})", flush=True)
    return 0


def write_table(folder: str, table: column_replacement.TableFiles) -> None:
    """The spliced files, each atomically: comparison.csv (and tuning.csv) first, then
    comparison.md, which names the replacement."""
    files = ComparisonFolder(folder)
    atomic_write_bytes(files.comparison_csv, table.csv_text.encode())
    if table.tuning_csv is not None:
        atomic_write_bytes(os.path.join(folder, TUNING_CSV), table.tuning_csv.encode())
    atomic_write_bytes(files.comparison_md, table.markdown.encode())
