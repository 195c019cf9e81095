"""Fashion-MNIST and MNIST dealt by the image partitions (`fashion_mnist`, `mnist_partitioned`),
MNIST by NIST writer (`mnist_writers`), and the LeNet-like CNN, on tiny files written here in the
official formats; one test checks the real MNIST writers when a copy is at hand (else skipped)."""

from __future__ import annotations

import gzip
import os
import sqlite3
import struct
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT
from test_functional_models import graph_apply

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import RunInfo
from tff_clustered.data import DataError, FederatedData, load_dataset
from tff_clustered.data.images import channel_stats, standardise
from tff_clustered.data.mnist import IDX_FILES
from tff_clustered.data.mnist_writers import read_writer_keys, writer_parts
from tff_clustered.data.spec import DataSpec
from tff_clustered.data.tff_datasets import shakespeare_vocabulary
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.models import count_trainable_parameters, model_spec, trainable_layer_sizes
from tff_clustered.models.functional import functional_model
from tff_clustered.models.split import classifier_layers
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runs.runner import spec_experiment

SHARED_MNIST = os.path.join(ROOT, "..", "shared", "data", "mnist")
# 90 test images per class: FedAC's local test sets need up to 0.25 * 350 of one class.
PER_CLASS_TRAIN, PER_CLASS_TEST = 20, 90
# Writers of the fixture's 200 training images: keys hsf * 10000 + writer, sizes 10..60.
WRITERS = {0: 25, 7: 40, 12: 10, 40012: 60, 40013: 30, 31999: 35}
TEST_WRITERS = {2500: 400, 42600: 500}


