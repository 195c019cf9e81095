"""Flat views of model weights, in the canonical order of `model.trainable_weights`.

Server-side clustering works on flat vectors (one row per client); the TFF state holds per-tensor
arrays stacked along a cluster axis. These convert between the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Shapes = Sequence[Sequence[int]]


def flatten(weights: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float32).ravel() for w in weights])


def unflatten(vector: np.ndarray, shapes: Shapes) -> list[np.ndarray]:
    sizes = [int(np.prod(s)) for s in shapes]
    if len(vector) != sum(sizes):
        raise ValueError(f"vector of {len(vector)} values does not fill shapes of {sum(sizes)}")
    parts = np.split(np.asarray(vector, np.float32), np.cumsum(sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, shapes)]


def stacked_to_matrix(stacked: Sequence[np.ndarray]) -> np.ndarray:
    """Per-tensor arrays with a leading cluster axis -> (num_clusters, d)."""
    k = len(stacked[0])
    return np.concatenate([np.asarray(t, np.float32).reshape(k, -1) for t in stacked], axis=1)


def matrix_to_stacked(matrix: np.ndarray, shapes: Shapes) -> tuple[np.ndarray, ...]:
    """(num_clusters, d) -> per-tensor arrays with a leading cluster axis."""
    rows = [unflatten(row, shapes) for row in np.asarray(matrix, np.float32)]
    return tuple(np.stack([r[i] for r in rows]) for i in range(len(shapes)))
