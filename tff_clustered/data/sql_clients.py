"""TFF's SqlClientData SQLite files: clients read by id (`SqlClients`), a population written.

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
The `tff_sql` dataset (`data.tff_sql`) is any population of such files.
"""

from __future__ import annotations

import array
import contextlib
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

from tff_clustered.data.client_source import ClientCounts, LazyClients
from tff_clustered.data.federated_data import ClientArrays, DataError
from tff_clustered.data.fingerprint import sampled_digest
from tff_clustered.data.sqlite_files import connect, locks_named
from tff_clustered.frameworks import tff

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

    def check_format(self) -> None:
        """DataError unless the file holds the tables of TFF's SqlClientData format, naming
        the ones it holds and how to write such a file (what `doctor.py` checks too)."""
        tables = {row[0] for row in self.rows("SELECT name FROM sqlite_master")}
        if not {"examples", "client_metadata"} <= tables:
            raise DataError(
                f"{self.path} is not a SQLite file of TFF's SqlClientData format (tables: "
                f"{sorted(tables) or 'none'}; need examples and client_metadata); write it with "
                "tff.simulation.datasets.save_to_sql_client_data"
            )

    def _sizes(self) -> dict[str, ClientCounts]:
        self.check_format()
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
