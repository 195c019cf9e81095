"""`tff_stackoverflow`: TFF's Stack Overflow database read by client id, as single-label tag
prediction, checked against the fixture's raw protos decoded here with protobuf alone."""

from __future__ import annotations

import collections
import csv
import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, run_binary

from tff_clustered.cli import run_flags
from tff_clustered.data import DataError, load_dataset
from tff_clustered.data.federated_data import chosen_clients
from tff_clustered.data.registry import data_files, source_fingerprint
from tff_clustered.data.stackoverflow import connect, load_tff_stackoverflow
from tff_clustered.models import count_trainable_parameters, model_spec

TINY = os.path.join(ROOT, "testdata", "tff_stackoverflow_tiny")
DATABASE = os.path.join(TINY, "stackoverflow.sqlite")


def raw_posts() -> dict[tuple[str, str], list[dict[str, str]]]:
    """(client, split) -> its posts' tokens, title and tags, in the order of their rows."""
    posts = collections.defaultdict(list)
    with sqlite3.connect(DATABASE) as db:
        rows = db.execute(
            "SELECT client_id, split_name, serialized_example_proto FROM examples ORDER BY rowid"
        ).fetchall()
    for client, split, blob in rows:
        feature = tf.train.Example.FromString(blob).features.feature
        posts[client, split].append(
            {k: feature[k].bytes_list.value[0].decode() for k in ("tokens", "title", "tags")}
        )
    return posts


def drawn_ids(num_clients: int, seed: int) -> list[str]:
    """The clients a load draws: `chosen_clients` over the ids with train and test rows."""
    with sqlite3.connect(DATABASE) as db:
        both = sorted(
            set(db.execute("SELECT client_id FROM client_metadata WHERE split_name = 'train'"))
            & set(db.execute("SELECT client_id FROM client_metadata WHERE split_name = 'test'"))
        )
    rng = np.random.default_rng([seed, 11])
    return [both[k][0] for k in chosen_clients(len(both), num_clients, rng, "")]


