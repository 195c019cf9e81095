"""Regenerates testdata/tff_emnist_tiny/emnist_all.sqlite: TFF 0.87's federated EMNIST format
(the `examples` and `client_metadata` tables of `SqlClientData`, each example a serialized
`tf.train.Example` with `pixels` 28x28 floats and an int64 `label`) with 4 made-up writers,
deterministically. Each image is a bright bar whose row encodes its label, on a white
background of value 1 as in TFF's EMNIST. Splits: `digits_only_train`/`digits_only_test`
(labels 0-9) and `all_train`/`all_test` (labels 0-61).

    .venv/bin/python scripts/make_tff_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sqlite3

import numpy as np
import tensorflow as tf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "tff_emnist_tiny")
WRITERS = ("f0000_14", "f0001_41", "f0002_07", "f0003_33")
# (split, examples per writer, classes)
SPLITS = (
    ("digits_only_train", 5, 10),
    ("digits_only_test", 2, 10),
    ("all_train", 3, 62),
    ("all_test", 2, 62),
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=OUT)
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "emnist_all.sqlite")
    if os.path.exists(path):
        os.remove(path)
    rng = np.random.default_rng(0)
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
            "serialized_example_proto BLOB NOT NULL);"
        )
        db.execute(
            "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
            "num_examples INTEGER NOT NULL);"
        )
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
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(
            "# tff_emnist_tiny\n\nTFF 0.87's federated EMNIST format (`emnist_all.sqlite`) with "
            "made-up content: 4 writers; each image a dark bar whose row encodes its label. Made "
            "by scripts/make_tff_fixtures.py.\n"
        )
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
