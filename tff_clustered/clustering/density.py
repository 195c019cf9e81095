"""FedTSDP's server-side math (Zhu et al., "Federated Two Stage Decoupling With Adaptive
Personalization Layers"), NumPy / scikit-learn only: Jensen-Shannon divergence of inference
outputs (Eqs. 3-5), the Hopkins statistic (Eq. 6) and the reference our calibrated trigger
compares it with, Hopkins-amended sampling of the public batch (Eqs. 7-8), the
weight-constraint distance (Eqs. 9-10), the two DBSCAN stages (Alg. 1 lines 19-26) and the
shared-layer count schedule (Eq. 11)."""

from __future__ import annotations

from typing import Optional

import numpy as np
from sklearn.cluster import DBSCAN

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


def _nearest_distances(queries: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Euclidean distance from every query row to every point row, (k, m), one query row at a
    time (never a (k, m, d) array)."""
    out = np.empty((len(queries), len(points)))
    for k, q in enumerate(queries):
        out[k] = np.linalg.norm(points - q[None], axis=1)
    return out


def _nearest_other(x: np.ndarray) -> np.ndarray:
    """Each point's distance to its nearest *other* point (Eq. 6's v_k for every point)."""
    own = _nearest_distances(x, x)
    own[np.arange(len(x)), np.arange(len(x))] = np.inf
    return own.min(axis=1)


def _hopkins_sums(x: np.ndarray, rng: np.random.Generator, size: int) -> tuple[float, float]:
    """One draw of Eq. 6's sums: (sum_k z_k, sum_k v_k) over `size` real and as many synthetic
    points (the real draw first, then the synthetic points, from `rng`)."""
    m = len(x)
    real = rng.choice(m, size, replace=False)
    synthetic = rng.uniform(x.min(axis=0), x.max(axis=0), size=(size, x.shape[1]))
    to_points = _nearest_distances(x[real], x)
    to_points[np.arange(size), real] = np.inf  # a point is never its own neighbour
    return float(_nearest_distances(synthetic, x).min(axis=1).sum()), float(
        to_points.min(axis=1).sum()
    )


def _hopkins_input(points: np.ndarray, sample_size: Optional[int]) -> tuple[np.ndarray, int]:
    x = np.asarray(points, np.float64)
    if x.ndim != 2:
        raise ValueError(f"points must be (m, d), got shape {x.shape}")
    if sample_size is not None and sample_size < 1:
        raise ValueError(f"sample_size must be at least 1, got {sample_size}")
    return x, min(sample_size or max(1, int(round(0.1 * len(x)))), len(x))


def hopkins_statistic(
    points: np.ndarray, rng: np.random.Generator, sample_size: Optional[int] = None
) -> float:
    """Hopkins statistic H = sum_k z_k / (sum_k z_k + sum_k v_k) (Eq. 6) of m points in R^d
    (FedTSDP: the m flattened B x C inference outputs), from one draw.

    m~ = `sample_size` or, when None, max(1, round(0.1 m)); it is capped at m. v_k: Euclidean
    distance from each of m~ real points (drawn without replacement) to its nearest *other*
    point; z_k: distance from each of m~ synthetic points, uniform in the axis-aligned bounding
    box of the points, to its nearest real point. Plain sums, no power d. About 0.5 without
    structure, near 1 for tight, well-separated groups. No clustering tendency can be measured
    with fewer than 2 points or when every distance is 0 (all points identical): 0.5 then.
    The real draw comes first, then the synthetic points, from `rng`.
    """
    x, size = _hopkins_input(points, sample_size)
    if len(x) < 2:
        return 0.5
    z, v = _hopkins_sums(x, rng, size)
    return 0.5 if z + v == 0 else float(z / (z + v))


def hopkins_estimate(
    points: np.ndarray,
    rng: np.random.Generator,
    sample_size: Optional[int] = None,
    target_std: float = 0.005,
    min_draws: int = 16,
    max_points: int = 20_000,
) -> tuple[float, int]:
    """H of Eq. 6 with a sampling spread small enough that a threshold on it decides, not the
    draw: repeated draws of m~ real and m~ synthetic points each (as `hopkins_statistic`),
    pooled as H = sum_r Z_r / (sum_r Z_r + sum_r V_r), until the estimated standard error of H
    is at most `target_std` (the ratio estimator's, sd(Z_r - H T_r) / (mean T_r sqrt(R)) with
    T_r = Z_r + V_r), from `min_draws` draws on, doubling the draws each time, up to
    `max_points` synthetic points in all. Returns (H, draws). At m = 10 and m~ = 1 a single
    draw has a standard deviation of 0.05-0.07 on trained models' outputs; the pooled
    estimate's is about 0.005 after a few hundred draws (milliseconds: a real point's nearest
    other point is computed once, the synthetic points' distances in blocks)."""
    if not target_std > 0 or min_draws < 2:
        raise ValueError(f"need target_std > 0 and min_draws >= 2, got {target_std}, {min_draws}")
    x, size = _hopkins_input(points, sample_size)
    m = len(x)
    if m < 2:
        return 0.5, 0
    nearest_other = _nearest_other(x)
    low, high, squares = x.min(axis=0), x.max(axis=0), np.einsum("ij,ij->i", x, x)
    block = max(1, (1 << 22) // max(1, x.shape[1]))  # synthetic rows per block (32 MiB)

    def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
        real = np.argsort(rng.random((count, m)), axis=1)[:, :size]
        synthetic_nearest = np.empty(count * size)
        for start in range(0, count * size, block):
            rows = min(block, count * size - start)
            y = rng.uniform(low, high, size=(rows, x.shape[1]))
            squared = np.einsum("ij,ij->i", y, y)[:, None] + squares[None] - 2 * y @ x.T
            synthetic_nearest[start : start + rows] = np.sqrt(np.maximum(squared, 0).min(1))
        return synthetic_nearest.reshape(count, size).sum(1), nearest_other[real].sum(1)

    z, v = draw(min_draws)
    while True:
        total = z + v
        if total.sum() == 0:
            return 0.5, len(z)
        h = float(z.sum() / total.sum())
        spread = np.std(z - h * total, ddof=1) / (total.mean() * np.sqrt(len(z)))
        more = min(len(z), max_points // size - len(z))
        if spread <= target_std or more < 1:
            return h, len(z)
        extra_z, extra_v = draw(more)
        z, v = np.concatenate([z, extra_z]), np.concatenate([v, extra_v])


def rotated_outputs(probs: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` sets of m clients' outputs like `probs` (m, B, C) with their client structure
    destroyed, the reference of FedTSDP's calibrated trigger: each sample's centred
    log-probabilities log p - mean_c log p (zero probabilities taken as 1e-12) of the m
    clients are mixed by a Haar-random orthogonal map of the client space that fixes the
    clients' mean, y = mean + U O U^T (l - mean) with U an orthonormal basis of the vectors
    orthogonal to all-ones and O uniform on O(m - 1), then mapped back by a softmax over the
    classes. Returns (count, m, B * C) float64: valid softmax outputs.

    Why this reference: it keeps the clients' mean, their covariance across the B * C
    coordinates (every correlation the models share) and the spread of their pairwise
    distances (the eigenvalues of the clients' Gram matrix), and it is exact when the
    clients' log-outputs are i.i.d. Gaussian (a rotation of i.i.d. Gaussian rows is
    distributed as the rows), but it puts clients that form groups (Gram eigenvectors constant
    on each group) in random positions. Softmax saturation stays: softmax outputs close to 0
    or 1 skew each coordinate, and a rotation of the probabilities themselves (or a Gaussian
    with their covariance) removes that skew, and the Hopkins statistic of m i.i.d. clients
    then sits above it. A coordinate-wise permutation keeps each coordinate's values but
    removes the correlation between coordinates: every client's output then lies at about
    the same distance from every other, and the real outputs' H sits far above it even on
    IID clients."""
    p = np.asarray(probs, np.float64)
    if p.ndim != 3:
        raise ValueError(f"probs must be (models, samples, classes), got shape {p.shape}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    m = len(p)
    logs = np.log(np.maximum(p, 1e-12))
    logs = (logs - logs.mean(axis=2, keepdims=True)).reshape(m, -1)
    mean = logs.mean(axis=0)
    # An orthonormal basis of the vectors orthogonal to all-ones (the client space's
    # directions that keep the mean), from the QR of the centring matrix.
    basis = np.linalg.qr(np.eye(m) - 1.0 / m)[0][:, : m - 1] if m > 1 else np.zeros((1, 0))
    projected = basis.T @ (logs - mean)  # (m - 1, B * C)
    out = np.empty((count, m, logs.shape[1]))
    for k in range(count):
        gaussian = rng.standard_normal((m - 1, m - 1))
        q, r = np.linalg.qr(gaussian)
        rotation = q * np.where(np.diag(r) < 0, -1.0, 1.0)  # Haar on O(m - 1)
        mixed = (mean + basis @ (rotation @ projected)).reshape(p.shape)
        mixed = np.exp(mixed - mixed.max(axis=2, keepdims=True))
        out[k] = (mixed / mixed.sum(axis=2, keepdims=True)).reshape(m, -1)
    return out


def hopkins_against_references(
    points: np.ndarray,
    references: np.ndarray,
    rng: np.random.Generator,
    sample_size: Optional[int] = None,
    draws: int = 256,
) -> tuple[float, np.ndarray]:
    """H of Eq. 6 of `points` (m, d) and of each of `references` (R, m, d), pooled over `draws`
    draws of m~ real and m~ synthetic points each (as `hopkins_estimate`), with common random
    numbers: every set uses the same real-point indices and the same uniform numbers, scaled
    to its own axis-aligned bounding box, so the differences between the sets are differences
    of the sets, not of the draws. Returns (H of `points`, H of each reference (R,))."""
    x, size = _hopkins_input(points, sample_size)
    refs = np.asarray(references, np.float64)
    if refs.ndim != 3 or refs.shape[1:] != x.shape:
        raise ValueError(f"references must be (R, {x.shape[0]}, {x.shape[1]}), got {refs.shape}")
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    m = len(x)
    if m < 2:
        return 0.5, np.full(len(refs), 0.5)
    real = np.argsort(rng.random((draws, m)), axis=1)[:, :size].reshape(-1)
    unit = rng.random((draws * size, x.shape[1]))
    sets = np.concatenate([x[None], refs])  # (S, m, d): the points, then the references
    # v: each real point's distance to its nearest other point in its own set.
    v = np.stack([_nearest_other(points_of_set) for points_of_set in sets])[:, real].sum(axis=1)
    # z: synthetic point low + u * width of each set's box to its nearest point x_j, with
    # ||u w + low - x_j||^2 = (u^2) . w^2 - 2 u . (w (x_j - low)) + ||x_j - low||^2 for all
    # sets in two products.
    low = sets.min(axis=1)
    width = sets.max(axis=1) - low
    offsets = sets - low[:, None]  # (S, m, d)
    squared = (
        ((unit * unit) @ (width * width).T)[:, :, None]
        - 2
        * (unit @ (width[:, None] * offsets).reshape(-1, x.shape[1]).T).reshape(
            len(unit), len(sets), m
        )
        + np.einsum("smd,smd->sm", offsets, offsets)[None]
    )
    z = np.sqrt(np.maximum(squared, 0).min(axis=2)).sum(axis=0)
    total = z + v
    h = np.where(total > 0, z / np.where(total > 0, total, 1.0), 0.5)
    return float(h[0]), h[1:]


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
