"""A TFF worker on this machine reading a client's training examples from files written once.

Sending a client's examples to TFF's worker costs this process TFF's value serialization every
round the client is sampled (about 1.5 ms of its CPU for 100 x 784 float32 values, against
0.1 ms for a reference; docs/performance.md). `ClientFiles` writes each client's training
arrays once, the first time it is sampled, as raw files in a temporary folder of this process,
and a round then takes the client's index and number of examples instead of its arrays
(`round_inputs.WorkerData`): the worker reads the files itself (`tf.io.read_file`,
`tf.io.decode_raw`) inside the client's computation. The bytes are the ones TFF's serialization
would have sent (the arrays as the round's specs' dtypes, in C order), so the client trains on
the same arrays and a run's results are the same bit for bit.

Nothing is kept in the worker's memory between rounds: it reads a client's files when it trains
it, and the operating system's page cache keeps them (or drops them under pressure). The files
are a second copy of the training arrays, on the temporary folder's disk (in memory where that
folder is a tmpfs), so a population whose training arrays exceed half that file system's free
space (`FREE_SPACE_SHARE`) is sent instead (`files_refusal`); a write that fails all the same
(the disk filled during the run) is one error naming the folder and the fix, its part removed
(`ClientFiles.write`). The folder is removed when the
`ClientFiles` is collected or the process exits; one a SIGKILLed process left behind is removed
by the next run that writes files (`remove_orphaned_folders`)."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_clustered.data.client_source import CountedSizes
from tff_clustered.data.federated_data import DataError, FederatedData
from tff_clustered.data.worker_reader import WorkerReader, worker_reader

# A population's training arrays are written as files only within this share of the free space
# of the temporary folder's file system: they are a second copy of them (in memory on a tmpfs).
FREE_SPACE_SHARE = 0.5
# Dtypes `tf.io.decode_raw` reads back (a data spec of another dtype is sent).
DECODABLE = (tf.float16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8)
# The files' folders in the temporary folder: this prefix, the process id, a random part.
FOLDER_PREFIX = "tff_clustered-clients-"
# A failed count check of a client's files read on the worker, as TF's Assert prints its data.
FILES_CHECK = re.compile(r"assertion failed: \[(client file .*?:) \] \[(.*?)\]")


def example_specs(input_spec: Mapping[str, tf.TensorSpec]) -> collections.OrderedDict:
    """Each array's spec as a round takes it: any number of examples, then the model's shape."""
    return collections.OrderedDict(
        (name, tf.TensorSpec([None, *spec.shape[1:]], spec.dtype))
        for name, spec in input_spec.items()
    )


def training_bytes(data: FederatedData, specs: Mapping[str, tf.TensorSpec]) -> int:
    """Bytes of every client's training arrays written as `specs` say."""
    per_example = sum(int(np.prod(s.shape[1:])) * s.dtype.size for s in specs.values())
    return sum(data.train_sizes.values()) * per_example


def files_refusal(
    data: FederatedData, input_spec: Mapping[str, tf.TensorSpec], folder: Optional[str] = None
) -> Optional[str]:
    """Why `data`'s training examples cannot be read on the worker from files written in
    `folder` (default: the temporary folder), or None when they can: an array whose dtype
    `decode_raw` cannot read or whose example shape is not fully known, a population whose
    training arrays exceed `FREE_SPACE_SHARE` of the folder's free space, or a lazy source
    that lists no sizes (its size is known only by reading every client)."""
    if isinstance(data.train_sizes, CountedSizes):  # its size would read every client
        return "its clients' sizes are known only by reading them"
    specs = example_specs(input_spec)
    for name, spec in specs.items():
        if spec.dtype not in DECODABLE or not spec.shape[1:].is_fully_defined():
            return f"its {name!r} arrays ({spec.dtype.name}, {spec.shape}) cannot be written raw"
    folder = folder or tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    needed = training_bytes(data, specs)
    if needed > FREE_SPACE_SHARE * free:
        return (
            f"its training arrays ({size_text(needed)}) exceed {FREE_SPACE_SHARE:.0%} of the "
            f"free space of the temporary folder {folder} ({size_text(free)}; set TMPDIR to a "
            "folder with more)"
        )
    return None


