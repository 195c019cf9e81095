"""A TFF worker reading a client's examples itself from a population file of TFF's SQL format.

A TFF worker reading a client's examples itself from a population file in TFF's SQL format
(`--client_data=read_on_worker`): `WorkerReader` builds the client's arrays inside a TF
computation from the client's id and listed size, as `sql_clients.SqlClients` reads them here,
and names the worker's failed reads (`WorkerReader.failure`); `worker_reader` makes one for a
lazily read `tff_sql` population.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_clustered.data.federated_data import FederatedData
from tff_clustered.data.sql_clients import SqlClients
from tff_clustered.data.sqlite_files import is_locked, locked_database, read_only_uri
from tff_clustered.data.vector_records import not_vector_examples, vector_records

# A failed check of a client's examples read on the worker (`WorkerReader.read`), as TF's
# Assert prints its data: "assertion failed: [client '...' (split) in path: ] [problem]".
WORKER_DATA_CHECK = re.compile(r"assertion failed: \[(client '.*?:) \] \[(.*?)\]")


@dataclasses.dataclass(frozen=True)
class WorkerReader:
    """Reads one client's examples of split `split_name` from TFF's SQLite file `path` inside a
    TF computation (`tf.data.experimental.SqlDataset`), so that a TFF worker that can open the
    same path builds the client's arrays itself from a `reference` (its id and its number of
    examples) instead of being sent them. The rows come in the order `SqlClients.records` reads
    them (`ORDER BY rowid`) and are parsed as `vector_records` parses them, so the arrays are
    the ones the orchestrator would have sent. The checks of a read at the orchestrator run as
    assertions on the worker: the listed number of examples, finite inputs, labels
    0..num_classes-1. `mean_values`: float values of a client's examples on average;
    `held_here`: whether this process keeps every client's examples of the split once read
    (they fit the source's cache), so that sending them costs no read of the file."""

    path: str
    split_name: str
    input_shape: tuple[int, ...]
    num_classes: int
    mean_values: float = 0.0
    held_here: bool = False
    local_only = False  # any worker that opens `path` reads it (not a field)

    @property
    def reference_spec(self) -> dict:
        """A client's `reference`, as TF specs (what a round's client input carries)."""
        return collections.OrderedDict(
            client_id=tf.TensorSpec([], tf.string), num_examples=tf.TensorSpec([], tf.int64)
        )

    def reference(self, client_id: str, num_examples: int) -> dict:
        return collections.OrderedDict(
            client_id=np.array(client_id, dtype=object), num_examples=np.int64(num_examples)
        )

    def read(self, reference: Mapping[str, tf.Tensor]) -> dict:
        """The client's OrderedDict(x=float32[n, *input_shape], y=int32[n]) (TF ops). The file
        is opened read-only (`read_only_uri`). A record that cannot be parsed fails the checks
        (not the parser, whose error would quote the record's bytes): one assertion naming the
        first check that failed (`failure` reads it)."""
        client = reference["client_id"]
        query = tf.strings.join(
            [
                "SELECT serialized_example_proto FROM examples WHERE client_id = '",
                tf.strings.regex_replace(client, "'", "''"),
                f"' AND split_name = '{self.split_name}' ORDER BY rowid",
            ]
        )
        rows = tf.data.experimental.SqlDataset(
            "sqlite", read_only_uri(self.path), query, (tf.string,)
        )
        (blobs,) = rows.batch(np.iinfo(np.int32).max).get_single_element()
        features = {
            "x": tf.io.FixedLenFeature(list(self.input_shape), tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64),
        }

        def parsed_records(records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            parsed = tf.io.parse_example(records, features)
            return parsed["x"], parsed["y"], tf.constant(True)

        unparsed = (
            tf.zeros([0, *self.input_shape], tf.float32),
            tf.zeros([0], tf.int64),
            tf.constant(False),
        )
        x, y, parsed = (
            tf.data.Dataset.from_tensors(blobs)
            .map(parsed_records)
            .ignore_errors()
            .concatenate(tf.data.Dataset.from_tensors(unparsed))
            .take(1)
            .get_single_element()
        )
        where = tf.strings.join(["client '", client, f"' ({self.split_name}) in {self.path}: "])
        checks = (
            (parsed, self.unparsed_problem),
            (
                tf.equal(tf.size(y, tf.int64), reference["num_examples"]),
                "not as many examples as client_metadata lists; regenerate the file",
            ),
            (tf.reduce_all(tf.math.is_finite(x)), "inputs contain NaN or infinity"),
            (
                tf.reduce_all((y >= 0) & (y < self.num_classes)),
                f"a label is outside 0..{self.num_classes - 1}; fix the labels or raise "
                "--num_classes",
            ),
        )
        holds = tf.stack([h for h, _ in checks])
        first_failed = tf.argmin(tf.cast(holds, tf.int32))
        problem = tf.gather(tf.constant([p for _, p in checks]), first_failed)
        check = tf.debugging.Assert(tf.reduce_all(holds), [where, problem])
        with tf.control_dependencies([check]):
            return collections.OrderedDict(x=tf.identity(x), y=tf.cast(y, tf.int32))

    @property
    def unparsed_problem(self) -> str:
        return f"{not_vector_examples(self.input_shape)}; regenerate the file"

    def failure(self, message: str) -> Optional[str]:
        """The one-line error of a TFF worker's failed read of this file, from the worker's
        error `message`: a client that failed `read`'s checks (its assertion), or the file
        locked by another process (`locked_database`); None for any other error."""
        found = WORKER_DATA_CHECK.search(message.replace("\\'", "'"))  # Assert escapes quotes
        if found is not None:
            return f"{found[1]} {found[2]}"
        if is_locked(message):
            return str(locked_database(self.path))
        return None


def worker_reader(data: FederatedData, split: str = "train") -> Optional[WorkerReader]:
    """A `WorkerReader` of `split` when `data` is read lazily from a file of TFF's SQL format
    with `x`/`y` records (`load_tff_sql`), else None (its clients can only be sent)."""
    read = getattr(data.source, "read", None)
    reader = getattr(read, "__self__", None)
    if not isinstance(reader, SqlClients) or reader.parse is not vector_records:
        return None
    sizes = data.train_sizes if split == "train" else data.test_sizes
    examples, values = sum(sizes.values()), int(np.prod(data.input_shape))
    source = data.source
    return WorkerReader(
        os.path.abspath(reader.path),
        reader.splits[split],
        data.input_shape,
        data.num_classes,
        mean_values=examples * values / max(len(sizes), 1),
        held_here=len(sizes) <= source.cache_clients
        and examples * 4 * (values + 1) <= source.cache_bytes,
    )