def grey_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """(n, 28, 28) uint8: noise plus a bright bar whose row encodes the label."""
    rng = np.random.default_rng([7, seed])
    x = rng.integers(0, 40, (len(labels), 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        x[i, 2 + 2 * int(label) : 4 + 2 * int(label), 4:24] = 220
    return x


def mnist_arrays() -> dict[str, np.ndarray]:
    """Keras' mnist.npz layout: 200 training and 900 test images, every class equally often."""
    y_train = np.random.default_rng(1).permutation(np.repeat(np.arange(10), PER_CLASS_TRAIN))
    y_test = np.random.default_rng(2).permutation(np.repeat(np.arange(10), PER_CLASS_TEST))
    return {
        "x_train": grey_images(y_train, 1),
        "y_train": y_train.astype(np.uint8),
        "x_test": grey_images(y_test, 2),
        "y_test": y_test.astype(np.uint8),
    }


def write_idx(path: str, array: np.ndarray) -> None:
    """One IDX file of unsigned bytes, gzipped if `path` ends in .gz."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(b"\x00\x00\x08" + bytes([array.ndim]))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def mnist_folder(
    folder: object, npz_name: Optional[str] = None, gzipped: bool = True
) -> dict[str, np.ndarray]:
    """`mnist_arrays()` written to `folder` as the four IDX files, or as `npz_name`."""
    arrays = mnist_arrays()
    os.makedirs(folder, exist_ok=True)
    if npz_name:
        np.savez(os.path.join(folder, npz_name), **arrays)
    else:
        for key, name in IDX_FILES.items():
            write_idx(os.path.join(folder, name + (".gz" if gzipped else "")), arrays[key])
    return arrays


def writer_keys(sizes: dict[int, int], seed: int) -> np.ndarray:
    """One writer key per image, the writers' images interleaved at random."""
    keys = np.concatenate([np.full(n, k) for k, n in sizes.items()])
    return np.random.default_rng(seed).permutation(keys).astype(np.int32)


def writers_folder(folder: object, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    """MNIST fixture files plus writers.npz (`overrides` replace or add arrays)."""
    arrays = mnist_folder(folder, "mnist.npz")
    writers = dict(
        train_writer_key=writer_keys(WRITERS, 3), test_writer_key=writer_keys(TEST_WRITERS, 4)
    )
    writers.update(overrides)
    np.savez(os.path.join(folder, "writers.npz"), **writers)
    return {**arrays, **writers}


def client_xy(data: FederatedData, split: str, cid: str) -> tuple[np.ndarray, np.ndarray]:
    arrays = data.arrays(split, cid)
    return np.asarray(arrays["x"]), np.asarray(arrays["y"])


def fingerprints(x: np.ndarray, y: np.ndarray) -> list[tuple[int, bytes]]:
    """Each example as (label, its bytes), sorted: equal lists = the same examples."""
    return sorted(zip(y.tolist(), (row.tobytes() for row in x)))


# -- fashion_mnist and mnist_partitioned -------------------------------------------------------


def test_fashion_mnist_reads_idx_gz_idx_and_both_npz_names_alike(tmp_path: object) -> None:
    arrays = mnist_folder(tmp_path / "gz")
    mnist_folder(tmp_path / "plain", gzipped=False)
    mnist_folder(tmp_path / "dash", "fashion-mnist.npz")
    mnist_folder(tmp_path / "underscore", "fashion_mnist.npz")
    loaded = [
        load_dataset("fashion_mnist", str(tmp_path / d), num_clients=4, partition="iid")
        for d in ("gz", "plain", "dash", "underscore")
    ]
    data = loaded[0]
    assert data.input_shape == (28, 28, 1) and data.image_shape == (28, 28, 1)
    assert data.num_classes == 10 and len(data.client_ids) == 4
    # IID: every training image dealt once, each client's share split 80/20.
    assert sum(data.train_sizes.values()) + sum(data.test_sizes.values()) == 10 * PER_CLASS_TRAIN
    assert all(data.train_sizes[c] == 40 and data.test_sizes[c] == 10 for c in data.client_ids)
    labels = np.concatenate(
        [client_xy(data, s, c)[1] for c in data.client_ids for s in ("train", "test")]
    )
    assert np.array_equal(np.bincount(labels), np.full(10, PER_CLASS_TRAIN))
    # Standardised with the training split's statistics; the public set is the test split.
    train, public = standardise(arrays["x_train"][..., None], arrays["x_test"][..., None])
    x = np.concatenate(
        [client_xy(data, s, c)[0] for c in data.client_ids for s in ("train", "test")]
    )
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3
    np.testing.assert_array_equal(data.public_x, public)
    for other in loaded[1:]:
        for cid in data.client_ids:
            for split in ("train", "test"):
                for a, b in zip(client_xy(data, split, cid), client_xy(other, split, cid)):
                    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "partition",
    ["iid", "dirichlet", "pathological", "shards", "fedac_dirichlet", "fedac_pathological"],
)
def test_every_partition_deals_fashion_mnist(tmp_path: object, partition: str) -> None:
    mnist_folder(tmp_path)
    data = load_dataset("fashion_mnist", str(tmp_path), num_clients=4, partition=partition, seed=2)
    assert len(data.client_ids) == 4 and data.input_shape == (28, 28, 1)
    labels = [
        set(np.concatenate([client_xy(data, s, c)[1] for s in ("train", "test")]).tolist())
        for c in data.client_ids
    ]
    if partition.startswith("fedac_"):
        assert data.public_x is None  # FedAC's local tests come from the test split
        assert all(50 <= data.train_sizes[c] <= 350 for c in data.client_ids)
        if partition == "fedac_pathological":
            assert all(len(s) == 2 for s in labels)
        return
    assert data.public_x.shape == (10 * PER_CLASS_TEST, 28, 28, 1)
    dealt = sum(data.train_sizes.values()) + sum(data.test_sizes.values())
    if partition == "pathological":  # 8 single-class shards: 2 classes per client
        assert all(len(s) == 2 for s in labels) and dealt <= 10 * PER_CLASS_TRAIN
    else:
        assert dealt == 10 * PER_CLASS_TRAIN


def test_mnist_partitioned_is_the_same_dealing_of_mnist_files(tmp_path: object) -> None:
    mnist_folder(tmp_path)
    fashion = load_dataset("fashion_mnist", str(tmp_path), num_clients=5, seed=1)
    mnist = load_dataset("mnist_partitioned", str(tmp_path), num_clients=5, seed=1)
    assert mnist.name == "mnist_partitioned" and mnist.input_shape == (28, 28, 1)
    for a, b in zip(fashion.client_ids, mnist.client_ids):
        for split in ("train", "test"):
            np.testing.assert_array_equal(
                client_xy(fashion, split, a)[1], client_xy(mnist, split, b)[1]
            )
    # FedGroup's `mnist` keeps its own setup: flat inputs, 1,000 two-digit clients by default.
    assert load_dataset("mnist", str(tmp_path), num_clients=10).input_shape == (784,)


def test_train_examples_deals_a_seeded_subset_of_the_training_images(tmp_path: object) -> None:
    """`train_examples` keeps that many training images, a choice fixed by the seed and drawn
    anew for another seed; the public set stays the whole test split; a count beyond the
    file or a dataset that has no such choice is refused. (Standardisation uses the chosen
    images' statistics, so their values are not those of the whole file.)"""
    arrays = mnist_folder(tmp_path)
    small = load_dataset("fashion_mnist", str(tmp_path), num_clients=4, seed=3, train_examples=60)
    again = load_dataset("fashion_mnist", str(tmp_path), num_clients=4, seed=3, train_examples=60)
    other = load_dataset("fashion_mnist", str(tmp_path), num_clients=4, seed=4, train_examples=60)
    assert sum(small.train_sizes.values()) + sum(small.test_sizes.values()) == 60
    assert small.public_x.shape[0] == len(arrays["y_test"])

    def pooled(data: FederatedData) -> list:
        return sorted(
            fp
            for cid in data.client_ids
            for split in ("train", "test")
            for fp in fingerprints(*client_xy(data, split, cid))
        )

    assert pooled(small) == pooled(again) and pooled(small) != pooled(other)
    with pytest.raises(DataError, match=r"--train_examples=201: fashion_mnist has 200"):
        load_dataset("fashion_mnist", str(tmp_path), train_examples=201)
    with pytest.raises(ValueError, match=r"--train_examples applies to .*not --dataset=digits"):
        load_dataset("digits", train_examples=10)


def test_missing_fashion_mnist_files_name_the_files_and_the_flag(tmp_path: object) -> None:
    with pytest.raises(
        DataError, match=r"train-images-idx3-ubyte\[.gz\] is missing.*Fashion-MNIST IDX.*--data_dir"
    ):
        load_dataset("fashion_mnist", str(tmp_path))
    with pytest.raises(
        DataError, match=r"reads files you already have.*fashion-mnist.npz.*--data_dir"
    ):
        load_dataset("fashion_mnist")
    with pytest.raises(DataError, match=r"not read from --tfds_dir.*--data_dir"):
        load_dataset("fashion_mnist", tfds_dir=str(tmp_path))
    np.savez(tmp_path / "fashion-mnist.npz", x_train=np.zeros((2, 28, 28)))
    with pytest.raises(DataError, match="lacks y_train, x_test, y_test; Keras' fashion-mnist.npz"):
        load_dataset("fashion_mnist", str(tmp_path))


# -- mnist_writers -----------------------------------------------------------------------------


def test_one_client_per_writer_with_its_own_images_split_80_20(tmp_path: object) -> None:
    files = writers_folder(tmp_path)
    data = load_dataset("mnist_writers", str(tmp_path), seed=3)
    assert data.client_ids == [f"writer_{k:05d}" for k in sorted(WRITERS)]
    assert data.input_shape == (28, 28, 1) and data.num_classes == 10
    train, public = standardise(files["x_train"][..., None], files["x_test"][..., None])
    np.testing.assert_array_equal(data.public_x, public)  # the test split's other writers
    for key, n in WRITERS.items():
        cid = f"writer_{key:05d}"
        assert data.train_sizes[cid] == int(0.8 * n) and data.test_sizes[cid] == n - int(0.8 * n)
        own = np.flatnonzero(files["train_writer_key"] == key)
        (x_tr, y_tr), (x_te, y_te) = client_xy(data, "train", cid), client_xy(data, "test", cid)
        # Train and test are disjoint and together exactly the writer's images.
        assert fingerprints(np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])) == (
            fingerprints(train[own], files["y_train"][own])
        )
        assert not set(fingerprints(x_tr, y_tr)) & set(fingerprints(x_te, y_te))
    again = load_dataset("mnist_writers", str(tmp_path), seed=3)
    other = load_dataset("mnist_writers", str(tmp_path), seed=4)
    cid = data.client_ids[0]
    assert np.array_equal(client_xy(data, "test", cid)[0], client_xy(again, "test", cid)[0])
    assert not np.array_equal(client_xy(data, "test", cid)[0], client_xy(other, "test", cid)[0])


