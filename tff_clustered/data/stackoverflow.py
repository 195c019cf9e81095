"""TFF's federated Stack Overflow (`tff.simulation.datasets.stackoverflow`) as TFF's tag
prediction baseline frames it, read client by client from the SQLite file TFF keeps in its
cache folder; nothing is downloaded.

`stackoverflow.sqlite` holds 342,477 train clients (135.8 million posts), 204,088 test clients
and 38,758 held-out ones (tens of GB). It is never read whole: the client ids come from the
small `client_metadata` table, `--num_clients` of those with posts in both `train` and `test`
are drawn from the run's seed, and only their rows of `examples` are fetched, in one streamed
query joined to a temporary table of the drawn ids.

A post is a `tf.train.Example` (`tokens`, `title`, `tags` joined by "|", `creation_date`,
`score`, `type`). As TFF's `tag_prediction_preprocessing.build_to_ids_fn` does, its input is
the bag of words of `tokens` and `title` over the 10,000 most frequent words, each word's count
divided by the number of in-vocabulary words. TFF's task is multi-label (every tag among the
500 most frequent); the models here are trained by softmax cross-entropy on one class, so a
post's label is its *most frequent* tag among the top `num_classes` (default 500), and posts
with none are dropped; a drawn client left without a post in either split is dropped too.

The vocabularies are TFF's files `stackoverflow.word_count` ("word count" lines, most frequent
first) and `stackoverflow.tag_count` (JSON {tag: count}) next to the database, as
`stackoverflow.load_word_counts` / `load_tag_counts` unpack them. When a file is absent its
vocabulary is counted instead from the drawn clients' train posts with TFF's definition (the
number of clients with a post containing the word or tag): a vocabulary of that draw, not TFF's.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.data.federated_data import (
    DataError,
    FederatedData,
    chosen_clients,
    from_arrays,
)
from tff_clustered.data.sql_clients import connect, has_client_index
from tff_clustered.data.tff_datasets import reason, tff_database
from tff_clustered.seeds import DataStream, data_rng

STACKOVERFLOW_FILE = "stackoverflow.sqlite"
STACKOVERFLOW_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma"
WORD_COUNT_FILE = "stackoverflow.word_count"
WORD_COUNT_URL = (
    "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2"
)
TAG_COUNT_FILE = "stackoverflow.tag_count"
TAG_COUNT_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.tag_count.tar.bz2"
WORD_VOCABULARY_SIZE = 10_000  # TFF's DEFAULT_WORD_VOCAB_SIZE
TAG_VOCABULARY_SIZE = 500  # TFF's DEFAULT_TAG_VOCAB_SIZE
# Clients with posts in both splits, in the order of their ids.
BOTH_SPLITS_QUERY = (
    "SELECT client_id FROM client_metadata WHERE split_name = 'train' INTERSECT "
    "SELECT client_id FROM client_metadata WHERE split_name = 'test' ORDER BY client_id"
)
# The drawn clients' posts: `drawn` is a temporary table of their ids.
DRAWN_POSTS_QUERY = (
    "SELECT client_id, split_name, serialized_example_proto FROM examples "
    "WHERE client_id IN (SELECT client_id FROM drawn) AND split_name IN ('train', 'test')"
)
log = logging.getLogger(__name__)

Posts = dict[str, dict[str, list[bytes]]]  # client -> split -> serialized examples


def stackoverflow_files(data_dir: str) -> list[str]:
    """The database and the two vocabulary files the loader reads from `data_dir` (the
    vocabulary files are read when present)."""
    return [
        os.path.join(data_dir, f) for f in (STACKOVERFLOW_FILE, WORD_COUNT_FILE, TAG_COUNT_FILE)
    ]


def client_ids_in_both_splits(db: sqlite3.Connection) -> list[str]:
    """The ids of the clients with posts in `train` and in `test`, sorted: one query of the
    small `client_metadata` table (a row per client and split)."""
    return [row[0] for row in db.execute(BOTH_SPLITS_QUERY)]


def drawn_posts(db: sqlite3.Connection, clients: Sequence[str]) -> Posts:
    """The serialized train and test posts of `clients`, streamed from one query; each
    client's in the order of their rows (rowid: the order of an index on client_id, and of a
    scan of the table)."""
    db.execute("CREATE TEMP TABLE drawn (client_id TEXT PRIMARY KEY)")
    db.executemany("INSERT INTO drawn VALUES (?)", ((c,) for c in clients))
    posts: Posts = {c: {"train": [], "test": []} for c in clients}
    for client, split, blob in db.execute(DRAWN_POSTS_QUERY):
        posts[client][split].append(blob)
    return posts


def parsed_posts(blobs: list[bytes]) -> dict[str, list[str]]:
    """`tokens`, `title` and `tags` of serialized posts, parsed by TFF's own parser."""
    from tensorflow_federated.python.simulation.datasets import stackoverflow

    parsed = stackoverflow._add_proto_parsing(  # noqa: SLF001 - TFF's format, kept in one place
        tf.data.Dataset.from_tensor_slices(tf.constant(blobs, tf.string))
    ).batch(max(len(blobs), 1))
    batch = next(iter(parsed.as_numpy_iterator()))
    return {
        key: [b.decode("utf-8", errors="replace") for b in batch[key]]
        for key in ("tokens", "title", "tags")
    }


