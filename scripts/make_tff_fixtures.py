"""Regenerates the tiny real-format TFF databases under testdata/, deterministically.

Regenerates the tiny real-format TFF databases under testdata/, deterministically, with
made-up content in TFF 0.87's `SqlClientData` format (the `examples` and `client_metadata`
tables, each example a serialized `tf.train.Example`):

* testdata/tff_emnist_tiny/emnist_all.sqlite: federated EMNIST, `pixels` 28x28 floats and an
  int64 `label`, 4 made-up writers. Each image is a bright bar whose row encodes its label, on
  a white background of value 1 as in TFF's EMNIST. Splits: `digits_only_train`/
  `digits_only_test` (labels 0-9) and `all_train`/`all_test` (labels 0-61).
* testdata/tff_cifar100_tiny/cifar100.sqlite: federated CIFAR-100, `image` 32x32x3 int64
  (0..255), an int64 fine `label` (0-99) and `coarse_label` (0-19; here made up as label // 5,
  not CIFAR-100's own grouping). Splits `train` (3 clients of 5-6 images) and `test` (2 other
  clients, ids "0" and "1" as in TFF, whose test ids reuse the train ids for other people).
  Each image is dark noise with a bright 3x3 patch at row 3 * (label // 10), column
  3 * (label % 10).
* testdata/tff_shakespeare_tiny/shakespeare.sqlite: federated Shakespeare, one `snippets`
  string per record, splits `train` and `test` for the same 4 speaking parts; the text is
  Shakespeare's (public domain), a few lines each. One part has fewer than 81 characters in its
  test split, so it has no next-character example there and the loader leaves it out.

    .venv/bin/python scripts/make_tff_fixtures.py [--out DIR]   (DIR/tff_emnist_tiny, ...)
"""

from __future__ import annotations

import argparse
import os
import sqlite3

import numpy as np
import tensorflow as tf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
WRITERS = ("f0000_14", "f0001_41", "f0002_07", "f0003_33")
# (split, examples per writer, classes)
SPLITS = (
    ("digits_only_train", 5, 10),
    ("digits_only_test", 2, 10),
    ("all_train", 3, 62),
    ("all_test", 2, 62),
)
# CIFAR-100: (split, {client: examples}); train and test clients are different people.
CIFAR_SPLITS = (
    ("train", {"0": 5, "1": 6, "2": 5}),
    ("test", {"0": 1, "1": 1}),
)