def test_num_clients_keeps_a_seeded_choice_of_writers(tmp_path: object) -> None:
    writers_folder(tmp_path)
    chosen = load_dataset("mnist_writers", str(tmp_path), num_clients=3, seed=1).client_ids
    assert len(chosen) == 3 and chosen == sorted(chosen)
    assert set(chosen) <= {f"writer_{k:05d}" for k in WRITERS}
    assert load_dataset("mnist_writers", str(tmp_path), num_clients=3, seed=1).client_ids == chosen
    draws = {
        tuple(load_dataset("mnist_writers", str(tmp_path), num_clients=3, seed=s).client_ids)
        for s in range(6)
    }
    assert len(draws) > 1
    with pytest.raises(DataError, match="holds 6 training writers.*--num_clients between 1 and 6"):
        load_dataset("mnist_writers", str(tmp_path), num_clients=7)


def test_writer_keys_group_and_check_alignment(tmp_path: object) -> None:
    parts = writer_parts(np.array([5, 3, 5, 0, 3, 5]))
    assert list(parts) == [0, 3, 5]
    assert [p.tolist() for p in parts.values()] == [[3], [1, 4], [0, 2, 5]]
    writers_folder(tmp_path)
    keys = read_writer_keys(str(tmp_path), 200, 900)
    assert keys.dtype == np.int64 and len(np.unique(keys)) == len(WRITERS)
    with pytest.raises(
        DataError, match=r"test_writer_key names the writers of 900 images.*holds 899"
    ):
        read_writer_keys(str(tmp_path), 200, 899)


