"""FedAC's server-side clustering: E-step and M-step over the stored client models, per round.

FedAC's server-side clustering (Zhang et al., "FedAC: A Adaptive Clustered Federated
Learning Framework for Heterogeneous Data", arXiv:2403.16460), NumPy only: the E-step (Eq. 4,
Alg. 1 line 11) and M-step (Eq. 5) over all stored client models, one round's clustering step
(E-step, M-step, then cluster number tuning, Alg. 3), and the initial assignment R^0. The PCA
map and LrCos (Alg. 2, Sec. 4.3) are in `low_rank_cosine`, cluster number tuning in
`cluster_number`.

Rows of every matrix are flattened client models (or their reduced vectors); labels are int32
cluster indices 0..K-1. No function mutates its inputs. Choices the paper leaves open, made
here (each is repeated where it applies):

* E-step: Eq. 4 prints argmin of a similarity; we take the argmax (as Eq. 3 does); ties go to
  the lowest cluster index. Clusters left empty by the E-step are removed (K decreases).
* Initialization (Alg. 1 line 1 initializes R^0 without saying how): spherical k-means with
  k-means++ seeding on the reduced vectors, or a random balanced assignment as an ablation.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from tff_clustered.clustering.cluster_number import CntResult, tune_cluster_number
from tff_clustered.clustering.cnt_settings import DEFAULT_CNT_SETTINGS, CntSettings
from tff_clustered.clustering.common import (
    SeedLike,
    as_generator,
    check_same_dim,
    checked_labels,
    checked_matrix,
    checked_weights,
    cosine_similarity,
    drop_empty_clusters,
    member_mean,
    nonempty_cluster_sizes,
    row_blocks,
)
from tff_clustered.clustering.decomposed import nearest_centers
from tff_clustered.clustering.low_rank_cosine import PcaMap, checked_reduced, lrcos, project

# E-step similarities: LrCos (Alg. 2), or squared L2 in full dimension (the ablation of
# Sec. 5.4).
SIMILARITIES = ("lrcos", "l2")


class ClusteringStep(NamedTuple):
    """Server state after one round's E-step, M-step and CNT (Alg. 1 lines 11-12 and Alg. 3):
    labels, full-dimension centres, reduced centres, and the CNT details."""

    assign: np.ndarray
    centers: np.ndarray
    reduced_centers: np.ndarray
    cnt: CntResult

    @property
    def num_clusters(self) -> int:
        return int(len(self.centers))


def e_step(reduced_models: np.ndarray, reduced_centers: np.ndarray) -> np.ndarray:
    """E-step (Eq. 4, Alg. 1 line 11): R_{i,k} = 1 iff k = argmax_j LrCos(w_i, Omega_j), for
    every stored model against the centres from before this round's M-step. Returns int32
    labels. Choice: Eq. 4 prints argmin of the similarity; the argmax (Eq. 3) is used, and
    ties go to the lowest cluster index."""
    return np.argmax(lrcos(reduced_models, reduced_centers), axis=1).astype(np.int32)


def m_step(
    models: np.ndarray,
    assign: np.ndarray,
    num_clusters: int,
    weights: Optional[np.ndarray] = None,
) -> np.ndarray:
    """M-step (Eq. 5): Omega_k = (1 / sum_i R_{i,k}) sum_i R_{i,k} w_i over all stored models,
    in full dimension; unweighted as in the paper, or weighted by `weights` (e.g. |D_i|) as an
    option. Returns (K, d) float64. Every cluster must have a member (drop_empty_clusters)."""
    x = checked_matrix(models, "models")
    labels = checked_labels(assign, len(x), num_clusters)
    nonempty_cluster_sizes(labels, num_clusters)
    weights = checked_weights(weights, len(x))
    return np.stack([member_mean(x, labels == k, weights) for k in range(num_clusters)])


def clustering_step(
    models: np.ndarray,
    centers: np.ndarray,
    pca_map: PcaMap,
    reduced_models: Optional[np.ndarray] = None,
    settings: CntSettings = DEFAULT_CNT_SETTINGS,
    weights: Optional[np.ndarray] = None,
    similarity: str = "lrcos",
    previous_splits: Optional[np.ndarray] = None,
) -> ClusteringStep:
    """One round's server-side clustering (Alg. 1 lines 11-12, then Alg. 3): E-step of every
    stored model against the current centres (before the M-step), removal of the clusters
    left empty, M-step, then CNT (`previous_splits`: see tune_cluster_number). `similarity="l2"`
    is the ablation of Sec. 5.4: the E-step assigns by the smallest squared L2 distance in full
    dimension instead of LrCos."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    x = checked_matrix(models, "models")
    c = checked_matrix(centers, "centers")
    check_same_dim(x, c, "models", "centers")
    z = checked_reduced(reduced_models, x, pca_map)
    if similarity == "lrcos":
        labels = e_step(z, project(pca_map, c))
    else:
        labels = np.concatenate([nearest_centers(block, c) for block in row_blocks(x)])
    labels, kept = drop_empty_clusters(labels, len(c))
    new_centers = m_step(x, labels, len(kept), weights)
    cnt = tune_cluster_number(
        x, new_centers, labels, pca_map, z, settings, weights, previous_splits
    )
    return ClusteringStep(cnt.assign, cnt.centers, cnt.reduced_centers, cnt)