def expected_client(
    posts: list[dict[str, str]], words: list[str], tags: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for post in posts:
        ranks = [tags.index(t) for t in post["tags"].split("|") if t in tags]
        if not ranks:
            continue
        counts = collections.Counter(
            w for w in f"{post['tokens']} {post['title']}".split() if w in words
        )
        total = sum(counts.values())
        xs.append([counts[w] / total if total else 0.0 for w in words])
        ys.append(min(ranks))
    return np.array(xs, np.float32).reshape(-1, len(words)), np.array(ys, np.int32)


def test_the_fixture_loads_as_tffs_bag_of_words_with_each_posts_most_frequent_tag() -> None:
    with open(os.path.join(TINY, "stackoverflow.word_count")) as f:
        words = [line.split()[0] for line in f]
    with open(os.path.join(TINY, "stackoverflow.tag_count")) as f:
        counts = json.load(f)
    tags = sorted(counts, key=lambda t: -counts[t])
    data = load_dataset("tff_stackoverflow", data_dir=TINY, num_clients=20)
    assert data.input_shape == (len(words),) and data.num_classes == len(tags) == 12
    posts = raw_posts()
    # 20 clients have train and test posts (not 00000020: train only; 00000030/40: heldout);
    # 00000019's test posts carry only a tag outside the counts, so it has no test example.
    assert data.client_ids == [f"{i:08d}" for i in range(19)]
    dropped = 0
    for client in data.client_ids:
        for split in ("train", "test"):
            x, y = expected_client(posts[client, split], words, tags)
            dropped += len(posts[client, split]) - len(y)
            got = data.arrays(split, client)
            np.testing.assert_array_equal(got["y"], y)
            np.testing.assert_allclose(got["x"], x, rtol=1e-6)
    assert dropped > 0  # posts without a counted tag are left out


def test_only_the_drawn_clients_rows_are_read_and_the_draw_follows_the_seed() -> None:
    fetched: list[str] = []
    statements: list[str] = []

    def traced(path: str) -> sqlite3.Connection:
        db = connect(path)
        db.set_trace_callback(statements.append)

        def record(cursor: sqlite3.Cursor, row: tuple) -> tuple:
            if [c[0] for c in cursor.description][-1] == "serialized_example_proto":
                fetched.append(row[0])
            return row

        db.row_factory = record
        return db

    data = load_tff_stackoverflow(TINY, num_clients=5, seed=3, open_database=traced)
    drawn = drawn_ids(5, 3)
    with sqlite3.connect(DATABASE) as db:
        marks = ",".join("?" * len(drawn))
        rows = db.execute(
            f"SELECT count(*) FROM examples WHERE client_id IN ({marks}) "
            "AND split_name IN ('train', 'test')",
            drawn,
        ).fetchone()[0]
    assert set(data.client_ids) <= set(drawn) and set(fetched) == set(drawn)
    assert len(fetched) == rows < 102  # the 102 train and test rows of the whole file
    assert [s for s in statements if "FROM examples" in s] == [
        "SELECT client_id, split_name, serialized_example_proto FROM examples "
        "WHERE client_id IN (SELECT client_id FROM drawn) AND split_name IN ('train', 'test')"
    ]
    again = load_tff_stackoverflow(TINY, num_clients=5, seed=3)
    assert again.client_ids == data.client_ids
    for client in data.client_ids:
        np.testing.assert_array_equal(
            again.arrays("train", client)["x"], data.arrays("train", client)["x"]
        )
    assert load_tff_stackoverflow(TINY, num_clients=5, seed=4).client_ids != data.client_ids


def test_missing_or_foreign_files_are_one_line_data_errors(tmp_path: Path) -> None:
    def error(**kwargs: Any) -> str:
        with pytest.raises(DataError) as raised:
            load_dataset("tff_stackoverflow", data_dir=str(tmp_path), **kwargs)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    message = error(num_clients=2)
    assert "needs stackoverflow.sqlite in --data_dir" in message
    assert "https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma" in message
    (tmp_path / "stackoverflow.sqlite").write_bytes(b"not a database at all" * 100)
    assert "is not TFF's federated Stack Overflow database" in error(num_clients=2)
    shutil.copy(
        os.path.join(ROOT, "testdata", "tff_emnist_tiny", "emnist_all.sqlite"),
        tmp_path / "stackoverflow.sqlite",
    )
    assert "no client has posts in both train and test" in error(num_clients=2)
    shutil.copy(DATABASE, tmp_path)
    assert "give --num_clients" in error()
    assert "use --num_clients between 1 and 20" in error(num_clients=21)
    (tmp_path / "stackoverflow.word_count").write_text("error 17\nis\n")
    assert "stackoverflow.word_count line 2: 'is' is not 'word count'" in error(num_clients=2)
    (tmp_path / "stackoverflow.word_count").unlink()
    (tmp_path / "stackoverflow.tag_count").write_text('["python"]')
    assert "stackoverflow.tag_count is not TFF's tag counts" in error(num_clients=2)
    shutil.copy(os.path.join(TINY, "stackoverflow.tag_count"), tmp_path)
    assert "--num_classes=13: " in error(num_clients=2, num_classes=13)
    assert "--num_classes=0: " in error(num_clients=2, num_classes=0)  # no tag: every post dropped


def test_the_num_classes_range_a_refusal_names_is_the_range_accepted() -> None:
    """The refusal's range is what the loader and --num_classes accept: from 2 (a classifier
    tells two classes apart; the flag's lower bound) to the fixture's 12 tags."""
    for refused in (1, 13):
        with pytest.raises(DataError) as raised:
            load_tff_stackoverflow(TINY, None, num_classes=refused)
        assert str(raised.value).endswith("gives 12 tags; use --num_classes between 2 and 12")
    for accepted in (2, 12):
        assert load_tff_stackoverflow(TINY, None, num_classes=accepted).num_classes == accepted
    assert run_flags.FLAGS["num_classes"].parser.lower_bound == 2


def test_without_the_vocabulary_files_the_drawn_clients_train_posts_give_them(
    tmp_path: Path,
) -> None:
    shutil.copy(DATABASE, tmp_path)
    data = load_tff_stackoverflow(str(tmp_path), num_clients=6, seed=0, num_classes=5)
    posts = raw_posts()
    drawn = drawn_ids(6, 0)
    word_clients = collections.Counter(
        w for c in drawn for w in {w for p in posts[c, "train"] for w in p["tokens"].split()}
    )
    tag_clients = collections.Counter(
        t for c in drawn for t in {t for p in posts[c, "train"] for t in p["tags"].split("|")}
    )
    words = sorted(word_clients, key=lambda w: (-word_clients[w], w))
    tags = sorted(tag_clients, key=lambda t: (-tag_clients[t], t))[:5]
    assert data.input_shape == (len(words),) and data.num_classes == 5
    assert data.client_ids  # each kept client's posts labelled by the draw's own vocabularies
    for client in data.client_ids:
        x, y = expected_client(posts[client, "train"], words, tags)
        np.testing.assert_array_equal(data.arrays("train", client)["y"], y)
        np.testing.assert_allclose(data.arrays("train", client)["x"], x, rtol=1e-6)
    cut = load_tff_stackoverflow(TINY, num_clients=4, seed=0, word_vocabulary_size=5)
    assert cut.input_shape == (5,)


def test_the_fingerprint_lists_the_database_and_both_vocabularies() -> None:
    names = ["stackoverflow.sqlite", "stackoverflow.word_count", "stackoverflow.tag_count"]
    assert data_files("tff_stackoverflow", TINY) == [os.path.join(TINY, n) for n in names]
    assert sorted(source_fingerprint("tff_stackoverflow", TINY).files) == sorted(names)


def test_tffs_logistic_regression_is_mclr_over_the_bag_of_words() -> None:
    # TFF's baseline: one Dense layer from 10,000 words to 500 tags (sigmoid there, softmax here).
    full = model_spec("mclr", (10_000,), 500).build()
    assert count_trainable_parameters(full) == 10_000 * 500 + 500
    data = load_dataset("tff_stackoverflow", data_dir=TINY, num_clients=20)
    batch = data.arrays("train", data.client_ids[0])
    model = model_spec("mclr", data.input_shape, data.num_classes).build()
    logits = model(batch["x"])
    assert logits.shape == (len(batch["y"]), 12)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=batch["y"], logits=logits)
    assert np.all(np.isfinite(loss.numpy()))
    padded = np.pad(batch["x"], ((0, 0), (0, 10_000 - data.input_shape[0])))
    assert full(padded).shape == (len(batch["y"]), 500)


