"""Clients read by id from a SQLite file in TFF's `SqlClientData` format, and `tff_sql`: any
population of `x` (float32 vector) and `y` (int64 label) examples in that format.

TFF's format (`tff.simulation.datasets.save_to_sql_client_data`, `SqlClientData`): a table
`examples(split_name, client_id, serialized_example_proto)` of `tf.train.Example` records and
a table `client_metadata(client_id, split_name, num_examples)`. The client ids and sizes come
from `client_metadata` in one query at start; a client's examples are fetched by one query
when the run first needs them (`SqlClients.read`), in the order of their rows, and parsed by
the dataset's parser; the clients of a round not cached yet are fetched and parsed together
(`SqlClients.read_many`). Without an index of `examples` on `client_id` each fetch scans the
table: `save_population` writes one, and a file without it gets a warning naming the
statement that adds it.

`save_to_sql_client_data` writes each client into one split, so a population whose clients
have a train and a test split is written by `save_population` (TFF's writer for each split,
then the two merged into one file): split names "train" and "test", the same client ids.

The file is opened read-only, and a file another process holds locked is one line naming it
(`sqlite_files`); a TFF worker reads the same rows itself with `worker_reader.WorkerReader`.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from google.protobuf.message import DecodeError

from tff_clustered.data.client_source import ClientCounts, LazyClients, federated_data
from tff_clustered.data.federated_data import (
    ClientArrays,
    DataError,
    FederatedData,
    chosen_clients,
    from_arrays,
    unreadable_examples,
)
from tff_clustered.data.fingerprint import sampled_digest
from tff_clustered.data.sqlite_files import connect, locks_named
from tff_clustered.seeds import DataStream, data_rng

log = logging.getLogger(__name__)

CLIENT_INDEX = "CREATE INDEX IF NOT EXISTS examples_by_client ON examples (client_id, split_name)"
METADATA_QUERY = "SELECT client_id, split_name, num_examples FROM client_metadata"
CLIENT_QUERY = (
    "SELECT serialized_example_proto FROM examples WHERE client_id = ? AND split_name = ? "
    "ORDER BY rowid"
)
# Several clients' records: CLIENT_QUERY for the ids filling the IN list.
CLIENTS_QUERY = (
    "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? AND "
    "client_id IN ({}) ORDER BY rowid"
)
IDS_PER_QUERY = 500  # SQLite before 3.32 binds at most 999 parameters to a statement
# Parses one client's serialized records into raw (x, y).
RecordParser = Callable[[list[bytes]], ClientArrays]


def has_client_index(db: sqlite3.Connection) -> bool:
    """Whether an index of `examples` starts with `client_id`: then a client's rows are found
    without scanning the table."""
    for index in db.execute("PRAGMA index_list('examples')").fetchall():
        columns = db.execute(f"PRAGMA index_info('{index[1]}')").fetchall()
        if columns and columns[0][2] == "client_id":
            return True
    return False


class SqlClients:
    """One client's records of one split by id from TFF's SQLite file `path` (`splits` maps
    the runs' "train"/"test" to the file's split names), parsed by `parse`."""

    def __init__(self, path: str, parse: RecordParser, splits: Mapping[str, str]) -> None:
        self.path, self.parse, self.splits = path, parse, dict(splits)
        self._local = threading.local()

    def connection(self) -> sqlite3.Connection:
        """This thread's read-only connection to the file."""
        if getattr(self._local, "db", None) is None:
            self._local.db = connect(self.path)
        return self._local.db

    def sizes(self) -> dict[str, ClientCounts]:
        """Each split's clients and their number of examples, from `client_metadata` in one
        query (a cheap check that the file is TFF's format: both tables exist), as compact
        counts over one index of the clients in sorted order. A count below 0 is refused,
        naming its client."""
        return self._sizes()

    def _sizes(self) -> dict[str, ClientCounts]:
        tables = {row[0] for row in self.rows("SELECT name FROM sqlite_master")}
        if not {"examples", "client_metadata"} <= tables:
            raise DataError(
                f"{self.path} is not a SQLite file of TFF's SqlClientData format (tables: "
                f"{sorted(tables) or 'none'}; need examples and client_metadata); write it with "
                "tff.simulation.datasets.save_to_sql_client_data"
            )
        ours = {name: split for split, name in self.splits.items()}
        ids: list[str] = []
        index: dict[str, int] = {}
        rows = {split: array.array("q") for split in self.splits}
        counts = {split: array.array("q") for split in self.splits}
        for client, name, count in self.rows(METADATA_QUERY + " ORDER BY client_id"):
            if name in ours:
                client = str(client)
                if client not in index:
                    index[client] = len(ids)
                    ids.append(client)
                rows[ours[name]].append(index[client])
                counts[ours[name]].append(int(count))
        for split, listed in counts.items():
            negative = np.flatnonzero(np.frombuffer(listed, np.int64) < 0)
            if negative.size:
                client = ids[rows[split][negative[0]]]
                raise DataError(
                    f"{self.path}: client_metadata lists {listed[negative[0]]} examples for client "
                    f"{client!r} ({self.splits[split]}); a number of examples is >= 0: regenerate "
                    "the file or correct that row"
                )
        if any(a > b for a, b in zip(ids, ids[1:])):  # SQLite's order of ids not stored as text
            order = sorted(range(len(ids)), key=ids.__getitem__)
            ids = [ids[i] for i in order]
            index = {c: i for i, c in enumerate(ids)}
            rows = {
                s: array.array("q", np.argsort(order)[np.frombuffer(r, np.int64)])
                for s, r in rows.items()
            }
        sizes = {}
        for split in self.splits:
            per_client = np.full(len(ids), -1, np.int64)
            per_client[np.frombuffer(rows[split], np.int64)] = np.frombuffer(
                counts[split], np.int64
            )
            sizes[split] = ClientCounts(ids, index, per_client)
        if not self.has_client_index():
            log.warning(
                "%s has no index of examples on client_id: each client read scans the table; "
                "add one with: sqlite3 %s '%s'",
                self.path,
                self.path,
                CLIENT_INDEX,
            )
        return sizes

    def has_client_index(self) -> bool:
        with locks_named(self.path):
            return has_client_index(self.connection())

    def rows(self, query: str, parameters: Sequence[Any] = ()) -> Iterator[tuple]:
        """The rows of `query` on this thread's connection, streamed; the file locked by
        another process is one line naming it (`locks_named`), wherever the rows are read."""
        with locks_named(self.path):
            yield from self.connection().execute(query, parameters)

    def records(self, split: str, client: str) -> list[bytes]:
        """The client's serialized records of `split`, in the order of their rows."""
        return [row[0] for row in self.rows(CLIENT_QUERY, (client, self.splits[split]))]

    def read(self, split: str, client: str) -> ClientArrays:
        """The client's raw `(x, y)` of `split`, parsed from its records."""
        return self.parse(self.records(split, client))

    def read_many(self, split: str, clients: Sequence[str]) -> list[ClientArrays]:
        """Each of `clients`' raw `(x, y)` of `split`, as `read` gives it, in one query per
        `IDS_PER_QUERY` clients and one call of the parser for all records (a parser parses
        each record on its own), split per client: each client's examples in the order of
        their rows. Raises when any record cannot be parsed."""
        records: dict[str, list[bytes]] = {c: [] for c in clients}
        unique = list(records)
        for begin in range(0, len(unique), IDS_PER_QUERY):
            ids = unique[begin : begin + IDS_PER_QUERY]
            query = CLIENTS_QUERY.format(", ".join("?" * len(ids)))
            for client, blob in self.rows(query, (self.splits[split], *ids)):
                records[str(client)].append(blob)
        x, y = self.parse([blob for c in clients for blob in records[c]])
        ends = np.cumsum([len(records[c]) for c in clients])
        if len(y) != (ends[-1] if len(ends) else 0):  # a parser that drops or adds examples
            raise ValueError(
                f"{self.path}: the parser gave {len(y)} examples for {ends[-1]} records; "
                "read_many needs one example per record (read these clients one at a time)"
            )
        return [
            (x[end - len(records[c]) : end].copy(), y[end - len(records[c]) : end].copy())
            if records[c]
            else self.parse([])
            for c, end in zip(clients, ends.tolist())
        ]

    def lazy(
        self,
        num_classes: int,
        clients: Optional[Sequence[str]] = None,
        vocabulary_size: Optional[int] = None,
        sizes: Optional[Mapping[str, Mapping[str, int]]] = None,
    ) -> LazyClients:
        """The file's clients (or `clients` of them) read when first needed; `sizes`: the
        file's `sizes()` when already read."""
        sizes = self.sizes() if sizes is None else sizes
        if clients is not None:
            sizes = {s: {c: sizes[s][c] for c in clients if c in sizes[s]} for s in sizes}
        return LazyClients(
            client_ids=list(clients) if clients is not None else list(sizes["train"]),
            sizes=sizes,
            read=self.read,
            read_many=self.read_many,
            num_classes=num_classes,
            digest=lambda: sampled_digest(self.path),
            where=self.path,
            vocabulary_size=vocabulary_size,
        )


