"""Start-up of `--dataset=tff_stackoverflow` read lazily, on a synthetic population.

Start-up of `--dataset=tff_stackoverflow` without `--num_clients` (every client, read
lazily) on a synthetic `stackoverflow.sqlite` (docs/data.md's figures).

    python scripts/time_stackoverflow_start.py write /tmp/so100k 100000 [--no-index]
    python scripts/time_stackoverflow_start.py lazy /tmp/so100k

`write` makes FOLDER/stackoverflow.sqlite in TFF's format: N clients with 1-3 train and 1-3
test posts, N/10 more with train posts only (left out: no test posts), each post one of 200
made-up posts of the fixture's writer (`make_stackoverflow_fixture.post`: TFF's six features,
every tag counted), an index on client_id unless --no-index; and copies the fixture's
vocabulary files beside it. `lazy` prints, after the imports, the seconds of the one trace of
TFF's parser (once per process, whatever the population), of `load_dataset` (the metadata
query, the first client's read), of the checkpoint's source fingerprint and of the run's client
index; run it in its own process."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_stackoverflow_fixture import TOPICS, post, topic_tags  # noqa: E402 - scripts folder
from make_tff_fixtures import new_database  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
VOCABULARIES = ("stackoverflow.word_count", "stackoverflow.tag_count")


def write(folder: str, num_clients: int, index: bool) -> None:
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    when = "2016-05-01 10:00:00 UTC"
    pool = [post(t, rng, topic_tags(t, rng), when) for t in TOPICS for _ in range(50)]
    with new_database(os.path.join(folder, "stackoverflow.sqlite")) as db:
        rows, metadata = [], []
        for k in range(num_clients + num_clients // 10):
            client = f"{k:08d}"
            for split in ("train", "test") if k < num_clients else ("train",):
                count = int(rng.integers(1, 4))
                rows += [(split, client, pool[int(rng.integers(len(pool)))]) for _ in range(count)]
                metadata.append((client, split, count))
        db.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
        db.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", metadata)
        if index:
            db.execute("CREATE INDEX examples_by_client ON examples (client_id, split_name)")
    db.close()
    for name in VOCABULARIES:
        shutil.copy(os.path.join(FIXTURE, "tff_stackoverflow_tiny", name), folder)


def lazy(folder: str) -> None:
    import tensorflow as tf

    from tff_clustered.data import load_dataset
    from tff_clustered.data.registry import source_fingerprint
    from tff_clustered.data.stackoverflow_task import tff_post_parser

    started = time.perf_counter()
    tff_post_parser()(tf.zeros([0], tf.string))
    traced = time.perf_counter()
    data = load_dataset("tff_stackoverflow", data_dir=folder)
    loaded = time.perf_counter()
    source_fingerprint("tff_stackoverflow", data_dir=folder)
    fingerprinted = time.perf_counter()
    data.client_index  # noqa: B018 - what the run builds at start
    indexed = time.perf_counter()
    print(
        f"{len(data.client_ids)} clients: parser trace {traced - started:.3f} s, load_dataset "
        f"{loaded - traced:.3f} s ({data.source.reads} client split read), fingerprint "
        f"{fingerprinted - loaded:.3f} s, client index {indexed - fingerprinted:.3f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("write", "lazy"))
    parser.add_argument("folder")
    parser.add_argument("num_clients", type=int, nargs="?", default=100_000)
    parser.add_argument("--no-index", action="store_true")
    args = parser.parse_args()
    if args.mode == "write":
        write(args.folder, args.num_clients, not args.no_index)
    else:
        lazy(args.folder)
