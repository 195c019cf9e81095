"""Files written atomically: a reader sees the old file or the new one, never a torn one.

Each file is written to a temporary file of its writer's own in the same folder (`temp_file`),
then published at its path in one step (`publish`: renamed over the old one with `os.replace`,
or linked where no file is yet, both atomic on POSIX). A process killed between creating the
temporary file and publishing it leaves it behind; the next writer in the folder deletes it
(`remove_orphan_temp_files`), and leaves the temporary files of writers still running alone,
so that folders several processes write at once (a population's, `data/population.py`) are
cleaned too.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

# The temporary files' names: `TEMP_PREFIX`, the writer's process id, `-` and 8 characters of
# [a-z0-9_] (`tempfile.mkstemp`'s). Versions before the process id named them without it.
TEMP_PREFIX = ".tmp-"
ORPHAN_TEMP_FILE = re.compile(re.escape(TEMP_PREFIX) + r"(?:(\d+)-)?[a-z0-9_]{8}")


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import (before any thread starts): reading the umask means setting it, so
# reading it per write could race with another thread creating a file.
_UMASK = _read_umask()


def user_file_mode() -> int:
    """The mode `open()` would give a new file: 0666 less the process's umask."""
    return 0o666 & ~_UMASK


@contextlib.contextmanager
def temp_file(path: str) -> Iterator[str]:
    """A new empty temporary file beside `path` (its folder made if needed), this writer's
    alone: its name holds this process's id (`remove_orphan_temp_files` spares a running
    writer's) and a random part (threads of one process). It has the mode the published file
    should have (the user's umask; `mkstemp` gives 0600), and is deleted when the block ends,
    unless `publish` has moved it to `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=directory)
    try:
        os.fchmod(fd, user_file_mode())
        os.close(fd)
        yield temp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def publish(temp: str, path: str, replace: bool = True) -> bool:
    """Puts the written temporary file `temp` at `path` in one step, and makes that lasting
    (the folder synced). `replace`: over any file at `path` (`os.replace`); else only where
    there is none (`os.link`, refused when `path` exists: another writer's, published first,
    is kept). Returns whether `temp` is now at `path`."""
    if replace:
        os.replace(temp, path)
    else:
        try:
            os.link(temp, path)  # atomic, and refused when `path` exists
        except FileExistsError:
            return False
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def atomic_write(path: str, write: Callable[[BinaryIO], Any]) -> None:
    """Writes `path` by `write(file)` so that readers see the old or the new file, never a mix
    (a large file, such as a checkpoint of a million clients, written straight to the disk
    with no copy of it in memory). The file takes the user's umask like any file they write."""
    with temp_file(path) as temp:
        with open(temp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        publish(temp, path)


def atomic_write_bytes(path: str, payload: bytes) -> None:
    """Writes `payload` to `path` atomically (`atomic_write`)."""
    atomic_write(path, lambda f: f.write(payload))


def remove_orphan_temp_files(folder: str) -> list[str]:
    """Deletes the temporary files killed writers left in `folder` (names matching
    `ORPHAN_TEMP_FILE` exactly, regular files only, whose writer is not running on this
    machine; one named without a process id, by an older version, counts as left) and returns
    their names. A running writer's is left alone, so any writer may call it on a folder others
    write in too."""
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        found = ORPHAN_TEMP_FILE.fullmatch(name)
        if found is None or not os.path.isfile(path) or os.path.islink(path):
            continue
        if found[1] is not None and process_is_running(int(found[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(name)
    return removed


def process_is_running(pid: int) -> bool:
    """Whether process `pid` exists on this machine (a signal 0 reaches it or is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
