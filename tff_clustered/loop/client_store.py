"""Each client's own model, kept in memory or in a file and checkpointed with the run.

The store is per-client state as one typed store: each client's own model (trainable tensors,
then state such as BatchNorm statistics), owned by the orchestration.

What a client keeps depends on the algorithm: its personal tensors (FedPer), its whole latest
model (stateful clients: Local, FeSEM, FedTSDP), or a separate personal model (Ditto). The
store does not care: a round reads some variable indices of each client's model and writes
some back. A client that never trained holds the initial model.

Two stores hold the same models and give the same runs:

- `MemoryClientStore`: a dict client id -> model; a checkpoint holds the dict.
- `DiskClientStore`: one memory-mapped float32 file in the run folder (`client_store.bin`) with
  two slots (rows of the flat model) per client, so memory holds only the rows a round touches.
  A checkpoint holds only which slot has each client's model (`StoreIndex`, one byte per
  client), never the models: a model written after a checkpoint goes to the slot the
  checkpoint does not name, so a run killed at any point resumes from the rows its last
  checkpoint names, untouched since. The index also holds each named row's CRC-32, so a
  resume refuses a file that does not hold those rows (damaged, zero-filled, another run's).

`--client_store=auto` (`store_kind`) takes the disk store when the file would exceed
`MEMORY_BUDGET_BYTES`, i.e. when every client's model held in memory could not be afforded.
"""

from __future__ import annotations

import abc
import dataclasses
import errno
import mmap
import os
import shutil
import tempfile
import weakref
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Optional, Union

import numpy as np

from tff_clustered.run_folder import RunFolder

Variables = tuple[np.ndarray, ...]

CLIENT_STORES = ("auto", "memory", "disk")
SLOTS = 2  # per client: the row its last checkpoint names and the row written since
MEMORY_BUDGET_BYTES = 1 << 30  # auto: the disk store when the store's file would be larger
NO_MODEL = -1  # a slot index: the client holds the initial model


def checked_store_choice(choice: object) -> str:
    """`choice` if it is one of `CLIENT_STORES`, else a one-line ValueError (TypeError when it
    is not a string)."""
    if not isinstance(choice, str):
        raise TypeError(f"client_store must be one of {', '.join(CLIENT_STORES)}, got {choice!r}")
    if choice not in CLIENT_STORES:
        raise ValueError(f"client_store={choice!r}: choose one of {', '.join(CLIENT_STORES)}")
    return choice


def store_kind(choice: str, num_clients: int, num_values: int) -> str:
    """The store a run of `num_clients` models of `num_values` values takes for `choice`:
    "memory" or "disk" as chosen, or for "auto" disk when the disk store's file (float32 values
    in `SLOTS` slots per client) would exceed `MEMORY_BUDGET_BYTES`."""
    if checked_store_choice(choice) != "auto":
        return choice
    size = num_clients * num_values * np.dtype(np.float32).itemsize * SLOTS
    return "disk" if size > MEMORY_BUDGET_BYTES else "memory"


@dataclasses.dataclass
class StoreIndex:
    """What a checkpoint holds of a `DiskClientStore`: per client, in the run's client order,
    the slot of its file holding its model (`NO_MODEL`: the initial one), the model's size in
    values (checked against the file on resume) and the CRC-32 (`zlib.crc32`) of the row the
    slot names (0 for `NO_MODEL`), which a resume checks against the file. `checksums` is None
    in a checkpoint made before they were recorded: its rows are taken as they are."""

    slots: np.ndarray  # (num_clients,) int8
    num_values: int
    checksums: Optional[np.ndarray] = None  # (num_clients,) uint32


# A checkpoint's client models: the memory store's dict or the disk store's index.
ClientModels = Union[dict[str, Variables], StoreIndex]


def holds_trained_models(models: ClientModels) -> bool:
    """Whether a checkpoint's client models hold one a client trained (the memory store keeps
    only those; the disk store's index names a slot for each)."""
    if isinstance(models, StoreIndex):
        return bool(np.any(models.slots != NO_MODEL))
    return bool(models)


