"""CFL's server-side math (Sattler et al., "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020): the split
criterion on update norms and the optimal bipartition by cosine similarity (Alg. 1)."""

from __future__ import annotations

from typing import Optional

import numpy as np
from sklearn.cluster import AgglomerativeClustering

from tff_clustered.clustering.decomposed import cosine_similarity


def pairwise_cosine(updates: np.ndarray) -> np.ndarray:
    """alpha_{i,j}: cosine similarity of the clients' updates."""
    return cosine_similarity(updates, updates)


def update_norms(updates: np.ndarray, weights: Optional[np.ndarray] = None) -> tuple[float, float]:
    """(||mean update||, max_i ||update_i||): the two quantities of CFL's split criterion."""
    u = np.asarray(updates, np.float64)
    mean = np.average(u, axis=0, weights=weights)
    return float(np.linalg.norm(mean)), float(np.linalg.norm(u, axis=1).max())


def should_split(
    mean_norm: float, max_norm: float, size: int, eps1: float, eps2: float, min_size: int = 2
) -> bool:
    """Near a stationary point of the cluster's joint objective (mean norm < eps1) while some
    client is far from its own (max norm > eps2), and more than `min_size` clients."""
    return mean_norm < eps1 and max_norm > eps2 and size > min_size


def optimal_bipartition(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bipartition maximising the smallest cross-cluster dissimilarity: complete-linkage
    agglomeration of -similarity into two clusters (as in the reference code). The part holding
    client 0 comes first."""
    s = np.asarray(similarity, np.float64)
    if len(s) < 2:
        raise ValueError("a bipartition needs at least 2 clients")
    labels = AgglomerativeClustering(
        n_clusters=2, metric="precomputed", linkage="complete"
    ).fit_predict(-s)
    first = np.flatnonzero(labels == labels[0])
    second = np.flatnonzero(labels != labels[0])
    return first, second


def max_cross_similarity(similarity: np.ndarray, first: np.ndarray, second: np.ndarray) -> float:
    """alpha_cross^max: the largest similarity between the two parts."""
    return float(np.max(np.asarray(similarity)[np.ix_(first, second)]))