def example(label: int, rng: np.random.Generator) -> bytes:
    pixels = np.ones((28, 28), np.float32) - rng.uniform(0, 0.1, (28, 28)).astype(np.float32)
    row = label % 28
    pixels[row, 4:24] = 0.0  # dark ink on white
    features = {
        "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=pixels.ravel())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def cifar_example(label: int, rng: np.random.Generator) -> bytes:
    """One CIFAR-100 record as TFF stores it: `image` as 3,072 int64 values (HWC order),
    `label`, `coarse_label`. Noise below 48 keeps most values one byte long."""
    image = rng.integers(0, 48, (32, 32, 3))
    row, col = 3 * (label // 10), 3 * (label % 10)
    image[row : row + 3, col : col + 3] = 200
    features = {
        "image": tf.train.Feature(int64_list=tf.train.Int64List(value=image.ravel())),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "coarse_label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label // 5])),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


# Speaking part -> (train snippets, test snippets), as TFF names its clients (PLAY_CHARACTER).
SHAKESPEARE_PARTS = {
    "THE_TRAGEDY_OF_MACBETH_MACBETH": (
        [
            "Tomorrow, and tomorrow, and tomorrow,\nCreeps in this petty pace from day to day,",
            "To the last syllable of recorded time;\nAnd all our yesterdays have lighted fools",
            "The way to dusty death. Out, out, brief candle!",
        ],
        [
            "Life's but a walking shadow, a poor player\n"
            "That struts and frets his hour upon the stage"
        ],
    ),
    "THE_TRAGEDY_OF_HAMLET_PRINCE_OF_DENMARK_HAMLET": (
        [
            "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
            "The slings and arrows of outrageous fortune,\n"
            "Or to take arms against a sea of troubles",
        ],
        ["And by opposing end them. To die, to sleep;\nNo more; and by a sleep to say we end"],
    ),
    "MUCH_ADO_ABOUT_NOTHING_BEATRICE": (
        [
            "I had rather hear my dog bark at a crow than a man swear he loves me.",
            "I wonder that you will still be talking, Signior Benedick: nobody marks you.",
        ],
        ["What, my dear Lady Disdain! are you yet living?  Is it possible disdain should die?"],
    ),
    "THE_TEMPEST_CALIBAN": (
        ["This island's mine, by Sycorax my mother,\nWhich thou takest from me."],
        ["You taught me language."],
    ),
}


def snippet_example(text: str) -> bytes:
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")]))
    features = tf.train.Features(feature={"snippets": feature})
    return tf.train.Example(features=features).SerializeToString()


def new_database(path: str) -> sqlite3.Connection:
    """An empty database at `path` with the two tables `SqlClientData` reads."""
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
        "serialized_example_proto BLOB NOT NULL);"
    )
    db.execute(
        "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
        "num_examples INTEGER NOT NULL);"
    )
    return db


def write_emnist(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "emnist_all.sqlite")
    rng = np.random.default_rng(0)
    with new_database(path) as db:
        for split, count, classes in SPLITS:
            for w, writer in enumerate(WRITERS):
                labels = [
                    (w + i) % classes if classes == 10 else (w * 13 + i * 7) % classes
                    for i in range(count)
                ]
                for label in labels:
                    db.execute(
                        "INSERT INTO examples VALUES (?, ?, ?)",
                        (split, writer, example(label, rng)),
                    )
                db.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (writer, split, count))
    db.close()
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(
            "# tff_emnist_tiny\n\nTFF 0.87's federated EMNIST format (`emnist_all.sqlite`) with "
            "made-up content: 4 writers; each image a dark bar whose row encodes its label. Made "
            "by scripts/make_tff_fixtures.py.\n"
        )
    return path


def write_cifar100(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "cifar100.sqlite")
    rng = np.random.default_rng(1)
    with new_database(path) as db:
        for s, (split, sizes) in enumerate(CIFAR_SPLITS):
            for c, (client, count) in enumerate(sizes.items()):
                for i in range(count):
                    label = (37 * c + 23 * i + 11 * s) % 100
                    db.execute(
                        "INSERT INTO examples VALUES (?, ?, ?)",
                        (split, client, cifar_example(label, rng)),
                    )
                db.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (client, split, count))
    db.close()
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(
            "# tff_cifar100_tiny\n\nTFF 0.87's federated CIFAR-100 format (`cifar100.sqlite`: "
            "splits `train` and `test`, each record `image` 32x32x3, `label` 0-99, "
            "`coarse_label` 0-19) with made-up content: 3 train clients of 5-6 images and 2 "
            "other test clients of 1 image; each image dark noise with a bright 3x3 patch at row "
            "3 * (label // 10), column 3 * (label % 10); coarse label = label // 5 (not "
            "CIFAR-100's grouping). Made by scripts/make_tff_fixtures.py.\n"
        )
    return path


def write_shakespeare(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "shakespeare.sqlite")
    with new_database(path) as db:
        for part, splits in SHAKESPEARE_PARTS.items():
            for split, snippets in zip(("train", "test"), splits):
                for text in snippets:
                    db.execute(
                        "INSERT INTO examples VALUES (?, ?, ?)",
                        (split, part, snippet_example(text)),
                    )
                db.execute(
                    "INSERT INTO client_metadata VALUES (?, ?, ?)", (part, split, len(snippets))
                )
    db.close()
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(
            "# tff_shakespeare_tiny\n\nTFF 0.87's federated Shakespeare format "
            "(`shakespeare.sqlite`: splits `train` and `test` for the same clients, each record "
            "one `snippets` string) with 4 speaking parts of a few lines of Shakespeare each "
            "(public domain). THE_TEMPEST_CALIBAN's test text is shorter than 81 characters, so "
            "it has no next-character example there. Made by scripts/make_tff_fixtures.py.\n"
        )
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=OUT)
    out = parser.parse_args().out
    for path in (
        write_emnist(os.path.join(out, "tff_emnist_tiny")),
        write_cifar100(os.path.join(out, "tff_cifar100_tiny")),
        write_shakespeare(os.path.join(out, "tff_shakespeare_tiny")),
    ):
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
