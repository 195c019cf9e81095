"""Opening SQLite files as this project reads them, and naming a locked one.

Every reader opens a database read-only (`read_only_uri`, also given to TF's `SqlDataset` on a
TFF worker), so that reading a database in WAL mode never checkpoints it nor deletes its
`-wal` file, as the last read-write connection to close does (while another process opens it,
that gives "database is locked"; https://www.sqlite.org/wal.html). A file another process
holds locked (a writer, or `BEGIN EXCLUSIVE`) is `DatabaseLocked`, one line naming the file and
the fix.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator

from tff_clustered.data.federated_data import DataError

# SQLite's messages for a database another connection holds (SQLITE_BUSY, SQLITE_LOCKED).
LOCKED_MESSAGES = ("database is locked", "database table is locked")


class DatabaseLocked(DataError):
    """A SQLite file another process holds locked: `locked_database`'s one line."""


def locked_database(path: str) -> DatabaseLocked:
    return DatabaseLocked(
        f"{path} is locked by another process (database is locked: a program is writing it or "
        "holds it with BEGIN EXCLUSIVE); let that program commit or close the file, then run "
        "again (--resume continues a run it stopped)"
    )


def is_locked(message: str) -> bool:
    """Whether SQLite's error `message` says another connection holds the database."""
    return any(m in message for m in LOCKED_MESSAGES)


@contextlib.contextmanager
def locks_named(path: str) -> Iterator[None]:
    """SQLite's "database is locked" on `path` as `locked_database`; other errors as they came."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if is_locked(str(error)):
            raise locked_database(path) from None
        raise


def read_only_uri(path: str) -> str:
    """`path` as a SQLite URI opened read-only (https://www.sqlite.org/uri.html, "mode=ro";
    the path quoted: a `?` or `#` in it is a file name's)."""
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"


# How long a read waits for another process's lock on the file before `locked_database`
# (Python's sqlite3 default).
BUSY_TIMEOUT_SECONDS = 5.0


def connect(path: str) -> sqlite3.Connection:
    """The database opened read-only (`read_only_uri`)."""
    return sqlite3.connect(read_only_uri(path), timeout=BUSY_TIMEOUT_SECONDS, uri=True)
