"""How a labelled pool of examples is dealt to clients (FedTSDP's setups), pure NumPy.

* IID: shuffled and split evenly;
* Dirichlet(beta): for every class, proportions p_c ~ Dir_K(beta) of its examples go to the K
  clients; redrawn until every client holds at least `min_size` (the NIID-Bench convention);
* pathological: the FedAvg paper's shards, each client holding `classes_per_client` classes.

Every random choice comes from the `np.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import FederatedData, from_arrays, split_train_test

PARTITIONS = ("iid", "dirichlet", "pathological")


def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list:
    if num_clients < 1 or num_clients > len(labels):
        raise ValueError(f"cannot deal {len(labels)} examples to {num_clients} clients")
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_draws: int = 1000,
) -> list:
    """Per class c, p_c ~ Dir_K(beta); client k gets its share p_c[k] of class c's examples."""
    labels = np.asarray(labels)
    if beta <= 0:
        raise ValueError(f"dirichlet beta must be > 0, got {beta}")
    if num_clients * min_size > len(labels):
        raise ValueError(
            f"{len(labels)} examples cannot give {num_clients} clients {min_size} each; "
            "use fewer clients"
        )
    for _ in range(max_draws):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k] += piece.tolist()
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, np.int64)) for p in parts]
    raise ValueError(
        f"no Dirichlet(beta={beta}) draw gave all {num_clients} clients >= {min_size} examples "
        f"in {max_draws} tries; raise beta or use fewer clients"
    )


def pathological_partition(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list:
    """Sort by label, cut into num_clients * classes_per_client single-class shards of equal
    size, deal each client that many shards of different classes (McMahan et al. 2017)."""
    labels = np.asarray(labels)
    num_shards = num_clients * classes_per_client
    classes = np.unique(labels)
    if classes_per_client < 1 or classes_per_client > len(classes):
        raise ValueError(f"classes_per_client must be in 1..{len(classes)}")
    order = np.argsort(labels, kind="stable")
    shard_size = len(labels) // num_shards
    if shard_size < 1:
        raise ValueError(f"{len(labels)} examples cannot make {num_shards} shards")
    # Shards inside each class: a class with more examples gives more shards.
    shards, shard_class = [], []
    counts = np.array([np.sum(labels == c) for c in classes], np.float64)
    per_class = np.floor(counts / counts.sum() * num_shards).astype(int)
    while per_class.sum() < num_shards:
        per_class[np.argmax(counts / np.maximum(per_class, 1))] += 1
    for c, n in zip(classes, per_class):
        idx = order[labels[order] == c]
        for piece in np.array_split(idx, n) if n else []:
            shards.append(piece)
            shard_class.append(c)
    shard_class = np.asarray(shard_class)
    for _ in range(1000):
        deal = rng.permutation(len(shards)).reshape(num_clients, classes_per_client)
        if all(len(set(shard_class[row])) == classes_per_client for row in deal):
            return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]
    raise ValueError(
        f"could not give {num_clients} clients {classes_per_client} shards of different "
        "classes; use fewer clients or classes per client"
    )


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    rng: np.random.Generator,
    dirichlet_beta: float = 0.5,
    classes_per_client: int = 2,
    min_size: int = 10,
) -> list:
    if scheme == "iid":
        return iid_partition(labels, num_clients, rng)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients, dirichlet_beta, rng, min_size)
    if scheme == "pathological":
        return pathological_partition(labels, num_clients, classes_per_client, rng)
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
    """Each client's allocation split at random into train (80 %) and test (20 %)."""
    train, test = {}, {}
    for k, idx in enumerate(parts):
        cid = f"{name}_{k:03d}"
        train[cid], test[cid] = split_train_test(x[idx], y[idx], train_fraction, rng)
    return from_arrays(
        name, train, test, num_classes, image_shape=image_shape, source=source, public_x=public_x
    )
