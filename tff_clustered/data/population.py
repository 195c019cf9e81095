"""A synthetic population of any size in TFF's SQL format, written client by client.

It is the data of the population benchmark (`tff_clustered/cli/benchmarks/population.py`)
and of tests that need a population file.

Each client holds `train_examples` and `test_examples` examples of `num_features` standard
normal float32 features; its label is `argmax(x @ W_g)` over `num_classes` classes, where
`W_g` is the linear map of the client's planted group g (one of `num_groups`). Every client
is a pure function of the seed and its index (`seeds.DataStream.POPULATION_CLIENT`), so a
client is the same whatever the population's size, and a population of a million clients is
written without holding more than one batch of clients in memory.

The file is what `tff.simulation.datasets.SqlClientData` reads: TFF's two tables, `examples`
(split_name, client_id, serialized_example_proto) and `client_metadata` (client_id,
split_name, num_examples), created by the same statements as
`tff.simulation.datasets.save_to_sql_client_data`, each example a `tf.train.Example` with a
float list `x` and an int64 `y`, which `load_and_parse_sql_client_data` parses back to
OrderedDict(x=float32[num_features], y=int64 scalar). Every client has a `train` and a `test`
split, as TFF's own EMNIST and Shakespeare files. TFF's writer cannot write that (it gives each
client id one split) and serializes example by example in Python (about a millisecond per
client here), so the rows are written here with `sqlite3`: each client's examples serialized
at once from one example's bytes (`ExampleTemplate`), inserted in batches. One index the TFF
writer does not make, on `examples (client_id, split_name)`, lets `SqlClientData`'s query per
client (`WHERE client_id = ... and split_name = ...`) read that client's rows instead of
scanning every example of the population.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import sqlite3

import numpy as np
import tensorflow as tf

from tff_clustered import atomic_files
from tff_clustered.data.sql_clients import CLIENT_INDEX
from tff_clustered.seeds import DataStream, data_rng

SPLITS = ("train", "test")
# Clients serialized and inserted per transaction: bounded memory at any population size.
CLIENTS_PER_BATCH = 2_000
# TFF's tables, as `save_to_sql_client_data` creates them (TFF 0.87).
TFF_TABLES = (
    """CREATE TABLE examples (
           split_name TEXT NOT NULL,
           client_id TEXT NOT NULL,
           serialized_example_proto BLOB NOT NULL);""",
    """CREATE TABLE client_metadata (
           client_id TEXT NOT NULL,
           split_name TEXT NOT NULL,
           num_examples INTEGER NOT NULL);""",
)


@dataclasses.dataclass(frozen=True)
class PopulationSpec:
    """A synthetic population: its size, each client's examples, and the seed."""

    num_clients: int
    train_examples: int = 20
    test_examples: int = 10
    num_features: int = 32
    num_classes: int = 10
    num_groups: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_clients", "train_examples", "test_examples", "num_features"):
            if getattr(self, name) < 1:
                raise ValueError(f"population {name} must be >= 1, got {getattr(self, name)}")
        if not 2 <= self.num_classes <= 127:
            raise ValueError(f"population num_classes must be 2..127, got {self.num_classes}")
        if self.num_groups < 1:
            raise ValueError(f"population num_groups must be >= 1, got {self.num_groups}")

    @property
    def file_name(self) -> str:
        """The file's name, from every field: a cached file is reused only for the same
        population."""
        return (
            f"population-n{self.num_clients}-train{self.train_examples}-test{self.test_examples}"
            f"-x{self.num_features}-y{self.num_classes}-g{self.num_groups}-s{self.seed}.sqlite"
        )

    def examples(self, split: str) -> int:
        """Examples per client in `split`."""
        return {"train": self.train_examples, "test": self.test_examples}[split]


def client_id(index: int) -> str:
    """Client `index`'s id: zero-padded, so ids sort in index order (`SqlClientData` sorts)."""
    return f"c{index:07d}"


@functools.lru_cache(maxsize=8)
def group_maps(spec: PopulationSpec) -> np.ndarray:
    """The planted groups' label maps W_g, shape (num_groups, num_features, num_classes)."""
    rng = data_rng(spec.seed, DataStream.POPULATION_GROUP_MAPS)
    return rng.normal(size=(spec.num_groups, spec.num_features, spec.num_classes))


def planted_group(spec: PopulationSpec, index: int) -> int:
    """Client `index`'s planted group."""
    return index % spec.num_groups


def client_arrays(spec: PopulationSpec, index: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Client `index`'s examples per split: (x float32 (n, num_features), y int64 (n,))."""
    rng = data_rng(spec.seed, DataStream.POPULATION_CLIENT, index)
    total = spec.train_examples + spec.test_examples
    x = rng.normal(size=(total, spec.num_features)).astype(np.float32)
    y = np.argmax(x @ group_maps(spec)[planted_group(spec, index)], axis=1).astype(np.int64)
    cut = spec.train_examples
    return {"train": (x[:cut], y[:cut]), "test": (x[cut:], y[cut:])}


def client_dataset(spec: PopulationSpec, split: str, cid: str) -> tf.data.Dataset:
    """Client `cid`'s `split` as TFF's writer takes it (`save_to_sql_client_data`'s
    `dataset_fn`): elements OrderedDict(x=float32[num_features], y=int64 scalar)."""
    x, y = client_arrays(spec, int(cid[1:]))[split]
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))


