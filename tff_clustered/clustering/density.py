"""FedTSDP's server-side math (Zhu et al., "Federated Two Stage Decoupling With Adaptive
Personalization Layers"), NumPy / scikit-learn only: Jensen-Shannon divergence of inference
outputs (Eqs. 3-5), the Hopkins statistic (Eq. 6), Hopkins-amended sampling of the public batch
(Eqs. 7-8), the weight-constraint distance (Eqs. 9-10), the two DBSCAN stages, and the
shared-layer count schedule (Eq. 11)."""

from __future__ import annotations

from typing import Optional

import numpy as np
from sklearn.cluster import DBSCAN

STAGES = ("both", "js", "weights")
ROUNDINGS = ("floor_each_step", "floor_at_use")


def js_divergence_matrix(probs: np.ndarray) -> np.ndarray:
    """D_JS(p_i || p_j) (Eq. 5, natural log, the divergence, not its square root) between the
    softmax outputs of m models on the same B samples, probs of shape (m, B, C): computed per
    sample over the C classes and averaged over the B samples. 0 log 0 = 0. Symmetric, zero
    diagonal, values in [0, ln 2]."""
    p = np.asarray(probs, np.float64)
    if p.ndim != 3:
        raise ValueError(f"probs must be (models, samples, classes), got shape {p.shape}")
    m = len(p)

    def plogp(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)

    entropy_terms = plogp(p).sum(axis=2)  # (m, B): sum_c p log p
    out = np.zeros((m, m))
    for i in range(m):
        mix = 0.5 * (p[i][None] + p[i + 1 :])  # (m - i - 1, B, C)
        # JS = 1/2 sum p log p + 1/2 sum q log q - sum mix log mix, per sample.
        js = 0.5 * entropy_terms[i][None] + 0.5 * entropy_terms[i + 1 :] - plogp(mix).sum(2)
        out[i, i + 1 :] = np.maximum(js.mean(axis=1), 0.0)
    return out + out.T


