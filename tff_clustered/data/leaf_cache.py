"""LEAF splits kept as NumPy arrays in the user's cache folder, keyed by the files' digests.

Parsing LEAF's JSON is most of a LEAF run's start-up (FEMNIST's 86 MB: seconds), and the same
files are read by every run on them. After a split is read (`leaf.read_leaf_split_examples`),
its users' arrays are written once, atomically, to `cache_folder()`: `$TFF_CLUSTERED_CACHE`,
else `$XDG_CACHE_HOME/tff_clustered`, else `~/.cache/tff_clustered` (never into the data's
own folders, which may be read-only or listed by the user's scripts). A file's name digests
the split's file paths, then its content key: the cache's format, every file's bytes
(`fingerprint.file_digest`: a changed file is another key, so a stale cache is never read, and
is deleted when its successor is written) and the reader's `num_classes`. The next read of the
same files loads the arrays instead: the same arrays, bit for bit, as parsing gives (inputs
float32, labels as parsed). Only numeric features and Shakespeare's character ids are kept
(Sent140's token lists are not arrays). `TFF_CLUSTERED_CACHE=off` keeps nothing; a cache
folder that cannot be written keeps nothing either, and the files are parsed each time.

The folder is bounded: after a split is kept, the least recently read or written splits are
deleted until the kept ones take at most `$TFF_CLUSTERED_CACHE_MB` megabytes (default
`DEFAULT_LIMIT_MB`; the split just kept is never deleted, even when it alone is larger). A read
marks its file as used (its modification time), so the splits a user reads stay.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.data.federated_data import ClientArrays
from tff_clustered.data.fingerprint import file_digest

FORMAT = "leaf-arrays-1"  # changed whenever what is kept, or how, changes
OFF = "off"
LIMIT_VARIABLE = "TFF_CLUSTERED_CACHE_MB"
DEFAULT_LIMIT_MB = 2048  # ours: some 40 FEMNIST-sized splits of the full LEAF FEMNIST


def limit_bytes() -> int:
    """The cache folder's bound in bytes, from `$TFF_CLUSTERED_CACHE_MB` (megabytes, a
    non-negative integer; 0 keeps only the split just read); ValueError naming the variable
    when it is not one."""
    given = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not given:
        return DEFAULT_LIMIT_MB * 2**20
    if not given.isdigit():
        raise ValueError(
            f"{LIMIT_VARIABLE}={given!r} is not a number of megabytes: set it to a non-negative "
            f"integer (default {DEFAULT_LIMIT_MB}), or TFF_CLUSTERED_CACHE=off to keep nothing"
        )
    return int(given) * 2**20


def cache_folder() -> Optional[str]:
    """Where the arrays are kept (see the module docstring); None: `TFF_CLUSTERED_CACHE=off`."""
    chosen = os.environ.get("TFF_CLUSTERED_CACHE")
    if chosen == OFF:
        return None
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tff_clustered")


def cache_path(files: Sequence[str], num_classes: Optional[int]) -> Optional[str]:
    """Where the arrays of the split read from `files` are kept: `leaf-PATHS-CONTENT.npz`, or
    None when no cache is kept."""
    folder = cache_folder()
    if folder is None:
        return None
    limit_bytes()  # a bound that is not a number is refused before any file is read
    paths = hashlib.sha256("\0".join(os.path.abspath(file) for file in files).encode())
    content = hashlib.sha256(FORMAT.encode())
    for file in files:
        content.update(f"\0{file_digest(file)}".encode())
    content.update(f"\0{num_classes}".encode())
    return os.path.join(folder, f"leaf-{paths.hexdigest()[:16]}-{content.hexdigest()[:16]}.npz")


def read_cached(path: str) -> Optional[tuple[dict[str, ClientArrays], str, str]]:
    """The split kept at `path` (its users' arrays, its kind's value, its source file), or
    None when there is none (or it cannot be read: it is then parsed again)."""
    try:
        with np.load(path, allow_pickle=False) as kept:
            meta = json.loads(bytes(kept["meta"]).decode())
            x, y, ends = kept["x"], kept["y"], kept["ends"]
    except (OSError, ValueError, KeyError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used now: the last to be deleted when the folder is over its bound
    starts = np.concatenate([[0], ends[:-1]])
    users = {
        user: (x[start:end], y[start:end])
        for user, start, end in zip(meta["users"], starts.tolist(), ends.tolist())
    }
    return users, meta["kind"], meta["source"]


def write_cached(path: str, users: dict[str, ClientArrays], kind: str, source: str) -> None:
    """Keeps the split at `path` when its arrays stack (one input shape and dtype); a folder
    that cannot be written keeps nothing."""
    arrays = list(users.values())
    if not arrays or len({(x.shape[1:], x.dtype, y.dtype) for x, y in arrays}) != 1:
        return
    meta = {"users": list(users), "kind": kind, "source": source}
    payload = io.BytesIO()
    np.savez(
        payload,
        meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
        x=np.concatenate([x for x, _ in arrays]),
        y=np.concatenate([y for _, y in arrays]),
        ends=np.cumsum([len(y) for _, y in arrays], dtype=np.int64),
    )
    try:
        atomic_write_bytes(path, payload.getvalue())
    except OSError:
        return  # a cache folder that cannot be written: parsed each time
    folder, name = os.path.split(path)
    same_files = name[: len("leaf-") + 17]  # the same paths' earlier contents: stale
    for other in os.listdir(folder):
        if other.startswith(same_files) and other != name:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, other))
    keep_within_limit(folder, name)


def keep_within_limit(folder: str, kept: str) -> None:
    """Deletes the least recently used splits of `folder` (by modification time) until the
    splits take at most `limit_bytes()`; `kept`, just written, stays."""
    limit = limit_bytes()
    total, others = 0, []
    for name in os.listdir(folder):
        if name.startswith("leaf-") and name.endswith(".npz"):
            with contextlib.suppress(OSError):
                stat = os.stat(os.path.join(folder, name))
                total += stat.st_size
                if name != kept:
                    others.append((stat.st_mtime_ns, stat.st_size, name))
    for _, size, name in sorted(others):  # the least recently used first
        if total <= limit:
            return
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, name))
            total -= size
