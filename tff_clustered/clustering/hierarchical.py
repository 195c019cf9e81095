"""FL+HC's server-side math: the clients' update distances and their hierarchical clustering.

FL+HC's server-side math (Briggs, Fan, Andras, "Federated learning with hierarchical
clustering of local updates to improve training on non-IID data", IJCNN 2020), NumPy / SciPy
only: the pairwise Euclidean distances of the clients' flattened updates and the agglomerative
hierarchical clustering of those updates, cut into a given number of clusters or at a distance
threshold."""

from __future__ import annotations

from typing import Optional

import numpy as np
from scipy.cluster import hierarchy
from scipy.spatial.distance import pdist, squareform

LINKAGES = ("ward", "average", "complete", "single")


def _points(points: np.ndarray) -> np.ndarray:
    p = np.asarray(points, np.float64)
    if p.ndim != 2 or len(p) == 0:
        raise ValueError(f"points must be a non-empty (n, d) matrix, got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("points must be finite (an update has NaN or infinite values)")
    return p


def euclidean_distances(points: np.ndarray) -> np.ndarray:
    """||x_i - x_j|| of every pair of rows, (n, n) float64 with a zero diagonal."""
    p = _points(points)
    if len(p) == 1:
        return np.zeros((1, 1))
    return squareform(pdist(p, metric="euclidean"))


def check_cut(num_clusters: Optional[int], distance_threshold: Optional[float]) -> None:
    """Exactly one way to cut the dendrogram: a cluster count >= 1, or a threshold > 0."""
    if (num_clusters is None) == (distance_threshold is None):
        raise ValueError(
            "cut the dendrogram either into --num_clusters clusters or at "
            "--flhc_distance_threshold, not both (and one of them)"
        )
    if num_clusters is not None and num_clusters < 1:
        raise ValueError(f"--num_clusters must be >= 1, got {num_clusters}")
    if distance_threshold is not None and not (
        distance_threshold > 0 and np.isfinite(distance_threshold)
    ):
        raise ValueError(f"--flhc_distance_threshold must be > 0, got {distance_threshold}")


def first_seen_labels(labels: np.ndarray) -> np.ndarray:
    """The same partition, labelled 0, 1, ... in the order the clusters first appear."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse].astype(np.int32)


def dendrogram(points: np.ndarray, linkage: str = "ward") -> np.ndarray:
    """SciPy's linkage matrix of the rows of `points` (Euclidean distance), (n - 1, 4)."""
    if linkage not in LINKAGES:
        raise ValueError(f"--flhc_linkage={linkage} is not one of {', '.join(LINKAGES)}")
    p = _points(points)
    if len(p) == 1:
        return np.zeros((0, 4))
    return hierarchy.linkage(p, method=linkage, metric="euclidean")


def hierarchical_clusters(
    points: np.ndarray,
    linkage: str = "ward",
    num_clusters: Optional[int] = None,
    distance_threshold: Optional[float] = None,
    tree: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Agglomerative hierarchical clustering of the rows of `points` with Euclidean distance
    and `linkage` (ward, average, complete, single), cut into at most `num_clusters` clusters
    or where the merge height exceeds `distance_threshold` (two clusters are merged only at a
    height <= the threshold; for ward linkage the height is SciPy's Ward distance, for the
    others the linkage's Euclidean distance). Labels 0..K-1 in order of first appearance;
    deterministic. `tree`: the points' `dendrogram`, when already built."""
    check_cut(num_clusters, distance_threshold)
    p = _points(points)
    if num_clusters is not None and num_clusters > len(p):
        raise ValueError(f"{num_clusters} clusters asked of {len(p)} points; lower --num_clusters")
    tree = dendrogram(p, linkage) if tree is None else tree
    if len(p) == 1:
        return np.zeros(1, np.int32)
    if num_clusters is not None:
        labels = hierarchy.fcluster(tree, t=num_clusters, criterion="maxclust")
    else:
        labels = hierarchy.fcluster(tree, t=distance_threshold, criterion="distance")
    return first_seen_labels(labels)


def merge_heights(
    points: np.ndarray, linkage: str = "ward", tree: Optional[np.ndarray] = None
) -> np.ndarray:
    """The dendrogram's n - 1 merge heights h_0 <= ... <= h_{n-2} (for choosing
    --flhc_distance_threshold): a threshold t with h_j <= t < h_{j+1} leaves n - 1 - j
    clusters. `tree`: the points' `dendrogram`, when already built."""
    return np.sort((dendrogram(points, linkage) if tree is None else tree)[:, 2])
