"""FedAC's setups: each client's training count, and its labels drawn from shared class pools.

FedAC's setups (Zhang et al., "FedAC: A Adaptive Clustered Federated Learning Framework for
Heterogeneous Data", arXiv:2403.16460, 2024, Sec. 5.1) fix each client's training count:
n_i ~ UniformInt[50, 350], and each client's n_i examples follow either a Dirichlet(alpha) label
mixture or n distinct labels, drawn without replacement from class pools shared by all clients
(`fedac_partition`); each client's local test set comes from the official test split with its
training label proportions.

Every partition returns one sorted index array per client, disjoint unless a class pool ran
dry and was refilled (reported in `refills`). Every random choice comes from the
`np.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

FEDAC_PARTITIONS = ("dirichlet", "pathological")
FEDAC_MIN_SAMPLES, FEDAC_MAX_SAMPLES = 50, 350  # n_i ~ UniformInt[50, 350] (FedAC, Sec. 5.1)
FEDAC_TEST_FRACTION = 0.25  # local test set size round(0.25 n_i); FedAC gives none


@dataclass(frozen=True)
class PoolPartition:
    """Per-client training indices (sorted; a client may hold an index twice only after a
    refill) and `refills[c]`, how often the pool of class `c` ran dry and was refilled from the
    whole class (only classes refilled at least once); log it, since refills make clients share
    examples."""

    parts: list[np.ndarray]
    refills: dict[int, int]


@dataclass(frozen=True)
class FedACPartition:
    """FedAC's clients: training counts `sizes` (n_i), training indices `train` (into the
    training labels), local test indices `test` (into the test labels) and the class pools'
    `refills` (see `PoolPartition`)."""

    sizes: np.ndarray
    train: list[np.ndarray]
    test: list[np.ndarray]
    refills: dict[int, int]


def client_sizes(
    num_clients: int,
    rng: np.random.Generator,
    min_samples: int = FEDAC_MIN_SAMPLES,
    max_samples: int = FEDAC_MAX_SAMPLES,
) -> np.ndarray:
    """Training counts n_i ~ UniformInt[min_samples, max_samples], both ends included, one per
    client (FedAC, Sec. 5.1: 50..350)."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 1 <= min_samples <= max_samples:
        raise ValueError(
            f"need 1 <= min_samples <= max_samples, got {min_samples}..{max_samples}; "
            f"FedAC uses {FEDAC_MIN_SAMPLES}..{FEDAC_MAX_SAMPLES}"
        )
    return rng.integers(min_samples, max_samples, size=num_clients, endpoint=True).astype(np.int64)


def _int_labels(labels: np.ndarray, what: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not labels.size or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{what} must be a non-empty 1-D integer array, got shape {labels.shape} of "
            f"{labels.dtype}; pass the class labels, e.g. y_train"
        )
    return labels


def _checked_sizes(sizes: Sequence[int], at_least: int = 1) -> np.ndarray:
    arr = np.asarray(sizes)
    if arr.ndim != 1 or not arr.size or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"sizes must be a non-empty 1-D integer array (one training count per client), got "
            f"shape {arr.shape} of {arr.dtype}; draw them with client_sizes"
        )
    if arr.min() < at_least:
        raise ValueError(
            f"client {int(np.argmin(arr))} has size {int(arr.min())}, below {at_least}; every "
            f"client needs >= {at_least} examples"
        )
    return arr.astype(np.int64)