def test_without_num_clients_every_client_is_read_lazily_as_the_drawn_path_reads_it() -> None:
    statements: list[str] = []

    def traced(path: str) -> sqlite3.Connection:
        db = connect(path)
        db.set_trace_callback(statements.append)
        return db

    lazy = load_tff_stackoverflow(TINY, num_clients=None, open_database=traced)
    # Start-up: one query of client_metadata and the first client's train posts, nothing else.
    assert not [s for s in statements if "examples" in s and "PRAGMA" not in s]
    assert lazy.source is not None and lazy.source.reads == 1
    # Every client with train and test rows, 00000019 too (its test posts have no counted tag).
    assert lazy.client_ids == [f"{i:08d}" for i in range(20)]
    drawn = load_dataset("tff_stackoverflow", data_dir=TINY, num_clients=20)
    assert drawn.client_ids == lazy.client_ids[:19]
    assert (lazy.input_shape, lazy.num_classes) == (drawn.input_shape, drawn.num_classes)
    for client in drawn.client_ids:
        for split in ("train", "test"):
            got, expected = lazy.arrays(split, client), drawn.arrays(split, client)
            for key in ("x", "y"):
                assert got[key].dtype == expected[key].dtype
                np.testing.assert_array_equal(got[key], expected[key])
        assert lazy.train_sizes[client] == drawn.train_sizes[client]
        assert lazy.test_sizes[client] == drawn.test_sizes[client]
    assert len(lazy.arrays("train", "00000019")["y"]) > 0
    with pytest.raises(DataError) as raised:
        lazy.arrays("test", "00000019")
    message = str(raised.value)
    assert message.startswith(
        f"client '00000019' (test) in {DATABASE}: none of its 2 posts has a tag among the 12 "
        "most frequent, so it has no example"
    )
    assert "give --num_clients" in message and "\n" not in message


