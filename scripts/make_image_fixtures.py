"""Regenerates the CIFAR-10, CIFAR-100, SVHN and TFDS fixtures in testdata/ in the official
on-disk formats, deterministically: synthetic, learnable images (noise plus a bright bar whose
row and colour encode the label), each file under 100 KB.

    .venv/bin/python scripts/make_image_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import types
from collections.abc import Iterator

import numpy as np
from scipy.io import savemat

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
# The 116-byte text field of a MATLAB 5 header, without the creation time savemat puts there.
MAT_HEADER = b"MATLAB 5.0 MAT-file Platform: posix, Created by: make_image_fixtures.py".ljust(116)
ORIGIN = "Written by scripts/make_image_fixtures.py (synthetic images, not real data)."


def images(labels: np.ndarray, seed: int) -> np.ndarray:
    """(n, 32, 32, 3) uint8: noise in 0..59 plus a bar of value 230 on rows
    1 + (3 * label) % 29 .. +2, columns 2..29, channel label % 3."""
    rng = np.random.default_rng([21, seed])
    x = rng.integers(0, 60, (len(labels), 32, 32, 3)).astype(np.uint8)
    for i, label in enumerate(labels):
        row = 1 + (3 * int(label)) % 29
        x[i, row : row + 3, 2:30, int(label) % 3] = 230
    return x


def cifar_batch(labels: np.ndarray, seed: int, label_keys: dict[bytes, list[int]]) -> dict:
    """A batch dict as in the official pickles: b"data" (n, 3072) uint8 rows in CHW order."""
    x = images(labels, seed)
    return {
        b"batch_label": b"fixture batch",
        b"data": x.transpose(0, 3, 1, 2).reshape(len(labels), 3072),
        b"filenames": [f"fixture_{seed}_{i}.png".encode() for i in range(len(labels))],
        **label_keys,
    }


def write_pickle(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_readme(folder: str, text: str) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write(f"{text}\n\n{ORIGIN}\n")


def cifar10(root: str) -> None:
    """5 training batches of 20 images (labels 0..9 twice) and a test batch of 20."""
    folder = os.path.join(root, "cifar10_tiny", "cifar-10-batches-py")
    labels = np.arange(20) % 10
    for i in range(1, 6):
        batch = cifar_batch(labels, i, {b"labels": labels.tolist()})
        write_pickle(os.path.join(folder, f"data_batch_{i}"), batch)
    test = cifar_batch(labels, 6, {b"labels": labels.tolist()})
    write_pickle(os.path.join(folder, "test_batch"), test)
    write_readme(
        os.path.dirname(folder),
        "# cifar10_tiny\n\nCIFAR-10's Python pickle layout (`cifar-10-batches-py/data_batch_1..5`, "
        "`test_batch`; dicts with bytes keys `data` (n, 3072) uint8 in CHW order, `labels`, "
        "`filenames`, `batch_label`): 5 x 20 training and 20 test images, labels 0..9.",
    )


def cifar100(root: str) -> None:
    """30 training images with fine labels spread over 0..99 (0 and 99 included), 10 test."""
    folder = os.path.join(root, "cifar100_tiny", "cifar-100-python")
    for split, n, seed in (("train", 30, 7), ("test", 10, 8)):
        fine = np.round(np.linspace(0, 99, n)).astype(int)
        keys = {b"fine_labels": fine.tolist(), b"coarse_labels": (fine // 5).tolist()}
        write_pickle(os.path.join(folder, split), cifar_batch(fine, seed, keys))
    write_readme(
        os.path.dirname(folder),
        "# cifar100_tiny\n\nCIFAR-100's Python pickle layout (`cifar-100-python/train`, `test`; "
        "dicts with bytes keys `data` (n, 3072) uint8 in CHW order, `fine_labels`, "
        "`coarse_labels`, `filenames`, `batch_label`): 30 training and 10 test images, fine "
        "labels spread over 0..99.",
    )


def svhn(root: str) -> None:
    """train_32x32.mat (30 images) and test_32x32.mat (10): X (32, 32, 3, n) uint8, y (n, 1)
    uint8 in 1..10, where 10 is the digit 0."""
    folder = os.path.join(root, "svhn_tiny")
    os.makedirs(folder, exist_ok=True)
    for split, n, seed in (("train", 30, 9), ("test", 10, 10)):
        digits = np.arange(n) % 10
        mat = {
            "X": images(digits, seed).transpose(1, 2, 3, 0),
            "y": np.where(digits == 0, 10, digits).reshape(-1, 1).astype(np.uint8),
        }
        buffer = io.BytesIO()
        savemat(buffer, mat)
        blob = buffer.getvalue()
        with open(os.path.join(folder, f"{split}_32x32.mat"), "wb") as f:
            f.write(MAT_HEADER + blob[len(MAT_HEADER) :])  # no creation time: reproducible
    write_readme(
        folder,
        "# svhn_tiny\n\nSVHN's cropped-digits MATLAB files (`train_32x32.mat`, `test_32x32.mat`; "
        "`X` (32, 32, 3, n) uint8, `y` (n, 1) uint8 in 1..10 with 10 for the digit 0): 30 "
        "training and 10 test images.",
    )


def tfds_cifar10(root: str) -> None:
    """A prepared TFDS `cifar10` directory (30 train, 10 test images) written by TFDS itself:
    the real builder, with only its download step replaced by a generator of fixture images."""
    import tensorflow_datasets as tfds

    folder = os.path.join(root, "tfds_tiny")
    shutil.rmtree(os.path.join(folder, "cifar10"), ignore_errors=True)
    builder = tfds.builder("cifar10", data_dir=folder)

    def split_generators(self: object, dl_manager: object) -> dict:
        def examples(n: int, seed: int) -> Iterator[tuple[int, dict]]:
            labels = np.arange(n) % 10
            for i, (image, label) in enumerate(zip(images(labels, seed), labels)):
                yield i, {"id": f"fixture_{seed}_{i}", "image": image, "label": int(label)}

        return {"train": examples(30, 11), "test": examples(10, 12)}

    builder._split_generators = types.MethodType(split_generators, builder)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
        )
    )
    write_readme(
        folder,
        f"# tfds_tiny\n\nA prepared TFDS data directory: `cifar10/{builder.version}/` (tfrecord "
        "shards, dataset_info.json, features.json) as `tensorflow_datasets` 4.9 writes it, "
        "with 30 train and 10 test fixture images. Read it with `--tfds_dir`.",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=ROOT, help="folder to write the fixtures into")
    root = parser.parse_args().out
    cifar10(root)
    cifar100(root)
    svhn(root)
    tfds_cifar10(root)


if __name__ == "__main__":
    main()
