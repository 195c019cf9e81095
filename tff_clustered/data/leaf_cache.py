"""LEAF splits kept as NumPy arrays in the user's cache folder, keyed by the files' digests.

Parsing LEAF's JSON is most of a LEAF run's start-up (FEMNIST's 86 MB: seconds), and the same
files are read by every run on them. After a split is read (`leaf.read_leaf_split_examples`),
its users' arrays are written once, atomically, to `cache_folder()`: `$TFF_CLUSTERED_CACHE`,
else `$XDG_CACHE_HOME/tff_clustered`, else `~/.cache/tff_clustered` (never into the data's own
folders, which may be read-only or listed by the user's scripts). A file's name digests the
split's file paths, then its content key: the cache's format, every file's bytes
(`fingerprint.file_digest`: a changed file is another key, so a stale cache is never read, and
is deleted when its successor is written) and the reader's `num_classes`. The next read of the
same files loads the arrays instead: the same arrays, bit for bit, as parsing gives (inputs
float32, labels as parsed). A kept file that cannot be read, whose arrays are not the ones
written or that fails parsing's checks is parsed again and rewritten (`read_cached`). Only
numeric features and Shakespeare's character ids are kept (Sent140's token lists are not
arrays). `TFF_CLUSTERED_CACHE=off` keeps nothing; a cache folder that cannot be written keeps
nothing either, and the files are parsed each time.

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
import stat
import zipfile
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.data.federated_data import ClientArrays
from tff_clustered.data.fingerprint import file_digest
from tff_clustered.data.leaf_examples import (
    LEAF_CHARACTERS,
    ExampleKind,
    class_indices,
    finite_inputs,
)

FORMAT = "leaf-arrays-3"  # changed whenever what is kept, or how, changes
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
    if not (given.isascii() and given.isdigit()):  # "²".isdigit(), but int() refuses it
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


def read_cached(
    path: str, num_classes: Optional[int]
) -> Optional[tuple[dict[str, ClientArrays], str, str]]:
    """The split kept at `path` (its users' arrays, its kind's value, its source file), or
    None when there is none, or it cannot be read or fails the checks (`checked_split`): the
    split is then parsed again, and the file rewritten. A changed byte is caught by the zip
    format's CRC-32 of each array, which NumPy's read checks, a cut file by the zip format, and
    arrays saved over the ones written (the CRC-32s the file's meta recorded are not theirs)
    by `crc32s`, at no cost: the zip's directory holds them, and a file kept for other LEAF
    files (another split's, copied over) by the name its meta recorded."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a named pipe there would never end
            return None
        with np.load(path, allow_pickle=False) as kept:
            meta = json.loads(bytes(kept["meta"]).decode())
            if meta["crc32"] != crc32s(kept.zip):
                raise ValueError("arrays other than the ones written with its users")
            if meta["name"] != os.path.basename(path):
                raise ValueError("kept for other files")
            split = checked_split(meta, kept["x"], kept["y"], kept["ends"], num_classes)
    except Exception:  # only a copy: whatever fails to read or to check is parsed again
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used now: the last to be deleted when the folder is over its bound
    return split


# A kept split's arrays by its kind (`ExampleKind`'s value), as parsing makes them: the inputs'
# and the labels' dtypes, and the classes both hold (None: labels below the reader's
# `num_classes`, inputs any finite numbers).
KEPT_KINDS = {
    ExampleKind.FEATURES.value: (np.float32, np.float64, None),
    ExampleKind.CHARACTERS.value: (np.float32, np.int64, len(LEAF_CHARACTERS) + 1),
}


def crc32s(kept: zipfile.ZipFile) -> dict[str, int]:
    """The zip format's CRC-32 of each array a kept split holds but its meta."""
    return {info.filename: info.CRC for info in kept.infolist() if info.filename != "meta.npy"}


def checked_split(
    meta: dict, x: np.ndarray, y: np.ndarray, ends: np.ndarray, num_classes: Optional[int]
) -> tuple[dict[str, ClientArrays], str, str]:
    """A kept split's users' arrays, its kind and source, checked as parsing checks the
    examples (`leaf_examples.finite_inputs`, `class_indices`) and as `write_cached` stacks them;
    ValueError naming what is wrong."""
    users, kind, source = meta["users"], meta["kind"], meta["source"]
    if not isinstance(users, list) or not all(isinstance(user, str) for user in users):
        raise ValueError("its users are not a list of names")
    if len(set(users)) != len(users) or kind not in KEPT_KINDS or not isinstance(source, str):
        raise ValueError("a user kept twice, or a kind of example the cache does not keep")
    inputs, labels, classes = KEPT_KINDS[kind]
    if (x.dtype, y.dtype, x.ndim, y.ndim, ends.dtype, ends.shape) != (
        inputs,
        labels,
        2,
        1,
        np.int64,
        (len(users),),
    ):
        raise ValueError("arrays of other types or shapes than parsing makes")
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    if np.any(ends < starts) or len(x) != len(y) or (len(ends) and ends[-1] != len(x)):
        raise ValueError("users' ends that do not split its examples")
    if not finite_inputs(x):
        raise ValueError("NaN or infinite inputs")
    class_indices(y, classes or num_classes)
    if classes:
        class_indices(x.ravel(), classes)  # character ids
    clients = {
        user: (x[start:end], y[start:end])
        for user, start, end in zip(users, starts.tolist(), ends.tolist())
    }
    return clients, kind, source


def write_cached(path: str, users: dict[str, ClientArrays], kind: str, source: str) -> None:
    """Keeps the split at `path` when its arrays stack (one input shape and dtype); a folder
    that cannot be written keeps nothing."""
    arrays = list(users.values())
    if not arrays or len({(x.shape[1:], x.dtype, y.dtype) for x, y in arrays}) != 1:
        return
    payload = io.BytesIO()
    np.savez(
        payload,
        x=np.concatenate([x for x, _ in arrays]),
        y=np.concatenate([y for _, y in arrays]),
        ends=np.cumsum([len(y) for _, y in arrays], dtype=np.int64),
    )
    with zipfile.ZipFile(payload, "a") as kept:
        meta = {
            "users": list(users),
            "kind": kind,
            "source": source,
            "crc32": crc32s(kept),
            "name": os.path.basename(path),  # its key: the LEAF files' paths and contents
        }
        with kept.open("meta.npy", "w") as f:
            np.lib.format.write_array(f, np.frombuffer(json.dumps(meta).encode(), np.uint8))
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
