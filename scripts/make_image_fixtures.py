"""Regenerates the CIFAR-10, CIFAR-100, SVHN, TFDS and PathMNIST fixtures in testdata/.

Regenerates the CIFAR-10, CIFAR-100, SVHN, TFDS and PathMNIST fixtures in testdata/ in the
official on-disk formats, deterministically: synthetic, learnable images (CIFAR/SVHN/TFDS: noise
plus a bright bar whose row and colour encode the label, each file under 100 KB; PathMNIST: a
class colour and stripe pattern plus noise, the .npz under 300 KB).

    .venv/bin/python scripts/make_image_fixtures.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import types
import zipfile
from collections.abc import Callable, Iterator

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


# PathMNIST (MedMNIST v2): 9 classes; per class 12, 16 or 20 training images (uneven, as the
# real classes are), 2 validation and 4 test images.
PATHMNIST_TRAIN = tuple(12 + 4 * (c % 3) for c in range(9))
PATHMNIST_VAL, PATHMNIST_TEST = 2, 4


def pathmnist_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """(n, 28, 28, 3) uint8: class c's colour (hue c/9, values 40..200) plus stripes of
    amplitude 40 and width 1 + c % 4 pixels (horizontal for c < 5, else vertical), plus noise
    in 0..3, so both the mean colour and the pattern give the class away."""
    rng = np.random.default_rng([23, seed])
    hue = 2 * np.pi * np.arange(9) / 9
    colours = 120 + 80 * np.cos(hue[:, None] - 2 * np.pi * np.arange(3) / 3)  # (9, 3)
    grid = np.arange(28)
    x = np.empty((len(labels), 28, 28, 3), np.uint8)
    for i, c in enumerate(int(c) for c in labels):
        along = grid[:, None] if c < 5 else grid[None, :]
        stripes = 40.0 * ((along // (1 + c % 4)) % 2) * np.ones((28, 28))
        noise = rng.integers(0, 4, (28, 28, 3))
        x[i] = np.clip(colours[c] + stripes[..., None] + noise - 20, 0, 255).astype(np.uint8)
    return x


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """What np.savez_compressed writes (a deflated zip of .npy members), with a fixed member
    time so that the bytes are the same every run."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(value), allow_pickle=False)


def pathmnist(root: str) -> None:
    """pathmnist_tiny/pathmnist.npz with MedMNIST v2's keys, dtypes and shapes: 144 training
    (12/16/20 per class), 18 validation and 36 test images, labels uint8 (n, 1), shuffled."""
    rng = np.random.default_rng(24)
    arrays = {}
    counts = {"train": PATHMNIST_TRAIN, "val": (PATHMNIST_VAL,) * 9, "test": (PATHMNIST_TEST,) * 9}
    for seed, (split, per_class) in enumerate(counts.items()):
        labels = rng.permutation(np.repeat(np.arange(9), per_class)).astype(np.uint8)
        arrays[f"{split}_images"] = pathmnist_images(labels, seed)
        arrays[f"{split}_labels"] = labels.reshape(-1, 1)
    folder = os.path.join(root, "pathmnist_tiny")
    write_npz(os.path.join(folder, "pathmnist.npz"), arrays)
    write_readme(
        folder,
        "# pathmnist_tiny\n\nMedMNIST v2's `pathmnist.npz` layout (`train_images` (n, 28, 28, 3) "
        "uint8, `train_labels` (n, 1) uint8 in 0..8, and the same for `val_` and `test_`): 144 "
        "training (12, 16 or 20 per class), 18 validation and 36 test images. A class sets the "
        "mean colour and the stripe pattern.",
    )


FIXTURES: dict[str, Callable[[str], None]] = {
    "cifar10": cifar10,
    "cifar100": cifar100,
    "svhn": svhn,
    "tfds": tfds_cifar10,
    "pathmnist": pathmnist,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=ROOT, help="folder to write the fixtures into")
    parser.add_argument(
        "--only", nargs="+", choices=list(FIXTURES), help="write only these fixtures (default: all)"
    )
    args = parser.parse_args()
    for name in args.only or FIXTURES:
        FIXTURES[name](args.out)


if __name__ == "__main__":
    main()
