"""Regenerates the CIFAR-10, CIFAR-100 and SVHN fixtures in testdata/, in the official file
formats (deterministic): learnable synthetic images whose class sets a coloured bar's row."""

import os
import pickle

import numpy as np
from scipy.io import savemat

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
rng = np.random.default_rng(21)


def images(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(n, 32, 32, 3) uint8: noise plus a bright bar at a row and colour given by the label."""
    x = rng.integers(0, 60, (len(labels), 32, 32, 3)).astype(np.uint8)
    for i, label in enumerate(labels):
        row = 1 + (3 * int(label)) % 29
        x[i, row : row + 3, 2:30, int(label) % 3] = 230
    return x


def cifar_batch(labels: np.ndarray, num_classes: int, label_key: bytes) -> dict:
    x = images(labels, num_classes)
    return {
        b"data": x.transpose(0, 3, 1, 2).reshape(len(labels), 3072),
        label_key: [int(v) for v in labels],
        b"batch_label": b"fixture",
    }


def write(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def main() -> None:
    folder = os.path.join(ROOT, "cifar10_tiny", "cifar-10-batches-py")
    for i in range(1, 6):
        write(
            os.path.join(folder, f"data_batch_{i}"), cifar_batch(np.arange(20) % 10, 10, b"labels")
        )
    write(os.path.join(folder, "test_batch"), cifar_batch(np.arange(20) % 10, 10, b"labels"))
    folder = os.path.join(ROOT, "cifar100_tiny", "cifar-100-python")
    write(os.path.join(folder, "train"), cifar_batch(np.arange(200) % 100, 100, b"fine_labels"))
    write(os.path.join(folder, "test"), cifar_batch(np.arange(100) % 100, 100, b"fine_labels"))
    os.makedirs(os.path.join(ROOT, "svhn_tiny"), exist_ok=True)
    for split, n in (("train", 120), ("test", 30)):
        digits = np.arange(n) % 10
        labels = np.where(digits == 0, 10, digits)  # SVHN stores the digit 0 as label 10
        savemat(
            os.path.join(ROOT, "svhn_tiny", f"{split}_32x32.mat"),
            {
                "X": images(digits, 10).transpose(1, 2, 3, 0),
                "y": labels.reshape(-1, 1).astype(np.uint8),
            },
        )


def prepared_tfds_cifar10() -> None:
    """A prepared TFDS `cifar10` directory written by TFDS itself; only the examples are ours
    (the builder's download step is replaced by a generator of 30 + 10 fixture images)."""
    import types

    import tensorflow_datasets as tfds

    builder = tfds.builder("cifar10", data_dir=os.path.join(ROOT, "tfds_tiny"))

    def split_generators(self: object, dl_manager: object) -> dict:
        def examples(n: int) -> object:
            labels = np.arange(n) % 10
            for i, (image, label) in enumerate(zip(images(labels, 10), labels)):
                yield i, {"id": f"fixture_{i}", "image": image, "label": int(label)}

        return {"train": examples(30), "test": examples(10)}

    builder._split_generators = types.MethodType(split_generators, builder)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP
        )
    )


if __name__ == "__main__":
    main()
    prepared_tfds_cifar10()