class ClientStore(abc.ABC):
    """Each client's own model, read and written by variable indices."""

    def __init__(self, initial: Variables) -> None:
        self.initial = tuple(initial)

    @abc.abstractmethod
    def model(self, client_id: str) -> Variables:
        """The client's whole own model (the initial one until it first trains)."""

    @abc.abstractmethod
    def put(self, client_id: str, model: Variables) -> None:
        """Stores `model` (float32 arrays) as the client's whole own model."""

    @abc.abstractmethod
    def trained(self) -> Iterator[tuple[str, Variables]]:
        """(client id, model) of every client that holds a model of its own."""

    @abc.abstractmethod
    def record(self) -> ClientModels:
        """What a checkpoint holds of the store now (the disk store's rows made durable first)."""

    def variables(self, client_id: str, indices: Sequence[int]) -> Variables:
        model = self.model(client_id)
        return tuple(model[i] for i in indices)

    def update(self, client_id: str, indices: Sequence[int], values: Sequence[np.ndarray]) -> None:
        if len(indices) != len(values):
            raise ValueError(f"{len(values)} values for {len(indices)} variable indices")
        if not indices:
            return
        model = list(self.model(client_id))
        for i, v in zip(indices, values):
            model[i] = np.asarray(v, np.float32)
        self.put(client_id, tuple(model))

    def flat(self, client_ids: Sequence[str], num_values: int) -> np.ndarray:
        """The clients' own models as rows of flat vectors (first `num_values` values)."""
        rows = [flat_model(self.model(c))[:num_values] for c in client_ids]
        return np.stack(rows) if rows else np.zeros((0, num_values), np.float32)


def flat_model(model: Variables) -> np.ndarray:
    """A model's variables as one float32 vector, in order."""
    return np.concatenate([np.asarray(v, np.float32).ravel() for v in model])


class MemoryClientStore(ClientStore):
    """The models in a dict; a checkpoint holds the dict itself."""

    def __init__(self, initial: Variables, models: Optional[dict[str, Variables]] = None) -> None:
        super().__init__(initial)
        self.models: dict[str, Variables] = dict(models or {})

    def model(self, client_id: str) -> Variables:
        return self.models.get(client_id, self.initial)

    def put(self, client_id: str, model: Variables) -> None:
        self.models[client_id] = model

    def trained(self) -> Iterator[tuple[str, Variables]]:
        return iter(self.models.items())

    def record(self) -> dict[str, Variables]:
        return self.models


