"""FedTSDP's data (Zhu et al. 2023): partitions, the CIFAR/SVHN/TFDS readers on real-format
fixtures, the digits partitions with a public set, and bad-input errors. No training."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTDATA
from sklearn.datasets import load_digits

from tff_clustered.data import DataError, FederatedData, from_arrays, load_dataset
from tff_clustered.data import partitions as parts
from tff_clustered.data import shard_partitions as sharding
from tff_clustered.data.image_formats import read_cifar, read_svhn, read_tfds
from tff_clustered.data.registry import image_beta

LABELS = np.repeat(np.arange(10), 100)
CIFAR10 = os.path.join(TESTDATA, "cifar10_tiny")
SVHN = os.path.join(TESTDATA, "svhn_tiny")
TFDS = os.path.join(TESTDATA, "tfds_tiny")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def label_entropy(per_client: list[np.ndarray]) -> float:
    """Mean over clients of the entropy (nats) of their label distribution."""
    values = []
    for labels in per_client:
        p = np.bincount(labels) / len(labels)
        values.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(values))


def assert_disjoint_cover(chunks: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(chunks)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


def client_arrays(data: FederatedData, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every client's (x, y) of one split, in client order."""
    source = data.train if split == "train" else data.test
    batches = (
        next(iter(source.create_tf_dataset_for_client(c).batch(100_000))) for c in data.client_ids
    )
    return [(b["x"].numpy(), b["y"].numpy()) for b in batches]


def client_labels(data: FederatedData) -> list[np.ndarray]:
    """Every client's labels, train and test together."""
    train, test = client_arrays(data, "train"), client_arrays(data, "test")
    return [np.concatenate([tr[1], te[1]]) for tr, te in zip(train, test)]


# Partitions.


def test_iid_partition_is_even_and_covers_everything() -> None:
    chunks = parts.iid_partition(LABELS, 7, rng())
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1
    assert_disjoint_cover(chunks, len(LABELS))
    with pytest.raises(ValueError, match="cannot deal 1000 examples to 1001 clients"):
        parts.iid_partition(LABELS, 1001, rng())


def test_dirichlet_partition_keeps_min_size_and_skews_more_with_smaller_beta() -> None:
    skewed = parts.dirichlet_partition(LABELS, 10, 0.1, rng(1))
    mild = parts.dirichlet_partition(LABELS, 10, 10.0, rng(1))
    for chunks in (skewed, mild):
        assert_disjoint_cover(chunks, len(LABELS))
        assert min(len(c) for c in chunks) >= 10
    assert (
        label_entropy([LABELS[c] for c in skewed]) < label_entropy([LABELS[c] for c in mild]) - 0.5
    )
    strict = parts.dirichlet_partition(LABELS, 10, 1.0, rng(1), min_size=70)  # needs redraws
    assert min(len(c) for c in strict) >= 70


def test_partitions_are_seeded() -> None:
    for scheme in parts.PARTITIONS:
        first = parts.partition(LABELS, 10, scheme, rng(1), dirichlet_beta=0.3)
        again = parts.partition(LABELS, 10, scheme, rng(1), dirichlet_beta=0.3)
        other = parts.partition(LABELS, 10, scheme, rng(2), dirichlet_beta=0.3)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_pathological_partition_gives_each_client_shards_of_distinct_classes() -> None:
    chunks = sharding.pathological_partition(LABELS, 20, 2, rng())
    assert_disjoint_cover(chunks, len(LABELS))
    assert all(len(np.unique(LABELS[c])) == 2 for c in chunks)
    assert {len(c) for c in chunks} == {50}  # 40 shards of 25
    # FedAvg's setting (100 clients x 2 shards of 10 classes): a random deal almost surely
    # repeats a class somewhere, so this needs the repair, not just redraws.
    many = np.repeat(np.arange(10), 60)
    chunks = sharding.pathological_partition(many, 100, 2, rng())
    assert_disjoint_cover(chunks, len(many))
    assert all(len(np.unique(many[c])) == 2 for c in chunks)
    # A larger class gives more shards.
    uneven = np.concatenate([np.repeat(np.arange(4), 40), np.full(80, 4)])
    chunks = sharding.pathological_partition(uneven, 6, 2, rng())
    assert sum(4 in uneven[c] for c in chunks) == 4
    assert all(len(np.unique(uneven[c])) == 2 for c in chunks)


