"""TFF's federated Stack Overflow as TFF's tag prediction frames it, read client by client.

TFF's federated Stack Overflow (`tff.simulation.datasets.stackoverflow`) as TFF's tag
prediction baseline frames it (`stackoverflow_task`: a post's bag of words and its most
frequent top tag), read client by client from the SQLite file TFF keeps in its cache folder;
nothing is downloaded.

`stackoverflow.sqlite` holds 342,477 train clients (135.8 million posts), 204,088 test clients
and 38,758 held-out ones (tens of GB). It is never read whole: the ids of the clients with
posts in both `train` and `test` come from one query of the small `client_metadata` table, and
then either

* every one of them is the population, read lazily (`--num_clients` not given): a client's
  split is fetched by one query (`sql_clients.SqlClients`) and labelled when a round first
  samples or scores it, and kept in `client_source.LazyClients`' bounded cache; or
* `--num_clients` of them are drawn from the run's seed, and only their rows of `examples`
  are fetched now, in one streamed query joined to a temporary table of the drawn ids, parsed
  in one batch and held in memory.

Both label a client's posts with the same functions (`TagPrediction`), so a client has the same
examples either way. What differs, and why:

* Sizes. `client_metadata`'s `num_examples` counts all of a client's posts, the untagged ones
  too: an upper bound, not its number of examples, and the sizes weight the averages. The lazy
  path counts a client's examples when it is first read (`LazyClients` without sizes:
  `CountedSizes`), and keeps the count after the examples leave the cache. A round reads its
  sampled clients anyway; what else asks for sizes asks for clients it touches (the weights of
  a round's clients, clients.csv's rows of the evaluated ones), except FeSEM, which trains
  every client at start.
* Vocabularies. The lazy path needs TFF's two vocabulary files (`stackoverflow_task`): counting
  them would mean decoding every train post at start. The drawn path counts a missing one from
  the drawn clients' train posts (a vocabulary of that draw, not TFF's).
* A client with no tagged post in a split. TFF's multi-label baseline has none: it keeps an
  untagged post with an all-zero target. Single-label training has no label for it, and every
  client here holds examples in both splits: local training batches them, the averages weight
  by them, the evaluation scores them (a client with none would be a zero-weight client, which
  the loop has no notion of). The drawn path leaves such a client out at start (a warning
  counts them). The lazy path knows a client's posts only when it reads them, and cannot leave
  a client out once the run has started (the population and its seeded draws are fixed then),
  so it refuses one at its read with an error naming the client and split, and the run stops
  there. A larger `--num_classes` makes such clients rarer; `--num_clients` avoids them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Sequence
from typing import Callable, Optional

from tff_clustered.data.client_source import LazyClients, federated_data
from tff_clustered.data.federated_data import (
    ClientArrays,
    DataError,
    FederatedData,
    chosen_clients,
    from_arrays,
)
from tff_clustered.data.fingerprint import file_digest, sampled_digest
from tff_clustered.data.sql_clients import CLIENT_INDEX, SqlClients, has_client_index
from tff_clustered.data.sqlite_files import connect
from tff_clustered.data.stackoverflow_task import (
    STACKOVERFLOW_FILE,
    WORD_VOCABULARY_SIZE,
    TagPrediction,
    parsed_posts,
    task_vocabularies,
    vocabulary_files,
)
from tff_clustered.data.tff_datasets import reason, tff_database
from tff_clustered.seeds import DataStream, data_rng

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
STACKOVERFLOW_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma"
log = logging.getLogger(__name__)

Posts = dict[str, dict[str, list[bytes]]]  # client -> split -> serialized examples


def stackoverflow_files(data_dir: str) -> list[str]:
    """The database and the two vocabulary files the loader reads from `data_dir` (the
    vocabulary files are read when present)."""
    return [os.path.join(data_dir, STACKOVERFLOW_FILE), *vocabulary_files(data_dir)]


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


def drawn_posts_parsed(
    path: str,
    num_clients: int,
    seed: int,
    open_database: Callable[[str], sqlite3.Connection],
    not_stackoverflow: Callable[[str], DataError],
) -> tuple[list[str], dict[str, dict[str, dict[str, list[str]]]]]:
    """`num_clients` of the clients with posts in train and test, drawn from
    `DataStream.TFF_CLIENTS`, and their posts read and parsed by client and split; a file
    that is not TFF's Stack Overflow is `not_stackoverflow`'s error."""
    try:
        with contextlib.closing(open_database(path)) as db:
            clients = client_ids_in_both_splits(db)
            if not clients:
                raise not_stackoverflow("no client has posts in both train and test")
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
    return drawn, posts


def labelled_clients(
    posts: dict[str, dict[str, dict[str, list[str]]]], task: TagPrediction
) -> dict[str, dict[str, ClientArrays]]:
    """Each split's arrays of the clients whose posts have a tag among the task's in both
    train and test, labelled by `task`."""
    arrays: dict[str, dict[str, ClientArrays]] = {"train": {}, "test": {}}
    for client, splits in posts.items():
        labelled = {
            split: task.labelled(splits.get(split, {"tokens": [], "title": [], "tags": []}))
            for split in ("train", "test")
        }
        if all(len(y) for _, y in labelled.values()):
            for split in ("train", "test"):
                arrays[split][client] = labelled[split]
    return arrays


def load_tff_stackoverflow(
    data_dir: Optional[str],
    num_clients: Optional[int],
    num_classes: Optional[int] = None,
    seed: int = 0,
    word_vocabulary_size: int = WORD_VOCABULARY_SIZE,
    open_database: Callable[[str], sqlite3.Connection] = connect,
) -> FederatedData:
    """TFF's Stack Overflow tag prediction (see the module docstring): every client with posts
    in train and test, each read when a round first needs it, or `num_clients` of them drawn
    from `DataStream.TFF_CLIENTS` and read now; labels among the `num_classes` (default 500)
    most frequent tags; inputs the bag of words over the `word_vocabulary_size` most frequent
    words. `open_database` opens the database (tests trace it)."""
    path, not_stackoverflow = tff_database(
        data_dir,
        "tff_stackoverflow",
        STACKOVERFLOW_FILE,
        STACKOVERFLOW_URL,
        "federated Stack Overflow",
    )
    if num_clients is None:
        task = task_vocabularies(data_dir, path, num_classes, word_vocabulary_size)
        return lazy_stackoverflow(path, task, open_database, not_stackoverflow)
    drawn, posts = drawn_posts_parsed(path, num_clients, seed, open_database, not_stackoverflow)
    task = task_vocabularies(
        data_dir,
        path,
        num_classes,
        word_vocabulary_size,
        lambda: [p["train"] for p in posts.values() if "train" in p],
    )
    arrays = labelled_clients(posts, task)
    if len(arrays["train"]) < len(drawn):
        log.warning(
            "%d of the %d clients drawn from %s have no post with a tag among the top %d in "
            "train or test, and are left out",
            len(drawn) - len(arrays["train"]),
            len(drawn),
            path,
            len(task.tags),
        )
    if not arrays["train"]:
        raise DataError(
            f"none of the {len(drawn)} clients drawn from {path} has a post with a tag among "
            f"the top {len(task.tags)} in both train and test; draw more with --num_clients"
        )
    return from_arrays(
        "tff_stackoverflow", arrays["train"], arrays["test"], len(task.tags), source=path
    )


class TaggedPosts(SqlClients):
    """A client's posts of a split read by id (`SqlClients`) and labelled by `task`; a split
    without a post tagged among the task's tags is refused (see the module docstring)."""

    def __init__(self, path: str, task: TagPrediction) -> None:
        super().__init__(path, task.examples, {"train": "train", "test": "test"})
        self.num_tags = len(task.tags)

    def read(self, split: str, client: str) -> ClientArrays:
        posts = self.records(split, client)
        x, y = self.parse(posts)
        if not len(y):
            raise DataError(
                f"client {client!r} ({split}) in {self.path}: none of its {len(posts)} posts has "
                f"a tag among the {self.num_tags} most frequent, so it has no example; a run "
                "over every client cannot leave it out once started: give --num_clients (a "
                "drawn client without a tagged post in a split is left out at start) or a "
                "larger --num_classes"
            )
        return x, y