def not_vector_examples(shape: Sequence[int] = ()) -> str:
    """What a record that `vector_records` cannot parse is not (`shape`: its `x`'s, if known)."""
    floats = f"{'x'.join(str(d) for d in shape)} floats" if len(shape) else "floats"
    return f"a record is not a tf.train.Example of x ({floats}) and y (an int64 label)"


def vector_records(blobs: list[bytes]) -> ClientArrays:
    """`x` (a float vector) and `y` (an int label) of serialized `tf.train.Example`s, the
    records `save_to_sql_client_data` writes for elements OrderedDict(x=float32[d], y=int64).
    A record that cannot be parsed: ValueError (`not_vector_examples`), not the parser's error,
    which quotes the record's bytes (and fails to, when they are not UTF-8)."""
    if not blobs:
        return np.zeros((0, 1), np.float32), np.zeros((0,), np.int64)
    try:
        first = tf.train.Example.FromString(blobs[0]).features.feature
    except DecodeError:
        raise ValueError(not_vector_examples()) from None
    if "x" not in first or "y" not in first:
        raise DataError(f"records have features {sorted(first)}, not x and y")
    width = len(first["x"].float_list.value)
    features = {
        "x": tf.io.FixedLenFeature([width], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
    }
    try:
        parsed = tf.io.parse_example(tf.constant(blobs), features)
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        raise ValueError(not_vector_examples([width])) from None
    return parsed["x"].numpy(), parsed["y"].numpy()


def tff_sql_path(data_dir: Optional[str]) -> str:
    """The SQLite file `--data_dir` names: the file itself, or the one `.sqlite` file in a
    folder."""
    if not data_dir:
        raise DataError(
            "--dataset=tff_sql needs --data_dir: a .sqlite file in TFF's SqlClientData format "
            "(splits train and test; sql_clients.save_population writes one), or its folder"
        )
    if os.path.isdir(data_dir):
        found = sorted(f for f in os.listdir(data_dir) if f.endswith(".sqlite"))
        if len(found) != 1:
            raise DataError(
                f"--data_dir={data_dir} holds {len(found)} .sqlite files; name the file itself"
            )
        return os.path.join(data_dir, found[0])
    if not os.path.isfile(data_dir):
        raise DataError(f"--data_dir={data_dir} does not exist; give the population's .sqlite file")
    return data_dir


def load_tff_sql(
    data_dir: Optional[str],
    num_classes: Optional[int],
    lazy: bool = True,
    num_clients: Optional[int] = None,
    seed: int = 0,
) -> FederatedData:
    """A population of `x`/`y` examples in TFF's SQL format (see the module docstring): every
    client of split "train" (each must be in "test" too), or `num_clients` of them drawn
    without replacement from `DataStream.TFF_CLIENTS` of `seed` (as the tff_* datasets draw
    theirs), read when first needed (`lazy`) or all at start. `num_classes`: as given
    (`--num_classes`), else the file's largest label + 1 (a scan of every record: give
    --num_classes to start without one)."""
    path = tff_sql_path(data_dir)
    reader = SqlClients(path, vector_records, {"train": "train", "test": "test"})
    try:
        sizes = reader.sizes()
        clients = None
        if num_clients is not None:
            listed = list(sizes["train"])
            drawn = chosen_clients(
                len(listed),
                num_clients,
                data_rng(seed, DataStream.TFF_CLIENTS),
                f"{path} has {len(listed):,} clients",
            )
            clients = [listed[i] for i in drawn]
        if num_classes is None:
            num_classes = largest_label(reader) + 1
        source = reader.lazy(num_classes, clients, sizes=sizes)
        if lazy:
            return federated_data("tff_sql", source)
        return from_arrays(
            "tff_sql",
            *({c: reader.read(s, c) for c in source.sizes[s]} for s in ("train", "test")),
            num_classes,
            source=path,
        )
    except sqlite3.DatabaseError as e:
        raise DataError(
            f"{path} is not a readable SQLite file ({e}); write it with "
            "tff.simulation.datasets.save_to_sql_client_data"
        ) from None


def largest_label(reader: SqlClients) -> int:
    """The largest label of any train or test record, parsed in batches of rows. A batch that
    cannot be parsed is named as a client's read names it (`unreadable_client`)."""
    largest = 0
    rows = reader.rows(
        "SELECT client_id, split_name, serialized_example_proto FROM examples "
        "WHERE split_name IN ('train', 'test') ORDER BY rowid"
    )
    while batch := list(itertools.islice(rows, 1 << 16)):
        try:
            labels = vector_records([row[2] for row in batch])[1]
        except ValueError as e:
            unnamed = DataError(f"{reader.path}: {e}; regenerate the file")
            raise unreadable_client(reader.path, batch) or unnamed from None
        largest = max(largest, int(np.max(labels)))
    return largest


def unreadable_client(path: str, rows: Sequence[tuple[str, str, bytes]]) -> Optional[DataError]:
    """The error naming the first client of `rows` ((client, split, record) of the file
    `path`) whose own records cannot be parsed, as `LazyClients.arrays` words it; None when
    each client's records parse alone (records of different widths across clients: the
    caller names the file)."""
    records: dict[tuple[str, str], list[bytes]] = {}
    for client, split, blob in rows:
        records.setdefault((str(client), str(split)), []).append(blob)
    for (client, split), blobs in records.items():
        try:
            vector_records(blobs)
        except ValueError as e:
            return unreadable_examples(f"client {client!r} ({split}) in {path}", e)
    return None


def save_population(
    path: str,
    client_ids: Sequence[str],
    dataset_fn: Callable[[str, str], tf.data.Dataset],
) -> None:
    """Writes clients with a "train" and a "test" split into one file of TFF's format:
    `dataset_fn(split, client)` gives a client's dataset of OrderedDict(x=float32[d],
    y=int64) elements. Each split is written by TFF's `save_to_sql_client_data`, then both
    are merged and an index on client_id is added (a client's read is then one index lookup)."""
    with tempfile.TemporaryDirectory() as folder:
        parts = {}
        for split in ("train", "test"):
            parts[split] = os.path.join(folder, f"{split}.sqlite")
            tff.simulation.datasets.save_to_sql_client_data(
                list(client_ids),
                lambda client, split=split: dataset_fn(split, client),
                parts[split],
                split_names_by_client_id={c: split for c in client_ids},
            )
        if os.path.exists(path):
            os.remove(path)
        shutil.move(parts["train"], path)
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("ATTACH DATABASE ? AS part", (parts["test"],))
            db.execute("INSERT INTO examples SELECT * FROM part.examples")
            db.execute("INSERT INTO client_metadata SELECT * FROM part.client_metadata")
            db.commit()
            db.execute("DETACH DATABASE part")
            db.execute(CLIENT_INDEX)
            db.commit()
