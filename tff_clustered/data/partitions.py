"""How a labelled pool of examples is dealt to clients (the setups of FedTSDP, Zhu et al.,
"Federated Two Stage Decoupling With Adaptive Personalization Layers", 2023), pure NumPy.

* IID: shuffled and split evenly;
* Dirichlet(beta): for every class c, proportions p_c ~ Dir_K(beta) of its examples go to the K
  clients; the whole partition is redrawn until every client holds at least `min_size`
  examples (the convention of NIID-Bench: Li et al., "Federated Learning on Non-IID Data
  Silos: An Experimental Study", ICDE 2022);
* pathological: the shards of McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data" (AISTATS 2017), each client holding `classes_per_client`
  single-class shards of different classes.

Every partition returns one sorted index array per client; the arrays are disjoint. Every
random choice comes from the `np.random.Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import FederatedData, from_arrays, split_train_test

PARTITIONS = ("iid", "dirichlet", "pathological")


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


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    rng: np.random.Generator,
    dirichlet_beta: float = 0.5,
    classes_per_client: int = 2,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Dispatches to the partition named `scheme` (one of `PARTITIONS`)."""
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
    """Client k (id f"{name}_{k:03d}") holds `x[parts[k]], y[parts[k]]`, split at random into
    train (`train_fraction`, 80 %) and test; `public_x` is the server's unlabeled set."""
    train, test = {}, {}
    for k, idx in enumerate(parts):
        cid = f"{name}_{k:03d}"
        train[cid], test[cid] = split_train_test(x[idx], y[idx], train_fraction, rng)
    return from_arrays(
        name, train, test, num_classes, image_shape=image_shape, source=source, public_x=public_x
    )