def test_missing_or_misaligned_writers_file_is_explained(tmp_path: object) -> None:
    mnist_folder(tmp_path / "no_writers", "mnist.npz")
    with pytest.raises(
        DataError,
        match=r"writers.npz not found.*--data_dir.*hsf \* 10000 \+ writer.*qmnist-train-labels",
    ):
        load_dataset("mnist_writers", str(tmp_path / "no_writers"))
    with pytest.raises(DataError, match=r"mnist_writers reads files you already have.*writers.npz"):
        load_dataset("mnist_writers")
    short = writer_keys(WRITERS, 3)[:-1]
    writers_folder(tmp_path / "short", train_writer_key=short)
    with pytest.raises(
        DataError,
        match=r"train_writer_key names the writers of 199 images.*holds 200.*do not align",
    ):
        load_dataset("mnist_writers", str(tmp_path / "short"))
    os.makedirs(tmp_path / "lacking")
    mnist_folder(tmp_path / "lacking", "mnist.npz")
    np.savez(tmp_path / "lacking" / "writers.npz", train_writer_key=writer_keys(WRITERS, 3))
    with pytest.raises(DataError, match="lacks test_writer_key"):
        load_dataset("mnist_writers", str(tmp_path / "lacking"))
    writers_folder(tmp_path / "floats", train_writer_key=np.zeros(200))
    with pytest.raises(DataError, match="train_writer_key is float64 of shape"):
        load_dataset("mnist_writers", str(tmp_path / "floats"))


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(SHARED_MNIST, "writers.npz")),
    reason=f"no real MNIST with writers.npz in {os.path.normpath(SHARED_MNIST)} (the machines' "
    "shared data folder; a user's clone has none)",
)
def test_real_mnist_writers() -> None:
    data = load_dataset("mnist_writers", SHARED_MNIST)
    assert len(data.client_ids) == 539
    assert sum(data.train_sizes.values()) + sum(data.test_sizes.values()) == 60_000
    with np.load(os.path.join(SHARED_MNIST, "mnist.npz")) as blob:
        x_train, y_train = blob["x_train"], blob["y_train"]
    keys = read_writer_keys(SHARED_MNIST, 60_000, 10_000)
    # Each client holds exactly its writer's images and labels of mnist.npz (standardised back).
    mean, std = channel_stats(x_train[..., None].astype(np.float32))
    assert data.public_x.shape == (10_000, 28, 28, 1)
    for cid in data.client_ids:
        own = np.flatnonzero(keys == int(cid.split("_")[1]))
        (x_tr, y_tr), (x_te, y_te) = client_xy(data, "train", cid), client_xy(data, "test", cid)
        raw = np.round(np.concatenate([x_tr, x_te]) * np.maximum(std, 1e-3) + mean).astype(np.uint8)
        assert fingerprints(raw, np.concatenate([y_tr, y_te])) == fingerprints(
            x_train[own][..., None], y_train[own]
        )