def test_a_lazy_run_needs_tffs_vocabulary_files_and_names_them(tmp_path: Path) -> None:
    shutil.copy(DATABASE, tmp_path)
    words = tmp_path / "stackoverflow.word_count"
    tags = tmp_path / "stackoverflow.tag_count"
    with pytest.raises(DataError) as raised:
        load_dataset("tff_stackoverflow", data_dir=str(tmp_path))
    message = str(raised.value)
    assert f"{words} and {tags} are absent" in message
    for url in (
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2",
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.tag_count.tar.bz2",
    ):
        assert url in message
    shutil.copy(os.path.join(TINY, "stackoverflow.word_count"), tmp_path)
    with pytest.raises(DataError, match=f"{tags} is absent"):
        load_dataset("tff_stackoverflow", data_dir=str(tmp_path))
    shutil.copy(os.path.join(TINY, "stackoverflow.tag_count"), tmp_path)
    assert len(load_dataset("tff_stackoverflow", data_dir=str(tmp_path)).client_ids) == 20


def test_a_lazy_run_fingerprints_the_database_by_samples_and_the_drawn_run_whole() -> None:
    lazy = source_fingerprint("tff_stackoverflow", TINY).files
    drawn = source_fingerprint("tff_stackoverflow", TINY, num_clients=5).files
    assert lazy["stackoverflow.sqlite"].split(":")[1].startswith("sampled-")
    assert not drawn["stackoverflow.sqlite"].split(":")[1].startswith("sampled-")
    for vocabulary in ("stackoverflow.word_count", "stackoverflow.tag_count"):
        assert lazy[vocabulary] == drawn[vocabulary]


def test_train_runs_a_few_rounds_over_every_client_read_lazily(tmp_path: Path) -> None:
    """train.py without --num_clients on the fixture less 00000019 (whose test posts carry no
    counted tag, which a lazy run refuses at its read): each evaluated client's row in
    clients.csv has the drawn path's example counts."""
    data = tmp_path / "data"
    shutil.copytree(TINY, data)
    with sqlite3.connect(data / "stackoverflow.sqlite") as db:
        for table in ("examples", "client_metadata"):
            db.execute(f"DELETE FROM {table} WHERE client_id = '00000019'")
    out = tmp_path / "run"
    done = run_binary(
        [
            os.path.join("binaries", "train.py"),
            "--dataset=tff_stackoverflow",
            f"--data_dir={data}",
            "--model=mclr",
            "--algorithm=fedavg",
            "--rounds=3",
            "--clients_per_round=4",
            "--local_epochs=1",
            "--execution=in_process",
            f"--output_dir={out}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "metrics.csv") as f:
        assert [int(row["round"]) for row in csv.DictReader(f)][-1] == 3
    drawn = load_dataset("tff_stackoverflow", data_dir=TINY, num_clients=20)
    with open(out / "clients.csv") as f:
        last = [row for row in csv.DictReader(f) if row["round"] == "3"]
    assert sorted(row["client"] for row in last) == drawn.client_ids
    for row in last:
        assert int(row["train_examples"]) == drawn.train_sizes[row["client"]]
        assert int(row["test_examples"]) == drawn.test_sizes[row["client"]]