def parsed_by_client(raw: Posts) -> dict[str, dict[str, dict[str, list[str]]]]:
    """`parsed_posts` of every client's splits that have posts, parsed in one batch (one
    parse for all clients, not one per client)."""
    keys = [(c, s) for c, splits in raw.items() for s, blobs in splits.items() if blobs]
    everything = parsed_posts([b for c, s in keys for b in raw[c][s]]) if keys else {}
    posts: dict[str, dict[str, dict[str, list[str]]]] = {c: {} for c in raw}
    start = 0
    for c, s in keys:
        end = start + len(raw[c][s])
        posts[c][s] = {key: values[start:end] for key, values in everything.items()}
        start = end
    return posts


def word_counts_file(path: str, limit: int) -> list[str]:
    """The first `limit` words of TFF's `stackoverflow.word_count` ("word count" lines)."""
    words = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if len(fields) != 2 or not fields[1].isdigit():
                raise DataError(
                    f"{path} line {number}: {line.strip()[:60]!r} is not 'word count'; get a "
                    f"fresh copy from {WORD_COUNT_URL} (unpack it next to {STACKOVERFLOW_FILE})"
                )
            words.append(fields[0])
            if len(words) == limit:
                break
    return words


def tag_counts_file(path: str) -> list[str]:
    """The tags of TFF's `stackoverflow.tag_count` (JSON {tag: count}), most frequent first."""
    try:
        with open(path, encoding="utf-8") as f:
            counts = json.load(f)
        ranked = sorted(counts.items(), key=lambda item: -int(item[1]))
    except (ValueError, AttributeError, TypeError) as e:
        raise DataError(
            f"{path} is not TFF's tag counts (a JSON object of tag: count; {reason(e)}); get a "
            f"fresh copy from {TAG_COUNT_URL} (unpack it next to {STACKOVERFLOW_FILE})"
        ) from None
    return [tag for tag, _ in ranked]


def counted_vocabulary(per_client: Iterable[Iterable[str]], limit: int) -> list[str]:
    """The `limit` items held by the most clients (TFF's count: clients, not occurrences),
    ties by the item; each element of `per_client` is one client's items."""
    clients = collections.Counter(item for items in per_client for item in set(items) if item)
    return sorted(clients, key=lambda item: (-clients[item], item))[:limit]


def bag_of_words(texts: Sequence[str], vocabulary: Mapping[str, int]) -> np.ndarray:
    """Each text's in-vocabulary word counts divided by its number of in-vocabulary words
    (all zero when it has none), as TFF's `build_to_ids_fn`: (len(texts), len(vocabulary))."""
    x = np.zeros((len(texts), len(vocabulary)), np.float32)
    for row, text in enumerate(texts):
        ids = [vocabulary[w] for w in text.split() if w in vocabulary]
        if ids:
            x[row] = np.bincount(ids, minlength=len(vocabulary)) / len(ids)
    return x


def most_frequent_tags(tags: Sequence[str], rank: Mapping[str, int]) -> np.ndarray:
    """Each post's label: the rank of its most frequent tag in `rank`, -1 when it has none."""
    return np.array(
        [min((rank[t] for t in joined.split("|") if t in rank), default=-1) for joined in tags],
        np.int64,
    )


