"""FedTSDP's server-side math: output divergences, the public batch, the two DBSCAN stages.

FedTSDP's server-side math (Zhu et al., "Federated Two Stage Decoupling With Adaptive
Personalization Layers"), NumPy / scikit-learn only: Jensen-Shannon divergence of inference
outputs (Eqs. 3-5), Hopkins-amended sampling of the public batch (Eqs. 7-8), the
weight-constraint distance (Eqs. 9-10), the two DBSCAN stages (Alg. 1 lines 19-26) and the
shared-layer count schedule (Eq. 11). The Hopkins statistic (Eq. 6) and the reference our
calibrated trigger compares it with are in `hopkins`."""

from __future__ import annotations

from typing import Optional

import numpy as np

STAGES = ("both", "js", "weights")
ROUNDINGS = ("floor_each_step", "floor_at_use")

# Columns of the weight matrix converted to float64 at a time in Eq. 9 (a few MiB per block).
_DISTANCE_CHUNK = 1 << 15


def _plogp(a: np.ndarray) -> np.ndarray:
    """a log a elementwise, natural log, with 0 log 0 = 0."""
    positive = a > 0
    return np.where(positive, a * np.log(np.where(positive, a, 1.0)), 0.0)


def _first_appearance(labels: np.ndarray) -> np.ndarray:
    """Renumber labels 0..J-1 in the order in which they first appear."""
    _, first_index, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first_index), np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(len(first_index))
    return rank[inverse.reshape(-1)]


def js_divergence_matrix(probs: np.ndarray) -> np.ndarray:
    """Sim[i, j] = D_JS(p_i || p_j) (Eq. 5 built on the KL divergence of Eqs. 3-4) between the
    softmax outputs of m models on the same B public samples, probs of shape (m, B, C).

    Per sample over the C classes, then averaged over the B samples; natural log, the
    divergence (not its square root), 0 log 0 = 0. Uses
    D_JS(p || q) = 1/2 sum p log p + 1/2 sum q log q - sum p^ log p^ with p^ = (p + q) / 2,
    which is Eq. 5 expanded, vectorised over all pairs (i, j > i) of one row at a time.
    Returns an (m, m) float64 matrix: exactly symmetric, zero diagonal, values in [0, ln 2].
    """
    p = np.asarray(probs, np.float64)
    if p.ndim != 3:
        raise ValueError(f"probs must be (models, samples, classes), got shape {p.shape}")
    if p.size and (not np.all(np.isfinite(p)) or p.min() < 0):
        raise ValueError("probs must be finite and non-negative (softmax outputs)")
    m = len(p)
    entropy_terms = _plogp(p).sum(axis=2)  # (m, B): sum_c p log p
    out = np.zeros((m, m))
    for i in range(m - 1):
        mix = 0.5 * (p[i][None] + p[i + 1 :])  # (m - i - 1, B, C)
        js = 0.5 * entropy_terms[i][None] + 0.5 * entropy_terms[i + 1 :] - _plogp(mix).sum(2)
        out[i, i + 1 :] = np.maximum(js.mean(axis=1), 0.0)  # rounding can give -1e-17
    return out + out.T


def weight_distance_matrix(weights: np.ndarray, upsilon: float = 1e-6) -> np.ndarray:
    """D[i, j] = dist(w_i, w_j) = ||w_i - w_j + upsilon e||_2 (Eq. 9, with the L2 norm of
    Eq. 10) between flat weight rows, weights of shape (m, d); e is the all-ones vector.

    Computed for i < j and mirrored (upsilon makes the formula very slightly asymmetric), zero
    diagonal. The differences are formed exactly (no Gram-matrix cancellation) in float64 on
    column blocks of the (possibly float32) input, so memory stays O(m * block), never
    O(m^2 d).
    """
    w = np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be (m, d), got shape {w.shape}")
    m, d = w.shape
    squared = np.zeros((m, m))
    for start in range(0, d, _DISTANCE_CHUNK):
        block = w[:, start : start + _DISTANCE_CHUNK].astype(np.float64)
        for i in range(m - 1):
            diff = block[i][None] - block[i + 1 :]
            diff += upsilon
            squared[i, i + 1 :] += np.einsum("ij,ij->i", diff, diff)
    out = np.sqrt(squared)
    return out + out.T


