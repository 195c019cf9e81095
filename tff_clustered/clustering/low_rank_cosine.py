"""FedAC's low-rank cosine (LrCos): the PCA map of the models, projections, their cosine.

FedAC's low-rank cosine (Zhang et al., "FedAC: A Adaptive Clustered Federated Learning
Framework for Heterogeneous Data", arXiv:2403.16460, Alg. 2 and Sec. 4.3), NumPy only: the PCA
map of UpdateMap, the projection P(w - x_bar) and LrCos, the cosine of projected vectors.

Choice the paper leaves open: the map is fit on the stored models of all clients (not only the
|S_t| of this round, which would cap the components at |S_t| - 1 < D = 50), by the exact
Gram-matrix route, with D clipped to the numerical rank; projections subtract the fitted mean
by default (Alg. 2 writes M w, uncentred, which is kept as `center=False`)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from tff_clustered.clustering.common import (
    SeedLike,
    as_generator,
    check_same_dim,
    checked_matrix,
    cosine_similarity,
    row_blocks,
)

# Reduced dimension D (Sec. 4.3).
NUM_COMPONENTS = 50
# Eigenvalues of the Gram matrix at most this fraction of the largest count as rank-deficient.
RANK_TOLERANCE = 1e-10
# Columns of the model matrix converted to float64 at a time when fitting the PCA map.
PCA_BLOCK_COLUMNS = 1 << 16


class PcaMap(NamedTuple):
    """The D x d map of UpdateMap (Alg. 2): z = axes @ (w - offset).

    `axes` (D', d) has orthonormal rows, the top principal axes of the fitted models (each
    axis's largest-magnitude entry positive); `offset` (d,) is the fitted mean x_bar when
    centring, zeros otherwise; `variances` (D',) are the Gram eigenvalues of the kept axes
    (sums of squared projections of the fitted models, not divided by n)."""

    offset: np.ndarray
    axes: np.ndarray
    variances: np.ndarray

    @property
    def num_components(self) -> int:
        return int(self.axes.shape[0])


def checked_reduced(
    reduced_models: Optional[np.ndarray], models: np.ndarray, pca_map: PcaMap
) -> np.ndarray:
    """The models' projections with `pca_map`: computed when None, else checked for shape."""
    if reduced_models is None:
        return project(pca_map, models)
    z = checked_matrix(reduced_models, "reduced_models")
    if z.shape != (len(models), pca_map.num_components):
        raise ValueError(
            f"reduced_models must be ({len(models)}, {pca_map.num_components}) (the models "
            f"projected with this map), got {z.shape}; recompute them with project()"
        )
    return z


def fit_pca_map(
    models: np.ndarray,
    num_components: int = NUM_COMPONENTS,
    center: bool = True,
    block_columns: int = PCA_BLOCK_COLUMNS,
) -> PcaMap:
    """UpdateMap (Alg. 2, Sec. 4.3): PCA with D = `num_components` of the stacked models (n, d).

    Exact PCA by the Gram matrix: G = Xc Xc^T (n x n, float64, accumulated over column blocks
    so a float32 store is never copied whole), eigh(G) = V diag(lambda) V^T, and the axes
    U^T = Lambda^{-1/2} V^T Xc (so the fitted rows project to V Lambda^{1/2}). D is clipped to
    the numerical rank, #{j : lambda_j > 1e-10 lambda_1}, which is at most n - 1 after
    centring. Axes have the dtype of the models (float32 stays float32).

    Choices: fit on all stored models (Alg. 2 fits on the |S_t| models of the round, which
    cannot give D = 50 components); `center=True` subtracts the fitted mean before projecting,
    `center=False` keeps Alg. 2's literal M w (the axes are the same either way)."""
    x = checked_matrix(models, "models")
    if num_components < 1:
        raise ValueError(f"num_components must be at least 1, got {num_components}")
    if len(x) < 2:
        raise ValueError(f"PCA needs at least 2 models, got {len(x)}")
    if block_columns < 1:
        raise ValueError(f"block_columns must be at least 1, got {block_columns}")
    n, d = x.shape
    mean = x.mean(axis=0, dtype=np.float64)
    gram = np.zeros((n, n))
    identical = True
    for start in range(0, d, block_columns):
        cols = slice(start, start + block_columns)
        identical = identical and bool(np.all(x[:, cols] == x[:1, cols]))
        xc = x[:, cols].astype(np.float64) - mean[cols]
        gram += xc @ xc.T
    eigenvalues, eigenvectors = np.linalg.eigh((gram + gram.T) / 2)
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    if identical or eigenvalues[0] <= 0:
        raise ValueError(
            "all models are identical, so there are no principal axes; fit the map after the "
            "clients have trained (e.g. after warm-up)"
        )
    rank = int(np.sum(eigenvalues > RANK_TOLERANCE * eigenvalues[0]))
    keep = min(num_components, rank)
    coefficients = eigenvectors[:, :keep] / np.sqrt(eigenvalues[:keep])  # V Lambda^{-1/2}
    axes = np.empty((keep, d), x.dtype)
    for start in range(0, d, block_columns):
        cols = slice(start, start + block_columns)
        xc = x[:, cols].astype(np.float64) - mean[cols]
        axes[:, cols] = coefficients.T @ xc
    largest = np.argmax(np.abs(axes), axis=1)
    signs = np.where(axes[np.arange(keep), largest] < 0, -1, 1).astype(x.dtype)
    offset = mean.astype(x.dtype) if center else np.zeros(d, x.dtype)
    return PcaMap(offset, axes * signs[:, None], eigenvalues[:keep].copy())


def random_projection_map(
    dim: int, num_components: int = NUM_COMPONENTS, seed: SeedLike = 0
) -> PcaMap:
    """A Gaussian random projection in place of PCA (the paper notes other reductions are
    compatible with LrCos): entries N(0, 1/D), shape (D, dim), no centring, float64; the
    `variances` field is zeros (there are no principal variances)."""
    if dim < 1 or num_components < 1:
        raise ValueError(f"dim and num_components must be positive, got {dim}, {num_components}")
    axes = as_generator(seed).standard_normal((num_components, dim)) / np.sqrt(num_components)
    return PcaMap(np.zeros(dim), axes, np.zeros(num_components))


def project(pca_map: PcaMap, models: np.ndarray) -> np.ndarray:
    """P(w - x_bar) for every row (Alg. 2; Sec. 4.3's P w): the reduced vectors (n, D'),
    float64, streamed over row blocks (a float32 store is not copied whole)."""
    x = checked_matrix(models, "models")
    if x.shape[1] != pca_map.axes.shape[1]:
        raise ValueError(
            f"models have {x.shape[1]} parameters but the PCA map was fit on "
            f"{pca_map.axes.shape[1]}; refit the map (fit_pca_map) on models of this shape"
        )
    offset = pca_map.offset.astype(x.dtype, copy=False)
    axes = pca_map.axes.astype(x.dtype, copy=False)
    return np.concatenate([(block - offset) @ axes.T for block in row_blocks(x)]).astype(float)


def lrcos(reduced_a: np.ndarray, reduced_b: np.ndarray) -> np.ndarray:
    """LrCos (Alg. 2): cos(P w_i, P Omega_k) of every row of `reduced_a` with every row of
    `reduced_b` (both already projected), a float64 matrix. A zero vector has cosine 0 with
    everything (norms are floored at 1e-12)."""
    a = checked_matrix(reduced_a, "reduced_a")
    b = checked_matrix(reduced_b, "reduced_b")
    check_same_dim(a, b, "reduced_a", "reduced_b")
    return cosine_similarity(a, b)


def lrcos_models(pca_map: PcaMap, models: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """LrCos(i, k) of Alg. 2 from full-dimension models (n, d) and centres (K, d): projects
    both with the map, then takes cosines (n, K)."""
    return lrcos(project(pca_map, models), project(pca_map, centers))