def test_partition_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="fewer clients"):
        parts.dirichlet_partition(LABELS, 200, 0.5, rng())
    with pytest.raises(ValueError, match="beta must be > 0"):
        parts.dirichlet_partition(LABELS, 5, 0.0, rng())
    with pytest.raises(ValueError, match=r"beta=0.01.*raise beta or use fewer clients"):
        parts.dirichlet_partition(LABELS, 50, 0.01, rng(), min_size=19, max_draws=5)
    with pytest.raises(ValueError, match="classes_per_client must be in 1..10"):
        sharding.pathological_partition(LABELS, 5, 11, rng())
    dominated = np.concatenate([np.zeros(900, int), np.arange(1, 11)])
    with pytest.raises(ValueError, match="some client would get it twice"):
        sharding.pathological_partition(dominated, 10, 2, rng())
    with pytest.raises(ValueError, match="unknown partition 'zipf'"):
        parts.partition(LABELS, 5, "zipf", rng())


def test_federate_splits_every_client_80_20_with_named_ids() -> None:
    x = np.arange(len(LABELS), dtype=np.float32)[:, None]
    chunks = parts.iid_partition(LABELS, 4, rng())
    data = parts.federate("toy", x, LABELS, chunks, 10, rng(), public_x=x[:3])
    assert data.client_ids == ["toy_000", "toy_001", "toy_002", "toy_003"]
    assert set(data.train_sizes.values()) == {200} and set(data.test_sizes.values()) == {50}
    for (x_tr, y_tr), (x_te, _), idx in zip(
        client_arrays(data, "train"), client_arrays(data, "test"), chunks
    ):
        held = np.concatenate([x_tr[:, 0], x_te[:, 0]]).astype(int)
        assert np.array_equal(np.sort(held), idx)
        assert np.array_equal(y_tr, LABELS[x_tr[:, 0].astype(int)])
    assert data.public_x.shape == (3, 1) and data.public_x.dtype == np.float32


def test_public_inputs_are_validated() -> None:
    client = {"a": (np.zeros((2, 3)), np.zeros(2))}
    with pytest.raises(DataError, match=r"public inputs of shape \(4,\) do not match"):
        from_arrays("toy", client, client, 2, public_x=np.zeros((5, 4)))
    with pytest.raises(DataError, match="NaN or infinity"):
        from_arrays("toy", client, client, 2, public_x=np.full((5, 3), np.nan))
    with pytest.raises(DataError, match="public inputs are empty"):
        from_arrays("toy", client, client, 2, public_x=np.zeros((0, 3)))
    assert from_arrays("toy", client, client, 2).public_x is None


# Readers on real-format fixtures.


@pytest.mark.parametrize(
    "name, folder, sizes, classes",
    [
        ("cifar10", "cifar10_tiny/cifar-10-batches-py", (100, 20), 10),
        ("cifar100", "cifar100_tiny/cifar-100-python", (30, 10), 100),
    ],
)
def test_cifar_readers_read_the_official_pickles(
    name: str, folder: str, sizes: tuple[int, int], classes: int
) -> None:
    outer, inner = folder.split("/")
    x_train, y_train, x_test, y_test = read_cifar(name, os.path.join(TESTDATA, outer))
    assert x_train.shape == (sizes[0], 32, 32, 3) and x_train.dtype == np.uint8
    assert x_test.shape == (sizes[1], 32, 32, 3) and len(y_test) == sizes[1]
    assert y_train.min() == 0 and y_train.max() == classes - 1
    # The bar encoding the label sits on the label's rows and channel: the HWC layout is right.
    for i in (3, 7):
        row, channel = 1 + (3 * int(y_train[i])) % 29, int(y_train[i]) % 3
        assert np.all(x_train[i, row : row + 3, 2:30, channel] == 230)
        assert x_train[i, row : row + 3, 2:30].max(axis=-1).min() == 230
    # --data_dir may also name the official folder itself.
    assert np.array_equal(read_cifar(name, os.path.join(TESTDATA, outer, inner))[0], x_train)


