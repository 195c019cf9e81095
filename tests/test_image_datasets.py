"""FedTSDP's data: partitions, the CIFAR/SVHN readers on real-format fixtures, the digits
partitions with a public set, and bad-input errors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from conftest import TESTDATA

from tff_clustered.data import DataError, load_dataset
from tff_clustered.data import partitions as parts
from tff_clustered.data.images import read_cifar, read_svhn

LABELS = np.repeat(np.arange(10), 100)


def label_entropy(labels: np.ndarray, chunks: list) -> float:
    """Mean over clients of the entropy of their label distribution."""
    values = []
    for idx in chunks:
        p = np.bincount(labels[idx], minlength=10) / len(idx)
        values.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(values))


def disjoint_cover(chunks: list, n: int) -> bool:
    joined = np.concatenate(chunks)
    return len(joined) == n and len(np.unique(joined)) == n


def test_iid_partition_is_even_and_covers_everything() -> None:
    chunks = parts.iid_partition(LABELS, 7, np.random.default_rng(0))
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and disjoint_cover(chunks, len(LABELS))


def test_dirichlet_partition_skews_more_with_smaller_beta() -> None:
    skewed = parts.dirichlet_partition(LABELS, 10, 0.1, np.random.default_rng(1))
    mild = parts.dirichlet_partition(LABELS, 10, 10.0, np.random.default_rng(1))
    for chunks in (skewed, mild):
        assert disjoint_cover(chunks, len(LABELS))
        assert min(len(c) for c in chunks) >= 10
    assert label_entropy(LABELS, skewed) < label_entropy(LABELS, mild) - 0.5
    again = parts.dirichlet_partition(LABELS, 10, 0.1, np.random.default_rng(1))
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again))
    other = parts.dirichlet_partition(LABELS, 10, 0.1, np.random.default_rng(2))
    assert not all(np.array_equal(a, b) for a, b in zip(skewed, other))


def test_pathological_partition_gives_exactly_two_classes_per_client() -> None:
    chunks = parts.pathological_partition(LABELS, 20, 2, np.random.default_rng(0))
    assert disjoint_cover(chunks, len(LABELS))
    assert all(len(np.unique(LABELS[c])) == 2 for c in chunks)


def test_partition_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="fewer clients"):
        parts.dirichlet_partition(LABELS, 200, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="beta"):
        parts.dirichlet_partition(LABELS, 5, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown partition"):
        parts.partition(LABELS, 5, "zipf", np.random.default_rng(0))


@pytest.mark.parametrize(
    "name, folder, train, classes",
    [("cifar10", "cifar10_tiny", 100, 10), ("cifar100", "cifar100_tiny", 200, 100)],
)
def test_cifar_readers_read_the_official_pickles(
    name: str, folder: str, train: int, classes: int
) -> None:
    x_train, y_train, x_test, y_test = read_cifar(name, os.path.join(TESTDATA, folder))
    assert x_train.shape == (train, 32, 32, 3) and x_train.dtype == np.uint8
    assert y_train.max() == classes - 1 and len(x_test) == len(y_test)
    # The bar encoding the label sits on the label's rows: the HWC layout is right.
    row = 1 + (3 * int(y_train[3])) % 29
    assert x_train[3, row, 10, int(y_train[3]) % 3] == 230


def test_svhn_reader_maps_label_10_to_digit_0() -> None:
    x_train, y_train, x_test, _ = read_svhn(os.path.join(TESTDATA, "svhn_tiny"))
    assert x_train.shape == (120, 32, 32, 3) and len(x_test) == 30
    assert y_train.min() == 0 and y_train.max() == 9 and (y_train == 0).sum() == 12


def test_image_federation_standardises_and_keeps_the_test_split_as_public_data() -> None:
    data = load_dataset(
        "cifar10",
        data_dir=os.path.join(TESTDATA, "cifar10_tiny"),
        partition="iid",
        num_clients=4,
    )
    assert len(data.client_ids) == 4 and data.input_shape == (32, 32, 3)
    assert data.public_x.shape == (20, 32, 32, 3)
    assert sum(data.train_sizes.values()) + sum(data.test_sizes.values()) == 100
    assert all(data.train_sizes[c] == 20 and data.test_sizes[c] == 5 for c in data.client_ids)
    pooled = np.concatenate(
        [
            next(iter(data.train.create_tf_dataset_for_client(c).batch(100)))["x"]
            for c in data.client_ids
        ]
        + [
            next(iter(data.test.create_tf_dataset_for_client(c).batch(100)))["x"]
            for c in data.client_ids
        ]
    )
    np.testing.assert_allclose(pooled.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(pooled.std(axis=(0, 1, 2)), 1.0, atol=1e-3)


def test_missing_and_corrupt_image_files_say_what_to_do(tmp_path: object) -> None:
    with pytest.raises(DataError, match="cifar-10-batches-py.*kriz/cifar"):
        load_dataset("cifar10", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="train_32x32.mat.*housenumbers"):
        load_dataset("svhn", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="--data_dir"):
        load_dataset("cifar100")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_1 cannot be read"):
        read_cifar("cifar10", str(tmp_path))
    (folder / "data_batch_1").write_bytes(pickle.dumps({b"labels": [1]}))
    with pytest.raises(DataError, match="not a CIFAR batch"):
        read_cifar("cifar10", str(tmp_path))


def test_digits_partitions_hold_out_a_public_set_with_true_labels() -> None:
    dirichlet = load_dataset("digits_dirichlet", seed=4)
    iid = load_dataset("digits_iid", seed=4)
    for data in (dirichlet, iid):
        assert len(data.client_ids) == 20 and data.public_x.shape == (449, 64)
        total = sum(data.train_sizes.values()) + sum(data.test_sizes.values())
        assert total + len(data.public_x) == 1797
        assert min(data.train_sizes.values()) + min(data.test_sizes.values()) >= 10

    def labels(data: object) -> list:
        return [
            next(iter(data.train.create_tf_dataset_for_client(c).batch(1000)))["y"].numpy()
            for c in data.client_ids
        ]

    def entropy(data: object) -> float:
        return float(np.mean([
            -(p[p > 0] * np.log(p[p > 0])).sum()
            for p in (np.bincount(y, minlength=10) / len(y) for y in labels(data))
        ]))  # fmt: skip

    assert entropy(dirichlet) < entropy(iid) - 0.7
    patho = load_dataset("digits_pathological", seed=4)
    assert all(len(np.unique(y)) <= 2 for y in labels(patho))


def test_a_prepared_tfds_directory_is_read_without_download(tmp_path: object) -> None:
    data = load_dataset(
        "cifar10", tfds_dir=os.path.join(TESTDATA, "tfds_tiny"), partition="iid", num_clients=3
    )
    assert data.public_x.shape == (10, 32, 32, 3)
    assert sum(data.train_sizes.values()) + sum(data.test_sizes.values()) == 30
    with pytest.raises(DataError, match="no prepared TFDS dataset 'svhn_cropped'"):
        load_dataset("svhn", tfds_dir=str(tmp_path))