class DiskClientStore(ClientStore):
    """The models as rows of the file `RunFolder(folder).client_store` (`folder`: a temporary
    folder, removed with the store, when None): row `s * n + i` is slot `s` of client
    `client_ids[i]` (of n), or of the client a given index `client_ids` maps to i. The file
    has its whole size from its first write, as a sparse file: never-trained clients' rows are
    holes, and it never grows. The disk blocks of a row are reserved (`reserve`) before it is
    written: a full disk is then an `OSError` naming the file and the fix, not a write into the
    mapping that the kernel cannot back (SIGBUS, which kills the process). Memory holds the
    rows touched since the last checkpoint: it writes them to disk and drops them from the
    process (they are read again when needed).
    `saved` (a checkpoint's `StoreIndex`): the slots it names are the clients' models, and the
    file must hold them."""

    def __init__(
        self,
        initial: Variables,
        client_ids: Union[Sequence[str], Mapping[str, int]],
        folder: Optional[str] = None,
        saved: Optional[StoreIndex] = None,
    ) -> None:
        super().__init__(initial)
        if folder is None:
            folder = tempfile.mkdtemp(prefix="tff-clustered-store-")
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self.path = RunFolder(folder).client_store
        # Each client's row: the run's own index of its clients when given (one per run, not
        # another dict of a million clients), else made from the ids in order.
        self.row_of = (
            client_ids
            if isinstance(client_ids, Mapping)
            else {c: i for i, c in enumerate(client_ids)}
        )
        self.shapes = [np.shape(v) for v in self.initial]
        self.cuts = np.cumsum([int(np.prod(s)) for s in self.shapes])[:-1]  # a row's variables
        self.num_values = sum(int(np.prod(s)) for s in self.shapes)
        self.initial_flat = flat_model(self.initial)
        self.saved = self.checked_slots(saved)  # the slots the last checkpoint names
        self.current = self.saved.copy()  # the slots of the clients' latest models
        # The CRC-32 of each client's row that `saved` names (0: none).
        self.checksums = np.zeros(len(self.row_of), np.uint32)
        self.mapping: Optional[mmap.mmap] = None
        self.rows: Optional[np.ndarray] = None  # (SLOTS * clients, values), on `mapping`
        self.fd: Optional[int] = None  # the file, open while the store is: `reserve`
        if (self.saved != NO_MODEL).any():
            self.open_rows(create=False)
            named = np.flatnonzero(self.saved != NO_MODEL)
            # Read once in the file's order (with read-ahead), then dropped from memory.
            self.mapping.madvise(mmap.MADV_SEQUENTIAL)
            self.checksums[named] = self.row_checksums(named, self.saved[named])
            self.mapping.madvise(mmap.MADV_DONTNEED)
            self.mapping.madvise(mmap.MADV_RANDOM)
            if saved is not None and saved.checksums is not None:
                self.refuse_other_rows(np.asarray(saved.checksums, np.uint32))

    @property
    def shape(self) -> tuple[int, int]:
        return (SLOTS * len(self.row_of), self.num_values)

    def checked_slots(self, saved: Optional[StoreIndex]) -> np.ndarray:
        """`saved`'s slots, refused (ValueError naming the fix) when they do not fit this run."""
        if saved is None:
            return np.full(len(self.row_of), NO_MODEL, np.int8)
        slots = np.asarray(saved.slots)
        if (
            saved.num_values != self.num_values
            or slots.shape != (len(self.row_of),)
            or not np.isin(slots, (NO_MODEL, *range(SLOTS))).all()
        ):
            raise ValueError(
                f"the checkpoint's client store index ({slots.shape[0] if slots.ndim else 0} "
                f"clients of {saved.num_values} values) does not fit this run's "
                f"{len(self.row_of)} clients of {self.num_values} values; start over in a new "
                "--output_dir"
            )
        return slots.astype(np.int8)

    def row_checksums(self, clients: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The CRC-32 of the rows of `slots` of client numbers `clients`, as the file holds
        them (read in order of the file)."""
        rows = self.row(clients, slots)
        out = np.zeros(len(rows), np.uint32)
        for k in np.argsort(rows, kind="stable"):
            out[k] = zlib.crc32(self.rows[rows[k]])
        return out

    def refuse_other_rows(self, recorded: np.ndarray) -> None:
        """ValueError naming the file and the fix when the rows the checkpoint names do not
        have the checksums it `recorded` (the file damaged or replaced since)."""
        if recorded.shape == self.checksums.shape and (recorded == self.checksums).all():
            return
        if recorded.shape != self.checksums.shape:
            differ = np.arange(len(self.checksums))
        else:
            differ = np.flatnonzero(recorded != self.checksums)
        first = next(c for c, i in self.row_of.items() if i == differ[0])
        raise ValueError(
            f"{self.path} does not hold the client models the checkpoint names: "
            f"{len(differ):,} of {int((self.saved != NO_MODEL).sum()):,} clients' rows differ "
            f"from their checksums (the first: client {first}); the file is damaged or another "
            "run's: put back this run's own file, or start over in a new --output_dir"
        )

    def open_rows(self, create: bool) -> None:
        """Maps the file's rows: a file made afresh (`create`: sparse, its whole size) or the
        existing one, refused when missing or of another size."""
        expected = int(np.prod(self.shape)) * np.dtype(np.float32).itemsize
        if not create:
            size = os.path.getsize(self.path) if os.path.exists(self.path) else None
            if size != expected:
                found = "is missing" if size is None else f"has {size:,} bytes, not {expected:,}"
                raise ValueError(
                    f"{self.path} {found}: it holds the client models the checkpoint names; "
                    "put it back as the run left it, or start over in a new --output_dir"
                )
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(self.path, flags, 0o666)
        try:
            if create:
                os.ftruncate(fd, expected)
            self.mapping = mmap.mmap(fd, expected)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        # Rows are touched at random: a fault maps its own page only. The kernel's default
        # reads ahead around a faulting page (the device's read-ahead, up to megabytes, holes
        # zero-filled page by page), which made a row's first write or read cost milliseconds
        # and filled memory with rows no round asked for.
        self.mapping.madvise(mmap.MADV_RANDOM)
        self.rows = np.frombuffer(self.mapping, np.float32).reshape(self.shape)

    def model(self, client_id: str) -> Variables:
        i = self.row_of[client_id]
        slot = self.current[i]
        if slot == NO_MODEL:
            return self.initial
        return self.variables_of(np.array(self.rows[self.row(i, slot)]))

    def row(self, client: Union[int, np.ndarray], slot: Union[int, np.ndarray]) -> np.ndarray:
        """The file's row(s) of slot `slot` of client number `client` (arrays: one each)."""
        return np.asarray(slot, np.int64) * len(self.row_of) + client

    def variables_of(self, row: np.ndarray) -> Variables:
        """A flat row as the model's variables (float32, as stored)."""
        return tuple(part.reshape(s) for part, s in zip(np.split(row, self.cuts), self.shapes))

    def put(self, client_id: str, model: Variables) -> None:
        i = self.row_of[client_id]
        if self.current[i] != self.saved[i]:
            slot = self.current[i]  # written since the checkpoint: overwritten in place
        else:
            slot = 0 if self.saved[i] == NO_MODEL else 1 - self.saved[i]
        if self.rows is None:
            self.open_rows(create=True)  # no checkpoint names a row of an older file
        row = int(self.row(i, slot))
        self.reserve(row, client_id)
        self.rows[row] = flat_model(model)
        self.current[i] = slot

    def reserve(self, row: int, client_id: str) -> None:
        """Allocates the disk blocks of the file's row `row` (whole pages: the mapping writes
        pages) with `posix_fallocate`, a no-op for blocks already allocated. A full disk (or
        quota): an `OSError` naming the file, the space and the fix. Where the file system
        cannot reserve (no `posix_fallocate`, EOPNOTSUPP), the row is written unreserved."""
        if self.fd is None or not hasattr(os, "posix_fallocate"):
            return
        row_bytes = self.num_values * np.dtype(np.float32).itemsize
        whole = int(np.prod(self.shape)) * np.dtype(np.float32).itemsize
        start = row * row_bytes // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(-(-(row + 1) * row_bytes // mmap.PAGESIZE) * mmap.PAGESIZE, whole)  # not past
        try:
            os.posix_fallocate(self.fd, start, end - start)
        except OSError as e:
            if e.errno == errno.EOPNOTSUPP:
                return
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OSError(
                e.errno,
                f"no space left on its disk for client {client_id}'s model ({end - start:,} "
                f"bytes now; the file takes up to {whole:,} bytes as clients train): free "
                "space, choose an --output_dir on another disk, or keep the clients' models in "
                "memory with --client_store=memory",
                self.path,
            ) from None

    def trained(self) -> Iterator[tuple[str, Variables]]:
        for client_id, i in self.row_of.items():
            if self.current[i] != NO_MODEL:
                yield client_id, self.model(client_id)

    def record(self) -> StoreIndex:
        """The index of the rows written so far, once they are on disk; from now on a write
        leaves these rows alone (each client's next model goes to its other slot)."""
        written = np.flatnonzero(self.current != self.saved)  # rows new since the last one
        if len(written):
            self.checksums[written] = self.row_checksums(written, self.current[written])
        if self.mapping is not None:
            self.mapping.flush()  # msync: the rows reach the disk before the checkpoint names them
            self.mapping.madvise(mmap.MADV_DONTNEED)  # clean now: dropped, read again if needed
        self.saved = self.current.copy()
        return StoreIndex(
            slots=self.saved.copy(), num_values=self.num_values, checksums=self.checksums.copy()
        )

    def flat(self, client_ids: Sequence[str], num_values: int) -> np.ndarray:
        """`ClientStore.flat`, read as rows of the file."""
        out = np.tile(self.initial_flat[:num_values], (len(client_ids), 1))
        index = np.array([self.row_of[c] for c in client_ids], np.int64)
        slots = self.current[index] if len(index) else np.zeros(0, np.int8)
        own = np.flatnonzero(slots != NO_MODEL)
        if len(own):
            out[own] = self.rows[self.row(index[own], slots[own]), :num_values]
        return out


def open_store(
    kind: str,
    initial: Variables,
    client_ids: Union[Sequence[str], Mapping[str, int]],
    folder: Optional[str] = None,
    saved: Optional[ClientModels] = None,
) -> ClientStore:
    """A store of `kind` ("memory" or "disk", whose file lives in `folder`) holding `saved`, a
    checkpoint's client models of either store (a run may resume with the other one)."""
    if isinstance(saved, StoreIndex):
        disk = DiskClientStore(initial, client_ids, folder, saved)
        return disk if kind == "disk" else MemoryClientStore(initial, dict(disk.trained()))
    if kind == "memory":
        return MemoryClientStore(initial, saved)
    store = DiskClientStore(initial, client_ids, folder)
    for client_id, model in (saved or {}).items():
        store.put(client_id, tuple(np.asarray(v, np.float32) for v in model))
    return store
