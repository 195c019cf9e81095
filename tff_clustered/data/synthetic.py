"""Synthetic(alpha, beta) of the FedProx / FedGroup papers, seeded.

For device k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k (60x10) and b_k (10) ~ N(u_k, 1);
v_k (60) ~ N(B_k, 1); x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2; y = argmax(W_k^T x + b_k);
floor(lognormal(4, 2)) + 50 samples; 90/10 train/test split.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import FederatedData, from_arrays, split_train_test
from tff_clustered.seeds import DataStream, data_rng

NUM_FEATURES = 60
NUM_CLASSES = 10


def load_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 100,
    train_fraction: float = 0.9,
    max_samples_per_client: Optional[int] = None,
    seed: int = 0,
) -> FederatedData:
    """Generates Synthetic(alpha, beta); `max_samples_per_client` caps the heavy lognormal tail."""
    if alpha < 0 or beta < 0:
        raise ValueError("Synthetic(alpha, beta) needs alpha >= 0 and beta >= 0")
    rng = data_rng(seed, DataStream.LOADER)
    sizes = np.floor(rng.lognormal(4, 2, num_clients)).astype(int) + 50
    if max_samples_per_client is not None:
        sizes = np.minimum(sizes, max_samples_per_client)
    sigma = np.power(np.arange(1, NUM_FEATURES + 1, dtype=np.float64), -1.2)
    train, test = {}, {}
    for k in range(num_clients):
        u_k = rng.normal(0, np.sqrt(alpha))
        b_mean = rng.normal(0, np.sqrt(beta))
        w = rng.normal(u_k, 1, (NUM_FEATURES, NUM_CLASSES))
        b = rng.normal(u_k, 1, NUM_CLASSES)
        v = rng.normal(b_mean, 1, NUM_FEATURES)
        x = rng.normal(v, np.sqrt(sigma), (sizes[k], NUM_FEATURES))
        y = np.argmax(x @ w + b, axis=1)
        cid = f"synthetic_{k:03d}"
        train[cid], test[cid] = split_train_test(x, y, train_fraction, rng)
    return from_arrays(
        f"synthetic_{alpha:g}_{beta:g}", train, test, NUM_CLASSES, source="synthetic generator"
    )
