"""Regenerates testdata/tff_stackoverflow_tiny/: made-up posts in TFF's Stack Overflow format.

Regenerates testdata/tff_stackoverflow_tiny/, deterministically: made-up posts in the format
of TFF 0.87's federated Stack Overflow (`stackoverflow.sqlite`, read by
`tff.simulation.datasets.stackoverflow.load_data`), with the two vocabulary files TFF's
`load_word_counts` / `load_tag_counts` unpack next to it.

* stackoverflow.sqlite: `SqlClientData`'s `examples` and `client_metadata` tables (the schema
  TFF's writer `save_to_sql_client_data` creates, `make_tff_fixtures.new_database`), each
  example a serialized `tf.train.Example` with TFF's six features (`creation_date`, `score`,
  `tags` joined by "|", `title`, `tokens`, `type`). 20 clients with rows in `train` and `test`,
  one with `train` rows only and two in `heldout` only (TFF's held-out users), so a loader must
  pick the clients with both splits. Some test posts carry only a tag made after the training
  period ("swiftui-2018", in no count file); client 00000019's test posts all do.
* stackoverflow.word_count: "word count" lines, most frequent first: for every word of the train
  posts' `tokens`, the number of clients with a train post containing it (TFF's definition),
  ties by the word.
* stackoverflow.tag_count: JSON {tag: clients with a train post carrying it}.

    .venv/bin/python scripts/make_stackoverflow_fixture.py [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tff_fixtures import new_database  # noqa: E402 - the scripts folder is no package

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
# Topic -> (its tags, its words). A post draws one topic; its tags are 1-3 of the topic's.
TOPICS = {
    "python": (["python", "pandas", "django"], "list dict import def class dataframe pip"),
    "web": (["javascript", "html", "css"], "div function var dom browser style click"),
    "java": (["java", "android", "spring"], "public static void class activity bean jar"),
    "data": (["sql", "mysql", "database"], "select join table row index query where"),
}
COMMON = "the a i is to it how can error when with this in".split()
NEW_TAG = "swiftui-2018"  # in no count file: a tag first used after the training period
CLIENTS = [f"{i:08d}" for i in range(20)]


def post(topic: str, rng: np.random.Generator, tags: list[str], when: str) -> bytes:
    """One post as TFF stores it: a `tf.train.Example` of its six features."""
    words = TOPICS[topic][1].split() + COMMON
    tokens = " ".join(rng.choice(words, int(rng.integers(4, 12))))
    title = " ".join(rng.choice(words, int(rng.integers(2, 5))))

    def text(value: str) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))

    features = {
        "creation_date": text(when),
        "score": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(-2, 9))])),
        "tags": text("|".join(tags)),
        "title": text(title),
        "tokens": text(tokens),
        "type": text(str(rng.choice(["question", "answer"]))),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def topic_tags(topic: str, rng: np.random.Generator) -> list[str]:
    own = TOPICS[topic][0]
    return [str(t) for t in rng.choice(own, int(rng.integers(1, 4)), replace=False)]


def write(out: str) -> str:
    folder = os.path.join(out, "tff_stackoverflow_tiny")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "stackoverflow.sqlite")
    rng = np.random.default_rng(0)
    topics = list(TOPICS)
    rows: list[tuple[str, str, bytes]] = []
    word_clients: dict[str, set[str]] = collections.defaultdict(set)
    tag_clients: dict[str, set[str]] = collections.defaultdict(set)
    plan = [(c, ("train", "test")) for c in CLIENTS]
    plan += [("00000020", ("train",)), ("00000030", ("heldout",)), ("00000040", ("heldout",))]
    for k, (client, splits) in enumerate(plan):
        topic = topics[k % len(topics)]  # each client mostly writes on one topic
        for split in splits:
            for i in range(int(rng.integers(2, 5)) if split != "test" else 2):
                on = topic if rng.random() < 0.8 else str(rng.choice(topics))
                tags = topic_tags(on, rng)
                if split == "test" and (client == CLIENTS[-1] or (k + i) % 5 == 0):
                    tags = [NEW_TAG]
                when = "2018-03-01 10:00:00 UTC" if split == "test" else "2016-05-01 10:00:00 UTC"
                blob = post(on, rng, tags, when)
                rows.append((split, client, blob))
                if split == "train":
                    example = tf.train.Example.FromString(blob).features.feature
                    for word in example["tokens"].bytes_list.value[0].decode().split():
                        word_clients[word].add(client)
                    for tag in tags:
                        tag_clients[tag].add(client)
    with new_database(path) as db:
        db.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
        counts = collections.Counter((client, split) for split, client, _ in rows)
        db.executemany(
            "INSERT INTO client_metadata VALUES (?, ?, ?)",
            [(client, split, n) for (client, split), n in sorted(counts.items())],
        )
    db.close()
    ranked = sorted(word_clients.items(), key=lambda item: (-len(item[1]), item[0]))
    with open(os.path.join(folder, "stackoverflow.word_count"), "w") as f:
        f.writelines(f"{word} {len(clients)}\n" for word, clients in ranked)
    with open(os.path.join(folder, "stackoverflow.tag_count"), "w") as f:
        json.dump({tag: len(clients) for tag, clients in sorted(tag_clients.items())}, f)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write(
            "# tff_stackoverflow_tiny\n\nTFF 0.87's federated Stack Overflow format "
            "(`stackoverflow.sqlite`: tables `examples` and `client_metadata`, each example a "
            "serialized `tf.train.Example` with `creation_date`, `score`, `tags`, `title`, "
            "`tokens`, `type`; splits `train`, `test`, `heldout`) with made-up posts: 20 "
            "clients in train and test, one in train only, two in heldout only. "
            "`stackoverflow.word_count` and `stackoverflow.tag_count` are the vocabulary files "
            "TFF's `load_word_counts` / `load_tag_counts` unpack, computed from this train "
            f"split. Test posts tagged only `{NEW_TAG}` (in no count file) have no label; "
            f"client {CLIENTS[-1]}'s test posts all are. Made by "
            "scripts/make_stackoverflow_fixture.py.\n"
        )
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    print(write(parser.parse_args().out))