@dataclasses.dataclass(frozen=True)
class ExampleTemplate:
    """The bytes of one serialized `tf.train.Example` of this population, and where its
    features and its label sit in them: every example has the same layout (a packed float
    list of `num_features` floats, one int64 label under 128, one varint byte), so a client's
    examples are that template with their own bytes put in."""

    template: np.ndarray  # uint8, one example's bytes
    x_offset: int  # first byte of the little-endian float32 features
    y_offset: int  # the label's varint byte

    @classmethod
    def of(cls, num_features: int) -> ExampleTemplate:
        """The template that protobuf's own serializer gives, its offsets found by
        serializing examples that differ only in the features, or only in the label."""
        x = np.arange(1, num_features + 1, dtype=np.float32)
        first = np.frombuffer(serialize_example(x, 3), np.uint8)
        other_label = np.frombuffer(serialize_example(x, 5), np.uint8)
        other_x = np.frombuffer(serialize_example(-x, 3), np.uint8)
        (y_offset,) = np.flatnonzero(first != other_label)
        x_offset = int(np.flatnonzero(first != other_x)[0]) - 3  # the sign is the 4th byte
        if first[x_offset : x_offset + 4 * num_features].tobytes() != x.astype("<f4").tobytes():
            raise RuntimeError("protobuf's Example layout is not a packed float list")
        return cls(first.copy(), x_offset, int(y_offset))

    def serialize(self, x: np.ndarray, y: np.ndarray) -> list[bytes]:
        """Examples (x (n, num_features), y (n,) in 0..127) as serialized `tf.train.Example`s."""
        rows = np.tile(self.template, (len(y), 1))
        features = np.ascontiguousarray(x, dtype="<f4").view(np.uint8)
        rows[:, self.x_offset : self.x_offset + features.shape[1]] = features
        rows[:, self.y_offset] = y
        return [row.tobytes() for row in rows]


def serialize_example(x: np.ndarray, y: int) -> bytes:
    """One example as TFF's serializer writes it: float list `x`, int64 list [`y`]."""
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x.ravel())),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def client_rows(
    spec: PopulationSpec, indices: range, template: ExampleTemplate
) -> tuple[list[tuple[str, str, bytes]], list[tuple[str, str, int]]]:
    """The `examples` rows and the `client_metadata` rows of the clients `indices`."""
    examples, metadata = [], []
    for index in indices:
        cid = client_id(index)
        for split, (x, y) in client_arrays(spec, index).items():
            examples += [(split, cid, proto) for proto in template.serialize(x, y)]
            metadata.append((cid, split, len(y)))
    return examples, metadata


def write_population_sql(spec: PopulationSpec, path: str, replace: bool = True) -> bool:
    """Writes the population to `path` in TFF's SQL format (see the module docstring), through
    a temporary file of this writer's own published at the end (`atomic_files`), so that
    `path` is either absent or whole, whatever other writers of it do at the same time; the
    temporary files of writers killed before (no longer running) are deleted first.
    `replace`: the file published over any at `path`; else a file already at `path` (another
    writer's, published first) is kept and this one's discarded. Returns whether this writer's
    file is at `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    atomic_files.remove_orphan_temp_files(folder)
    with atomic_files.temp_file(path) as partial:
        template = ExampleTemplate.of(spec.num_features)
        connection = sqlite3.connect(partial)
        try:
            connection.execute("PRAGMA journal_mode = OFF")
            connection.execute("PRAGMA synchronous = OFF")
            for statement in TFF_TABLES:
                connection.execute(statement)
            for start in range(0, spec.num_clients, CLIENTS_PER_BATCH):
                batch = range(start, min(start + CLIENTS_PER_BATCH, spec.num_clients))
                examples, metadata = client_rows(spec, batch, template)
                with connection:
                    connection.executemany(
                        "INSERT INTO examples (split_name, client_id, serialized_example_proto)"
                        " VALUES (?, ?, ?);",
                        examples,
                    )
                    connection.executemany(
                        "INSERT INTO client_metadata (client_id, split_name, num_examples)"
                        " VALUES (?, ?, ?);",
                        metadata,
                    )
            with connection:
                connection.execute(CLIENT_INDEX)
        finally:
            connection.close()
        return atomic_files.publish(partial, path, replace)


def population_file(spec: PopulationSpec, folder: str) -> tuple[str, bool]:
    """The population's file in `folder`, written unless already there (its name holds every
    field of `spec`), and whether it was written now: by this call, not by another writer of
    the same file that published its file first (then this one's is discarded)."""
    path = os.path.join(folder, spec.file_name)
    if os.path.exists(path):
        return path, False
    return path, write_population_sql(spec, path, replace=False)
