"""How a labelled pool of examples is dealt to clients (the setups of FedTSDP, Zhu et al.,
"Federated Two Stage Decoupling With Adaptive Personalization Layers", 2023), pure NumPy.

* IID: shuffled and split evenly;
* Dirichlet(beta): for every class c, proportions p_c ~ Dir_K(beta) of its examples go to the K
  clients; the whole partition is redrawn until every client holds at least `min_size`
  examples (the convention of NIID-Bench: Li et al., "Federated Learning on Non-IID Data
  Silos: An Experimental Study", ICDE 2022);
* pathological: the shards of McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data" (AISTATS 2017), each client holding `classes_per_client`
  single-class shards of different classes;
* shards: McMahan et al.'s split as they describe it and as UA-PDFL (Zhu, Fan and Xie, "UA-PDFL:
  A Personalized Approach for Decentralized Federated Learning", arXiv:2412.11674) uses it for
  its extreme non-IID peers: the training set sorted by label and cut into 2M equal contiguous
  shards (a shard may straddle two classes), two random shards per peer, redrawn while some
  peer would hold a single class (`shard_partition`).

UA-PDFL's peers then hold out a random 20 % of their own allocation as their local test set
(`holdout_split`, `federate_holdout`).

FedAC's setups, which fix each client's training count instead, are in
`fedac_partitions.py`.

Every partition returns one sorted index array per client; the arrays are disjoint. Every
random choice comes from the `np.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import FederatedData, from_arrays, split_train_test

PARTITIONS = ("iid", "dirichlet", "pathological", "shards")
HOLDOUT_FRACTION = 0.2  # UA-PDFL: each peer tests on a random 20 % of its own allocation


def iid_partition(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """All examples shuffled and split into `num_clients` parts whose sizes differ by <= 1."""
    if num_clients < 1 or num_clients > len(labels):
        raise ValueError(
            f"cannot deal {len(labels)} examples to {num_clients} clients; use 1..{len(labels)}"
        )
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_draws: int = 1000,
) -> list[np.ndarray]:
    """Per class c, p_c ~ Dir_K(beta) and client k gets the share p_c[k] of class c's examples;
    the whole draw is repeated until every client has >= `min_size` examples. Smaller beta
    gives more skewed label distributions."""
    labels = np.asarray(labels)
    if beta <= 0:
        raise ValueError(f"dirichlet beta must be > 0, got {beta}")
    if num_clients < 1 or num_clients * min_size > len(labels):
        raise ValueError(
            f"{len(labels)} examples cannot give {num_clients} clients {min_size} each; "
            "use fewer clients"
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_draws):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in by_class:
            idx = rng.permutation(members)
            shares = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        sizes = [sum(len(p) for p in pieces) for pieces in parts]
        if min(sizes) >= min_size:
            return [np.sort(np.concatenate(pieces)).astype(np.int64) for pieces in parts]
    raise ValueError(
        f"no Dirichlet(beta={beta}) draw gave all {num_clients} clients >= {min_size} examples "
        f"in {max_draws} tries; raise beta or use fewer clients"
    )


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


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    rng: np.random.Generator,
    dirichlet_beta: float = 0.5,
    classes_per_client: int = 2,
    min_size: int = 10,
    shards_per_client: int = 2,
) -> list[np.ndarray]:
    """Dispatches to the partition named `scheme` (one of `PARTITIONS`)."""
    if scheme == "iid":
        return iid_partition(labels, num_clients, rng)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients, dirichlet_beta, rng, min_size)
    if scheme == "pathological":
        return pathological_partition(labels, num_clients, classes_per_client, rng)
    if scheme == "shards":
        return shard_partition(labels, num_clients, rng, shards_per_client)
    if scheme.startswith("fedac_"):
        raise ValueError(
            f"partition {scheme!r} deals the image datasets only (FedAC's setting: cifar10, "
            f"cifar100, svhn, fashion_mnist, mnist_partitioned); this dataset takes one of "
            f"{', '.join(PARTITIONS)}"
        )
    raise ValueError(f"unknown partition {scheme!r}; choose one of {', '.join(PARTITIONS)}")


def federate(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    num_classes: int,
    rng: np.random.Generator,
    train_fraction: float = 0.8,
    public_x: Optional[np.ndarray] = None,
    image_shape: Optional[tuple[int, ...]] = None,
    source: str = "",
) -> FederatedData:
    """Client k (id f"{name}_{k:03d}") holds `x[parts[k]], y[parts[k]]`, split at random into
    train (`train_fraction`, 80 %) and test; `public_x` is the server's unlabeled set."""
    train, test = {}, {}
    for k, idx in enumerate(parts):
        cid = f"{name}_{k:03d}"
        train[cid], test[cid] = split_train_test(x[idx], y[idx], train_fraction, rng)
    return from_arrays(
        name, train, test, num_classes, image_shape=image_shape, source=source, public_x=public_x
    )


def holdout_split(
    indices: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One peer's allocation split at random into (train, test), both sorted: the test part
    holds round(fraction * n) of its n indices, rounded half up and kept within 1..n - 1 so
    both parts are non-empty (UA-PDFL, arXiv:2412.11674: each peer tests on a random 20 % of
    its own data and trains on the rest, n_i being the training part). Pass a generator seeded
    apart from the partition's, so the holdouts do not shift the partition's random stream."""
    indices = np.asarray(indices)
    if not 0 < fraction < 1:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction}; UA-PDFL uses 0.2")
    if indices.ndim != 1 or len(indices) < 2:
        raise ValueError(
            f"a holdout needs a 1-D allocation of >= 2 indices, got shape {indices.shape}; give "
            "every peer at least 2 examples"
        )
    n = len(indices)
    n_test = int(np.clip(np.floor(fraction * n + 0.5), 1, n - 1))
    order = rng.permutation(n)
    return np.sort(indices[order[n_test:]]), np.sort(indices[order[:n_test]])


def federate_holdout(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    num_classes: int,
    rng: np.random.Generator,
    test_fraction: float = HOLDOUT_FRACTION,
    public_x: Optional[np.ndarray] = None,
    image_shape: Optional[tuple[int, ...]] = None,
    source: str = "",
) -> FederatedData:
    """Peer k (id f"{name}_{k:03d}") trains on `x[train], y[train]` and tests on `x[test],
    y[test]`, `train, test = holdout_split(parts[k], test_fraction, rng)`, peers in order and
    all from `rng` (UA-PDFL's local test sets); `public_x` is the unlabeled public set."""
    train, test = {}, {}
    for k, idx in enumerate(parts):
        cid = f"{name}_{k:03d}"
        try:
            tr, te = holdout_split(idx, test_fraction, rng)
        except ValueError as e:
            raise ValueError(f"peer {cid}: {e}") from e
        train[cid], test[cid] = (x[tr], y[tr]), (x[te], y[te])
    return from_arrays(
        name, train, test, num_classes, image_shape=image_shape, source=source, public_x=public_x
    )