def load_tff_stackoverflow(
    data_dir: Optional[str],
    num_clients: Optional[int],
    num_classes: Optional[int] = None,
    seed: int = 0,
    word_vocabulary_size: int = WORD_VOCABULARY_SIZE,
    open_database: Callable[[str], sqlite3.Connection] = connect,
) -> FederatedData:
    """TFF's Stack Overflow tag prediction (see the module docstring): `num_clients` clients
    with posts in train and test, drawn from `DataStream.TFF_CLIENTS`; labels among the
    `num_classes` (default 500) most frequent tags; inputs the bag of words over the
    `word_vocabulary_size` most frequent words. `open_database` opens the database (tests trace
    it)."""
    path, not_stackoverflow = tff_database(
        data_dir,
        "tff_stackoverflow",
        STACKOVERFLOW_FILE,
        STACKOVERFLOW_URL,
        "federated Stack Overflow",
    )
    try:
        with contextlib.closing(open_database(path)) as db:
            clients = client_ids_in_both_splits(db)
            if not clients:
                raise not_stackoverflow("no client has posts in both train and test")
            if num_clients is None:
                raise DataError(
                    f"--dataset=tff_stackoverflow reads only the clients drawn, and {path} has "
                    f"{len(clients)} with train and test posts: give --num_clients (e.g. 100)"
                )
            drawn = [
                clients[k]
                for k in chosen_clients(
                    len(clients),
                    num_clients,
                    data_rng(seed, DataStream.TFF_CLIENTS),
                    f"{path} has {len(clients)} clients with train and test posts",
                )
            ]
            if not has_client_index(db):
                log.warning(
                    "%s has no index on examples(client_id): SQLite scans the whole table once "
                    "to find the %d clients' posts",
                    path,
                    len(drawn),
                )
            raw = drawn_posts(db, drawn)
        posts = parsed_by_client(raw)
    except DataError:
        raise
    except Exception as e:  # a truncated or foreign file: sqlite3, TFF's parser
        raise not_stackoverflow(f"{type(e).__name__}: {reason(e)}") from None
    words_path, tags_path = stackoverflow_files(data_dir or "")[1:]
    if os.path.isfile(words_path):
        words = word_counts_file(words_path, word_vocabulary_size)
    else:
        words = counted_vocabulary(
            (" ".join(p["train"]["tokens"]).split() for p in posts.values() if "train" in p),
            word_vocabulary_size,
        )
    if os.path.isfile(tags_path):
        tags = tag_counts_file(tags_path)
    else:
        tags = counted_vocabulary(
            ("|".join(p["train"]["tags"]).split("|") for p in posts.values() if "train" in p),
            TAG_VOCABULARY_SIZE if num_classes is None else num_classes,
        )
    if num_classes is not None and not 1 <= num_classes <= len(tags):
        raise DataError(
            f"--num_classes={num_classes}: {tags_path if os.path.isfile(tags_path) else path} "
            f"gives {len(tags)} tags; use --num_classes between 1 and {len(tags)}"
        )
    tags = tags[: TAG_VOCABULARY_SIZE if num_classes is None else num_classes]
    word_index = {w: i for i, w in enumerate(words)}
    tag_rank = {t: i for i, t in enumerate(tags)}
    arrays: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {"train": {}, "test": {}}
    for client, splits in posts.items():
        labelled = {}
        for split in ("train", "test"):
            post = splits.get(split, {"tokens": [], "title": [], "tags": []})
            y = most_frequent_tags(post["tags"], tag_rank)
            texts = [
                f"{a} {b}" for a, b, keep in zip(post["tokens"], post["title"], y >= 0) if keep
            ]
            labelled[split] = (bag_of_words(texts, word_index), y[y >= 0])
        if all(len(y) for _, y in labelled.values()):
            for split in ("train", "test"):
                arrays[split][client] = labelled[split]
    if len(arrays["train"]) < len(drawn):
        log.warning(
            "%d of the %d clients drawn from %s have no post with a tag among the top %d in "
            "train or test, and are left out",
            len(drawn) - len(arrays["train"]),
            len(drawn),
            path,
            len(tags),
        )
    if not arrays["train"]:
        raise DataError(
            f"none of the {len(drawn)} clients drawn from {path} has a post with a tag among "
            f"the top {len(tags)} in both train and test; draw more with --num_clients"
        )
    return from_arrays("tff_stackoverflow", arrays["train"], arrays["test"], len(tags), source=path)