def test_svhn_reader_maps_label_10_to_digit_0() -> None:
    x_train, y_train, x_test, y_test = read_svhn(SVHN)
    assert x_train.shape == (30, 32, 32, 3) and x_test.shape == (10, 32, 32, 3)
    assert x_train.dtype == np.uint8
    assert y_train.min() == 0 and y_train.max() == 9
    assert np.array_equal(y_train, np.arange(30) % 10) and np.array_equal(y_test, np.arange(10))
    row = 1 + (3 * int(y_train[4])) % 29
    assert np.all(x_train[4, row : row + 3, 2:30, 1] == 230)


@pytest.mark.parametrize("name, folder", [("cifar10", CIFAR10), ("svhn", SVHN)])
def test_image_federation_standardises_on_train_and_makes_the_test_split_public(
    name: str, folder: str
) -> None:
    reader = read_svhn if name == "svhn" else lambda d: read_cifar(name, d)
    x_train, y_train, x_test, _ = reader(folder)
    clients = 5 if name == "cifar10" else 3
    data = load_dataset(name, data_dir=folder, partition="iid", num_clients=clients)
    share = len(y_train) // clients
    assert len(data.client_ids) == clients and data.client_ids[0] == f"{name}_000"
    assert data.input_shape == (32, 32, 3) and data.image_shape == (32, 32, 3)
    assert data.num_classes == 10 and data.true_clusters is None
    assert set(data.train_sizes.values()) == {int(0.8 * share)}
    assert set(data.test_sizes.values()) == {share - int(0.8 * share)}
    held = client_arrays(data, "train") + client_arrays(data, "test")
    pooled_x, pooled_y = (np.concatenate(arrays) for arrays in zip(*held))
    # The clients together hold the whole training split, standardised per channel.
    np.testing.assert_allclose(pooled_x.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(pooled_x.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
    assert np.array_equal(np.bincount(pooled_y), np.bincount(y_train))
    # The public set is the test split, standardised with the training statistics.
    raw = x_train.astype(np.float64)
    mean, std = raw.mean(axis=(0, 1, 2)), raw.std(axis=(0, 1, 2))
    np.testing.assert_allclose(data.public_x, (x_test - mean) / std, atol=1e-4)
    assert data.public_x.dtype == np.float32


def test_image_federation_partitions_and_seeds() -> None:
    dirichlet = load_dataset("cifar10", data_dir=CIFAR10, num_clients=4, seed=3)  # default
    again = load_dataset("cifar10", data_dir=CIFAR10, num_clients=4, seed=3)
    other = load_dataset("cifar10", data_dir=CIFAR10, num_clients=4, seed=4)
    assert dirichlet.train_sizes == again.train_sizes
    assert all(
        np.array_equal(a[0], b[0])
        for a, b in zip(client_arrays(dirichlet, "train"), client_arrays(again, "train"))
    )
    assert not all(
        np.array_equal(a[0], b[0])
        for a, b in zip(client_arrays(dirichlet, "train"), client_arrays(other, "train"))
    )
    assert (
        min(dirichlet.train_sizes[c] + dirichlet.test_sizes[c] for c in dirichlet.client_ids) >= 10
    )
    patho = load_dataset("cifar10", data_dir=CIFAR10, partition="pathological", num_clients=5)
    assert all(len(np.unique(y)) == 2 for y in client_labels(patho))
    cifar100 = load_dataset(
        "cifar100", data_dir=os.path.join(TESTDATA, "cifar100_tiny"), partition="iid", num_clients=3
    )
    assert cifar100.num_classes == 100 and cifar100.public_x.shape == (10, 32, 32, 3)


def cifar10_folder(root: Path, train_per_class: int, test_per_class: int) -> str:
    """CIFAR-10's pickle layout with random images: 5 training batches and a test batch."""
    rng = np.random.default_rng(0)

    def batch(per_class: int) -> dict:
        labels = np.repeat(np.arange(10), per_class)
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        return {b"data": data, b"labels": labels.tolist()}

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(train_per_class)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(test_per_class)))
    return str(root)


