"""CFL's server-side math: update similarities, the split criterion, the optimal bipartition.

CFL's server-side math (Sattler et al., "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020), NumPy /
scikit-learn only: the pairwise cosine similarities alpha_{i,j} of the client updates, the two
update norms of the split criterion (eps1, eps2), the optimal bipartition and its
alpha_cross^max (Alg. 1), following the authors' reference code where the paper leaves
implementation choices open."""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clustered.clustering.common import cosine_similarity


def _updates(updates: np.ndarray) -> np.ndarray:
    u = np.asarray(updates)
    if u.ndim != 2 or len(u) == 0:
        raise ValueError(f"updates must be a non-empty (clients, d) matrix, got shape {u.shape}")
    return u


def pairwise_cosine(updates: np.ndarray) -> np.ndarray:
    """alpha_{i,j} = <dW_i, dW_j> / (||dW_i|| ||dW_j||) for the flattened client updates
    (m, d); (m, m) float64, a zero update has similarity 0 with everything."""
    u = _updates(updates)
    return cosine_similarity(u, u)


def update_norms(updates: np.ndarray, weights: Optional[np.ndarray] = None) -> tuple[float, float]:
    """The two quantities of CFL's split criterion (Alg. 1): ||mean_i dW_i|| (weighted by
    `weights`, e.g. |D_i|, when given; the reference code's compute_mean_update_norm is
    unweighted) and max_i ||dW_i|| (compute_max_update_norm). Accumulated in float64."""
    u = _updates(updates).astype(np.float64, copy=False)
    if weights is not None and np.shape(weights) != (len(u),):
        raise ValueError(f"weights must have one entry per update, got shape {np.shape(weights)}")
    mean = np.average(u, axis=0, weights=weights)
    return float(np.linalg.norm(mean)), float(np.linalg.norm(u, axis=1).max())


def should_split(
    mean_norm: float, max_norm: float, size: int, eps1: float, eps2: float, min_size: int = 2
) -> bool:
    """CFL's split criterion (Alg. 1): the cluster is near a stationary point of its joint
    objective (||mean update|| < eps1) while some client is still far from a stationary point
    of its own (max ||update|| > eps2), and it has more than `min_size` clients (the reference
    code's len(idc) > 2). The reference code's warm-up (round > 20) is the caller's."""
    return bool(mean_norm < eps1 and max_norm > eps2 and size > min_size)


def optimal_bipartition(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CFL's bipartition c1, c2 of a cluster (Alg. 1: argmin over c1 + c2 = c of
    max_{i in c1, j in c2} alpha_{i,j}), computed as in the authors' reference code:
    complete-linkage agglomerative clustering of -similarity into two clusters
    (AgglomerativeClustering(affinity="precomputed", linkage="complete").fit(-S)). Note: the
    exact argmin is the single-linkage (maximum-spacing) cut; complete linkage is kept for
    fidelity to the reference results and agrees with it on well-separated groups. Returns
    the two parts as sorted index arrays, the part holding client 0 first; deterministic."""
    from sklearn.cluster import AgglomerativeClustering

    s = np.asarray(similarity, np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"similarity must be a square matrix, got shape {s.shape}")
    if len(s) < 2:
        raise ValueError(f"a bipartition needs at least 2 clients, got {len(s)}")
    labels = AgglomerativeClustering(
        n_clusters=2, metric="precomputed", linkage="complete"
    ).fit_predict(-s)
    first = np.flatnonzero(labels == labels[0])
    second = np.flatnonzero(labels != labels[0])
    return first, second


def max_cross_similarity(similarity: np.ndarray, first: np.ndarray, second: np.ndarray) -> float:
    """alpha_cross^max = max_{i in c1, j in c2} alpha_{i,j}: the largest similarity between
    the two parts of a bipartition (CFL's diagnostic of how well they separate)."""
    first, second = np.asarray(first), np.asarray(second)
    if len(first) == 0 or len(second) == 0:
        raise ValueError("both parts of the bipartition must be non-empty")
    return float(np.max(np.asarray(similarity, np.float64)[np.ix_(first, second)]))


def separation_gap(similarity: np.ndarray, first: np.ndarray, second: np.ndarray) -> float:
    """Sattler et al.'s separation gap of a bipartition (Sec. III): the smallest similarity
    within either part minus the largest across them. Positive exactly when every client is
    more similar to each member of its own part than to any of the other (the condition under
    which their Theorem guarantees the split separates clients with different optima); about
    zero or negative for updates that differ only by noise (IID clients). A part of one client
    has no within-part pair."""
    s = np.asarray(similarity, np.float64)
    within = [s[np.ix_(part, part)][~np.eye(len(part), dtype=bool)] for part in (first, second)]
    within_values = np.concatenate(within)
    if not within_values.size:
        return -np.inf
    return float(within_values.min() - s[np.ix_(first, second)].max())


def neighbour_separation_gap(
    similarity: np.ndarray, first: np.ndarray, second: np.ndarray
) -> float:
    """The separation gap with each client's nearest neighbour in its own part in place of
    every pair of the part: the smallest, over clients, of the largest similarity to another
    member of its part, minus the largest similarity across. Positive when every client has a
    partner on its own side closer than anything across, which is what a correct bipartition
    of k >= 2 groups gives; `separation_gap` also asks every two members of a part to be
    similar, which holds for two groups only (a bipartition of four puts two different groups
    on each side). About zero or negative for updates that differ only by noise. A part of
    one client has no neighbour in it (-inf)."""
    s = np.asarray(similarity, np.float64)
    nearest = []
    for part in (first, second):
        if len(part) < 2:
            return -np.inf
        within = s[np.ix_(part, part)].copy()
        np.fill_diagonal(within, -np.inf)
        nearest.append(within.max(axis=1).min())
    return float(min(nearest) - s[np.ix_(first, second)].max())
