"""McMahan et al.'s shards: each client given a few shards of the label-sorted examples.

McMahan et al.'s shards ("Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017), pure NumPy: a partition of a labelled pool that gives each
client a few shards of the label-sorted examples.

* pathological: each client holds `classes_per_client` single-class shards of different
  classes (`pathological_partition`);
* shards: McMahan et al.'s split as they describe it and as UA-PDFL (Zhu, Fan and Xie, "UA-PDFL:
  A Personalized Approach for Decentralized Federated Learning", arXiv:2412.11674) uses it for
  its extreme non-IID peers: the training set sorted by label and cut into 2M equal contiguous
  shards (a shard may straddle two classes), two random shards per peer, redrawn while some
  peer would hold a single class (`shard_partition`).

Every partition returns one sorted index array per client; the arrays are disjoint. Every
random choice comes from the `np.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np


def _class_shards(labels: np.ndarray, num_shards: int) -> tuple[list[np.ndarray], np.ndarray]:
    """`num_shards` single-class shards of (near) equal size, and the class of each: a class
    gets shards in proportion to its size (highest averages), its examples split evenly among
    them. A class too small for a single shard is left out."""
    classes, counts = np.unique(labels, return_counts=True)
    per_class = np.floor(counts / counts.sum() * num_shards).astype(int)
    while per_class.sum() < num_shards:
        per_class[np.argmax(counts / np.maximum(per_class, 1))] += 1
    order = np.argsort(labels, kind="stable")
    shards, shard_class = [], []
    for c, n in zip(classes, per_class):
        for piece in np.array_split(order[labels[order] == c], n) if n else []:
            shards.append(piece)
            shard_class.append(c)
    return shards, np.asarray(shard_class)


def _rows_with_repeats(classes: np.ndarray) -> np.ndarray:
    """Indices of the rows of a (clients, shards) class matrix that hold a class twice."""
    ordered = np.sort(classes, axis=1)
    return np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))


def _repair_repeats(
    deal: np.ndarray, shard_class: np.ndarray, rng: np.random.Generator
) -> Optional[np.ndarray]:
    """`deal` with every repeated class swapped away, or None if the repair gets stuck.

    A repeated shard of a row is swapped with a random shard of another row such that neither
    row repeats a class afterwards. Each swap removes at least one repeat, so this ends within
    `deal.size` swaps.
    """
    deal = deal.copy()
    for _ in range(deal.size + 1):
        cls = shard_class[deal]
        bad = _rows_with_repeats(cls)
        if not bad.size:
            return deal
        r = int(bad[0])
        _, first = np.unique(cls[r], return_index=True)
        j = int(np.setdiff1d(np.arange(deal.shape[1]), first)[0])  # a repeated class's 2nd shard
        fits = ~np.isin(cls, cls[r]) & ~(cls == cls[r, j]).any(axis=1, keepdims=True)
        candidates = np.argwhere(fits)
        if not len(candidates):
            return None
        r2, j2 = candidates[rng.integers(len(candidates))]
        deal[r, j], deal[r2, j2] = deal[r2, j2], deal[r, j]
    return None


def pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    rejection_draws: int = 1000,
    repair_draws: int = 100,
) -> list[np.ndarray]:
    """Sort by label, cut into num_clients * classes_per_client single-class shards of equal
    size (a larger class gives more shards) and deal each client `classes_per_client` shards
    of different classes (McMahan et al. 2017).

    Deals are drawn uniformly at random and redrawn while some client holds a class twice
    (uniform over the valid deals); after `rejection_draws` failures (likely with many clients,
    e.g. 100 clients x 2 of 10 classes) a random deal is repaired by swapping shards instead.
    """
    labels = np.asarray(labels)
    num_shards = num_clients * classes_per_client
    num_classes = len(np.unique(labels))
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(
            f"classes_per_client must be in 1..{num_classes} (the classes present), "
            f"got {classes_per_client}"
        )
    if num_clients < 1 or num_shards > len(labels):
        raise ValueError(
            f"{len(labels)} examples cannot make {num_clients} x {classes_per_client} shards; "
            "use fewer clients or classes per client"
        )
    shards, shard_class = _class_shards(labels, num_shards)
    most = int(np.max(np.unique(shard_class, return_counts=True)[1]))
    if most > num_clients or len(np.unique(shard_class)) < classes_per_client:
        raise ValueError(
            f"one class makes {most} of the {num_shards} shards, more than the {num_clients} "
            "clients, so some client would get it twice; use more clients, fewer classes per "
            "client, or a balanced dataset"
        )
    for attempt in range(rejection_draws + repair_draws):
        deal = rng.permutation(num_shards).reshape(num_clients, classes_per_client)
        if attempt >= rejection_draws:
            deal = _repair_repeats(deal, shard_class, rng)
        elif _rows_with_repeats(shard_class[deal]).size:
            deal = None
        if deal is not None:
            return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]
    raise ValueError(
        f"could not give {num_clients} clients {classes_per_client} shards of different "
        "classes; use fewer clients or classes per client"
    )


# McMahan et al.'s contiguous shards, as UA-PDFL (arXiv:2412.11674) deals its extreme non-IID
# peers.


def label_sorted_shards(
    labels: np.ndarray, num_shards: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """The examples sorted by label (in random order within a class) and cut into `num_shards`
    contiguous shards whose sizes differ by at most 1 (the first `len(labels) % num_shards` are
    the larger). A shard may straddle the boundary between two classes."""
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    return np.array_split(order, num_shards)


def _pure_classes(labels: np.ndarray, shards: Sequence[np.ndarray]) -> np.ndarray:
    """The class of each shard that holds a single class, -1 for a shard of several."""
    return np.asarray(
        [int(labels[s[0]]) if np.all(labels[s] == labels[s[0]]) else -1 for s in shards],
        dtype=np.int64,
    )


def _single_class_rows(classes: np.ndarray) -> np.ndarray:
    """Which rows of a (peers, shards) matrix of `_pure_classes` hold one class only: all their
    shards single-class shards of the same class."""
    return (classes[:, 0] >= 0) & (classes == classes[:, :1]).all(axis=1)


def fewest_single_class_peers(pure: np.ndarray, num_clients: int, shards_per_client: int) -> int:
    """The fewest peers that must hold a single class, given the class of every single-class
    shard (`pure`, -1 for mixed shards): a peer holds at most `shards_per_client - 1` shards of
    class c without being single-class, so a class with k_c > (s - 1) M single-class shards
    forces k_c - (s - 1) M peers onto it alone (and no more are needed). 0 unless one class
    fills more than (s - 1) / s of the shards (with s = 2, more than half the data)."""
    counts = np.bincount(pure[pure >= 0]) if np.any(pure >= 0) else np.zeros(0, np.int64)
    return int(np.maximum(counts - (shards_per_client - 1) * num_clients, 0).sum())


def _repair_single_class(
    deal: np.ndarray, pure: np.ndarray, target: int, rng: np.random.Generator
) -> Optional[np.ndarray]:
    """`deal` with shards swapped until at most `target` peers hold a single class, or None if
    no single swap lowers the count any more (then draw again). Each swap moves a shard of a
    random single-class peer r to a random place (r2, j2) such that the number of single-class
    peers drops, so this ends within `deal.shape[0]` swaps."""
    deal = deal.copy()
    s = deal.shape[1]
    for _ in range(deal.shape[0] + 1):
        classes = pure[deal]
        single = _single_class_rows(classes)
        if single.sum() <= target:
            return deal
        r = int(rng.choice(np.flatnonzero(single)))
        c = classes[r, 0]
        is_c = classes == c
        # After swapping deal[r, 0] (class c) with deal[r2, j2]: r stays single-class iff the
        # incoming shard is of class c too (or r holds one shard); r2 becomes single-class iff
        # all its other shards are of class c.
        r_single = is_c if s > 1 else classes >= 0
        r2_single = (is_c.sum(axis=1, keepdims=True) - is_c) == s - 1
        change = r_single.astype(int) + r2_single - 1 - single[:, None]
        change[r] = 0
        candidates = np.argwhere(change < 0)
        if not len(candidates):
            return None
        r2, j2 = candidates[rng.integers(len(candidates))]
        deal[r, 0], deal[r2, j2] = deal[r2, j2], deal[r, 0]
    return None


def shard_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    shards_per_client: int = 2,
    rejection_draws: int = 1000,
    repair_draws: int = 100,
) -> list[np.ndarray]:
    """The extreme non-IID split of McMahan et al. (2017) that UA-PDFL (arXiv:2412.11674) uses:
    sort the examples by label, cut them into `num_clients * shards_per_client` contiguous
    shards of equal size (+-1, `label_sorted_shards`) and give each peer `shards_per_client` (2)
    random shards. Unlike `pathological_partition`, shards are cut from the sorted whole, not
    per class, so a shard may straddle two classes and a peer may get two shards of one class.

    The deal is redrawn while some peer would hold a single class (all its shards single-class
    shards of the same class): uniform over the deals without one. After `rejection_draws`
    failures (likely with many peers: with 100 peers x 2 shards of 10 classes a deal has about
    9 such peers on average) a random deal is repaired by swapping shards instead. When one
    class fills more than (s - 1) / s of the shards, some peers must hold it alone; the deal
    then has the fewest such peers (`fewest_single_class_peers`). Every example is dealt once.
    """
    labels = np.asarray(labels)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    if num_clients < 1 or num_shards > len(labels):
        raise ValueError(
            f"{len(labels)} examples cannot make {num_clients} x {shards_per_client} shards; "
            "use fewer clients or shards per client"
        )
    shards = label_sorted_shards(labels, num_shards, rng)
    pure = _pure_classes(labels, shards)
    target = fewest_single_class_peers(pure, num_clients, shards_per_client)
    for attempt in range(rejection_draws + repair_draws):
        deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
        if attempt >= rejection_draws:
            deal = _repair_single_class(deal, pure, target, rng)
        elif _single_class_rows(pure[deal]).sum() > target:
            deal = None
        if deal is not None:
            return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]
    raise ValueError(
        f"could not deal {num_shards} shards to {num_clients} clients with at most {target} "
        f"holding a single class in {rejection_draws + repair_draws} draws; raise "
        "repair_draws or use fewer clients"
    )