def test_image_federation_deals_fedacs_clients(tmp_path: Path) -> None:
    """FedAC's reading of its Sec. 5.1: UniformInt[50, 350] training images per client (the
    small class pools refill), a local test set of round(0.25 n_i) from the test split in the
    training proportions, no public set; alpha 0.1 unless given; seeded."""
    folder = cifar10_folder(tmp_path, train_per_class=4, test_per_class=100)
    data = load_dataset("cifar10", data_dir=folder, partition="fedac_dirichlet", num_clients=4)
    again = load_dataset("cifar10", data_dir=folder, partition="fedac_dirichlet", num_clients=4)
    assert data.train_sizes == again.train_sizes and data.public_x is None
    for c in data.client_ids:
        n = data.train_sizes[c]
        assert 50 <= n <= 350 and abs(data.test_sizes[c] - 0.25 * n) <= 1
    for (_, y_train), (_, y_test) in zip(client_arrays(data, "train"), client_arrays(data, "test")):
        assert set(np.unique(y_test)) <= set(np.unique(y_train))
    patho = load_dataset(
        "cifar10", data_dir=folder, partition="fedac_pathological", num_clients=5,
        classes_per_client=3,
    )  # fmt: skip
    assert all(len(np.unique(y)) == 3 for y in client_labels(patho))
    with pytest.raises(ValueError, match="deals the image datasets only"):
        load_dataset("digits_dirichlet", partition="fedac_dirichlet")
    assert image_beta("fedac_dirichlet", None) == 0.1 and image_beta(None, None) == 0.5
    assert image_beta("fedac_dirichlet", 0.3) == 0.3


def test_a_prepared_tfds_directory_is_read_without_download(tmp_path: Path) -> None:
    x_train, y_train, x_test, y_test = read_tfds("cifar10", TFDS)
    assert x_train.shape == (30, 32, 32, 3) and x_test.shape == (10, 32, 32, 3)
    assert sorted(np.bincount(y_train)) == [3] * 10 and sorted(y_test) == list(range(10))
    for i in range(3):
        row = 1 + (3 * int(y_train[i])) % 29
        assert np.all(x_train[i, row : row + 3, 2:30, int(y_train[i]) % 3] == 230)
    # The data directory, the dataset's folder or a version folder all work.
    for path in (os.path.join(TFDS, "cifar10"), os.path.join(TFDS, "cifar10", "3.0.2")):
        assert np.array_equal(read_tfds("cifar10", path)[1], y_train)
    data = load_dataset("cifar10", tfds_dir=TFDS, partition="iid", num_clients=3)
    assert data.public_x.shape == (10, 32, 32, 3)
    assert sum(data.train_sizes.values()) + sum(data.test_sizes.values()) == 30
    with pytest.raises(DataError, match=r"no prepared TFDS dataset 'svhn_cropped' version 3\.\d"):
        load_dataset("svhn", tfds_dir=str(tmp_path))
    (tmp_path / "cifar100" / "1.0.0").mkdir(parents=True)
    with pytest.raises(DataError, match=r"holds versions \['1.0.0'\].*tfds build"):
        read_tfds("cifar100", str(tmp_path))


# Bad input.


