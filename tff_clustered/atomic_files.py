"""Files written atomically: a reader sees the old file or the new one, never a torn one.

Each file is written to a temporary file in the same folder, flushed to disk, then renamed over
the old one (`os.replace` is atomic on POSIX). A process killed between creating the temporary
file and renaming it leaves it behind; the next run to hold the folder deletes it
(`remove_orphan_temp_files`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile

# `atomic_write_bytes`' temporary files: `tempfile.mkstemp(prefix=TEMP_PREFIX)` names them with
# 8 characters of [a-z0-9_]. A process killed between creating one and renaming it leaves it.
TEMP_PREFIX = ".tmp-"
ORPHAN_TEMP_FILE = re.compile(re.escape(TEMP_PREFIX) + r"[a-z0-9_]{8}")


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


def atomic_write_bytes(path: str, payload: bytes) -> None:
    """Writes `payload` to `path` so that readers see the old or the new file, never a mix. The
    file takes the user's umask like any file they write (a temporary file would be 0600)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        os.fchmod(fd, user_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_orphan_temp_files(folder: str) -> list[str]:
    """Deletes the temporary files killed runs left in `folder` (names matching
    `ORPHAN_TEMP_FILE` exactly, regular files only) and returns their names. Call it only while
    holding the folder (`checkpoint.hold_run_folder`): no other run can then be writing one."""
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if ORPHAN_TEMP_FILE.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(name)
    return removed