# ----------------------------------------------------------------------------------------------
# Initialization of R^0 (Alg. 1 line 1, left open by the paper).


def _kmeans_pp_seeds(unit: np.ndarray, num_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding under the cosine distance 1 - cos: the first seed uniform, each next
    one drawn with probability proportional to its squared distance to the nearest seed
    (uniform among the non-seeds when every distance is 0)."""
    n = len(unit)
    seeds = [int(rng.integers(n))]
    nearest = 1.0 - unit @ unit[seeds[0]]
    for _ in range(1, num_clusters):
        weight = np.maximum(nearest, 0.0) ** 2
        weight[seeds] = 0.0
        if weight.sum() <= 0:
            weight = np.ones(n)
            weight[seeds] = 0.0
        seeds.append(int(rng.choice(n, p=weight / weight.sum())))
        nearest = np.minimum(nearest, 1.0 - unit @ unit[seeds[-1]])
    return np.array(seeds)


def _spherical_lloyd(
    unit: np.ndarray, centroids: np.ndarray, iterations: int
) -> tuple[np.ndarray, float]:
    """Lloyd passes of spherical k-means from the given centroids; returns (labels, objective
    sum_i cos(z_i, centroid of its cluster)). An emptied cluster is re-seeded with the point
    least similar to its own centroid among clusters of 2 or more members."""
    n, num_clusters = len(unit), len(centroids)
    labels = np.full(n, -1, np.int32)
    for _ in range(iterations):
        similarity = cosine_similarity(unit, centroids)
        new_labels = np.argmax(similarity, axis=1).astype(np.int32)
        for k in np.flatnonzero(np.bincount(new_labels, minlength=num_clusters) == 0):
            own = similarity[np.arange(n), new_labels]
            movable = np.bincount(new_labels, minlength=num_clusters)[new_labels] >= 2
            new_labels[int(np.argmin(np.where(movable, own, np.inf)))] = k
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centroids = np.stack([unit[labels == k].mean(axis=0) for k in range(num_clusters)])
    objective = cosine_similarity(unit, centroids)[np.arange(n), labels].sum()
    return labels, float(objective)


def spherical_kmeans(
    reduced_models: np.ndarray,
    num_clusters: int,
    seed: SeedLike = 0,
    iterations: int = 20,
    restarts: int = 10,
) -> np.ndarray:
    """Initial assignment R^0 (Alg. 1 line 1; the paper does not say how): spherical k-means
    on the reduced vectors (assign by argmax cosine as the E-step; centroid = mean of the
    members' unit vectors), k-means++ seeded, at most `iterations` passes per run. Every
    cluster is non-empty (see _spherical_lloyd). Returns int32 labels.

    Choice: `restarts` runs from successive seedings of one generator built from `seed`, keeping
    the run of largest sum of member-to-centroid cosines (the first on ties); a single run
    puts two seeds in one well-separated group about a quarter of the time on 4 planted groups
    and stays there."""
    z = checked_matrix(reduced_models, "reduced_models").astype(np.float64)
    n = len(z)
    if not 1 <= num_clusters <= n:
        raise ValueError(
            f"cannot form {num_clusters} clusters from {n} clients; use 1 <= K <= {n} clusters "
            "(fewer clusters or more clients)"
        )
    if iterations < 1 or restarts < 1:
        raise ValueError(
            f"iterations and restarts must be at least 1, got {iterations}, {restarts}"
        )
    unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    rng = as_generator(seed)
    best_labels, best_objective = np.zeros(n, np.int32), -np.inf
    for _ in range(restarts):
        seeds = _kmeans_pp_seeds(unit, num_clusters, rng)
        labels, objective = _spherical_lloyd(unit, unit[seeds], iterations)
        if objective > best_objective:
            best_labels, best_objective = labels, objective
    return best_labels


def random_assignment(num_clients: int, num_clusters: int, seed: SeedLike = 0) -> np.ndarray:
    """Random initial R^0 (ablation; Alg. 1 line 1 is left open): a random permutation of
    0, 1, ..., K-1, 0, 1, ..., so sizes differ by at most 1 and no cluster is empty."""
    if not 1 <= num_clusters <= num_clients:
        raise ValueError(
            f"cannot form {num_clusters} clusters from {num_clients} clients; use "
            f"1 <= K <= {num_clients}"
        )
    labels = np.arange(num_clients) % num_clusters
    return as_generator(seed).permutation(labels).astype(np.int32)