def test_missing_files_name_the_file_the_source_and_the_flag(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"cifar-10-batches-py not found.*kriz/cifar.*--data_dir"):
        load_dataset("cifar10", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"train_32x32.mat not found.*housenumbers.*--data_dir"):
        load_dataset("svhn", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"--data_dir.*cifar-100-python.*--tfds_dir"):
        load_dataset("cifar100")
    folder = tmp_path / "cifar-10-batches-py"
    shutil.copytree(os.path.join(CIFAR10, "cifar-10-batches-py"), folder)
    os.remove(folder / "test_batch")
    with pytest.raises(DataError, match=r"cifar-10-batches-py/test_batch not found.*kriz"):
        read_cifar("cifar10", str(folder))


def test_corrupt_files_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_1 cannot be read as a CIFAR pickle"):
        read_cifar("cifar10", str(tmp_path))
    (folder / "data_batch_1").write_bytes(pickle.dumps({b"labels": [1]}))
    with pytest.raises(DataError, match="data_batch_1 is not a CIFAR batch"):
        read_cifar("cifar10", str(tmp_path))
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}
    (folder / "data_batch_1").write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError, match="label 10, outside the 10 classes 0..9; download") as e:
        read_cifar("cifar10", str(tmp_path))
    batch[b"labels"] = [3, 2.5]
    (folder / "data_batch_1").write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError) as e:
        read_cifar("cifar10", str(tmp_path))
    assert str(e.value).count("cifar10:") == 1, e.value  # one message, not one inside another
    (tmp_path / "train_32x32.mat").write_bytes(b"MATLAB? no")
    (tmp_path / "test_32x32.mat").write_bytes(b"")
    with pytest.raises(DataError, match="train_32x32.mat is not an SVHN .mat file"):
        read_svhn(str(tmp_path))


# The embedded digits with FedTSDP's partitions.


def test_digits_partitions_hold_out_a_public_set_and_keep_the_true_labels() -> None:
    digits = load_digits()
    index = {(row / 16.0).astype(np.float32).tobytes(): i for i, row in enumerate(digits.data)}
    assert len(index) == 1797  # every image is distinct, so images identify examples
    for name in ("digits_dirichlet", "digits_iid", "digits_pathological"):
        data = load_dataset(name, seed=4)
        assert len(data.client_ids) == 20 and data.image_shape == (8, 8, 1)
        assert data.input_shape == (64,) and data.public_x.shape == (449, 64)
        held = [
            (index[x.tobytes()], int(y))
            for split in ("train", "test")
            for xs, ys in client_arrays(data, split)
            for x, y in zip(xs, ys)
        ]
        public = [index[x.tobytes()] for x in data.public_x]
        ids = [i for i, _ in held]
        assert sorted(ids + public) == list(range(1797))  # disjoint, and covering everything
        assert all(digits.target[i] == y for i, y in held)  # true labels, no permutation
        for cid in data.client_ids:
            total = data.train_sizes[cid] + data.test_sizes[cid]
            assert data.train_sizes[cid] == int(0.8 * total) and total >= 10


def test_digits_dirichlet_is_skewed_and_seeded() -> None:
    dirichlet = load_dataset("digits_dirichlet", seed=4)
    skew = label_entropy(client_labels(dirichlet))
    assert skew < label_entropy(client_labels(load_dataset("digits_iid", seed=4))) - 0.7
    mild = load_dataset("digits_dirichlet", seed=4, dirichlet_beta=5.0)
    assert skew < label_entropy(client_labels(mild)) - 0.5
    patho = load_dataset("digits_iid", seed=4, partition="pathological")  # partition overrides
    assert patho.name == "digits_pathological"
    assert all(len(np.unique(y)) == 2 for y in client_labels(patho))
    again = load_dataset("digits_dirichlet", seed=4)
    other = load_dataset("digits_dirichlet", seed=5)
    assert again.train_sizes == dirichlet.train_sizes
    assert np.array_equal(again.public_x, dirichlet.public_x)
    assert other.train_sizes != dirichlet.train_sizes
    assert not np.array_equal(other.public_x, dirichlet.public_x)


