"""The embedded default: scikit-learn's 1,797 real handwritten 8x8 digits, no download.

Clients fall into `num_groups` planted groups; each group relabels the digits with its own
permutation (a concept shift: the same image means a different class in each group). One
global model cannot fit all groups, a model per group (or a personal head) can, so clustered
and personalized methods must clearly beat FedAvg. Optionally each client also sees only
`classes_per_client` digits (pathological non-IID).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clustered.data import partitions
from tff_clustered.data.federated_data import FederatedData, from_arrays, split_train_test
from tff_clustered.seeds import DataStream, data_rng


def label_permutations(num_groups: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Group 0 keeps the true labels; every other group gets a distinct random permutation."""
    perms = [np.arange(num_classes)]
    while len(perms) < num_groups:
        candidate = rng.permutation(num_classes)
        if not any(np.array_equal(candidate, p) for p in perms):
            perms.append(candidate)
    return np.stack(perms)


def client_shares(
    y: np.ndarray,
    num_clients: int,
    classes_per_client: Optional[int],
    num_classes: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each client's image indices: a uniform share of all images, or with
    `classes_per_client` the images of its digits (client c owns digits c, c+1, ... mod 10;
    each digit's images dealt out round-robin among its owners)."""
    if classes_per_client is None:
        return np.array_split(rng.permutation(len(y)), num_clients)
    owners: dict[int, list[int]] = {d: [] for d in range(num_classes)}
    for c in range(num_clients):
        for j in range(classes_per_client):
            owners[(c + j) % num_classes].append(c)
    buckets: list[list[int]] = [[] for _ in range(num_clients)]
    for d in range(num_classes):
        idx = rng.permutation(np.flatnonzero(y == d))
        for pos, i in enumerate(idx):
            buckets[owners[d][pos % len(owners[d])]].append(int(i))
    return [np.asarray(b) for b in buckets]


def load_digits_clusters(
    num_clients: int = 40,
    num_groups: int = 4,
    classes_per_client: Optional[int] = None,
    train_fraction: float = 0.8,
    seed: int = 0,
) -> FederatedData:
    """Digits over `num_clients` clients in `num_groups` label-permutation groups. The server's
    unlabeled public set (FedTSDP's) is every image without its label: the groups differ in
    what the images mean, which unlabeled images do not reveal."""
    from sklearn.datasets import load_digits

    if num_groups < 1 or num_clients < num_groups:
        raise ValueError(
            f"need 1 <= num_groups <= num_clients, got {num_groups} groups, {num_clients} clients"
        )
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    num_classes = 10
    if classes_per_client is not None and not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes_per_client must be in 1..{num_classes}")
    if len(y) // num_clients < 4:
        raise ValueError(f"{num_clients} clients leave fewer than 4 digits each; use fewer")
    # Separate streams: which images a client holds does not depend on the grouping.
    rng = data_rng(seed, DataStream.DIGITS_SHARES)
    perms = label_permutations(
        num_groups, num_classes, data_rng(seed, DataStream.LABEL_PERMUTATIONS)
    )
    groups = data_rng(seed, DataStream.PLANTED_GROUPS).permutation(
        np.arange(num_clients) % num_groups
    )

    shares = client_shares(y, num_clients, classes_per_client, num_classes, rng)

    train, test, true_clusters = {}, {}, {}
    for c, idx in enumerate(shares):
        cid = f"digits_{c:03d}"
        g = int(groups[c])
        train[cid], test[cid] = split_train_test(x[idx], perms[g][y[idx]], train_fraction, rng)
        true_clusters[cid] = g
    return from_arrays(
        "digits",
        train,
        test,
        num_classes,
        image_shape=(8, 8, 1),
        true_clusters=true_clusters,
        public_x=x,
        source="sklearn.datasets.load_digits",
    )


def load_digits_partitioned(
    partition: str = "dirichlet",
    num_clients: int = 20,
    dirichlet_beta: float = 0.2,
    classes_per_client: int = 2,
    public_fraction: float = 0.25,
    seed: int = 0,
) -> FederatedData:
    """Digits with their true labels, FedTSDP-style: `public_fraction` of the images held out
    as the server's unlabeled public set, the rest dealt to clients (IID, Dirichlet(beta) with
    at least 10 examples each, or pathological), each client's share split 80/20."""
    from sklearn.datasets import load_digits

    if not 0 < public_fraction < 1:
        raise ValueError("public_fraction must be in (0, 1)")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = data_rng(seed, DataStream.PUBLIC_HOLDOUT).permutation(len(y))
    num_public = int(round(public_fraction * len(y)))
    public, pool = order[:num_public], order[num_public:]
    parts = partitions.partition(
        y[pool],
        num_clients,
        partition,
        data_rng(seed, DataStream.CLIENT_EXAMPLES),
        dirichlet_beta=dirichlet_beta,
        classes_per_client=classes_per_client,
    )
    return partitions.federate(
        f"digits_{partition}",
        x[pool],
        y[pool],
        parts,
        10,
        data_rng(seed, DataStream.CLIENT_TEST_SETS),
        public_x=x[public],
        image_shape=(8, 8, 1),
        source="sklearn.datasets.load_digits",
    )
