"""UA-PDFL's data (Zhu, Fan and Xie, "UA-PDFL: A Personalized Approach for Decentralized
Federated Learning", arXiv:2412.11674): the PathMNIST reader on a real-format fixture, the
peers' partitions (Dirichlet with >= 10 per peer, McMahan et al.'s label-sorted shards, IID),
the 20 % local holdouts, and bad-file errors. No training."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from conftest import TESTDATA, load_script

from tff_clustered.data import DataError, FederatedData, load_dataset
from tff_clustered.data import partitions as parts
from tff_clustered.data import shard_partitions as sharding
from tff_clustered.data.images import channel_stats, standardise
from tff_clustered.data.medmnist import read_pathmnist

PATHMNIST = os.path.join(TESTDATA, "pathmnist_tiny")
FIXTURE = os.path.join(PATHMNIST, "pathmnist.npz")
FIXTURE_TRAIN = [12, 16, 20] * 3  # training images per class in the fixture
# Uneven class sizes, roughly in PathMNIST's proportions (its largest class ~1.6x its smallest):
# 1,000 labels for the shards, 10,000 for the Dirichlet draws (PathMNIST has ~90,000).
COUNTS = np.array([104, 106, 115, 116, 89, 135, 88, 104, 143])
LABELS = np.repeat(np.arange(9), COUNTS)
MANY = np.repeat(np.arange(9), 10 * COUNTS)


def rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng(list(seed))


def entropy(labels: np.ndarray) -> float:
    """Entropy (nats) of a label distribution."""
    p = np.bincount(labels) / len(labels)
    return float(-(p[p > 0] * np.log(p[p > 0])).sum())


def mean_entropy(labels: np.ndarray, chunks: list[np.ndarray]) -> float:
    return float(np.mean([entropy(labels[c]) for c in chunks]))


def assert_disjoint_cover(chunks: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(chunks)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


def single_class_peers(labels: np.ndarray, chunks: list[np.ndarray]) -> int:
    return sum(len(np.unique(labels[c])) == 1 for c in chunks)


def fixture_script() -> ModuleType:
    return load_script(os.path.join("scripts", "make_image_fixtures.py"))


def standardised_fixture() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixture's train and test images scaled to [0, 1] and standardised per channel with
    the training statistics (float64), and their labels."""
    with np.load(FIXTURE) as f:
        x_train, x_test = f["train_images"] / 255.0, f["test_images"] / 255.0
        y_train, y_test = f["train_labels"][:, 0], f["test_labels"][:, 0]
    mean, std = x_train.mean(axis=(0, 1, 2)), x_train.std(axis=(0, 1, 2))
    return (x_train - mean) / std, y_train.astype(int), (x_test - mean) / std, y_test.astype(int)


def save_npz(path: Path, **arrays: np.ndarray) -> str:
    with open(path / "pathmnist.npz", "wb") as f:
        np.savez(f, **arrays)
    return str(path)


def good_arrays(n: int = 4) -> dict[str, np.ndarray]:
    return {
        "train_images": np.zeros((n, 28, 28, 3), np.uint8),
        "train_labels": (np.arange(n) % 9).reshape(-1, 1).astype(np.uint8),
        "test_images": np.zeros((2, 28, 28, 3), np.uint8),
        "test_labels": np.zeros((2, 1), np.uint8),
    }


# The fixture and the reader.


def test_fixture_has_medmnist_layout_is_small_and_reproducible(tmp_path: Path) -> None:
    assert os.path.getsize(FIXTURE) < 300_000
    with np.load(FIXTURE) as f:
        assert sorted(f.files) == sorted(
            f"{s}_{k}" for s in ("train", "val", "test") for k in ("images", "labels")
        )
        for split, per_class in (("train", FIXTURE_TRAIN), ("val", [2] * 9), ("test", [4] * 9)):
            x, y = f[f"{split}_images"], f[f"{split}_labels"]
            assert x.dtype == np.uint8 and x.shape == (sum(per_class), 28, 28, 3)
            assert y.dtype == np.uint8 and y.shape == (sum(per_class), 1)
            assert np.bincount(y[:, 0], minlength=9).tolist() == per_class
    # The committed file is what the script writes, byte for byte.
    fixture_script().pathmnist(str(tmp_path))
    assert (tmp_path / "pathmnist_tiny" / "pathmnist.npz").read_bytes() == Path(
        FIXTURE
    ).read_bytes()


def test_read_pathmnist_reads_the_folder_or_the_file() -> None:
    x_train, y_train, x_test, y_test = read_pathmnist(PATHMNIST)
    assert x_train.shape == (144, 28, 28, 3) and x_train.dtype == np.uint8
    assert x_test.shape == (36, 28, 28, 3) and x_test.dtype == np.uint8
    assert y_train.shape == (144,) and y_train.dtype == np.int64
    assert np.bincount(y_train).tolist() == FIXTURE_TRAIN
    assert np.bincount(y_test).tolist() == [4] * 9  # 9 classes; val (2 per class) not read
    again = read_pathmnist(FIXTURE)
    assert all(np.array_equal(a, b) for a, b in zip(again, (x_train, y_train, x_test, y_test)))


