"""A committed table's command, narrowed to one cell, with its data paths resolved.

The compare.py command is read from the table's .md file (flagfiles expanded), narrowed to one
cell (`rerun_arguments`), and its data paths (`DATA/...`) resolved on this machine."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import NamedTuple, Optional

from absl import flags

from tff_clustered.cli import exits
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.comparison.committed_tables import read_table_file
from tff_clustered.comparison.numerics import machine_fields, recorded_variables

COMMAND = re.compile(r"^- command: `python binaries/compare\.py (.*)`\s*$", re.MULTILINE)
# A recorded data path's stand-in for the folder of datasets (`--data_dir=DATA/mnist`), and
# the compare.py flags that carry a data path.
DATA = "DATA"
DATA_FLAGS = ("data_dir", "tfds_dir", "glove_path")
DATA_ROOT_VARIABLE = "TFF_CLUSTERED_DATA"
SHARED_DATA = os.path.join(os.path.dirname(REPOSITORY), "shared", "data")
flags.DEFINE_string(
    "data_root",
    None,
    "The folder DATA stands for in the tables' data paths (--data_dir=DATA/mnist), read by "
    "check_results.py --with_data and compare.py --replace_columns; default "
    "$TFF_CLUSTERED_DATA, else ../shared/data next to the repository.",
)


def table_command(markdown: str) -> Optional[list[str]]:
    """The compare.py arguments written in a table's .md file, its flagfiles expanded
    (`expand_flagfiles`), without its --output_dir."""
    found = COMMAND.search(markdown)
    if not found:
        return None
    command = expand_flagfiles(shlex.split(found.group(1)))
    return [a for a in command if not a.startswith("--output_dir=")]


class Cell(NamedTuple):
    """One (setting, algorithm) of a table and the seeds rerun of it."""

    setting: str
    algorithm: str
    seeds: tuple[int, ...]

    def __str__(self) -> str:
        seeds = ", ".join(map(str, self.seeds))
        return (
            f"{self.setting} / {self.algorithm} / seed{'s' if len(self.seeds) > 1 else ''} {seeds}"
        )


def sampled_cell(rows: Sequence[dict[str, str]], all_seeds: bool) -> Cell:
    """The cell the check reruns: the first row's setting and algorithm, with the lowest seed
    committed for it, or every one (`all_seeds`). `rows`: a table that passed
    `committed_problems`."""
    first = rows[0]
    seeds = sorted(
        int(r["seed"])
        for r in rows
        if (r["setting"], r["algorithm"]) == (first["setting"], first["algorithm"])
    )
    return Cell(first["setting"], first["algorithm"], tuple(seeds if all_seeds else seeds[:1]))


def expand_flagfiles(command: list[str]) -> list[str]:
    """`command` with each flagfile replaced, in place, by the flags it holds (paths relative
    to the repository, where compare.py runs): absl's own expansion
    (`FlagValues.read_flags_from_files`), so that narrowing and the data paths see every
    option. A missing flagfile is a usage error naming it."""
    here = os.getcwd()
    os.chdir(REPOSITORY)
    try:
        return flags.FlagValues().read_flags_from_files(command, force_gnu=True)
    except flags.CantOpenFlagFileError as error:
        raise exits.usage_error(
            f"a table's command reads a flagfile that cannot be opened ({error}); restore the "
            "file or withdraw the table"
        ) from None
    finally:
        os.chdir(here)


def rerun_arguments(command: list[str], cell: Cell) -> list[str]:
    """`command` (flagfiles expanded: `table_command`) narrowed to `cell`: its
    algorithm (without the other algorithms' options, which its run never reads and
    compare.py refuses for it), its setting when the table has setting rows (the setting is
    then a partition, not the dataset's name), its seeds (with the seeds its trials ran with,
    `tuning_seeds_of`: a `--tune_seeds=N` table's trials need its N lowest seeds)."""
    from tff_clustered import options as options_lib
    from tff_clustered.algorithms import ALGORITHMS, algorithm_class

    every_option = set().union(*(options_lib.names(c.Options) for c in ALGORITHMS.values()))
    own = options_lib.names(algorithm_class(cell.algorithm.split(":")[0]).Options)

    def kept(argument: str) -> bool:
        name = argument[2:].split("=", 1)[0]
        return not argument.startswith("--") or name not in every_option or name in own

    narrowed = [a for a in command if kept(a)]
    seeds = sorted({*cell.seeds, *tuning_seeds_of(command)})
    narrowed += [f"--algorithms={cell.algorithm}", f"--seeds={','.join(map(str, seeds))}"]
    if any(a.startswith("--settings=") for a in command) or ":" in cell.setting:
        narrowed.append(f"--settings={cell.setting}")
    return narrowed


def given_value(command: Sequence[str], name: str) -> Optional[str]:
    """The value `command` gives `--name` (the last one given), None when not given."""
    given = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
    return given[-1] if given else None


def tuning_seeds_of(command: Sequence[str]) -> list[int]:
    """The seeds the trials of a `--tune_seeds=N` table ran with, its N lowest `--seeds`, which
    a rerun of its cell keeps (the cell's rows alone are compared); none without it, or when
    the values are not numbers (compare.py then refuses them itself)."""
    count, seeds = given_value(command, "tune_seeds"), given_value(command, "seeds")
    if count is None or seeds is None:
        return []
    try:
        return sorted(int(s) for s in seeds.split(","))[: int(count)]
    except ValueError:
        return []


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
    return os.path.join(REPOSITORY, recorded)


def with_data_root(command: list[str], data_root: str) -> list[str]:
    """`command` with each data flag's path resolved (`resolve_data_path`)."""

    def resolved(argument: str) -> str:
        found = data_flag(argument)
        return f"--{found[0]}={resolve_data_path(found[1], data_root)}" if found else argument

    return [resolved(a) for a in command]


def missing_data(tables: list[str], data_root: str) -> list[tuple[str, str, str]]:
    """(path here, path as recorded, table) for each data path a table's command names that
    is not on this machine; a path that is not portable, and a table that cannot be read, are
    left to `check_table`."""
    missing = []
    for path in tables:
        try:
            command = table_command(read_table_file(path)) or []
        except ValueError:
            continue
        for recorded in data_paths(command):
            try:
                here = resolve_data_path(recorded, data_root)
            except ValueError:
                continue
            if here is not None and not os.path.exists(here):
                missing.append((here, recorded, path))
    return missing


def named_data_root(data_root: Optional[str]) -> str:
    """The folder DATA stands for: `data_root` (--data_root), else $TFF_CLUSTERED_DATA, else
    ../shared/data next to the repository when it exists. A usage error when there is none
    or the one named is not a folder."""
    named = data_root or os.environ.get(DATA_ROOT_VARIABLE)
    if named:
        source = f"--data_root={named}" if data_root else f"${DATA_ROOT_VARIABLE}={named}"
        if not os.path.isdir(os.path.expanduser(named)):
            raise exits.usage_error(
                f"{source} is not a folder; pass --data_root=DIR, the folder holding the "
                f"dataset folders the tables name as {DATA}/<folder>"
            )
        return os.path.abspath(os.path.expanduser(named))
    if os.path.isdir(SHARED_DATA):
        return SHARED_DATA
    raise exits.usage_error(
        f"a table's command names its data as {DATA}/<folder> (--data_dir={DATA}/mnist): pass "
        f"--data_root=DIR, the folder holding them (or set ${DATA_ROOT_VARIABLE}); there is no "
        f"{SHARED_DATA}"
    )


def rerun_environment(committed: str) -> dict[str, str]:
    """This process's environment with TensorFlow's numerics variables (oneDNN on or off,
    thread counts) set or unset as the committed table's `- numerics:` line records them (as
    they are here when it records none): the rerun uses the kernels the table was written
    with, on this CPU."""
    environment = dict(os.environ)
    for name, value in recorded_variables(machine_fields(committed).get("numerics", "")).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment
