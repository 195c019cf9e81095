"""The `tff_sql` dataset: any population of `x`/`y` examples in a file of TFF's SQL format.

The file is read by `data.sql_clients.SqlClients`, its records parsed by
`data.vector_records.vector_records` (float32 vector `x`, int64 label `y`).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.data.client_source import federated_data
from tff_clustered.data.federated_data import (
    DataError,
    FederatedData,
    chosen_clients,
    from_arrays,
    unreadable_examples,
)
from tff_clustered.data.sql_clients import SqlClients
from tff_clustered.data.vector_records import vector_records
from tff_clustered.seeds import DataStream, data_rng


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