class RunsACommand:
    """What a crafted pickle would hold: unpickling it calls os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def test_a_crafted_cifar_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    shutil.copytree(os.path.join(CIFAR10, "cifar-10-batches-py"), folder)
    marker = tmp_path / "it_ran"
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": RunsACommand(f"touch {marker}"), b"labels": [0]}, f)
    with pytest.raises(
        DataError, match=r"data_batch_3 cannot be read.*posix.system|data_batch_3.*system"
    ):
        read_cifar("cifar10", str(tmp_path))
    assert not marker.exists()
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump([1, 2, 3], f)
    with pytest.raises(DataError, match="data_batch_3 holds a list, not a CIFAR batch"):
        read_cifar("cifar10", str(tmp_path))


CIFAR_CORRUPTIONS = {
    "data is None": lambda b: b.update({b"data": None}),
    "data is a dict": lambda b: b.update({b"data": {"a": 1}}),
    "a NaN pixel": lambda b: b.update({b"data": np.where(b[b"data"] == b[b"data"], np.nan, 0)}),
    "a pixel of 300": lambda b: b.update({b"data": b[b"data"].astype(np.int64) + 300}),
    "a negative pixel": lambda b: b.update({b"data": b[b"data"].astype(np.int64) - 256}),
    "a fractional pixel": lambda b: b.update({b"data": b[b"data"] + 0.5}),
    "float labels": lambda b: b.update({b"labels": [x + 0.7 for x in b[b"labels"]]}),
    "a negative label": lambda b: b.update({b"labels": [-1] + b[b"labels"][1:]}),
    "string labels": lambda b: b.update({b"labels": ["cat"] * len(b[b"labels"])}),
}


@pytest.mark.parametrize("corruption", sorted(CIFAR_CORRUPTIONS))
def test_cifar_pixels_and_labels_that_are_not_whole_0_255_are_refused(
    tmp_path: Path, corruption: str
) -> None:
    """A damaged batch is a one-line `DataError` naming the file: never converted (NaN or 300
    wrapped to some uint8, a label 2.7 truncated to class 2), never another exception."""
    root = cifar10_folder(tmp_path, train_per_class=1, test_per_class=1)
    path = Path(root) / "cifar-10-batches-py" / "data_batch_3"
    batch = pickle.loads(path.read_bytes())
    CIFAR_CORRUPTIONS[corruption](batch)
    path.write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError, match=r"data_batch_3.*; download the official files again"):
        read_cifar("cifar10", root)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(X=m["X"].astype(np.float64) * np.nan), "pixel value nan"),
        (lambda m: m.update(X=m["X"].astype(np.int32) + 256), "pixel value 2"),
        (lambda m: m.update(y=m["y"] + 0.25), "label 1.25|label .*\\.25"),
    ],
)
def test_svhn_pixels_and_labels_that_are_not_whole_are_refused(
    tmp_path: Path, edit: object, message: str
) -> None:
    from scipy.io import loadmat, savemat

    for split in ("train", "test"):
        mat = {k: v for k, v in loadmat(os.path.join(SVHN, f"{split}_32x32.mat")).items()}
        if split == "train":
            edit(mat)
        savemat(str(tmp_path / f"{split}_32x32.mat"), {"X": mat["X"], "y": mat["y"]})
    with pytest.raises(DataError, match=f"train_32x32.mat holds the ({message})"):
        read_svhn(str(tmp_path))


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_tfds_folder_with_a_damaged_dataset_info_is_one_error(
    tmp_path: Path, damage: str
) -> None:
    import shutil

    copy = tmp_path / "tfds"
    shutil.copytree(TFDS, copy)
    (info,) = copy.glob("cifar10/*/dataset_info.json")
    if damage == "corrupt":
        info.write_text('{"name": "cifar10", "splits": [{"name": ')
    else:
        info.unlink()
    with pytest.raises(DataError) as raised:
        read_tfds("cifar10", str(copy))
    assert "\n" not in str(raised.value) and "cifar10" in str(raised.value)
