"""FedAC's server-side clustering math (Zhang et al., "FedAC: A Adaptive Clustered Federated
Learning Framework for Heterogeneous Data", arXiv:2403.16460), NumPy only: the PCA map of
UpdateMap and the low-rank cosine LrCos (Alg. 2, Sec. 4.3), the E-step (Eq. 4, Alg. 1 line 11)
and M-step (Eq. 5) over all stored client models, and cluster number tuning (CNT, Alg. 3, with
(a, b) = (0.2, 0.8) from Sec. 5.5, or our relative rule).

Rows of every matrix are flattened client models (or their reduced vectors); labels are int32
cluster indices 0..K-1. No function mutates its inputs. Choices the paper leaves open, made
here (each is repeated where it applies):

* E-step: Eq. 4 prints argmin of a similarity; we take the argmax (as Eq. 3 does); ties go to
  the lowest cluster index. Clusters left empty by the E-step are removed (K decreases).
* PCA: fit on the stored models of all clients (not only the |S_t| of this round, which would
  cap the components at |S_t| - 1 < D = 50), by the exact Gram-matrix route, with D clipped
  to the numerical rank; projections subtract the fitted mean by default (Alg. 2 writes
  M w, uncentred, which is kept as `center=False`).
* CNT, the paper's rule (`rule="paper"`): G_c is computed once per call (a snapshot); merges
  (smallest G_c first) go to the centre nearest in squared L2 in full dimension; splits
  (largest G_c first) are seeded by the member least LrCos-similar to its centre and the
  member least similar to that one, followed by one reassignment pass; K stays within
  [K_min, K_max]; a split that leaves a side with fewer than s_min members is cancelled, and
  a cluster touched by a merge in the same call is not split.
* CNT, our relative rule (`rule="relative"`, the default): the same merge targets, split
  seeding and bounds, but the decisions compare clusters with their own members' spread
  instead of G_c = Dist_intra / Dist_inter. G_c < a also holds for distinct, well-separated
  groups as soon as members gather around their centres, which FedAC's mu pull makes them do
  (at mu = 1 on the embedded digits the paper's rule merged three planted groups into one).
  A cluster merges into its nearest when the two are not clearly apart (`separation` < 2: a
  test of their means against the members' pooled spread, ~1 for two halves of one group);
  a cluster splits when its two sides are clearly apart (separation > 4) and two-sided along
  their main axis (`bimodality` > 3/4, more than a cut of any symmetric unimodal group).
  Pulling members toward their centres can only raise a pair's separation (no merge of
  groups it did not already allow) and leaves a split's statistics unchanged.
* Initialization (Alg. 1 line 1 initializes R^0 without saying how): spherical k-means with
  k-means++ seeding on the reduced vectors, or a random balanced assignment as an ablation.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Union

import numpy as np
from scipy.spatial.distance import cdist

from tff_clustered.clustering.decomposed import (
    _float,
    cosine_similarity,
    nearest_centers,
    row_blocks,
)

# Reduced dimension D (Sec. 4.3), G_c bounds (a, b) (Sec. 5.5); K_min, K_max, s_min are not in
# the paper (our defaults).
NUM_COMPONENTS = 50
GC_LOWER = 0.2
GC_UPPER = 0.8
# CNT's decision rules: "relative" (ours, the default) bounds the separation of two member sets
# (see `separation`), "paper" is Alg. 3's G_c < a / G_c > b.
CNT_RULES = ("relative", "paper")
# The relative rule's bounds (ours): merge when `separation` is below 2 (two random halves of one
# group average 1), split when it is above 4 (sides twice as far apart as random halves) and
# `bimodality` is above 3/4 (more two-sided than a cut of any symmetric unimodal group: a
# chosen cut of a large group can be far from random, its separation growing with its size).
MERGE_SEPARATION = 2.0
SPLIT_SEPARATION = 4.0
UNIMODAL_BIMODALITY = 0.75
MIN_CLUSTERS = 2
MAX_CLUSTERS = 20
MIN_SPLIT_SIZE = 2
# Eigenvalues of the Gram matrix at most this fraction of the largest count as rank-deficient.
RANK_TOLERANCE = 1e-10
# Columns of the model matrix converted to float64 at a time when fitting the PCA map.
PCA_BLOCK_COLUMNS = 1 << 16

# An int seed, or a Generator (e.g. Generator(SeedSequence((seed, round, purpose)))), which the
# call advances.
SeedLike = Union[int, np.random.Generator]


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


class CntResult(NamedTuple):
    """Outcome of one CNT call (Alg. 3): the new labels (0..K'-1), full-dimension centres
    (K', d), reduced centres (K', D'), the G_c snapshot of the input clusters, the merges as
    (merged cluster, receiving cluster) pairs and the split clusters, both in input indices.
    Whatever the rule, `merge_separations` holds each input cluster's `separation` from its
    nearest centre (the snapshot before any merge), and `split_separations` and
    `split_bimodalities` the separation and `bimodality` of the two sides of the split CNT
    considered for it (NaN where none was: a cluster merged or grown by a merge, or too small
    to leave `min_split_size` members on both sides). `split_candidates` marks, per model, the
    considered splits the relative bounds allow: 2 j or 2 j + 1 for the two sides of the j-th
    of them, -1 elsewhere (a row of the next calls' `previous_splits`)."""

    assign: np.ndarray
    centers: np.ndarray
    reduced_centers: np.ndarray
    gc: np.ndarray
    merges: tuple[tuple[int, int], ...]
    splits: tuple[int, ...]
    merge_separations: np.ndarray
    split_separations: np.ndarray
    split_bimodalities: np.ndarray
    split_candidates: np.ndarray

    @property
    def num_clusters(self) -> int:
        return int(len(self.centers))


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


# ----------------------------------------------------------------------------------------------
# Validation helpers.


def _rng(seed: SeedLike) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _matrix(a: np.ndarray, name: str) -> np.ndarray:
    a = _float(a)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D (rows, dim) array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf; check the uploaded models")
    return a


def _same_dim(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{name_a} has {a.shape[1]} columns but {name_b} has {b.shape[1]}; both must be "
            "flattened in the same layout (same model, same variable order)"
        )


def _labels(assign: np.ndarray, num_rows: int, num_clusters: int) -> np.ndarray:
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


def _reduced(
    reduced_models: Optional[np.ndarray], models: np.ndarray, pca_map: PcaMap
) -> np.ndarray:
    """The models' projections with `pca_map`: computed when None, else checked for shape."""
    if reduced_models is None:
        return project(pca_map, models)
    z = _matrix(reduced_models, "reduced_models")
    if z.shape != (len(models), pca_map.num_components):
        raise ValueError(
            f"reduced_models must be ({len(models)}, {pca_map.num_components}) (the models "
            f"projected with this map), got {z.shape}; recompute them with project()"
        )
    return z


def _require_nonempty(labels: np.ndarray, num_clusters: int) -> np.ndarray:
    sizes = np.bincount(labels, minlength=num_clusters)
    empty = np.flatnonzero(sizes == 0)
    if len(empty):
        raise ValueError(
            f"clusters {empty.tolist()} have no members; remove them with drop_empty_clusters "
            "before computing centres"
        )
    return sizes


# ----------------------------------------------------------------------------------------------
# PCA map and LrCos (Alg. 2, Sec. 4.3).


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
    x = _matrix(models, "models")
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
    axes = _rng(seed).standard_normal((num_components, dim)) / np.sqrt(num_components)
    return PcaMap(np.zeros(dim), axes, np.zeros(num_components))


def project(pca_map: PcaMap, models: np.ndarray) -> np.ndarray:
    """P(w - x_bar) for every row (Alg. 2; Sec. 4.3's P w): the reduced vectors (n, D'),
    float64, streamed over row blocks (a float32 store is not copied whole)."""
    x = _matrix(models, "models")
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
    a = _matrix(reduced_a, "reduced_a")
    b = _matrix(reduced_b, "reduced_b")
    _same_dim(a, b, "reduced_a", "reduced_b")
    return cosine_similarity(a, b)


def lrcos_models(pca_map: PcaMap, models: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """LrCos(i, k) of Alg. 2 from full-dimension models (n, d) and centres (K, d): projects
    both with the map, then takes cosines (n, K)."""
    return lrcos(project(pca_map, models), project(pca_map, centers))


# ----------------------------------------------------------------------------------------------
# E-step and M-step (Eqs. 4-5, Alg. 1 lines 11-12).


def e_step(reduced_models: np.ndarray, reduced_centers: np.ndarray) -> np.ndarray:
    """E-step (Eq. 4, Alg. 1 line 11): R_{i,k} = 1 iff k = argmax_j LrCos(w_i, Omega_j), for
    every stored model against the centres from before this round's M-step. Returns int32
    labels. Choice: Eq. 4 prints argmin of the similarity; the argmax (Eq. 3) is used, and
    ties go to the lowest cluster index."""
    return np.argmax(lrcos(reduced_models, reduced_centers), axis=1).astype(np.int32)


def drop_empty_clusters(assign: np.ndarray, num_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove the clusters the E-step left without members (K decreases; the paper does not
    say what happens to them). Returns (labels renumbered 0..K'-1 in the old order, the old
    indices of the kept clusters)."""
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be at least 1, got {num_clusters}")
    labels = _labels(assign, len(np.asarray(assign)), num_clusters)
    kept = np.flatnonzero(np.bincount(labels, minlength=num_clusters) > 0)
    new_index = np.full(num_clusters, -1, np.int32)
    new_index[kept] = np.arange(len(kept), dtype=np.int32)
    return new_index[labels], kept


def _cluster_mean(
    models: np.ndarray, members: np.ndarray, weights: Optional[np.ndarray]
) -> np.ndarray:
    """Mean (float64) of the member rows, unweighted or weighted; copies only the members."""
    rows = models[members]
    if weights is None:
        return rows.mean(axis=0, dtype=np.float64)
    w = weights[members]
    return (w @ rows.astype(np.float64)) / w.sum()


def _weights(weights: Optional[np.ndarray], num_rows: int) -> Optional[np.ndarray]:
    if weights is None:
        return None
    w = np.asarray(weights, np.float64)
    if w.shape != (num_rows,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(
            f"weights must be {num_rows} positive finite numbers (one per model, e.g. |D_i|), "
            f"got shape {w.shape}"
        )
    return w


def m_step(
    models: np.ndarray,
    assign: np.ndarray,
    num_clusters: int,
    weights: Optional[np.ndarray] = None,
) -> np.ndarray:
    """M-step (Eq. 5): Omega_k = (1 / sum_i R_{i,k}) sum_i R_{i,k} w_i over all stored models,
    in full dimension; unweighted as in the paper, or weighted by `weights` (e.g. |D_i|) as an
    option. Returns (K, d) float64. Every cluster must have a member (drop_empty_clusters)."""
    x = _matrix(models, "models")
    labels = _labels(assign, len(x), num_clusters)
    _require_nonempty(labels, num_clusters)
    w = _weights(weights, len(x))
    return np.stack([_cluster_mean(x, labels == k, w) for k in range(num_clusters)])


# ----------------------------------------------------------------------------------------------
# Cluster number tuning (Alg. 3).


def _squared_distances_to(rows: np.ndarray, center: np.ndarray) -> np.ndarray:
    """||row - center||^2 for every row, float64, by explicit differences (no cancellation)."""
    return np.concatenate(
        [((block.astype(np.float64) - center) ** 2).sum(axis=1) for block in row_blocks(rows)]
    )


def _member_distances(x: np.ndarray, c: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """||w_i - Omega_{label i}||^2 of every row, float64."""
    out = np.empty(len(x))
    for k in range(len(c)):
        members = np.flatnonzero(labels == k)
        if len(members):
            out[members] = _squared_distances_to(x[members], c[k])
    return out


def _gc_from(intra: np.ndarray, c: np.ndarray) -> np.ndarray:
    num_clusters = len(c)
    inter = cdist(c, c, "sqeuclidean").sum(axis=1) / (num_clusters - 1)
    gc = np.full(num_clusters, np.inf)
    gc[intra == 0] = 0.0
    positive = (intra > 0) & (inter > 0)
    gc[positive] = intra[positive] / inter[positive]
    return gc


def gc_ratios(models: np.ndarray, centers: np.ndarray, assign: np.ndarray) -> np.ndarray:
    """G_c^k = Dist_intra^k / Dist_inter^k of every cluster (Alg. 3), squared L2 in full
    dimension: Dist_intra^k = (1/|k|) sum_{i in k} ||w_i - Omega_k||^2 and
    Dist_inter^k = (1/(K-1)) sum_j ||Omega_k - Omega_j||^2 (the j = k term is 0).

    Choices: a cluster with Dist_intra = 0 (a singleton, or identical members) has G_c = 0;
    otherwise Dist_inter = 0 (it coincides with every other centre) gives G_c = inf."""
    x = _matrix(models, "models")
    c = _matrix(centers, "centers").astype(np.float64)
    _same_dim(x, c, "models", "centers")
    num_clusters = len(c)
    if num_clusters < 2:
        raise ValueError("G_c needs at least 2 clusters (Dist_inter is undefined for K = 1)")
    labels = _labels(assign, len(x), num_clusters)
    sizes = _require_nonempty(labels, num_clusters)
    distances = _member_distances(x, c, labels)
    return _gc_from(np.bincount(labels, distances, num_clusters) / sizes, c)


def separation(
    count_a: int,
    count_b: int,
    squared_distance: float,
    spread_a: float,
    spread_b: float,
    fallback_variance: float = 0.0,
) -> float:
    """How far apart two member sets are for their size and spread (the relative CNT rule's
    statistic, ours): the squared distance of their centres over what it would be on average
    if both were random samples of one group,

        T = ||Omega_a - Omega_b||^2 / (s^2 (1/n_a + 1/n_b)),
        s^2 = (S_a + S_b) / (n_a + n_b - 2),

    with n the member counts and S the summed squared distances of the members to their own
    centre (s^2 is the pooled spread of one member; the trace form of Hotelling's two-sample
    statistic). T is about 1 for one group cut in two at random, whatever the group's spread
    or the dimension, and 1 + n_a n_b / (n_a + n_b) Delta^2 / s^2 for two groups whose means are
    Delta apart. It does not change when every model is scaled by a common factor, and it only
    grows when members move toward their own centres (as FedAC's mu pull makes them: s shrinks,
    the centres stay), so such a shrinkage can stop a merge, never cause one.

    Two singletons have no spread of their own (n_a + n_b = 2): `fallback_variance` stands in
    for s^2. s^2 = 0 gives T = inf (0 when the centres coincide too)."""
    if count_a < 1 or count_b < 1:
        raise ValueError(f"separation needs members on both sides, got {count_a}, {count_b}")
    dof = count_a + count_b - 2
    variance = (spread_a + spread_b) / dof if dof > 0 else fallback_variance
    scale = variance * (1.0 / count_a + 1.0 / count_b)
    if scale <= 0:
        return 0.0 if squared_distance <= 0 else float("inf")
    return float(squared_distance / scale)


def bimodality(reduced_a: np.ndarray, reduced_b: np.ndarray) -> float:
    """How two-sided two member sets are along the main axis of their union (the relative CNT
    rule's second statistic, ours), from their reduced vectors:

        Q = (n_a n_b / (n_a + n_b)) ||z_a_bar - z_b_bar||^2 / lambda_1,

    the scatter between the two sides over the largest eigenvalue of the union's scatter
    matrix. Q <= 1 (the between scatter is the union's scatter along one direction), with 1
    for two point masses. A cut of one symmetric unimodal group explains at most 3/4 of its
    main axis's scatter (such a group is a mixture of centred uniform segments, and
    (E|X|)^2 <= 3/4 E[X^2] for each; a uniform segment cut at its middle reaches 3/4, a
    Gaussian 2/pi), so Q > 3/4 says the union is not one such group (for many members; a
    few can look two-sided by chance, which the separation bound guards against). Q does not
    change when everything is scaled, and it grows when each side shrinks toward its own
    centre (lambda_1 falls, the between scatter stays). Empty scatter gives 0."""
    za = _matrix(reduced_a, "reduced_a")
    zb = _matrix(reduced_b, "reduced_b")
    _same_dim(za, zb, "reduced_a", "reduced_b")
    union = np.concatenate([za, zb])
    centred = union - union.mean(axis=0)
    small = centred @ centred.T if len(union) <= union.shape[1] else centred.T @ centred
    top = float(np.linalg.eigvalsh(small)[-1])
    gap = za.mean(axis=0) - zb.mean(axis=0)
    between = len(za) * len(zb) / len(union) * float(gap @ gap)
    return min(between / top, 1.0) if top > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class CntSettings:
    """Cluster number tuning's settings. `rule="paper"`: merge below G_c `lower` (a), split
    above `upper` (b) (Alg. 3; Sec. 5.5: 0.2, 0.8). `rule="relative"` (ours, the default):
    merge a cluster into its nearest when their `separation` is below `merge_separation`,
    split one whose considered split has sides separated by more than `split_separation` and
    a `bimodality` above `unimodal_bimodality`. Both: K stays in [`min_clusters`,
    `max_clusters`]; a split leaving a side with fewer than `min_split_size` members is
    cancelled (the last three are ours)."""

    lower: float = GC_LOWER
    upper: float = GC_UPPER
    min_clusters: int = MIN_CLUSTERS
    max_clusters: int = MAX_CLUSTERS
    min_split_size: int = MIN_SPLIT_SIZE
    rule: str = "relative"
    merge_separation: float = MERGE_SEPARATION
    split_separation: float = SPLIT_SEPARATION
    unimodal_bimodality: float = UNIMODAL_BIMODALITY

    def __post_init__(self) -> None:
        if self.rule not in CNT_RULES:
            raise ValueError(f"the CNT rule must be one of {CNT_RULES}, got {self.rule!r}")
        if not 0 <= self.lower <= self.upper:
            raise ValueError(
                f"need 0 <= lower <= upper for the G_c bounds, got ({self.lower}, {self.upper})"
            )
        if not 0 <= self.merge_separation <= self.split_separation:
            raise ValueError(
                "need 0 <= merge_separation <= split_separation, got "
                f"({self.merge_separation}, {self.split_separation})"
            )
        if not 0 <= self.unimodal_bimodality <= 1:
            raise ValueError(
                f"the bimodality bound must be in [0, 1], got {self.unimodal_bimodality}"
            )
        if not 1 <= self.min_clusters <= self.max_clusters:
            raise ValueError(
                "need 1 <= min_clusters <= max_clusters, got "
                f"{self.min_clusters}, {self.max_clusters}"
            )
        if self.min_split_size < 1:
            raise ValueError(f"min_split_size must be at least 1, got {self.min_split_size}")


def _split_sides(reduced_members: np.ndarray, reduced_center: np.ndarray) -> np.ndarray:
    """Alg. 3's split of one cluster into 2 (seeding left open by the paper): seed1 = the
    member least LrCos-similar to the centre, seed2 = the member least similar to seed1, then
    one pass in which each member joins the seed of higher cosine (ties to seed1). Returns a
    boolean mask of the members that go to seed2."""
    to_center = lrcos(reduced_members, reduced_center[None, :])[:, 0]
    seed1 = int(np.argmin(to_center))
    seed2 = int(np.argmin(lrcos(reduced_members, reduced_members[seed1][None, :])[:, 0]))
    to_seeds = lrcos(reduced_members, reduced_members[[seed1, seed2]])
    return to_seeds[:, 1] > to_seeds[:, 0]


def _same_split(
    previous: np.ndarray, members: np.ndarray, second: np.ndarray, min_split_size: int
) -> bool:
    """Whether a previous call allowed the split of `members` into (~second, second) on the
    members it shares with it: one of its candidates holds at least `min_split_size` members
    of each side, all of one side on one of its sides and all of the other on the other."""
    marks = previous[members]
    for candidate in np.unique(marks[marks >= 0] // 2):
        inside = marks // 2 == candidate
        side_a, side_b = marks[inside & ~second], marks[inside & second]
        if min(len(side_a), len(side_b)) < min_split_size:
            continue
        if len(set(side_a)) == 1 and len(set(side_b)) == 1 and side_a[0] != side_b[0]:
            return True
    return False


def tune_cluster_number(
    models: np.ndarray,
    centers: np.ndarray,
    assign: np.ndarray,
    pca_map: PcaMap,
    reduced_models: Optional[np.ndarray] = None,
    settings: CntSettings = CntSettings(),
    weights: Optional[np.ndarray] = None,
    previous_splits: Optional[np.ndarray] = None,
) -> CntResult:
    """Cluster number tuning (Alg. 3): merge clusters into their closest cluster, split
    clusters into 2 (K grows by 1 per split), by `settings.rule`:

    * "paper" (Alg. 3 literal; (a, b) = (0.2, 0.8), Sec. 5.5): merge when G_c < a, split when
      G_c > b. G_c falls whenever members gather around their centres, for distinct groups as
      much as for fragments of one: under FedAC's mu pull well-separated groups merge.
    * "relative" (ours): merge a cluster into its nearest when their `separation` is below
      `merge_separation`, split a cluster when the sides of its considered split are
      separated by more than `split_separation` and their `bimodality` is above
      `unimodal_bimodality`. A common shrinkage of every cluster toward its centre can only
      stop merges, never cause them, and leaves a split's statistics unchanged. With
      `previous_splits` (the `split_candidates` of earlier calls, one row per call, or one
      1-D array), a split also needs every one of those calls to have allowed the same split
      of the members they share with this one (at least `min_split_size` on each side): in
      FedAC the clients that trained in a round have just moved together, away from the
      stale ones, so a pure cluster can look two-sided along that line until other members
      train (FedAC asks for the same split over a full pass over the clients).

    Deterministic. `reduced_models` are the projections of `models` with `pca_map` (computed
    when None); the reduced centres that seed splits are projected here. Choices (the paper
    leaves them open):
    * G_c is one snapshot per call (gc_ratios); K < 2 returns the input unchanged (G_c NaN);
    * paper: merges go smallest G_c first (snapshot), each into the live centre nearest in
      squared L2 (full dimension, ties to the lowest index), whose centre becomes the mean of
      its new member set; relative: each merge joins the live cluster least separated from
      its nearest live centre and that cluster (recomputed after every merge; ties to the
      lowest index), the smaller of the two moving into the larger (equal sizes: the higher
      index moves), until none is below `merge_separation`; both stop at K = min_clusters;
    * splits skip clusters removed or grown by a merge in this call, need 2 * min_split_size
      members, are seeded as in _split_sides and are cancelled when a side has fewer than
      min_split_size members; they go largest G_c (paper) or separation (relative) first and
      stop at K = max_clusters; the relative statistics of each candidate split (Q in the
      reduced space, where the seeding works) are computed whatever the rule, for the record;
    * new centres are member means (weighted by `weights` when given, as in m_step); the
      separations count members, unweighted, around those centres; two singletons are
      compared with the pooled spread of all clusters (of all models when every cluster is a
      singleton).
    Labels of the result: surviving input clusters in their order, then one new cluster per
    split."""
    lower, upper = settings.lower, settings.upper
    min_clusters, max_clusters = settings.min_clusters, settings.max_clusters
    min_split_size = settings.min_split_size
    paper = settings.rule == "paper"
    x = _matrix(models, "models")
    c = _matrix(centers, "centers").astype(np.float64)
    _same_dim(x, c, "models", "centers")
    num_clusters = len(c)
    labels = _labels(assign, len(x), num_clusters)
    w = _weights(weights, len(x))
    z = _reduced(reduced_models, x, pca_map)
    previous = np.zeros((0, len(x)), np.int32)
    if previous_splits is not None:
        previous = np.asarray(previous_splits)
        previous = previous[None, :] if previous.ndim == 1 else previous
        if previous.ndim != 2 or previous.shape[1] != len(x):
            raise ValueError(
                f"previous_splits must hold one integer per model ({len(x)}) per previous call, "
                f"got shape {np.shape(previous_splits)}; pass earlier calls' split_candidates"
            )
        if not np.issubdtype(previous.dtype, np.integer):
            raise ValueError(f"previous_splits must be integers, got {previous.dtype}")
    if num_clusters < 2:
        nan = np.full(num_clusters, np.nan)
        none = np.full(len(x), -1, np.int32)
        return CntResult(labels, c, project(pca_map, c), nan, (), (), nan, nan, nan, none)
    counts = _require_nonempty(labels, num_clusters).astype(np.int64)
    spread = np.bincount(labels, _member_distances(x, c, labels), num_clusters)
    gc = _gc_from(spread / counts, c)
    if len(x) > num_clusters:  # s^2 for two singletons: the pooled spread of every cluster
        fallback = float(spread.sum() / (len(x) - num_clusters))
    else:  # every cluster a singleton: the spread of all models
        fallback = float(_squared_distances_to(x, x.mean(axis=0, dtype=np.float64)).sum())
        fallback /= max(len(x) - 1, 1)
    labels, c = labels.copy(), c.copy()
    alive = np.ones(num_clusters, bool)
    touched = np.zeros(num_clusters, bool)

    def nearest_separations() -> tuple[np.ndarray, np.ndarray]:
        """Every live cluster's nearest live centre and their separation (NaN if removed)."""
        d2 = cdist(c, c, "sqeuclidean")
        d2[~alive, :] = np.inf
        d2[:, ~alive] = np.inf
        np.fill_diagonal(d2, np.inf)
        nearest = np.argmin(d2, axis=1)
        t = np.full(num_clusters, np.nan)
        for k in np.flatnonzero(alive):
            j = nearest[k]
            t[k] = separation(counts[k], counts[j], d2[k, j], spread[k], spread[j], fallback)
        return nearest, t

    merge_separations = nearest_separations()[1]
    count = num_clusters
    merges: list[tuple[int, int]] = []

    def merge(k: int, target: int) -> None:
        nonlocal count
        labels[labels == k] = target
        members = labels == target
        c[target] = _cluster_mean(x, members, w)
        spread[target] = _squared_distances_to(x[members], c[target]).sum()
        counts[target] += counts[k]
        alive[k], touched[target] = False, True
        merges.append((k, target))
        count -= 1

    if paper:
        for k in np.argsort(gc, kind="stable"):
            if gc[k] >= lower or count <= min_clusters:
                break
            if not alive[k]:
                continue
            distances = cdist(c[k][None, :], c, "sqeuclidean")[0]
            distances[~alive | (np.arange(num_clusters) == k)] = np.inf
            merge(int(k), int(np.argmin(distances)))
    else:
        while count > min_clusters:
            nearest, t = nearest_separations()
            k = int(np.nanargmin(t))
            if not t[k] < settings.merge_separation:
                break
            j = int(nearest[k])
            if (counts[j], -j) < (counts[k], -k):  # the smaller one joins the larger one
                k, j = j, k
            merge(k, j)
    reduced_centers = project(pca_map, c)
    split_separations = np.full(num_clusters, np.nan)
    split_bimodalities = np.full(num_clusters, np.nan)
    sides: dict[int, np.ndarray] = {}
    for k in np.flatnonzero(alive & ~touched):  # the split CNT would make of each cluster
        members = np.flatnonzero(labels == k)
        if len(members) < 2 * min_split_size:
            continue
        second = _split_sides(z[members], reduced_centers[k])
        if min(second.sum(), (~second).sum()) < min_split_size:
            continue
        side_a, side_b = members[~second], members[second]
        mean_a, mean_b = _cluster_mean(x, side_a, w), _cluster_mean(x, side_b, w)
        split_separations[k] = separation(
            len(side_a),
            len(side_b),
            float(np.sum((mean_a - mean_b) ** 2)),
            _squared_distances_to(x[side_a], mean_a).sum(),
            _squared_distances_to(x[side_b], mean_b).sum(),
        )
        split_bimodalities[k] = bimodality(z[side_a], z[side_b])
        sides[int(k)] = second
    new_centers: list[np.ndarray] = []
    splits: list[int] = []
    allowed = (split_separations > settings.split_separation) & (
        split_bimodalities > settings.unimodal_bimodality
    )  # clearly apart and two-sided
    candidates = np.full(len(x), -1, np.int32)
    for j, k in enumerate(np.flatnonzero(allowed)):
        members = np.flatnonzero(labels == k)
        candidates[members] = 2 * j + sides[int(k)]
    if paper:
        score, wanted = gc, gc > upper
    else:
        score, wanted = split_separations, allowed.copy()
        for k in np.flatnonzero(allowed):
            members = np.flatnonzero(labels == k)
            wanted[k] = all(
                _same_split(row, members, sides[int(k)], min_split_size) for row in previous
            )
    for k in np.argsort(-np.where(np.isnan(score), -np.inf, score), kind="stable"):
        if paper and not wanted[k] or count >= max_clusters:
            break
        if int(k) not in sides or not wanted[k]:
            continue
        members = np.flatnonzero(labels == k)
        new_label = num_clusters + len(new_centers)
        labels[members[sides[int(k)]]] = new_label
        c[k] = _cluster_mean(x, labels == k, w)
        new_centers.append(_cluster_mean(x, labels == new_label, w))
        splits.append(int(k))
        count += 1
    all_centers = np.concatenate([c, np.reshape(new_centers, (-1, c.shape[1]))])
    keep = np.concatenate([alive, np.ones(len(new_centers), bool)])
    labels, kept = drop_empty_clusters(labels, len(all_centers))
    if not np.array_equal(kept, np.flatnonzero(keep)):
        raise AssertionError("CNT bookkeeping: a live cluster lost all its members")
    final = all_centers[kept]
    return CntResult(
        labels,
        final,
        project(pca_map, final),
        gc,
        tuple(merges),
        tuple(splits),
        merge_separations,
        split_separations,
        split_bimodalities,
        candidates,
    )


SIMILARITIES = ("lrcos", "l2")


def clustering_step(
    models: np.ndarray,
    centers: np.ndarray,
    pca_map: PcaMap,
    reduced_models: Optional[np.ndarray] = None,
    settings: CntSettings = CntSettings(),
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
    x = _matrix(models, "models")
    c = _matrix(centers, "centers")
    _same_dim(x, c, "models", "centers")
    z = _reduced(reduced_models, x, pca_map)
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
    z = _matrix(reduced_models, "reduced_models").astype(np.float64)
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
    rng = _rng(seed)
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
    return _rng(seed).permutation(labels).astype(np.int32)