# -- lenet -------------------------------------------------------------------------------------


def test_lenet_builds_for_images_and_flat_inputs() -> None:
    image = model_spec("lenet", (28, 28, 1), 10).build()
    flat = model_spec("lenet", (784,), 10, image_shape=(28, 28, 1)).build()
    for model in (image, flat):
        assert trainable_layer_sizes(model) == [2, 2, 2, 2, 2]  # 5 weighted layers
        # 156 + 2,416 + (7 * 7 * 16 = 784) * 120 + 120 + 10,164 + 850.
        assert count_trainable_parameters(model) == 107_786
        assert not any(
            isinstance(layer, (tf.keras.layers.Dropout, tf.keras.layers.BatchNormalization))
            for layer in model.layers
        )
    assert flat(np.zeros((2, 784), np.float32)).shape == (2, 10)
    digits = model_spec("lenet", (64,), 10, image_shape=(8, 8, 1)).build()  # 8 -> 4 -> 2
    assert digits(np.zeros((3, 64), np.float32)).shape == (3, 10)


def test_lenet_head_is_its_three_fc_layers() -> None:
    model = model_spec("lenet", (28, 28, 1), 10).build()
    assert classifier_layers(model) == 3
    sizes = tuple(trainable_layer_sizes(model))
    run = RunInfo(
        client_ids=("a", "b"), train_sizes={"a": 1, "b": 1}, seed=0, clients_per_round=2,
        layer_sizes=sizes, tensor_sizes=(1,) * sum(sizes), num_trainable_values=sum(sizes),
        initial_model=np.zeros(sum(sizes)), classifier_layers=classifier_layers(model),
    )  # fmt: skip
    assert make_algorithm("uapdfl").head_start(run) == 4  # conv1, conv2 | fc1, fc2, logits


@pytest.mark.parametrize(
    "shape, kwargs", [((28, 28, 1), {}), ((784,), {"image_shape": (28, 28, 1)})]
)
def test_lenet_functional_path_matches_keras(shape: tuple, kwargs: dict) -> None:
    spec = model_spec("lenet", shape, 10, **kwargs)
    keras_model = spec.build()
    x = tf.random.stateless_normal([5, *shape], seed=[4, 2])
    want = keras_model(x, training=False)
    weights = [tf.constant(v.numpy()) for v in keras_model.trainable_weights]
    model = functional_model(keras_model, spec.input_spec())
    assert model.layer_sizes == (2, 2, 2, 2, 2) and model.state_shapes == ()
    assert model.features is not None  # UA-PDFL's auxiliary features
    logits, _ = graph_apply(model, weights, [], x, False)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)


TFF_EMNIST_TINY = os.path.join(ROOT, "testdata", "tff_emnist_tiny")


def test_tff_emnist_reads_tffs_database_by_writer_with_its_own_splits() -> None:

    digits = load_dataset("tff_emnist", data_dir=TFF_EMNIST_TINY)
    assert digits.num_classes == 10 and digits.input_shape == (784,)
    assert sorted(digits.train_sizes.values()) == [5] * 4 and set(digits.test_sizes.values()) == {2}
    x, y = (digits.train_arrays["f0001_41"][k] for k in ("x", "y"))
    # The fixture's bar row is the label; TFF's images are ink (0) on white (1).
    rows = np.argmin(np.asarray(x).reshape(-1, 28, 28).mean(axis=2), axis=1)
    assert rows.tolist() == np.asarray(y).tolist() == [1, 2, 3, 4, 5]
    letters = load_dataset("tff_emnist", data_dir=TFF_EMNIST_TINY, num_classes=62, num_clients=2)
    assert letters.num_classes == 62 and len(letters.client_ids) == 2
    again = load_dataset("tff_emnist", data_dir=TFF_EMNIST_TINY, num_classes=62, num_clients=2)
    assert again.client_ids == letters.client_ids  # the seed draws the writers


