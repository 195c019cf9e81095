"""FedTSDP's clustering-tendency test: the Hopkins statistic (Eq. 6) and its reference.

FedTSDP's clustering-tendency test (Zhu et al., "Federated Two Stage Decoupling With
Adaptive Personalization Layers"), NumPy only: the Hopkins statistic of Eq. 6 from one draw or
pooled over many, and the reference our calibrated trigger compares it with (the clients'
outputs with their client structure destroyed, scored with the same draws)."""

from __future__ import annotations

from typing import Optional

import numpy as np


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
    estimate's is about 0.005 after a few hundred draws (a real point's nearest other point is
    computed once, the synthetic points' distances in blocks)."""
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
