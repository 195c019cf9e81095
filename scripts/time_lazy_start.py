"""Start-up of `--dataset=tff_sql` on a synthetic population: seconds and peak memory.

Start-up of `--dataset=tff_sql` on a synthetic population: seconds of `load_tff_sql` and
peak memory, read lazily or whole (docs/data.md's table).

    python scripts/time_lazy_start.py write /tmp/pop1e5.sqlite 100000
    python scripts/time_lazy_start.py lazy /tmp/pop1e5.sqlite
    python scripts/time_lazy_start.py memory /tmp/pop1e5.sqlite

`write` makes the file in TFF's SqlClientData format (the records TFF's serializer writes:
`tf.train.Example` with `x` a float list and `y` an int64), 4 planted groups, 16 train and 4
test examples of 32 features per client, with an index on client_id; run each mode in its own
process (peak memory is the process's)."""

from __future__ import annotations

import os
import resource
import sqlite3
import sys
import time

import numpy as np
import tensorflow as tf

from tff_clustered.data.sql_clients import CLIENT_INDEX
from tff_clustered.data.tff_sql import load_tff_sql

FEATURES, TRAIN, TEST, GROUPS, CLASSES = 32, 16, 4, 4, 10
TABLES = (
    "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
    "serialized_example_proto BLOB NOT NULL)",
    "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
    "num_examples INTEGER NOT NULL)",
)


def record(x: np.ndarray, y: int) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(path: str, clients: int, chunk: int = 10_000) -> None:
    if os.path.exists(path):
        os.remove(path)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(GROUPS, CLASSES, FEATURES)).astype(np.float32)
    with sqlite3.connect(path) as db:
        for table in TABLES:
            db.execute(table)
        for split, size in (("train", TRAIN), ("test", TEST)):
            for start in range(0, clients, chunk):
                rows, sizes = [], []
                for i in range(start, min(clients, start + chunk)):
                    client, y = f"client_{i:07d}", rng.integers(0, CLASSES, size)
                    x = centres[i % GROUPS, y] + rng.normal(size=(size, FEATURES))
                    rows += [(split, client, record(x[j], int(y[j]))) for j in range(size)]
                    sizes.append((client, split, size))
                db.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
                db.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", sizes)
                db.commit()
        db.execute(CLIENT_INDEX)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def main(mode: str, path: str, clients: str = "100000") -> None:
    if mode == "write":
        write(path, int(clients))
        return
    before = rss_mb()
    start = time.perf_counter()
    data = load_tff_sql(path, CLASSES, lazy=mode == "lazy")
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{mode}: {len(data.client_ids):,} clients, load {seconds:.2f} s, peak memory "
        f"{peak:.0f} MB ({peak - before:+.0f} MB over the process before loading)"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
