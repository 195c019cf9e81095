"""FedGroup's dataset setups (MNIST, FEMNIST, Sent140) on small fixtures in the real formats."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
from conftest import TESTDATA

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import DataError, load_dataset
from tff_clustered.data.mnist import partition_by_classes, read_mnist
from tff_clustered.data.tweets import tokenize
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import count_trainable_parameters, model_spec

MNIST_DIR = os.path.join(TESTDATA, "mnist_idx_tiny")
SENT140_DIR = os.path.join(TESTDATA, "sent140_tiny")
GLOVE = os.path.join(SENT140_DIR, "glove_tiny.300d.txt")


def labels_of(data: object, cid: str) -> set:
    out = set()
    for source in (data.train, data.test):
        for batch in source.create_tf_dataset_for_client(cid).batch(1000):
            out |= set(batch["y"].numpy().tolist())
    return out


def test_mnist_from_idx_gives_two_digit_power_law_clients() -> None:
    data = load_dataset("mnist", MNIST_DIR, num_clients=20, seed=1)
    assert len(data.client_ids) == 20 and data.input_shape == (784,)
    sizes = []
    for u, cid in enumerate(data.client_ids):
        assert labels_of(data, cid) <= {u % 10, (u + 1) % 10}
        n = data.train_sizes[cid] + data.test_sizes[cid]
        assert n >= 10  # 5 of each of its digits first
        assert data.train_sizes[cid] == int(np.floor(0.9 * n))
        sizes.append(n)
    assert sum(sizes) == 300  # every image dealt out once


def test_partition_gives_power_law_sizes_at_mnist_scale() -> None:
    y = np.repeat(np.arange(10), 7000)
    shares = partition_by_classes(y, 1000, 2, np.random.default_rng(0))
    sizes = np.array([len(s) for s in shares])
    assert sizes.sum() == 70_000 and sizes.min() >= 10
    assert len(np.unique(np.concatenate(shares))) == 70_000  # a partition: no image twice
    assert sizes.max() > 20 * np.median(sizes)  # heavy tail (lognormal sigma = 2)


def test_mnist_npz_and_idx_agree_and_bad_files_are_named(tmp_path: object) -> None:
    x, y = read_mnist(MNIST_DIR)
    np.savez(
        tmp_path / "mnist.npz",
        x_train=x[:240].reshape(-1, 28, 28),
        y_train=y[:240],
        x_test=x[240:].reshape(-1, 28, 28),
        y_test=y[240:],
    )
    x2, y2 = read_mnist(str(tmp_path))
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.*missing"):
        os.makedirs(tmp_path / "partial")
        for name in (
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz",
        ):
            os.symlink(os.path.join(MNIST_DIR, name), tmp_path / "partial" / name)
        read_mnist(str(tmp_path / "partial"))
    os.makedirs(tmp_path / "cut")
    for name in os.listdir(MNIST_DIR):
        if name.endswith(".gz"):
            os.symlink(os.path.join(MNIST_DIR, name), tmp_path / "cut" / name)
    os.unlink(tmp_path / "cut" / "t10k-images-idx3-ubyte.gz")
    with gzip.open(os.path.join(MNIST_DIR, "t10k-images-idx3-ubyte.gz")) as f:
        truncated = f.read()[:5000]
    with gzip.open(tmp_path / "cut" / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(truncated)
    with pytest.raises(DataError, match="truncated"):
        read_mnist(str(tmp_path / "cut"))
    with pytest.raises(DataError, match="does not exist"):
        read_mnist(str(tmp_path / "nowhere"))


def test_femnist_subset_has_a_26_way_head_matching_table_2(tmp_path: object) -> None:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        os.makedirs(tmp_path / split)
        users = ["f_0", "f_1"]
        blob = {
            "users": users,
            "num_samples": [3, 3],
            "user_data": {
                u: {"x": rng.random((3, 784)).round(3).tolist(), "y": [0, 4, 9]} for u in users
            },
        }
        with open(tmp_path / split / "data.json", "w") as f:
            json.dump(blob, f)
    data = load_dataset("femnist", str(tmp_path))
    assert data.num_classes == 26 and data.image_shape == (28, 28, 1)
    spec = model_spec("mclr", data.input_shape, data.num_classes)
    assert count_trainable_parameters(spec.build()) == 20_410
    assert load_dataset("femnist_leaf", str(tmp_path)).num_classes == 62
    with pytest.raises(DataError, match="needs --data_dir.*FedProx"):
        load_dataset("femnist")


def test_sent140_tokenises_embeds_and_maps_labels() -> None:
    assert tokenize("I can't go, sorry!! ok") == ["I", "can't", "go", ",", "sorry", "!", "!", "ok"]
    assert len(tokenize(" ".join(["w"] * 40))) == 25
    data = load_dataset("sent140", SENT140_DIR, glove_path=GLOVE)
    assert data.input_shape == (25, 300) and data.num_classes == 2
    batch = next(iter(data.train.create_tf_dataset_for_client("user0").batch(100)))
    assert set(batch["y"].numpy().tolist()) <= {0, 1}  # raw label 4 became 1
    x = batch["x"].numpy()
    assert np.all(x[:, -1] == 0)  # right padding is the zero vector
    raw = json.load(
        open(os.path.join(SENT140_DIR, "train", os.listdir(os.path.join(SENT140_DIR, "train"))[0]))
    )["user_data"]["user0"]["x"]
    for row, embedded in zip(raw, x):
        tokens = tokenize(row[4])
        for j, token in enumerate(tokens):
            assert (np.abs(embedded[j]).sum() == 0) == (token == "unknownword")
    lstm = model_spec("lstm", data.input_shape, 2)
    assert count_trainable_parameters(lstm.build()) == 243_861
    with pytest.raises(DataError, match="GloVe file .* not found"):
        load_dataset("sent140", SENT140_DIR, glove_path="/nowhere/glove.txt")


@pytest.mark.usefixtures("tff_context")
@pytest.mark.parametrize(
    "dataset, model, kwargs, lr",
    [
        ("mnist", "mclr", dict(data_dir=MNIST_DIR, num_clients=20), 0.05),
        ("sent140", "lstm", dict(data_dir=SENT140_DIR, glove_path=GLOVE), 0.3),
    ],
)
def test_short_training_run_learns(dataset: str, model: str, kwargs: dict, lr: float) -> None:
    data = load_dataset(dataset, seed=0, **kwargs)
    spec = model_spec(model, data.input_shape, data.num_classes)
    clients = min(10, len(data.client_ids))
    config = TrainingConfig(
        rounds=4, clients_per_round=clients, local_epochs=3, learning_rate=lr, seed=0
    )
    experiment = Experiment(data, spec, make_algorithm("fedavg"), config)
    experiment.start()
    history = list(experiment.rounds())
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["accuracy"] > 0.7