class _ClassPools:
    """One shuffled pool per class, shared by all clients and drawn without replacement. A pool
    that runs dry is refilled with its whole class (counted in `refills`), ordered so that the
    client drawing takes first the examples it holds the fewest times (random among equals): a
    client repeats an example only after it holds its whole class, and then evenly."""

    def __init__(self, labels: np.ndarray, rng: np.random.Generator) -> None:
        self.classes = np.unique(labels)
        self.members = [np.flatnonzero(labels == c) for c in self.classes]
        self.pools = [rng.permutation(m) for m in self.members]
        self.used = np.zeros(len(self.classes), dtype=np.int64)
        self.refills = np.zeros(len(self.classes), dtype=np.int64)

    def take(self, j: int, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` examples of the j-th class for one client."""
        got: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        while count > 0:
            if self.used[j] == len(self.pools[j]):
                members = self.members[j]
                held = np.bincount(
                    np.searchsorted(members, np.concatenate(got)), minlength=len(members)
                )
                order = rng.permutation(len(members))
                self.pools[j] = members[order[np.argsort(held[order], kind="stable")]]
                self.used[j] = 0
                self.refills[j] += 1
            piece = self.pools[j][self.used[j] : self.used[j] + count]
            got.append(piece)
            self.used[j] += len(piece)
            count -= len(piece)
        return np.concatenate(got)

    def deal(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A client's sorted indices, `counts[j]` of the j-th class."""
        picks = [self.take(j, int(k), rng) for j, k in enumerate(counts) if k]
        return np.sort(np.concatenate(picks)).astype(np.int64)

    def refilled(self) -> dict[int, int]:
        return {int(c): int(r) for c, r in zip(self.classes, self.refills) if r}


def fedac_dirichlet_partition(
    labels: np.ndarray, sizes: Sequence[int], alpha: float, rng: np.random.Generator
) -> PoolPartition:
    """Client i gets exactly `sizes[i]` examples with a Dirichlet(alpha) label mixture:
    q_i ~ Dir(alpha 1_C) over the C classes present, class counts c_i ~ Multinomial(n_i, q_i),
    and c_{i,y} examples of class y without replacement from class y's shared pool (FedAC,
    Sec. 5.1, Dirichlet alpha = 0.1 with 50..350 samples per client; the paper does not say how
    the two combine, and this per-client mixture is the reading that keeps the counts). Smaller
    alpha gives more skewed clients. Unlike `dirichlet_partition`, a class pool may run dry;
    it is then refilled (see `PoolPartition`)."""
    labels = _int_labels(labels, "labels")
    sizes = _checked_sizes(sizes)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(
            f"dirichlet alpha must be a finite number > 0, got {alpha}; FedAC uses 0.1"
        )
    pools = _ClassPools(labels, rng)
    parts = []
    for n in sizes:
        q = rng.dirichlet(np.full(len(pools.classes), float(alpha)))
        parts.append(pools.deal(rng.multinomial(n, q / q.sum()), rng))
    return PoolPartition(parts, pools.refilled())


def fedac_pathological_partition(
    labels: np.ndarray, sizes: Sequence[int], labels_per_client: int, rng: np.random.Generator
) -> PoolPartition:
    """Client i draws `labels_per_client` distinct classes uniformly at random and gets
    `sizes[i]` examples split equally among them, the remainder going one each to random
    classes among them (so its class counts differ by at most 1), without replacement from
    shared class pools (FedAC, Sec. 5.1: n = 3 labels per client on CIFAR-10, 8 on
    CIFAR-100). A pool that runs dry is refilled (see `PoolPartition`)."""
    labels = _int_labels(labels, "labels")
    num_classes = len(np.unique(labels))
    if not 1 <= labels_per_client <= num_classes:
        raise ValueError(
            f"labels_per_client must be in 1..{num_classes} (the classes present), got "
            f"{labels_per_client}; FedAC uses 3 on CIFAR-10 and 8 on CIFAR-100"
        )
    sizes = _checked_sizes(sizes, at_least=labels_per_client)
    pools = _ClassPools(labels, rng)
    parts = []
    for n in sizes:
        held = rng.choice(num_classes, labels_per_client, replace=False)
        counts = np.zeros(num_classes, dtype=np.int64)
        counts[held] = n // labels_per_client
        counts[rng.choice(held, n % labels_per_client, replace=False)] += 1
        parts.append(pools.deal(counts, rng))
    return PoolPartition(parts, pools.refilled())


def _proportional_counts(counts: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """`total` split in proportion to `counts` by largest remainders (ties at random), then,
    if `total` covers every nonzero class, each nonzero class that got 0 takes one from the
    class most above its quota."""
    quota = counts * total / counts.sum()
    out = np.floor(quota).astype(np.int64)
    rest = total - int(out.sum())
    order = np.lexsort((rng.random(len(counts)), -(quota - out)))
    out[order[:rest]] += 1
    if total >= np.count_nonzero(counts):
        for j in np.flatnonzero((counts > 0) & (out == 0)):
            donor = int(np.argmax(np.where(out >= 2, out - quota, -np.inf)))
            out[donor] -= 1
            out[j] += 1
    return out


def local_test_partition(
    labels: np.ndarray,
    parts: Sequence[np.ndarray],
    test_labels: np.ndarray,
    rng: np.random.Generator,
    fraction: float = FEDAC_TEST_FRACTION,
) -> list[np.ndarray]:
    """Each client's local test set: round(fraction * n_i) indices into `test_labels` (round
    half up; n_i = len(parts[i])), split among the classes of its training examples
    `labels[parts[i]]` in proportion to their counts (largest remainders), with >= 1 per held
    class when the size allows, drawn without replacement within the client. Clients draw
    independently, so two clients may share test examples. FedAC reports test accuracy but no
    test split (Sec. 5.1); this is our protocol. Pass a generator seeded apart from the
    training partition's."""
    labels = _int_labels(labels, "labels")
    test_labels = _int_labels(test_labels, "test_labels")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}; FedAC's default is 0.25")
    classes = np.unique(labels)
    by_class = {int(c): np.flatnonzero(test_labels == c) for c in classes}
    tests = []
    for i, idx in enumerate(parts):
        idx = np.asarray(idx)
        if not idx.size:
            raise ValueError(f"client {i} holds no training examples; give every client >= 1")
        held, counts = np.unique(labels[idx], return_counts=True)
        size = int(np.floor(fraction * idx.size + 0.5))
        picks = []
        for c, k in zip(held, _proportional_counts(counts, size, rng)):
            pool = by_class[int(c)]
            if k > len(pool):
                raise ValueError(
                    f"client {i} needs {k} test examples of class {int(c)} but test_labels has "
                    f"{len(pool)}; use a larger test split or a smaller fraction"
                )
            picks.append(rng.choice(pool, int(k), replace=False))
        tests.append(np.sort(np.concatenate(picks)).astype(np.int64))
    return tests


def fedac_partition(
    labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    scheme: str,
    rng: np.random.Generator,
    test_rng: np.random.Generator,
    alpha: float = 0.1,
    labels_per_client: Optional[int] = None,
    min_samples: int = FEDAC_MIN_SAMPLES,
    max_samples: int = FEDAC_MAX_SAMPLES,
    test_fraction: float = FEDAC_TEST_FRACTION,
) -> FedACPartition:
    """FedAC's clients (Sec. 5.1): sizes n_i from `client_sizes`, training indices from
    `fedac_dirichlet_partition` (`scheme` "dirichlet", `alpha`) or
    `fedac_pathological_partition` ("pathological", `labels_per_client`), all drawn from `rng`;
    local test sets from `local_test_partition`, drawn from `test_rng`, a separate generator
    (`DataStream.CLIENT_TEST_SETS` beside `DataStream.CLIENT_EXAMPLES`, `seeds.data_rng`), so the
    test sets do not shift the training partition's random stream."""
    if scheme not in FEDAC_PARTITIONS:
        raise ValueError(
            f"unknown FedAC partition {scheme!r}; choose one of {', '.join(FEDAC_PARTITIONS)}"
        )
    if rng is test_rng:
        raise ValueError(
            "rng and test_rng are the same generator; seed the local test sets separately, "
            "e.g. seeds.data_rng(seed, DataStream.CLIENT_EXAMPLES) and "
            "seeds.data_rng(seed, DataStream.CLIENT_TEST_SETS)"
        )
    if scheme == "pathological" and labels_per_client is None:
        raise ValueError(
            "the pathological partition needs labels_per_client (FedAC: 3 on CIFAR-10, "
            "8 on CIFAR-100)"
        )
    sizes = client_sizes(num_clients, rng, min_samples, max_samples)
    if scheme == "dirichlet":
        drawn = fedac_dirichlet_partition(labels, sizes, alpha, rng)
    else:
        drawn = fedac_pathological_partition(labels, sizes, int(labels_per_client), rng)
    tests = local_test_partition(labels, drawn.parts, test_labels, test_rng, test_fraction)
    return FedACPartition(sizes, drawn.parts, tests, drawn.refills)
