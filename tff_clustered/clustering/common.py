"""What the clustering modules share: model matrices, their checks, cosines, member means.

What the clustering modules share, NumPy only: dtype and row-block handling of (possibly
float32, possibly memory-mapped) model matrices, the cosine of rows, checks of model
matrices, labels and weights with messages that say how to fix the input, and the mean of each
cluster's members (FeSEM's Eq. 9, FedAC's Eq. 5 and CNT's new centres).

Rows of every matrix are flattened client models or updates; labels are integer cluster
indices 0..K-1. No function mutates its inputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional, Union

import numpy as np

# Norms below this count as zero (a zero row has cosine 0 with everything).
EPS = 1e-12
# Rows per block when a pass streams over a model or update matrix (which may be a disk memmap).
BLOCK_ROWS = 512

# An int seed, or a Generator (e.g. Generator(SeedSequence((seed, round, purpose)))), which the
# call advances.
SeedLike = Union[int, np.random.Generator]


def as_float(a: np.ndarray) -> np.ndarray:
    """float32 stays float32 (client x parameter matrices are large), anything else float64."""
    a = np.asarray(a)
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)


def row_blocks(a: np.ndarray, block_rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
    """Consecutive row blocks of `a` (views: a memmap is read block by block)."""
    for start in range(0, len(a), block_rows):
        yield as_float(a[start : start + block_rows])


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """K(A, B): cosine of every row of `a` with every row of `b` (FedGroup's Eq. 5-6), float64.
    A zero row has cosine 0 with everything (norms are floored at EPS; the cosine of a zero
    vector is undefined, and an empty group's direction is zero, so such a group is at Eq. 9
    dissimilarity 1/2 from every newcomer)."""
    a, b = as_float(a), as_float(b)
    na = np.linalg.norm(a, axis=1, keepdims=True)
    nb = np.linalg.norm(b, axis=1, keepdims=True)
    sim = (a / np.maximum(na, EPS)) @ (b / np.maximum(nb, EPS)).T
    return sim.astype(np.float64)


def as_generator(seed: SeedLike) -> np.random.Generator:
    """The generator itself, or a new one from an int seed."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def checked_matrix(a: np.ndarray, name: str) -> np.ndarray:
    """`a` as a non-empty, finite 2-D float matrix (float32 kept), else ValueError naming it."""
    a = as_float(a)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D (rows, dim) array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf; check the uploaded models")
    return a


def check_same_dim(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    """ValueError unless the two matrices have as many columns (the same model layout)."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{name_a} has {a.shape[1]} columns but {name_b} has {b.shape[1]}; both must be "
            "flattened in the same layout (same model, same variable order)"
        )


def checked_labels(assign: np.ndarray, num_rows: int, num_clusters: int) -> np.ndarray:
    """`assign` as int32 labels, one per row, each in 0..num_clusters-1, else ValueError."""
    labels = np.asarray(assign)
    if labels.shape != (num_rows,):
        raise ValueError(f"assign must have one label per model ({num_rows}), got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"assign must hold integer cluster indices, got dtype {labels.dtype}")
    if num_rows and (labels.min() < 0 or labels.max() >= num_clusters):
        raise ValueError(
            f"assign holds labels outside 0..{num_clusters - 1}; pass the matching number of "
            "clusters (or centres)"
        )
    return labels.astype(np.int32)


def checked_weights(weights: Optional[np.ndarray], num_rows: int) -> Optional[np.ndarray]:
    """None, or `weights` as float64, one positive finite number per row, else ValueError."""
    if weights is None:
        return None
    w = np.asarray(weights, np.float64)
    if w.shape != (num_rows,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(
            f"weights must be {num_rows} positive finite numbers (one per model, e.g. |D_i|), "
            f"got shape {w.shape}"
        )
    return w


def nonempty_cluster_sizes(labels: np.ndarray, num_clusters: int) -> np.ndarray:
    """Members of each cluster 0..num_clusters-1; ValueError if one has none."""
    sizes = np.bincount(labels, minlength=num_clusters)
    empty = np.flatnonzero(sizes == 0)
    if len(empty):
        raise ValueError(
            f"clusters {empty.tolist()} have no members; remove them with drop_empty_clusters "
            "before computing centres"
        )
    return sizes


def drop_empty_clusters(assign: np.ndarray, num_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove the clusters without members (K decreases). Returns (labels renumbered 0..K'-1
    in the old order, the old indices of the kept clusters)."""
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be at least 1, got {num_clusters}")
    labels = checked_labels(assign, len(np.asarray(assign)), num_clusters)
    kept = np.flatnonzero(np.bincount(labels, minlength=num_clusters) > 0)
    new_index = np.full(num_clusters, -1, np.int32)
    new_index[kept] = np.arange(len(kept), dtype=np.int32)
    return new_index[labels], kept


def member_mean(
    models: np.ndarray, members: np.ndarray, weights: Optional[np.ndarray] = None
) -> np.ndarray:
    """Mean (float64) of the rows `members` selects (a boolean mask or indices), unweighted or
    weighted by `weights` (one per row of `models`); copies only the members' rows."""
    rows = models[members]
    if weights is None:
        return rows.mean(axis=0, dtype=np.float64)
    w = np.asarray(weights, np.float64)[members]
    return (w[:, None] * rows).sum(axis=0) / w.sum()


def mean_per_cluster(
    models: np.ndarray,
    labels: np.ndarray,
    previous: np.ndarray,
    weights: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The mean of each cluster's members (FeSEM's M-step, Eq. 9), (K, d) float64, unweighted
    or weighted by `weights` (e.g. training examples), as member_mean; a cluster without
    members keeps its row of `previous`, the (K, d) centres before this step (Eq. 9 is
    undefined for it). FedAC's M-step, whose clusters are never empty, is `member_mean` per
    cluster (`fedac.m_step`)."""
    models, labels = as_float(models), np.asarray(labels)
    centers = np.array(previous, np.float64, copy=True)
    for k in range(len(centers)):
        members = labels == k
        if members.any():
            centers[k] = member_mean(models, members, weights)
    return centers


def squared_distances_to(rows: np.ndarray, center: np.ndarray) -> np.ndarray:
    """||row - center||^2 for every row, float64, by explicit differences (no cancellation),
    streamed over row blocks."""
    return np.concatenate(
        [((block.astype(np.float64) - center) ** 2).sum(axis=1) for block in row_blocks(rows)]
    )