def test_tff_emnist_without_its_file_names_the_file_and_where_to_get_it(tmp_path: object) -> None:

    with pytest.raises(
        DataError, match=r"emnist_all\.sqlite in --data_dir.*emnist_all\.sqlite\.lzma"
    ):
        load_dataset("tff_emnist", data_dir=str(tmp_path))
    (tmp_path / "emnist_all.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DataError, match="is not TFF's federated EMNIST database"):
        load_dataset("tff_emnist", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="10 .digits. or 62"):
        load_dataset("tff_emnist", data_dir=TFF_EMNIST_TINY, num_classes=26)


TFF_CIFAR100_TINY = os.path.join(ROOT, "testdata", "tff_cifar100_tiny")


def patch_labels(x: np.ndarray) -> list[int]:
    """The label the fixture's bright 3x3 patch encodes, at row 3 * (label // 10), column
    3 * (label % 10) (standardising each channel keeps it the brightest spot)."""
    flat = np.asarray(x).sum(axis=3).reshape(len(x), -1).argmax(axis=1)
    return [int(r // 3 * 10 + c // 3) for r, c in zip(flat // 32, flat % 32)]


def test_tff_cifar100_reads_train_clients_with_seeded_20_percent_local_tests() -> None:

    fine = load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY)
    assert fine.name == "tff_cifar100" and fine.num_classes == 100
    assert fine.input_shape == fine.image_shape == (32, 32, 3)
    assert fine.client_ids == ["0", "1", "2"]  # the train split's clients, not the test split's
    # 5, 6, 5 images: round(0.2 n) held out as each client's local test set.
    assert fine.train_sizes == {"0": 4, "1": 5, "2": 4} and set(fine.test_sizes.values()) == {1}
    for split in ("train", "test"):
        for client in fine.client_ids:
            x, y = (fine.arrays(split, client)[k] for k in ("x", "y"))
            assert x.dtype == np.float32 and y.dtype == np.int32 and np.isfinite(x).all()
            assert patch_labels(x) == y.tolist() and ((0 <= y) & (y < 100)).all()
    # Standardised per channel with the training images' statistics, as cifar100's are.
    x_train = np.concatenate([fine.train_arrays[c]["x"] for c in fine.client_ids])
    mean, std = channel_stats(x_train)
    np.testing.assert_allclose(mean, 0, atol=1e-4)
    np.testing.assert_allclose(std, 1, atol=1e-3)
    # Each client's images, once each, between its train and test sets.
    client_1 = np.concatenate([fine.arrays(s, "1")["y"] for s in ("train", "test")])
    assert sorted(client_1.tolist()) == sorted([(37 + 23 * i) % 100 for i in range(6)])

    def held_out(data: FederatedData) -> dict[str, list[int]]:
        return {c: data.test_arrays[c]["y"].tolist() for c in data.client_ids}

    assert held_out(load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY)) == held_out(fine)
    other = load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, seed=1)
    assert held_out(other) != held_out(fine)

    coarse = load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, num_classes=20)
    assert coarse.name == "tff_cifar100_20" and coarse.num_classes == 20
    for client in coarse.client_ids:  # the fixture's coarse label is its fine label // 5
        fine_y = (patch_labels(coarse.arrays(s, client)["x"]) for s in ("train", "test"))
        coarse_y = (coarse.arrays(s, client)["y"].tolist() for s in ("train", "test"))
        assert [[f // 5 for f in ys] for ys in fine_y] == list(coarse_y)
    assert held_out(coarse).keys() == held_out(fine).keys()

    two = load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, num_clients=2, seed=1)
    assert len(two.client_ids) == 2 and set(two.client_ids) < {"0", "1", "2"}
    again = load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, num_clients=2, seed=1)
    assert again.client_ids == two.client_ids  # the seed draws the clients
    # A client's local test set does not depend on which other clients are kept.
    assert all(held_out(two)[c] == held_out(other)[c] for c in two.client_ids)
    with pytest.raises(ValueError, match="--num_clients=4: .* has 3 train clients"):
        load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, num_clients=4)
    with pytest.raises(ValueError, match="100 .fine labels. or 20 .coarse labels."):
        load_dataset("tff_cifar100", data_dir=TFF_CIFAR100_TINY, num_classes=10)


