"""FedAC's client partitions (Zhang et al. 2024, Sec. 5.1): 50..350 training examples per
client, Dirichlet(alpha) label mixtures or n labels per client from shared class pools (with
counted refills), and local test sets with each client's training proportions. Pure NumPy."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tff_clustered.data import fedac_partitions as parts

# CIFAR-10-like and CIFAR-100-like label arrays (train / official test).
C10, C10_TEST = np.repeat(np.arange(10), 5000), np.repeat(np.arange(10), 1000)
C100 = np.repeat(np.arange(100), 500)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def class_counts(labels: np.ndarray, idx: np.ndarray, num_classes: int = 10) -> np.ndarray:
    return np.bincount(labels[idx], minlength=num_classes)


def assert_no_repeats_and_disjoint(chunks: list[np.ndarray]) -> None:
    for c in chunks:
        assert len(np.unique(c)) == len(c)
    every = np.concatenate(chunks)
    assert len(np.unique(every)) == len(every)


def test_client_sizes_are_uniform_integers_in_the_inclusive_range() -> None:
    sizes = parts.client_sizes(5000, rng())
    assert sizes.dtype == np.int64 and sizes.shape == (5000,)
    assert sizes.min() == 50 and sizes.max() == 350  # both ends drawn, nothing outside
    assert abs(sizes.mean() - 200) < 5
    assert set(parts.client_sizes(20, rng(), 3, 4)) == {3, 4}


def test_dirichlet_clients_get_exactly_n_i_distinct_examples_from_shared_pools() -> None:
    r = rng(3)
    sizes = parts.client_sizes(100, r)
    drawn = parts.fedac_dirichlet_partition(C10, sizes, 0.1, r)
    assert [len(p) for p in drawn.parts] == list(sizes)
    assert all(np.all(np.diff(p) >= 0) for p in drawn.parts)  # sorted
    assert drawn.refills == {}  # 20k of 50k examples: no pool runs dry
    assert_no_repeats_and_disjoint(drawn.parts)


def test_dirichlet_alpha_sets_the_skew() -> None:
    sizes = parts.client_sizes(100, rng(1))

    def mean_top_share(alpha: float) -> float:
        chunks = parts.fedac_dirichlet_partition(C10, sizes, alpha, rng(2)).parts
        return float(np.mean([class_counts(C10, c).max() / len(c) for c in chunks]))

    # Dir(0.1) puts most of a client on one class (~0.67); a uniform mixture of 50..350
    # examples over 10 classes has a top share near 0.14, far below 0.5.
    assert mean_top_share(0.1) > 0.5
    assert mean_top_share(1000.0) < 0.2
    # CIFAR-100-like: Dir(0.1 * 1_100) has total concentration 10, so the top share is ~0.2,
    # against ~0.03 for a uniform mixture; sizes stay exact.
    chunks = parts.fedac_dirichlet_partition(C100, sizes, 0.1, rng(2)).parts
    assert [len(c) for c in chunks] == list(sizes)
    assert np.mean([class_counts(C100, c, 100).max() / len(c) for c in chunks]) > 0.12


@pytest.mark.parametrize("labels,n,num_classes", [(C10, 3, 10), (C100, 8, 100)])
def test_pathological_clients_hold_exactly_n_classes_split_evenly(
    labels: np.ndarray, n: int, num_classes: int
) -> None:
    r = rng(4)
    sizes = parts.client_sizes(100, r)
    drawn = parts.fedac_pathological_partition(labels, sizes, n, r)
    assert drawn.refills == {}
    assert_no_repeats_and_disjoint(drawn.parts)
    used = set()
    for size, chunk in zip(sizes, drawn.parts):
        counts = class_counts(labels, chunk, num_classes)
        held = counts[counts > 0]
        assert len(held) == n and held.sum() == size == len(chunk)
        assert held.max() - held.min() <= 1 and held.min() == size // n
        used |= set(np.flatnonzero(counts))
    assert len(used) > 0.9 * num_classes  # classes drawn at random, not always the same


def test_pathological_remainder_goes_to_random_held_classes() -> None:
    # n_i = 301 over 3 classes: one class gets 101. Over 30 seeds it is sometimes the lowest
    # held class and sometimes not (a rule like "remainder to the first class" would fail).
    lowest_got_it = set()
    for seed in range(30):
        (chunk,) = parts.fedac_pathological_partition(C10, [301], 3, rng(seed)).parts
        counts = class_counts(C10, chunk)
        assert sorted(counts[counts > 0]) == [100, 100, 101]
        lowest_got_it.add(bool(counts[np.flatnonzero(counts)[0]] == 101))
    assert lowest_got_it == {True, False}


def test_a_dry_pool_is_refilled_from_the_whole_class_and_counted() -> None:
    one_class = np.zeros(50, dtype=np.int64)
    # 40 + 40 > 50: client 1 empties the pool after 10 and takes 30 more from the refill,
    # none of them its own 10 again, so it shares 30 with client 0 but repeats nothing.
    drawn = parts.fedac_pathological_partition(one_class, [40, 40], 1, rng())
    assert drawn.refills == {0: 1}
    first, second = drawn.parts
    assert len(np.unique(first)) == 40 and len(np.unique(second)) == 40
    assert len(np.intersect1d(first, second)) == 30
    # A client needing more than its class holds repeats examples, evenly (2 or 3 times each).
    (alone,) = parts.fedac_pathological_partition(one_class, [120], 1, rng()).parts
    assert len(alone) == 120
    assert set(np.bincount(alone, minlength=50)) == {2, 3}
    # Dirichlet on a small pool: sizes stay exact, refills are reported, and a client repeats
    # an example of class y only when it needs more of y than y has (and then evenly).
    small = np.repeat(np.arange(2), 30)
    drawn = parts.fedac_dirichlet_partition(small, [50] * 6, 1.0, rng(5))
    assert [len(c) for c in drawn.parts] == [50] * 6
    assert sum(drawn.refills.values()) >= 4 and set(drawn.refills) <= {0, 1}
    for chunk in drawn.parts:
        for y in (0, 1):
            copies = np.bincount(chunk[small[chunk] == y], minlength=60)[small == y]
            demand = copies.sum()
            assert copies.max() == -(-demand // 30) and copies.max() - copies.min() <= (
                1 if demand >= 30 else copies.max()
            )


def test_local_test_sets_match_training_proportions() -> None:
    r = rng(6)
    sizes = parts.client_sizes(100, r)
    train = parts.fedac_dirichlet_partition(C10, sizes, 0.1, r).parts
    tests = parts.local_test_partition(C10, train, C10_TEST, rng(7))
    distances = []
    for size, chunk, test in zip(sizes, train, tests):
        assert len(test) == int(np.floor(0.25 * size + 0.5))
        assert len(np.unique(test)) == len(test)
        have, want = class_counts(C10, chunk), class_counts(C10_TEST, test)
        assert np.all(want[have == 0] == 0)  # only classes the client holds
        if len(test) >= np.count_nonzero(have):
            assert np.all(want[have > 0] >= 1)
        quota = have * len(test) / size
        lifted = np.count_nonzero((have > 0) & (quota < 1))  # classes raised to 1
        assert np.all(np.abs(want - quota) < 1 + lifted)
        distances.append(0.5 * np.abs(want / len(test) - have / size).sum())
    assert np.mean(distances) < 0.06


def test_local_test_set_rounds_half_up_and_gives_each_held_class_one() -> None:
    # 45 of class 0 and 2, 1, 1, 1 of classes 1..4: n = 50, test size round(12.5) = 13; the
    # quotas (11.7, 0.52, 0.26, 0.26, 0.26) round to (12, 1, 0, 0, 0), and the three classes
    # left at 0 each take one from class 0.
    train = np.array([0] * 45 + [1, 1, 2, 3, 4])
    (test,) = parts.local_test_partition(train, [np.arange(50)], C10_TEST, rng())
    assert list(class_counts(C10_TEST, test)[:5]) == [9, 1, 1, 1, 1]
    # Too small to cover every held class: 3 classes, 1 test example, of a held class.
    (test,) = parts.local_test_partition(train, [np.array([0, 45, 47])], C10_TEST, rng())
    assert len(test) == 1 and C10_TEST[test[0]] in (0, 1, 2)


def test_same_seeds_same_clients_and_test_stream_is_separate() -> None:
    def draw(scheme: str, seed: int, test_seed: int) -> parts.FedACPartition:
        return parts.fedac_partition(
            C10, C10_TEST, 30, scheme, rng(seed), rng(test_seed), labels_per_client=3
        )

    def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))

    for scheme in parts.FEDAC_PARTITIONS:
        first, again = draw(scheme, 1, 100), draw(scheme, 1, 100)
        assert np.array_equal(first.sizes, again.sizes)
        assert same(first.train, again.train) and same(first.test, again.test)
        other = draw(scheme, 2, 100)
        assert not np.array_equal(first.sizes, other.sizes) and not same(first.train, other.train)
        other_tests = draw(scheme, 1, 101)  # only the test seed changes
        assert same(first.train, other_tests.train) and not same(first.test, other_tests.test)
        assert len(first.train) == len(first.test) == 30
        assert all(50 <= len(c) <= 350 for c in first.train)


BAD: list[tuple[Callable[[], object], str]] = [
    (lambda: parts.client_sizes(0, rng()), "num_clients must be >= 1"),
    (lambda: parts.client_sizes(5, rng(), 350, 50), "min_samples <= max_samples"),
    (lambda: parts.fedac_dirichlet_partition(C10, [60], 0.0, rng()), "alpha must be"),
    (lambda: parts.fedac_dirichlet_partition(C10, [60], np.nan, rng()), "alpha must be"),
    (lambda: parts.fedac_dirichlet_partition(C10, [60, 0], 0.1, rng()), "client 1 has size 0"),
    (lambda: parts.fedac_dirichlet_partition(C10, [], 0.1, rng()), "sizes must be"),
    (lambda: parts.fedac_dirichlet_partition(C10, [6.5], 0.1, rng()), "sizes must be"),
    (lambda: parts.fedac_dirichlet_partition(C10 * 1.0, [60], 0.1, rng()), "integer array"),
    (lambda: parts.fedac_dirichlet_partition(C10[:, None], [60], 0.1, rng()), "1-D"),
    (lambda: parts.fedac_pathological_partition(C10, [60], 0, rng()), r"in 1\.\.10"),
    (lambda: parts.fedac_pathological_partition(C10, [60], 11, rng()), r"in 1\.\.10"),
    (lambda: parts.fedac_pathological_partition(C10, [60, 2], 3, rng()), "below 3"),
    (
        lambda: parts.local_test_partition(C10, [np.arange(60)], C10_TEST, rng(), 0.0),
        "fraction must be",
    ),
    (
        lambda: parts.local_test_partition(C10, [np.arange(60)], C10_TEST[1000:], rng()),
        "class 0 but test_labels has 0",
    ),
    (
        lambda: parts.local_test_partition(C10, [np.arange(60), []], C10_TEST, rng()),
        "client 1 holds no training examples",
    ),
    (lambda: parts.fedac_partition(C10, C10_TEST, 5, "iid", rng(), rng()), "unknown FedAC"),
    (
        lambda: parts.fedac_partition(C10, C10_TEST, 5, "pathological", rng(), rng()),
        "needs labels_per_client",
    ),
]


@pytest.mark.parametrize("call,message", BAD)
def test_bad_inputs_raise_errors_naming_problem_and_fix(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_one_generator_for_partition_and_tests_is_refused() -> None:
    shared = rng()
    with pytest.raises(ValueError, match="seed the local test sets separately"):
        parts.fedac_partition(C10, C10_TEST, 5, "dirichlet", shared, shared)
