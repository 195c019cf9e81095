"""How a labelled pool of examples is dealt to clients: IID, Dirichlet, pathological, shards.

How a labelled pool of examples is dealt to clients (the setups of FedTSDP, Zhu et al.,
"Federated Two Stage Decoupling With Adaptive Personalization Layers", 2023), pure NumPy.

* IID: shuffled and split evenly;
* Dirichlet(beta): for every class c, proportions p_c ~ Dir_K(beta) of its examples go to the K
  clients; the whole partition is redrawn until every client holds at least `min_size`
  examples (the convention of NIID-Bench: Li et al., "Federated Learning on Non-IID Data
  Silos: An Experimental Study", ICDE 2022);
* pathological and shards: McMahan et al.'s shards (`shard_partitions.py`).

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
from tff_clustered.data.shard_partitions import pathological_partition, shard_partition

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