def size_text(size: int) -> str:
    """`size` bytes in the largest unit that keeps it at least 1 (B, KB, MB, GB, TB: powers of
    1000), to 3 significant digits: never a 0 MB for a few kilobytes."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 999.5:  # 999.5 KB would read 1e+03 KB
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} TB"


class ClientFiles:
    """Each sampled client's training arrays written once as raw files (`reference` writes a
    client's the first time it is asked for it), read back on the worker by `read`; a
    `round_inputs.WorkerData` that only a worker on this machine can read (`local_only`).
    `mean_values` and `held_here` are what `executions.reads_on_worker` decides by."""

    local_only = True
    held_here = True  # this process holds or reads the clients (it writes their files)

    def __init__(self, data: FederatedData, input_spec: Mapping[str, tf.TensorSpec]) -> None:
        self.data, self.specs = data, example_specs(input_spec)
        values = int(np.prod(data.input_shape))
        self.mean_values = sum(data.train_sizes.values()) * values / max(len(data.train_sizes), 1)
        self.written: set[str] = set()

    @functools.cached_property
    def index(self) -> Mapping[str, int]:
        """Each client's position, the name of its files."""
        return self.data.client_index

    @functools.cached_property
    def folder(self) -> str:
        """The files' folder, made on first use (named by this process's id) and removed with
        this object or at exit; the folders of processes that died without removing theirs
        (SIGKILL) are removed first."""
        remove_orphaned_folders(tempfile.gettempdir())
        folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        return folder

    @property
    def reference_spec(self) -> dict:
        """A client's `reference`, as TF specs (what a round's client input carries)."""
        return collections.OrderedDict(
            index=tf.TensorSpec([], tf.int64), num_examples=tf.TensorSpec([], tf.int64)
        )

    def reference(self, client_id: str, num_examples: int) -> dict:
        """The client's reference, its files written first if they are not yet."""
        index = self.index[client_id]
        if client_id not in self.written:
            (arrays,) = self.data.arrays_of("train", [client_id])
            for name, spec in self.specs.items():
                array = np.ascontiguousarray(arrays[name], spec.dtype.as_numpy_dtype)
                self.write(client_id, self.path(index, name), array)
            self.written.add(client_id)
        return collections.OrderedDict(index=np.int64(index), num_examples=np.int64(num_examples))

    def write(self, client_id: str, path: str, array: np.ndarray) -> None:
        """`array`'s bytes as the file `path`, whole or not at all: a write that fails (the
        temporary folder's disk full) removes its part and is one DataError naming the folder
        and the fix."""
        try:
            with open(path + ".tmp", "wb") as f:
                f.write(array.data)
            os.replace(path + ".tmp", path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.remove(path + ".tmp")
            raise DataError(
                f"the examples of client {client_id!r} ({size_text(array.nbytes)}) cannot be "
                f"written to the temporary folder {self.folder} ({e.strerror or e}); free space "
                "there, or set TMPDIR to a folder with room, or pass --client_data=sent"
            ) from None

    def path(self, index: int, name: str) -> str:
        return os.path.join(self.folder, f"{index}.{name}")

    def read(self, reference: Mapping[str, tf.Tensor]) -> dict:
        """The client's arrays, read from its files (TF ops), its first array's length checked
        against the reference's number of examples (`failure` names a failed check)."""
        stem = tf.strings.join([self.folder, os.sep, tf.strings.as_string(reference["index"])])
        arrays = collections.OrderedDict()
        for name, spec in self.specs.items():
            raw = tf.io.read_file(tf.strings.join([stem, f".{name}"]))
            arrays[name] = tf.reshape(tf.io.decode_raw(raw, spec.dtype), [-1, *spec.shape[1:]])
        count = tf.shape(next(iter(arrays.values())), out_type=tf.int64)[0]
        check = tf.debugging.Assert(
            tf.equal(count, reference["num_examples"]),
            [tf.strings.join(["client file ", stem, ": "]), "not as many examples as written"],
        )
        with tf.control_dependencies([check]):
            return collections.OrderedDict((n, tf.identity(a)) for n, a in arrays.items())

    def failure(self, message: str) -> Optional[str]:
        """The one-line error of a worker's failed read of these files, from its `message`: a
        client's files missing (the folder removed while the run ran) or of another length;
        None for any other error."""
        found = FILES_CHECK.search(message)
        if found is not None:
            return f"{found[1]} {found[2]}: its file changed while the run ran; rerun it"
        if self.folder in message and ("NotFound" in message or "No such file" in message):
            return (
                f"a client's examples file is missing from {self.folder}: the temporary folder "
                "was removed while the run ran; rerun it (--resume continues from the last "
                "checkpoint) or pass --client_data=sent"
            )
        return None


def remove_orphaned_folders(parent: str) -> None:
    """Removes the `ClientFiles` folders in `parent` whose process no longer runs."""
    for name in os.listdir(parent):
        found = re.fullmatch(rf"{FOLDER_PREFIX}(\d+)-.*", name)
        if found is None or int(found[1]) == os.getpid():
            continue
        try:
            os.kill(int(found[1]), 0)  # signal 0: only whether the process exists
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except PermissionError:  # another user's live process
            continue


def worker_source(
    data: FederatedData, input_spec: Mapping[str, tf.TensorSpec]
) -> tuple[Optional[WorkerReader | ClientFiles], Optional[str]]:
    """Where a TFF worker can read `data`'s training examples itself, or None and why not: the
    population's file of TFF's SQL format (`worker_reader`), else files written here
    (`ClientFiles`) unless `files_refusal` says why not."""
    reader = worker_reader(data)
    if reader is not None:
        return reader, None
    refusal = files_refusal(data, input_spec)
    return (None, refusal) if refusal else (ClientFiles(data, input_spec), None)
