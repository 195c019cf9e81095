"""What a run's data is, cheaply: a checkpoint resumes only on the data it was made on.

Two kinds of data, one rule (a digest that changes when an example changes):

* data read from files (LEAF JSON, MNIST IDX, CIFAR pickles, TFF's SQLite databases, ...):
  `SourceFingerprint.of_files`, each file's path relative to the data folder and a digest of
  its bytes (`file_digest`). Hashing streams the bytes once and decodes nothing, so it costs
  less than the loading it guards (docs/reproducibility.md measures it). A file above
  `FULL_HASH_LIMIT` is not hashed whole (`file_digest`); a lazy dataset whose population is
  one large file (10^6 clients in a SQLite file) gets the same bounded cost.
  A file read lazily (`--dataset=tff_sql`, `tff_stackoverflow` without `--num_clients`) gets
  `sampled_digest`: its size and sampled pages.
* a SQLite database (https://www.sqlite.org/fileformat2.html) changes in ways a sample of its
  pages may miss, so its digests add what SQLite changes on every committed write. In the
  rollback-journal modes (DELETE, TRUNCATE, PERSIST, MEMORY, OFF) that is the header's file
  change counter (offset 24), which every digest reads. WAL mode does not increment it: a
  write is appended to the `-wal` file beside the database and copied into the database by a
  checkpoint. So a database in WAL mode (header bytes 18-19 = 2) adds its `-wal` file's digest
  (writes not yet checkpointed; an absent or empty `-wal` file holds none) and, when sampled,
  its modification time (a checkpoint rewrites the changed pages in place, nothing else).
  Readers (this project opens databases read-only) change neither. A copy of a WAL-mode
  database that does not keep its modification time (`cp -p` and `rsync -a` keep it) is
  taken for changed data: a resume on it is refused.
* data held in memory (the Python API's arrays): `arrays_digest`, every client's examples;
  the API's lazily read `ClientData` their source's fingerprint (`ClientSource.fingerprint`).

Data generated from the settings (digits, Synthetic(1,1)) has no files: its generator's
parameters and seed are in the run's settings, which a checkpoint already pins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

import numpy as np

# Files up to this size are hashed whole.
FULL_HASH_LIMIT = 1 << 30
# Larger files: their size and modification time, and SHA-256 of this many blocks of
# `SAMPLE_BLOCK` bytes at evenly spaced offsets (the first and the last block included).
SAMPLED_BLOCKS = 256
SAMPLE_BLOCK = 1 << 20
READ_CHUNK = 1 << 20
ABSENT = "absent"
# A lazily read file (a population in TFF's SQLite format): its size, its first and last
# `EDGE_BYTES` and `PAGE_SAMPLES` blocks of `PAGE_SAMPLE` bytes at evenly spaced offsets. SQLite
# rewrites whole pages: a changed row changes its page, a changed client count the header.
EDGE_BYTES = 1 << 20
PAGE_SAMPLES = 64
PAGE_SAMPLE = 1 << 16
# A SQLite database's first bytes (its header string), where its header keeps the file format
# versions (bytes 18 and 19: 1 rollback journal, 2 WAL), and the file of its writes not yet
# checkpointed in WAL mode (https://www.sqlite.org/fileformat2.html, https://www.sqlite.org/wal.html).
SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_FORMAT_VERSIONS = slice(18, 20)
HEAD_BYTES = SQLITE_FORMAT_VERSIONS.stop
WAL_MODE = b"\x02\x02"
WAL_SUFFIX = "-wal"


# Whole-file digests this process already computed, by what `os.stat` says of the file (a
# write changes its ctime): the run's data fingerprint and the LEAF cache's key hash the same
# files once.
_HASHED: dict[tuple, str] = {}


def file_digest(path: str) -> str:
    """`size:sha256` of the file's bytes (first 16 hex digits), or for a file above
    `FULL_HASH_LIMIT` `size:mtime_ns:sampled-sha256` of `SAMPLED_BLOCKS` evenly spaced blocks;
    a SQLite database in WAL mode adds its `-wal` file's (`wal_witness`); `ABSENT` when there
    is no such file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return ABSENT
    digest = hashlib.sha256()
    seen = (os.path.abspath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
        if stat.st_size <= FULL_HASH_LIMIT and (seen, stat.st_ctime_ns) in _HASHED:
            text = _HASHED[seen, stat.st_ctime_ns]
        elif stat.st_size <= FULL_HASH_LIMIT:
            digest.update(head)
            for chunk in iter(lambda: f.read(READ_CHUNK), b""):
                digest.update(chunk)
            text = _HASHED[seen, stat.st_ctime_ns] = f"{stat.st_size}:{digest.hexdigest()[:16]}"
        else:
            last = stat.st_size - SAMPLE_BLOCK
            for i in range(SAMPLED_BLOCKS):
                f.seek(last * i // (SAMPLED_BLOCKS - 1))
                digest.update(f.read(SAMPLE_BLOCK))
            text = f"{stat.st_size}:{stat.st_mtime_ns}:sampled-{digest.hexdigest()[:16]}"
    return text + wal_witness(path, head, stat, with_time=False)


def sampled_digest(path: str) -> str:
    """`size:sampled-sha256` (16 hex digits) of the file's first and last `EDGE_BYTES` and
    `PAGE_SAMPLES` evenly spaced blocks: a bounded read whatever the population (a lazily read
    file is never read whole); a SQLite database in WAL mode adds its modification time and
    its `-wal` file's digest (`wal_witness`); `ABSENT` when there is no such file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return ABSENT
    size = stat.st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(EDGE_BYTES)
        digest.update(head)
        for i in range(PAGE_SAMPLES):
            f.seek(max(size - PAGE_SAMPLE, 0) * i // (PAGE_SAMPLES - 1))
            digest.update(f.read(PAGE_SAMPLE))
        f.seek(max(size - EDGE_BYTES, 0))
        digest.update(f.read(EDGE_BYTES))
    sampled = f"{size}:sampled-{digest.hexdigest()[:16]}"
    return sampled + wal_witness(path, head, stat, with_time=True)


def in_wal_mode(head: bytes) -> bool:
    """Whether a file starting with `head` is a SQLite database in WAL mode."""
    return head.startswith(SQLITE_MAGIC) and head[SQLITE_FORMAT_VERSIONS] == WAL_MODE


def wal_witness(path: str, head: bytes, stat: os.stat_result, with_time: bool) -> str:
    """What a digest of `path` (a file starting with `head`, of `stat`) adds for a SQLite
    database in WAL mode (see the module docstring): its `-wal` file's `file_digest` (a
    `-wal` file is small: SQLite copies it into the database every 1,000 pages by default)
    when that holds writes (neither absent nor empty: readers leave an empty one) and,
    `with_time` (a digest that does not read every page), its modification time; "" for any
    other file."""
    if not in_wal_mode(head):
        return ""
    witness = f":mtime-{stat.st_mtime_ns}" if with_time else ""
    wal = path + WAL_SUFFIX
    with contextlib.suppress(FileNotFoundError):
        if os.path.getsize(wal) > 0:
            witness += f":wal-{file_digest(wal)}"
    return witness


def folder_files(folder: str) -> list[str]:
    """Every regular file under `folder`, recursively, in a fixed order."""
    found = []
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(parent, name) for name in sorted(files)]
    return found


@dataclasses.dataclass(frozen=True)
class SourceFingerprint:
    """The files a dataset is read from: `root` (the data folder, as the flags named it) and
    each file's path relative to it -> `file_digest`. No files: data generated from the
    settings."""

    root: str = ""
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_files(
        cls, root: str, paths: Iterable[str], digest: Callable[[str], str] = file_digest
    ) -> SourceFingerprint:
        """Each file of `paths` by `digest` (`sampled_digest` for a lazily read file)."""
        return cls(root, {os.path.relpath(p, root or "."): digest(p) for p in paths})

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "files": dict(sorted(self.files.items()))}

    @classmethod
    def from_json(cls, value: Any) -> Optional[SourceFingerprint]:
        """The fingerprint `to_json` wrote, or None for anything else."""
        if not isinstance(value, dict) or not isinstance(value.get("root"), str):
            return None
        files = value.get("files")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            return None
        return cls(value["root"], files)

    def change_since(self, saved: SourceFingerprint) -> Optional[str]:
        """The first file (by path) that differs from `saved`, as a phrase ("train/a.json
        differs", "... is new", "... is gone"), or None when every file is the same."""
        for name in sorted(set(saved.files) | set(self.files)):
            before, now = saved.files.get(name, ABSENT), self.files.get(name, ABSENT)
            if before == now:
                continue
            if before == ABSENT:
                return f"{name} is new"
            if now == ABSENT:
                return f"{name} is gone"
            return f"{name} differs"
        return None


def arrays_digest(*splits: Mapping[str, Mapping[str, np.ndarray]]) -> str:
    """A digest of every client's arrays of each split (client ids, then each array's bytes by
    key): in-memory data has no file to hash."""
    digest = hashlib.sha256()
    for split in splits:
        for client in sorted(split):
            digest.update(client.encode())
            arrays = split[client]  # once: a split may make a client's arrays when asked
            for key in sorted(arrays):
                digest.update(np.ascontiguousarray(arrays[key]).tobytes())
    return digest.hexdigest()[:16]
