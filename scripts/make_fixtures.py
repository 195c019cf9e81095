"""Regenerates the MNIST-IDX and Sent140 fixtures in testdata/ (deterministic)."""

import gzip
import json
import os
import random
import struct

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
rng = np.random.default_rng(11)


def write_idx(path: str, arr: np.ndarray) -> None:
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(b"\x00\x00\x08" + bytes([arr.ndim]))
        f.write(struct.pack(">" + "I" * arr.ndim, *arr.shape))
        f.write(arr.astype(np.uint8).tobytes())


def images(labels: np.ndarray) -> np.ndarray:
    # A bright bar whose row encodes the label, plus noise: learnable.
    x = np.zeros((len(labels), 28, 28), np.uint8)
    for i, label in enumerate(labels):
        x[i, 2 + 2 * label : 4 + 2 * label, 4:24] = 200 + rng.integers(0, 55)
        x[i][rng.random((28, 28)) < 0.02] = 90
    return x


d = os.path.join(ROOT, "mnist_idx_tiny")
os.makedirs(d, exist_ok=True)
ytr = np.repeat(np.arange(10), 24)
rng.shuffle(ytr)
yte = np.repeat(np.arange(10), 6)
rng.shuffle(yte)
write_idx(f"{d}/train-images-idx3-ubyte.gz", images(ytr))
write_idx(f"{d}/train-labels-idx1-ubyte.gz", ytr)
write_idx(f"{d}/t10k-images-idx3-ubyte.gz", images(yte))
write_idx(f"{d}/t10k-labels-idx1-ubyte.gz", yte)
with open(f"{d}/README.md", "w") as f:
    f.write(
        "# mnist_idx_tiny\n\nMNIST's file format with made-up content: the four gzipped IDX "
        "files, 240 + 60 28x28 images, 30 per digit. Each image is a bright bar whose row "
        "encodes its label, plus noise. Made by scripts/make_fixtures.py.\n"
    )

random.seed(3)
d = os.path.join(ROOT, "sent140_tiny")
pos, neg = ["good", "happy", "love", "great"], ["bad", "sad", "hate", "awful"]
filler = ["the", "a", "day", "is", "so", "not"]


def tweet(label: int) -> str:
    tokens = [random.choice(filler) for _ in range(random.randint(2, 8))]
    tokens += [random.choice(pos if label else neg)] + random.choice([["!"], ["."], []])
    if random.random() < 0.3:
        tokens.append("unknownword")
    random.shuffle(tokens)
    return " ".join(tokens)


for split, n in (("train", 12), ("test", 4)):
    os.makedirs(f"{d}/{split}", exist_ok=True)
    users = [f"user{i}" for i in range(3)]
    user_data = {}
    for j, u in enumerate(users):
        ys = [random.randint(0, 1) for _ in range(n)]
        user_data[u] = {
            "x": [
                [str(1000 * j + k), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", u, tweet(y)]
                for k, y in enumerate(ys)
            ],
            # Some positives as the raw Sentiment140 label 4.
            "y": [4 if (y and k % 3 == 0) else y for k, y in enumerate(ys)],
        }
    blob = {"users": users, "num_samples": [n] * 3, "user_data": user_data}
    with open(f"{d}/{split}/all_data_niid_03_keep_30_{split}_9.json", "w") as f:
        json.dump(blob, f)
with open(f"{d}/glove_tiny.300d.txt", "w") as f:
    for w in filler + pos + neg + ["!", "."]:
        v = rng.normal(0, 0.3, 300)
        v[:10] += 1.0 if w in pos else -1.0 if w in neg else 0.0
        f.write(w + " " + " ".join(f"{x:.4f}" for x in v) + "\n")
with open(f"{d}/README.md", "w") as f:
    f.write(
        "# sent140_tiny\n\nSent140 in LEAF's format (train/*.json, test/*.json): 3 users, each "
        "example a raw row [id, date, query, user, text] as LEAF writes it; labels 0/1, some "
        "positives written as the raw label 4. glove_tiny.300d.txt is a GloVe-format text file "
        "(a word and 300 values per line); 'unknownword' is deliberately out of vocabulary. "
        "Made by scripts/make_fixtures.py.\n"
    )
