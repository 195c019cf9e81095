"""The statistics FedAC's cluster number tuning decides on: G_c, separation, bimodality.

The statistics FedAC's cluster number tuning (CNT, Alg. 3 of Zhang et al., arXiv:2403.16460)
decides on, NumPy only: the paper's G_c = Dist_intra / Dist_inter, and our relative rule's
`separation` (two member sets' means against their pooled spread) and `bimodality` (how
two-sided they are along their union's main axis); the seeding of a split into two sides and
the test that earlier calls allowed the same split. Rows are flattened client models (or their
reduced vectors); no function mutates its inputs."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

from tff_clustered.clustering.common import (
    check_same_dim,
    checked_labels,
    checked_matrix,
    nonempty_cluster_sizes,
    squared_distances_to,
)
from tff_clustered.clustering.low_rank_cosine import lrcos


def member_distances(x: np.ndarray, c: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """||w_i - Omega_{label i}||^2 of every row, float64."""
    out = np.empty(len(x))
    for k in range(len(c)):
        members = np.flatnonzero(labels == k)
        if len(members):
            out[members] = squared_distances_to(x[members], c[k])
    return out


def gc_from_spread(intra: np.ndarray, c: np.ndarray) -> np.ndarray:
    """G_c of every cluster from its Dist_intra (`intra`) and the centres `c` (see gc_ratios)."""
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
    x = checked_matrix(models, "models")
    c = checked_matrix(centers, "centers").astype(np.float64)
    check_same_dim(x, c, "models", "centers")
    num_clusters = len(c)
    if num_clusters < 2:
        raise ValueError("G_c needs at least 2 clusters (Dist_inter is undefined for K = 1)")
    labels = checked_labels(assign, len(x), num_clusters)
    sizes = nonempty_cluster_sizes(labels, num_clusters)
    distances = member_distances(x, c, labels)
    return gc_from_spread(np.bincount(labels, distances, num_clusters) / sizes, c)


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
    za = checked_matrix(reduced_a, "reduced_a")
    zb = checked_matrix(reduced_b, "reduced_b")
    check_same_dim(za, zb, "reduced_a", "reduced_b")
    union = np.concatenate([za, zb])
    centred = union - union.mean(axis=0)
    small = centred @ centred.T if len(union) <= union.shape[1] else centred.T @ centred
    top = float(np.linalg.eigvalsh(small)[-1])
    gap = za.mean(axis=0) - zb.mean(axis=0)
    between = len(za) * len(zb) / len(union) * float(gap @ gap)
    return min(between / top, 1.0) if top > 0 else 0.0


def split_sides(reduced_members: np.ndarray, reduced_center: np.ndarray) -> np.ndarray:
    """Alg. 3's split of one cluster into 2 (seeding left open by the paper): seed1 = the
    member least LrCos-similar to the centre, seed2 = the member least similar to seed1, then
    one pass in which each member joins the seed of higher cosine (ties to seed1). Returns a
    boolean mask of the members that go to seed2."""
    to_center = lrcos(reduced_members, reduced_center[None, :])[:, 0]
    seed1 = int(np.argmin(to_center))
    seed2 = int(np.argmin(lrcos(reduced_members, reduced_members[seed1][None, :])[:, 0]))
    to_seeds = lrcos(reduced_members, reduced_members[[seed1, seed2]])
    return to_seeds[:, 1] > to_seeds[:, 0]


def same_split(
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