def test_tff_cifar100_missing_or_damaged_file_is_a_data_error(tmp_path: object) -> None:

    missing = r"cifar100\.sqlite in --data_dir.*does not exist; download .*cifar100\.sqlite\.lzma"
    with pytest.raises(DataError, match=missing):
        load_dataset("tff_cifar100", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"cifar100\.sqlite in --data_dir.*no --data_dir given"):
        load_dataset("tff_cifar100")
    with open(os.path.join(TFF_CIFAR100_TINY, "cifar100.sqlite"), "rb") as f:
        good = f.read()
    with open(os.path.join(TFF_EMNIST_TINY, "emnist_all.sqlite"), "rb") as f:
        emnist = f.read()
    page = len(good) // 4096 // 2 * 4096  # a page of examples, read inside tf.data
    path = tmp_path / "cifar100.sqlite"

    def edited(sql: str, *args: object) -> bytes:
        path.write_bytes(good)
        with sqlite3.connect(path) as db:
            db.execute(sql, args)
        db.close()
        return path.read_bytes()

    damaged = {
        "garbage": b"not a database at all" * 100,
        "truncated": good[: len(good) // 2],
        "overwritten page": good[:page] + bytes(range(256)) * 16 + good[page + 4096 :],
        "garbage record": edited(
            "UPDATE examples SET serialized_example_proto = ? WHERE rowid = 3", b"\xffgarbage"
        ),
        "client without examples": edited("DELETE FROM examples WHERE client_id = '1'"),
        "client with one image": edited(
            "DELETE FROM examples WHERE client_id = '1' AND rowid > 6"  # its rows: 6..11
        ),
        "emnist": emnist,  # a sound TFF database without a `train` split
    }
    for kind, content in damaged.items():
        path.write_bytes(content)
        with pytest.raises(DataError) as raised:
            load_dataset("tff_cifar100", data_dir=str(tmp_path))
        message = str(raised.value)
        assert type(raised.value) is DataError and str(path) in message, kind
        assert "cifar100.sqlite.lzma" in message and "\n" not in message, kind
        assert "is not TFF's federated CIFAR-100 database" in message, kind


TFF_SHAKESPEARE_TINY = os.path.join(ROOT, "testdata", "tff_shakespeare_tiny")


def test_tff_shakespeare_is_leafs_next_character_task_per_speaking_part() -> None:
    data = load_dataset("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY)
    # THE_TEMPEST_CALIBAN's test text has fewer than 81 characters: no example, left out.
    assert data.client_ids == [
        "MUCH_ADO_ABOUT_NOTHING_BEATRICE",
        "THE_TRAGEDY_OF_HAMLET_PRINCE_OF_DENMARK_HAMLET",
        "THE_TRAGEDY_OF_MACBETH_MACBETH",
    ]
    assert data.num_classes == data.vocabulary_size == 87 and data.input_shape == (80,)
    vocabulary = shakespeare_vocabulary() + "\x00"  # id 86: any other character
    text = (  # the snippets joined, the newline a space
        "Tomorrow, and tomorrow, and tomorrow, Creeps in this petty pace from day to day, "
        "To the last syllable of recorded time; And all our yesterdays have lighted fools "
        "The way to dusty death. Out, out, brief candle!"
    )
    macbeth = data.train_arrays["THE_TRAGEDY_OF_MACBETH_MACBETH"]
    assert len(macbeth["y"]) == len(text) - 80  # stride 1, as LEAF
    for i in (0, 1, len(text) - 81):
        assert "".join(vocabulary[int(c)] for c in macbeth["x"][i]) == text[i : i + 80]
        assert vocabulary[macbeth["y"][i]] == text[i + 80]
    # Runs of spaces are one space (LEAF): Beatrice's test line has 83 characters as written.
    assert data.test_sizes["MUCH_ADO_ABOUT_NOTHING_BEATRICE"] == 82 - 80
    two = load_dataset("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY, num_clients=2, seed=3)
    again = load_dataset("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY, num_clients=2, seed=3)
    assert len(two.client_ids) == 2 and two.client_ids == again.client_ids
    with pytest.raises(ValueError, match="3 parts with more than 80 characters"):
        load_dataset("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY, num_clients=4)
    with pytest.raises(ValueError, match="leave --num_classes unset"):
        load_dataset("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY, num_classes=80)


def test_character_ids_need_the_character_model_and_it_needs_them() -> None:
    with pytest.raises(ValueError, match="use it with --dataset=tff_shakespeare"):
        model_spec("char_lstm", (64,), 10)
    with pytest.raises(ValueError, match="character ids: use --model=char_lstm"):
        model_spec("mlp", (80,), 87, vocabulary_size=87)
    model = model_spec("char_lstm", (80,), 87, vocabulary_size=87).build()
    assert count_trainable_parameters(model) == 819_727  # LEAF's: 8-dim embedding, 2 x 256
    with pytest.raises(DataError, match=r"token ids 0\.\.86; fix the tokenisation"):
        ids_federation(np.array([[3.0, 86.5]]))
    with pytest.raises(DataError, match=r"token ids 0\.\.86"):
        ids_federation(np.array([[3.0, 87.0]]))


def ids_federation(x: np.ndarray) -> FederatedData:
    from tff_clustered.data.federated_data import from_arrays

    client = {"a": (x, np.zeros(len(x)))}
    return from_arrays("ids", client, client, 87, vocabulary_size=87)


def test_tff_shakespeare_missing_or_damaged_file_is_a_data_error(tmp_path: object) -> None:
    missing = r"shakespeare\.sqlite in --data_dir.*does not exist; download .*shakespeare\.sqlite"
    with pytest.raises(DataError, match=missing):
        load_dataset("tff_shakespeare", data_dir=str(tmp_path))
    with open(os.path.join(TFF_SHAKESPEARE_TINY, "shakespeare.sqlite"), "rb") as f:
        good = f.read()
    with open(os.path.join(TFF_EMNIST_TINY, "emnist_all.sqlite"), "rb") as f:
        emnist = f.read()
    path = tmp_path / "shakespeare.sqlite"
    for kind, content in {
        "garbage": b"not a database at all" * 100,
        "truncated": good[: len(good) // 2],
        "emnist": emnist,  # a sound TFF database without `train`/`test` splits
    }.items():
        path.write_bytes(content)
        with pytest.raises(DataError) as raised:
            load_dataset("tff_shakespeare", data_dir=str(tmp_path))
        message = str(raised.value)
        assert "is not TFF's federated Shakespeare database" in message, kind
        assert "shakespeare.sqlite.lzma" in message and "\n" not in message, kind


def test_the_character_lstm_learns_the_tiny_shakespeare_text() -> None:
    # Both executions run it in the model matrix; here it must learn. Three rounds of FedAvg
    # on ~300 windows get it to the characters' frequencies, not past them (their entropy is
    # 2.99 nats; that takes tens of rounds): the training loss falls every round and ends well
    # below log(87) = 4.47, the loss of a model that has learnt nothing.
    spec = RunSpec(
        algorithm="fedavg",
        data=DataSpec("tff_shakespeare", data_dir=TFF_SHAKESPEARE_TINY),
        model_choice=ModelChoice("char_lstm"),
        training=TrainingConfig(
            rounds=3, clients_per_round=3, local_epochs=1, learning_rate=0.5, eval_every=3
        ),
    )
    experiment = spec_experiment(spec, RunExecution.of("in_process"))
    experiment.start()
    losses = [row["train_loss"] for row in experiment.rounds() if row["round"] > 0]
    assert losses[0] > losses[1] > losses[2] and losses[2] < np.log(87) - 0.8, losses