def test_fixture_is_learnable_from_its_class_means() -> None:
    x_train, y_train, x_test, y_test = standardised_fixture()
    means = np.stack([x_train[y_train == c].mean(axis=0) for c in range(9)])
    distances = ((x_test[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
    assert np.mean(distances.argmin(axis=1) == y_test) == 1.0


def test_channel_statistics_are_accumulated_in_float64() -> None:
    # A float32 reduction over (0, 1, 2) drifts by hundreds here (and on full CIFAR or
    # PathMNIST, by a third of the mean): 6M values per channel around 3e5.
    noise = rng(0).uniform(0, 255, (2000, 32, 32, 3)).astype(np.float32)
    x = noise + np.float32(3e5)
    mean, std = channel_stats(x, chunk=300)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 1, 2), dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(std, x.std(axis=(0, 1, 2), dtype=np.float64), rtol=1e-9)
    train, test = standardise(noise, noise[:5] * 2)
    np.testing.assert_allclose(train.mean(axis=(0, 1, 2), dtype=np.float64), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=(0, 1, 2), dtype=np.float64), 1.0, atol=1e-5)
    ref_mean = noise.mean(axis=(0, 1, 2), dtype=np.float64)
    ref_std = noise.std(axis=(0, 1, 2), dtype=np.float64)
    np.testing.assert_allclose(test, (noise[:5] * 2 - ref_mean) / ref_std, atol=1e-4)


def test_pathmnist_is_standardised_with_a_public_test_split_and_20_percent_holdouts() -> None:
    data = load_dataset("pathmnist", data_dir=PATHMNIST, partition="iid", num_clients=4, seed=1)
    assert isinstance(data, FederatedData)
    assert data.client_ids == [f"pathmnist_{k:03d}" for k in range(4)]
    assert data.input_shape == (28, 28, 3) and data.image_shape == (28, 28, 3)
    assert data.num_classes == 9
    # 144 / 4 = 36 images per peer; round(0.2 * 36) = 7 held out, n_i = 29.
    assert set(data.train_sizes.values()) == {29} and set(data.test_sizes.values()) == {7}
    x_train, y_train, x_test, _ = standardised_fixture()
    held = [data.arrays(s, c) for c in data.client_ids for s in ("train", "test")]
    pooled_x = np.concatenate([a["x"] for a in held]).astype(np.float64)
    pooled_y = np.concatenate([a["y"] for a in held])
    np.testing.assert_allclose(pooled_x.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(pooled_x.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
    assert np.bincount(pooled_y).tolist() == FIXTURE_TRAIN  # every training image dealt once
    assert data.public_x.dtype == np.float32 and data.public_x.shape == (36, 28, 28, 3)
    np.testing.assert_allclose(data.public_x, x_test, atol=1e-4)
    # The default is UA-PDFL's 30 peers with >= 10 images each: too many for 144 images.
    with pytest.raises(ValueError, match="144 examples cannot give 30 clients 10 each"):
        load_dataset("pathmnist", data_dir=PATHMNIST)


@pytest.mark.parametrize("scheme, peers", [("dirichlet", 4), ("shards", 6), ("iid", 5)])
def test_pathmnist_peers_hold_the_seeded_partition_and_holdouts(scheme: str, peers: int) -> None:
    data = load_dataset(
        "pathmnist", data_dir=PATHMNIST, partition=scheme, num_clients=peers, seed=3
    )
    x_train, y_train, _, _ = standardised_fixture()
    # The partition comes from seed stream [3, 4], the holdouts from [3, 5], peers in order.
    expected = parts.partition(y_train, peers, scheme, rng(3, 4), dirichlet_beta=0.5)
    holdout_rng = rng(3, 5)
    for cid, idx in zip(data.client_ids, expected):
        train, test = parts.holdout_split(idx, 0.2, holdout_rng)
        for split, chosen in (("train", train), ("test", test)):
            got = data.arrays(split, cid)
            assert np.array_equal(got["y"], y_train[chosen])
            np.testing.assert_allclose(got["x"], x_train[chosen], atol=1e-4)
        assert data.test_sizes[cid] == int(np.floor(0.2 * len(idx) + 0.5))
    if scheme == "dirichlet":
        assert min(data.train_sizes[c] + data.test_sizes[c] for c in data.client_ids) >= 10
    if scheme == "shards":  # 12 shards of 12 images, 2 per peer, no peer with one class
        assert {data.train_sizes[c] + data.test_sizes[c] for c in data.client_ids} == {24}
        for cid in data.client_ids:
            labels = np.concatenate([data.arrays(s, cid)["y"] for s in ("train", "test")])
            assert len(np.unique(labels)) >= 2
    again = load_dataset(
        "pathmnist", data_dir=PATHMNIST, partition=scheme, num_clients=peers, seed=3
    )
    other = load_dataset(
        "pathmnist", data_dir=PATHMNIST, partition=scheme, num_clients=peers, seed=4
    )
    tests = [[d.arrays("test", c)["x"] for c in d.client_ids] for d in (data, again, other)]
    assert all(np.array_equal(a, b) for a, b in zip(tests[0], tests[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(tests[0], tests[2]))


# Bad files.


def test_a_missing_file_names_where_to_get_it(tmp_path: Path) -> None:
    fix = r".*zenodo\.org/records/10519652.*pip install medmnist.*--data_dir"
    with pytest.raises(DataError, match=r"pathmnist\.npz not found" + fix):
        load_dataset("pathmnist", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"--dataset=pathmnist reads a file" + fix):
        load_dataset("pathmnist")
    with pytest.raises(DataError, match="nothing is downloaded at run time"):
        read_pathmnist(str(tmp_path / "elsewhere.npz"))


def test_bad_files_name_the_problem_and_the_fix(tmp_path: Path) -> None:
    fix = r".*zenodo\.org/records/10519652"
    (tmp_path / "pathmnist.npz").write_bytes(b"not a zip file")
    with pytest.raises(DataError, match=r"cannot be read as a NumPy \.npz archive" + fix):
        read_pathmnist(str(tmp_path))
    with open(tmp_path / "pathmnist.npz", "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(DataError, match=r"holds a single ndarray, not an \.npz archive" + fix):
        read_pathmnist(str(tmp_path))
    arrays = good_arrays()
    read_pathmnist(save_npz(tmp_path, **arrays))  # the good base case reads
    partial = {k: arrays[k] for k in ("train_images", "test_labels")}
    with pytest.raises(DataError, match=r"lacks train_labels, test_images \(it holds" + fix):
        read_pathmnist(save_npz(tmp_path, **partial))
    cases = [
        ("train_images", np.zeros((4, 64, 64, 3), np.uint8), r"\(4, 64, 64, 3\).*MedMNIST\+"),
        ("train_images", np.zeros((4, 28, 28, 3), np.float32), r"float32 of shape.*expected uint8"),
        ("test_images", np.zeros((2, 28, 28), np.uint8), r"test_images.*\(2, 28, 28\)"),
        ("train_labels", np.zeros((3, 1), np.uint8), r"train_labels.*\(3, 1\).*shape \(4, 1\)"),
        ("train_labels", np.full((4, 1), 0.5), r"float64.*expected integers"),
        ("train_labels", np.full((4, 1), 9, np.uint8), r"label 9, outside the 9 classes 0\.\.8"),
        ("test_labels", np.array([[None], [1]], object), r"test arrays .* cannot be read"),
    ]
    for key, value, message in cases:
        with pytest.raises(DataError, match=message + fix):
            read_pathmnist(save_npz(tmp_path, **{**arrays, key: value}))


# The Dirichlet partition: per class p_c ~ Dir_M(beta), redrawn until every peer has >= 10.


def test_dirichlet_redraws_until_every_peer_has_10_and_deals_everything() -> None:
    for seed in range(3):
        chunks = parts.dirichlet_partition(MANY, 30, 0.1, rng(seed))
        assert_disjoint_cover(chunks, len(MANY))
        assert min(len(c) for c in chunks) >= 10
        # With 30 peers at beta = 0.1 the first draw of these seeds starves some peer: the
        # guarantee rests on the redraw, and a bounded number of draws fails clearly.
        with pytest.raises(ValueError, match=r"no Dirichlet\(beta=0.1\) draw.*in 1 tries.*beta"):
            parts.dirichlet_partition(MANY, 30, 0.1, rng(seed), max_draws=1)
    with pytest.raises(ValueError, match=r"10000 examples cannot give 1001 clients 10 each"):
        parts.dirichlet_partition(MANY, 1001, 0.5, rng(0))


def test_smaller_beta_gives_more_label_skew() -> None:
    by_beta = {
        beta: mean_entropy(MANY, parts.dirichlet_partition(MANY, 30, beta, rng(7)))
        for beta in (0.1, 0.5, 100.0)
    }
    iid = mean_entropy(MANY, parts.iid_partition(MANY, 30, rng(7)))
    shards = mean_entropy(MANY, sharding.shard_partition(MANY, 30, rng(7)))
    assert by_beta[0.1] < by_beta[0.5] - 0.5
    assert by_beta[0.5] < by_beta[100.0] - 0.3
    assert abs(by_beta[100.0] - iid) < 0.05 and iid > np.log(9) - 0.05
    # Two shards hold at most two classes, bar a shard straddling a class boundary.
    assert shards < np.log(2) + 0.15 and shards < by_beta[0.5] - 0.5


# The shard partition: sorted by label, 2M contiguous shards, 2 per peer.


def test_shards_are_contiguous_equal_and_two_per_peer() -> None:
    chunks = sharding.shard_partition(LABELS, 30, rng(11))
    shards = sharding.label_sorted_shards(LABELS, 60, rng(11))  # the shards it cut from rng(11)
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(LABELS)  # 1000 / 60: 16 or 17
    assert all(np.all(np.diff(LABELS[s]) >= 0) for s in shards)
    assert all(LABELS[a].max() <= LABELS[b].min() for a, b in zip(shards, shards[1:]))
    owner = np.empty(len(LABELS), int)
    for k, c in enumerate(chunks):
        owner[c] = k
    held = [np.unique(owner[s]) for s in shards]
    assert all(len(h) == 1 for h in held)  # a shard is never split between peers
    assert sorted(np.bincount(np.concatenate(held)).tolist()) == [2] * 30  # 2 shards a peer
    assert_disjoint_cover(chunks, len(LABELS))
    assert {len(c) for c in chunks} <= {32, 33, 34}
    assert single_class_peers(LABELS, chunks) == 0
    assert max(len(np.unique(LABELS[c])) for c in chunks) <= 4  # extreme skew: few classes each


def test_shards_are_seeded() -> None:
    first = sharding.shard_partition(LABELS, 30, rng(1))
    again = sharding.shard_partition(LABELS, 30, rng(1))
    other = sharding.shard_partition(LABELS, 30, rng(2))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_shards_avoid_single_class_peers_by_repair_when_redraws_fail() -> None:
    # Two classes of 500 in 100 pure shards for 50 peers: only deals pairing every class-0 shard
    # with a class-1 shard are valid, which a random deal almost never is.
    halves = np.repeat([0, 1], 500)
    chunks = sharding.shard_partition(halves, 50, rng(0), rejection_draws=10)
    assert_disjoint_cover(chunks, 1000)
    assert single_class_peers(halves, chunks) == 0
    # FedAvg's setting: 100 peers x 2 shards of 10 equal classes, repair only.
    tens = np.repeat(np.arange(10), 60)
    chunks = sharding.shard_partition(tens, 100, rng(0), rejection_draws=0)
    assert_disjoint_cover(chunks, 600)
    assert single_class_peers(tens, chunks) == 0
    assert {len(c) for c in chunks} == {6}


def test_shards_keep_single_class_peers_to_the_unavoidable_few() -> None:
    # 80 % one class: 8 of 10 shards hold only class 0, so >= 8 - 5 = 3 of 5 peers hold it alone.
    skewed = np.repeat([0, 1], [80, 20])
    pure = np.array([0] * 8 + [1] * 2)
    assert sharding.fewest_single_class_peers(pure, 5, 2) == 3
    for seed in range(5):
        chunks = sharding.shard_partition(skewed, 5, rng(seed))
        assert single_class_peers(skewed, chunks) == 3
        assert_disjoint_cover(chunks, 100)
    with pytest.raises(ValueError, match=r"cannot make 501 x 2 shards; use fewer clients"):
        sharding.shard_partition(LABELS, 501, rng(0))
    with pytest.raises(ValueError, match="unknown partition 'zipf'"):
        parts.partition(LABELS, 5, "zipf", rng(0))


# The local holdout.


def test_holdout_is_a_random_disjoint_fifth_rounded_half_up() -> None:
    expected = {2: 1, 3: 1, 5: 1, 10: 2, 12: 2, 13: 3, 36: 7, 100: 20}
    for n, n_test in expected.items():
        indices = np.arange(1000, 1000 + n)[::-1]
        train, test = parts.holdout_split(indices, 0.2, rng(n))
        assert len(test) == n_test and len(train) == n - n_test
        assert np.array_equal(np.sort(np.concatenate([train, test])), np.sort(indices))
        assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    for n in range(2, 200):
        _, test = parts.holdout_split(np.arange(n), 0.2, rng(n))
        assert len(test) == min(max(int(np.floor(0.2 * n + 0.5)), 1), n - 1)
    # Every index is held out with probability 1/5.
    hits = np.zeros(10)
    for seed in range(2000):
        hits[parts.holdout_split(np.arange(10), 0.2, rng(seed))[1]] += 1
    np.testing.assert_allclose(hits / 2000, 0.2, atol=0.03)
    with pytest.raises(ValueError, match=">= 2 indices"):
        parts.holdout_split(np.arange(1), 0.2, rng(0))
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\)"):
        parts.holdout_split(np.arange(10), 0.0, rng(0))