def dbscan_clusters(distance: np.ndarray, eps: float, min_samples: int = 2) -> np.ndarray:
    """DBSCAN on a precomputed distance matrix (Alg. 1 lines 20 and 24): neighbourhood
    distance <= eps, `min_samples` counting the point itself. Every noise point (-1) becomes
    its own singleton cluster. Labels 0..J-1 in order of first appearance."""
    from sklearn.cluster import DBSCAN

    d = np.asarray(distance, np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distance must be a square matrix, got shape {d.shape}")
    if not eps > 0 or min_samples < 1:
        raise ValueError(f"DBSCAN needs eps > 0 and min_samples >= 1, got {eps}, {min_samples}")
    if len(d) == 0:
        return np.zeros(0, np.int64)
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(d)
    keys = np.where(raw >= 0, raw, -1 - np.arange(len(d)))  # noise: a cluster of its own
    return _first_appearance(keys)


def two_stage_clusters(
    js: np.ndarray,
    weight_distance: np.ndarray,
    eps1: float,
    eps2: float,
    min_samples: int = 2,
    stages: str = "both",
) -> np.ndarray:
    """The two-stage clustering of Alg. 1 lines 19-26: stage 1, DBSCAN(eps1) on the JS
    divergences of Eq. 5; stage 2, DBSCAN(eps2) on the Eq. 9 weight distances inside each
    stage-1 group (its sub-matrix); the flattened list C^2 as labels 0..J'-1 in order of first
    appearance. Noise points are singletons in both stages.

    stages: "both" (the paper), "js" (stage 1 only, C^2 = C^1), "weights" (stage 2 on all
    clients as one group): the ablations of the paper's Fig. 9."""
    if stages not in STAGES:
        raise ValueError(f"stages must be one of {STAGES}, got {stages!r}")
    js = np.asarray(js, np.float64)
    weight_distance = np.asarray(weight_distance, np.float64)
    m = len(js)
    if js.shape != (m, m) or weight_distance.shape != (m, m):
        raise ValueError(
            "js and weight_distance must be square matrices of the same size, got shapes "
            f"{js.shape} and {weight_distance.shape}"
        )
    if stages == "weights":
        first = np.zeros(m, np.int64)
    else:
        first = dbscan_clusters(js, eps1, min_samples)
    if stages == "js":
        return first
    labels = np.empty(m, np.int64)
    next_label = 0
    for group in np.unique(first):
        members = np.flatnonzero(first == group)
        sub = dbscan_clusters(weight_distance[np.ix_(members, members)], eps2, min_samples)
        labels[members] = sub + next_label
        next_label += int(sub.max()) + 1
    return _first_appearance(labels)


def draw_public_batch(
    sampling_weights: np.ndarray, batch_size: int, rng: np.random.Generator
) -> np.ndarray:
    """D_pub^B: B public indices drawn without replacement with probabilities W (the weights
    of Eqs. 7-8, normalised here), returned sorted; all N indices in order when B >= N."""
    w = np.asarray(sampling_weights, np.float64)
    if w.ndim != 1:
        raise ValueError(f"sampling_weights must be a vector, got shape {w.shape}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if batch_size >= len(w):
        return np.arange(len(w))
    if not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
        raise ValueError("sampling_weights must be finite, non-negative, with a positive sum")
    return np.sort(rng.choice(len(w), batch_size, replace=False, p=w / w.sum()))


def _weights_and_batch(
    sampling_weights: np.ndarray, batch_indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A float64 copy of the weights W and the batch D_B as distinct indices into W."""
    w = np.array(sampling_weights, np.float64)
    batch = np.asarray(batch_indices, np.int64).reshape(-1)
    if w.ndim != 1:
        raise ValueError(f"sampling_weights must be a vector, got shape {w.shape}")
    if len(batch) == 0:
        raise ValueError("the batch D_B is empty")
    if batch.min() < 0 or batch.max() >= len(w) or len(np.unique(batch)) != len(batch):
        raise ValueError(f"batch indices must be distinct and in [0, {len(w)})")
    return w, batch


def amend_sampling_weights(
    sampling_weights: np.ndarray, batch_indices: np.ndarray, increment: Optional[float] = None
) -> np.ndarray:
    """Hopkins-amended sampling: Eq. 7, W_k <- W_k + |D_pub| / |D_B| (or `increment`) for every
    k in this round's batch D_B, the other W_k unchanged; Eq. 8, W <- W / sum W. Returns a new
    array. Favours the public samples on which the client models disagreed."""
    w, batch = _weights_and_batch(sampling_weights, batch_indices)
    step = len(w) / len(batch) if increment is None else float(increment)
    if step < 0:
        raise ValueError(f"increment must be non-negative, got {step}")
    w[batch] += step
    return w / w.sum()


def raise_sampling_weights(sampling_weights: np.ndarray, batch_indices: np.ndarray) -> np.ndarray:
    """Hopkins-amended sampling with bounded weights (our reading of Eqs. 7-8): W counts in
    units of one public sample (W^0 = 1 each, Eq. 8's normalisation only makes them
    probabilities for the draw), and Eq. 7's increment |D_pub| / |D_B| is given to a sample once:
    W_k <- max(W_k, 1 + |D_pub| / |D_B|) for k in D_B. One amended batch then holds about half of
    the sampling mass and no later trigger can push any batch above that, whereas Eq. 7 added to
    normalised weights puts 1 - 1/|D_pub| of the mass on the first amended batch."""
    w, batch = _weights_and_batch(sampling_weights, batch_indices)
    w[batch] = np.maximum(w[batch], 1.0 + len(w) / len(batch))
    return w


def shared_tensor_count(
    num_tensors: int,
    psi: float,
    triggers: int,
    rounding: str = "floor_each_step",
    min_shared: int = 0,
) -> int:
    """L^s, in parameter tensors, after `triggers` clustering rounds of L^s <- L^s * psi
    (Eq. 11; psi = 0.98 in the paper), starting from all `num_tensors`.

    "floor_each_step": L^s <- floor(L^s * psi) at every trigger (8 -> 7 -> 6 ...: at least one
    tensor per trigger); "floor_at_use": floor(num_tensors * psi^triggers) (8 -> 7 for triggers
    1..6, 6 at the 7th). Never below min(min_shared, num_tensors). A 1e-9 guard keeps float
    round-off (e.g. 49.99999999) from dropping a whole tensor."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if num_tensors < 0 or triggers < 0 or min_shared < 0:
        raise ValueError("num_tensors, triggers and min_shared must be non-negative")
    if not 0 < psi <= 1:
        raise ValueError(f"the dampening ratio psi must be in (0, 1], got {psi}")
    if rounding == "floor_at_use":
        count = int(np.floor(num_tensors * psi**triggers + 1e-9))
    else:
        count = num_tensors
        for _ in range(triggers):
            count = int(np.floor(count * psi + 1e-9))
    return max(count, min(min_shared, num_tensors))