def hopkins_statistic(
    points: np.ndarray, rng: np.random.Generator, sample_size: Optional[int] = None
) -> float:
    """Hopkins statistic H (Eq. 6) of m points in R^d: m~ real points drawn without
    replacement, v_k their distance to the nearest *other* point; m~ synthetic points uniform
    in the bounding box of the points, z_k their distance to the nearest point;
    H = sum z / (sum z + sum v). About 0.5 without structure, near 1 for tight, separated
    groups. m~ = max(1, round(0.1 m)) unless given. Fewer than 2 points, or all identical:
    0.5 (no clustering tendency can be measured)."""
    x = np.asarray(points, np.float64)
    m = len(x)
    if m < 2:
        return 0.5
    size = sample_size or max(1, int(round(0.1 * m)))
    size = min(size, m)
    real = rng.choice(m, size, replace=False)
    low, high = x.min(axis=0), x.max(axis=0)
    synthetic = rng.uniform(low, high, size=(size, x.shape[1]))

    def distances(a: np.ndarray) -> np.ndarray:
        return np.sqrt(np.maximum(((a[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))

    to_real = distances(x[real])
    to_real[np.arange(size), real] = np.inf  # never its own neighbour
    v = to_real.min(axis=1).sum()
    z = distances(synthetic).min(axis=1).sum()
    if z + v == 0:
        return 0.5
    return float(z / (z + v))


def weight_distance_matrix(weights: np.ndarray, upsilon: float = 1e-6) -> np.ndarray:
    """dist(w_i, w_j) = ||w_i - w_j + upsilon e||_2 (Eqs. 9-10) for flat weight rows, computed
    on the upper triangle and mirrored (the constant makes it very slightly asymmetric), zero
    diagonal. One row difference at a time: no (m, m, d) array."""
    w = np.asarray(weights)
    m = len(w)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            diff = w[i].astype(np.float64) - w[j] + upsilon
            out[i, j] = np.sqrt(np.dot(diff, diff))
    return out + out.T


def dbscan_clusters(distance: np.ndarray, eps: float, min_samples: int = 2) -> np.ndarray:
    """DBSCAN on a precomputed distance matrix (neighbourhood <= eps, min_samples counting the
    point itself); every noise point becomes its own singleton cluster. Labels 0..J-1 in order
    of first appearance."""
    d = np.asarray(distance, np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distance must be a square matrix, got shape {d.shape}")
    if eps <= 0 or min_samples < 1:
        raise ValueError("DBSCAN needs eps > 0 and min_samples >= 1")
    if len(d) == 0:
        return np.zeros(0, np.int64)
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(d)
    labels = np.empty(len(d), np.int64)
    seen: dict[int, int] = {}
    for i, label in enumerate(raw):
        key = int(label) if label >= 0 else -(i + 1)  # noise: a cluster of its own
        labels[i] = seen.setdefault(key, len(seen))
    return labels


def two_stage_clusters(
    js: np.ndarray,
    weight_distance: np.ndarray,
    eps1: float,
    eps2: float,
    min_samples: int = 2,
    stages: str = "both",
) -> np.ndarray:
    """Algorithm 1 lines 19-26: DBSCAN on the JS divergences (stage 1), then DBSCAN on the
    weight distances inside each stage-1 group (stage 2), flattened into labels 0..J'-1.
    `stages`: "js" stops after stage 1, "weights" runs stage 2 on everyone (the ablation)."""
    if stages not in STAGES:
        raise ValueError(f"stages must be one of {STAGES}, got {stages!r}")
    m = len(js)
    if np.shape(js) != (m, m) or np.shape(weight_distance) != (m, m):
        raise ValueError("js and weight_distance must be square matrices of the same size")
    first = (
        np.zeros(m, np.int64) if stages == "weights" else dbscan_clusters(js, eps1, min_samples)
    )
    if stages == "js":
        return first
    labels = np.empty(m, np.int64)
    next_label = 0
    for group in range(int(first.max()) + 1 if m else 0):
        members = np.flatnonzero(first == group)
        sub = dbscan_clusters(weight_distance[np.ix_(members, members)], eps2, min_samples)
        labels[members] = sub + next_label
        next_label += int(sub.max()) + 1
    return labels


def draw_public_batch(
    sampling_weights: np.ndarray, batch_size: int, rng: np.random.Generator
) -> np.ndarray:
    """B public indices drawn without replacement with probabilities W (all when B >= N)."""
    w = np.asarray(sampling_weights, np.float64)
    if batch_size >= len(w):
        return np.arange(len(w))
    return np.sort(rng.choice(len(w), batch_size, replace=False, p=w / w.sum()))


def amend_sampling_weights(
    sampling_weights: np.ndarray, batch_indices: np.ndarray, increment: Optional[float] = None
) -> np.ndarray:
    """Eq. 7: W_k += |D_pub| / |D_B| (or `increment`) for the samples of this round's batch;
    Eq. 8: normalise. Favours public samples on which the client models disagreed."""
    w = np.array(sampling_weights, np.float64)
    batch = np.asarray(batch_indices)
    step = len(w) / len(batch) if increment is None else increment
    w[batch] += step
    return w / w.sum()


def shared_tensor_count(
    num_tensors: int,
    psi: float,
    triggers: int,
    rounding: str = "floor_each_step",
    min_shared: int = 0,
) -> int:
    """L_s after `triggers` clustering rounds (Eq. 11, L_s <- L_s * psi), counted in parameter
    tensors: "floor_each_step" floors after every step (8 -> 7 -> 6 ...: at least one tensor per
    trigger), "floor_at_use" floors num_tensors * psi^triggers. Never below `min_shared`."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if rounding == "floor_at_use":
        count = int(np.floor(num_tensors * psi**triggers + 1e-9))
    else:
        count = num_tensors
        for _ in range(triggers):
            count = int(np.floor(count * psi + 1e-9))
    return max(count, min(min_shared, num_tensors))