def lazy_stackoverflow(
    path: str,
    task: TagPrediction,
    open_database: Callable[[str], sqlite3.Connection],
    not_stackoverflow: Callable[[str], DataError],
) -> FederatedData:
    """Every client with posts in train and test (one query of `client_metadata`), each
    split read by id and labelled when a round first needs it; sizes counted at that read."""
    try:
        with contextlib.closing(open_database(path)) as db:
            clients = client_ids_in_both_splits(db)
            indexed = has_client_index(db)
    except Exception as e:  # a truncated or foreign file
        raise not_stackoverflow(f"{type(e).__name__}: {reason(e)}") from None
    if not clients:
        raise not_stackoverflow("no client has posts in both train and test")
    if not indexed:
        log.warning(
            "%s has no index on examples(client_id): each client read scans the whole table; "
            "add one with: sqlite3 %s '%s'",
            path,
            path,
            CLIENT_INDEX,
        )
    reader = TaggedPosts(path, task)
    vocabularies = vocabulary_files(os.path.dirname(path))
    source = LazyClients(
        client_ids=clients,
        sizes=None,
        read=reader.read,
        num_classes=len(task.tags),
        digest=lambda: ",".join([sampled_digest(path), *(file_digest(p) for p in vocabularies)]),
        where=path,
        input_shape=(len(task.words),),
    )
    try:
        return federated_data("tff_stackoverflow", source)
    except DataError:
        raise
    except Exception as e:  # the first client's read: a foreign file's records
        raise not_stackoverflow(f"{type(e).__name__}: {reason(e)}") from None
