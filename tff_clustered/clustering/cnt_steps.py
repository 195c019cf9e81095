"""The steps of FedAC's cluster number tuning and its two decision rules.

The steps of FedAC's cluster number tuning (CNT, Alg. 3 of Zhang et al., arXiv:2403.16460)
and its two decision rules, NumPy only. tune_cluster_number (cluster_number) runs them over a
working set of clusters: start, merge (the rule's next_merge until it has none), consider a
split of every cluster untouched by a merge, split those the rule wants, in its order."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Protocol

import numpy as np
from scipy.spatial.distance import cdist

from tff_clustered.clustering.cnt_settings import CntSettings
from tff_clustered.clustering.cnt_statistics import (
    bimodality,
    member_distances,
    same_split,
    separation,
    split_sides,
)
from tff_clustered.clustering.common import (
    member_mean,
    nonempty_cluster_sizes,
    squared_distances_to,
)
from tff_clustered.clustering.low_rank_cosine import PcaMap, project


class CntInput(NamedTuple):
    """One call's checked inputs: models x (n, d), reduced models z (n, D'), weights (or
    None), the earlier calls' split candidates (one row per call, possibly none), and the
    pooled variance that stands in for two singletons' (see `separation`)."""

    models: np.ndarray
    reduced: np.ndarray
    weights: Optional[np.ndarray]
    previous_splits: np.ndarray
    fallback_variance: float


@dataclasses.dataclass
class WorkingClusters:
    """CNT's working clusters within one call, indexed by input cluster (splits add labels K,
    K + 1, ...): labels (n,), centres (K, d) float64, member counts, summed squared member
    distances to the centre (`spread`), which clusters are still alive (not merged away) and
    which grew by a merge, the merges made, and the splits made with their new centres."""

    labels: np.ndarray
    centers: np.ndarray
    counts: np.ndarray
    spread: np.ndarray
    alive: np.ndarray
    touched: np.ndarray
    merges: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    splits: list[int] = dataclasses.field(default_factory=list)
    new_centers: list[np.ndarray] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """The current number of clusters."""
        return int(self.alive.sum()) + len(self.new_centers)


class SplitCandidates(NamedTuple):
    """The split CNT considers for each untouched cluster k (both rules): its members, the
    mask of those that go to the second side, and the sides' separation and bimodality
    (NaN for clusters without a considered split)."""

    members: dict[int, np.ndarray]
    sides: dict[int, np.ndarray]
    separations: np.ndarray
    bimodalities: np.ndarray


def checked_previous(previous_splits: Optional[np.ndarray], num_rows: int) -> np.ndarray:
    """Earlier calls' split candidates as a (calls, num_rows) integer array (none: 0 rows)."""
    if previous_splits is None:
        return np.zeros((0, num_rows), np.int32)
    previous = np.asarray(previous_splits)
    previous = previous[None, :] if previous.ndim == 1 else previous
    if previous.ndim != 2 or previous.shape[1] != num_rows:
        raise ValueError(
            f"previous_splits must hold one integer per model ({num_rows}) per previous call, "
            f"got shape {np.shape(previous_splits)}; pass earlier calls' split_candidates"
        )
    if not np.issubdtype(previous.dtype, np.integer):
        raise ValueError(f"previous_splits must be integers, got {previous.dtype}")
    return previous


def pooled_fallback_variance(x: np.ndarray, spread: np.ndarray) -> float:
    """s^2 for two singletons: the pooled spread of every cluster, or the spread of all models
    when every cluster is a singleton."""
    if len(x) > len(spread):
        return float(spread.sum() / (len(x) - len(spread)))
    variance = float(squared_distances_to(x, x.mean(axis=0, dtype=np.float64)).sum())
    return variance / max(len(x) - 1, 1)


def start_clusters(x: np.ndarray, centers: np.ndarray, labels: np.ndarray) -> WorkingClusters:
    """The input clusters as working clusters (copies: the inputs are not changed)."""
    num_clusters = len(centers)
    counts = nonempty_cluster_sizes(labels, num_clusters).astype(np.int64)
    spread = np.bincount(labels, member_distances(x, centers, labels), num_clusters)
    alive = np.ones(num_clusters, bool)
    return WorkingClusters(labels.copy(), centers.copy(), counts, spread, alive, ~alive)


def nearest_separations(
    clusters: WorkingClusters, fallback_variance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every live cluster's nearest live centre (squared L2, ties to the lowest index) and
    their `separation` (NaN for clusters merged away)."""
    c, alive, counts, spread = clusters.centers, clusters.alive, clusters.counts, clusters.spread
    d2 = cdist(c, c, "sqeuclidean")
    d2[~alive, :] = np.inf
    d2[:, ~alive] = np.inf
    np.fill_diagonal(d2, np.inf)
    nearest = np.argmin(d2, axis=1)
    t = np.full(len(c), np.nan)
    for k in np.flatnonzero(alive):
        j = nearest[k]
        t[k] = separation(counts[k], counts[j], d2[k, j], spread[k], spread[j], fallback_variance)
    return nearest, t


def merge_clusters(clusters: WorkingClusters, data: CntInput, k: int, target: int) -> None:
    """Cluster k joins `target`, whose centre becomes the mean of its new member set."""
    clusters.labels[clusters.labels == k] = target
    members = clusters.labels == target
    clusters.centers[target] = member_mean(data.models, members, data.weights)
    center = clusters.centers[target]
    clusters.spread[target] = squared_distances_to(data.models[members], center).sum()
    clusters.counts[target] += clusters.counts[k]
    clusters.alive[k], clusters.touched[target] = False, True
    clusters.merges.append((k, target))


def consider_splits(
    clusters: WorkingClusters, data: CntInput, pca_map: PcaMap, min_split_size: int
) -> SplitCandidates:
    """The split of each live cluster untouched by a merge that leaves at least
    `min_split_size` members on both sides (seeded in the reduced space, split_sides), with
    its sides' separation (full dimension, unweighted spreads around weighted means) and
    bimodality (reduced space)."""
    x, z, w = data.models, data.reduced, data.weights
    reduced_centers = project(pca_map, clusters.centers)
    separations = np.full(len(clusters.centers), np.nan)
    bimodalities = np.full(len(clusters.centers), np.nan)
    members_of: dict[int, np.ndarray] = {}
    sides: dict[int, np.ndarray] = {}
    for k in np.flatnonzero(clusters.alive & ~clusters.touched):
        members = np.flatnonzero(clusters.labels == k)
        if len(members) < 2 * min_split_size:
            continue
        second = split_sides(z[members], reduced_centers[k])
        if min(second.sum(), (~second).sum()) < min_split_size:
            continue
        side_a, side_b = members[~second], members[second]
        mean_a, mean_b = member_mean(x, side_a, w), member_mean(x, side_b, w)
        separations[k] = separation(
            len(side_a),
            len(side_b),
            float(np.sum((mean_a - mean_b) ** 2)),
            squared_distances_to(x[side_a], mean_a).sum(),
            squared_distances_to(x[side_b], mean_b).sum(),
        )
        bimodalities[k] = bimodality(z[side_a], z[side_b])
        members_of[int(k)], sides[int(k)] = members, second
    return SplitCandidates(members_of, sides, separations, bimodalities)


def relative_allowed(candidates: SplitCandidates, settings: CntSettings) -> np.ndarray:
    """The considered splits whose sides are clearly apart and two-sided (relative bounds)."""
    return (candidates.separations > settings.split_separation) & (
        candidates.bimodalities > settings.unimodal_bimodality
    )


def candidate_marks(num_rows: int, candidates: SplitCandidates, allowed: np.ndarray) -> np.ndarray:
    """Per model: 2 j or 2 j + 1 for the sides of the j-th allowed split, -1 elsewhere."""
    marks = np.full(num_rows, -1, np.int32)
    for j, k in enumerate(np.flatnonzero(allowed)):
        marks[candidates.members[int(k)]] = 2 * j + candidates.sides[int(k)]
    return marks


def split_cluster(clusters: WorkingClusters, data: CntInput, k: int, second: np.ndarray) -> None:
    """The members of cluster k on its second side form a new cluster; both get new centres."""
    members = np.flatnonzero(clusters.labels == k)
    new_label = len(clusters.centers) + len(clusters.new_centers)
    clusters.labels[members[second]] = new_label
    clusters.centers[k] = member_mean(data.models, clusters.labels == k, data.weights)
    clusters.new_centers.append(
        member_mean(data.models, clusters.labels == new_label, data.weights)
    )
    clusters.splits.append(k)


class CntRule(Protocol):
    """One CNT decision rule: which merge comes next, and which considered splits it wants
    in which order."""

    def next_merge(
        self, clusters: WorkingClusters, data: CntInput, gc: np.ndarray, settings: CntSettings
    ) -> Optional[tuple[int, int]]:
        """The next (merged cluster, receiving cluster) pair, or None to stop merging."""
        ...

    def split_wishes(
        self,
        candidates: SplitCandidates,
        allowed: np.ndarray,
        data: CntInput,
        gc: np.ndarray,
        settings: CntSettings,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per input cluster: (score, larger first; which clusters the rule wants split)."""
        ...


class PaperRule:
    """Alg. 3 literal: merge below G_c = a, smallest G_c first (snapshot), each into the live
    centre nearest in squared L2 (full dimension, ties to the lowest index); split above
    G_c = b, largest G_c first."""

    def next_merge(
        self, clusters: WorkingClusters, data: CntInput, gc: np.ndarray, settings: CntSettings
    ) -> Optional[tuple[int, int]]:
        order = np.argsort(gc, kind="stable")
        k = int(order[clusters.alive[order]][0])  # the merged ones are a prefix of the order
        if gc[k] >= settings.lower:
            return None
        c = clusters.centers
        distances = cdist(c[k][None, :], c, "sqeuclidean")[0]
        distances[~clusters.alive | (np.arange(len(c)) == k)] = np.inf
        return k, int(np.argmin(distances))

    def split_wishes(
        self,
        candidates: SplitCandidates,
        allowed: np.ndarray,
        data: CntInput,
        gc: np.ndarray,
        settings: CntSettings,
    ) -> tuple[np.ndarray, np.ndarray]:
        return gc, gc > settings.upper


class RelativeRule:
    """Ours: merge the live cluster least separated from its nearest live centre into it (the
    smaller of the two joins the larger; equal sizes: the higher index moves), recomputed
    after every merge, while that separation is below `merge_separation`; split the clusters
    whose considered split the relative bounds allow, in this call and in every earlier call
    given (same_split), largest separation first."""

    def next_merge(
        self, clusters: WorkingClusters, data: CntInput, gc: np.ndarray, settings: CntSettings
    ) -> Optional[tuple[int, int]]:
        nearest, t = nearest_separations(clusters, data.fallback_variance)
        k = int(np.nanargmin(t))
        if not t[k] < settings.merge_separation:
            return None
        j = int(nearest[k])
        counts = clusters.counts
        return (j, k) if (counts[j], -j) < (counts[k], -k) else (k, j)

    def split_wishes(
        self,
        candidates: SplitCandidates,
        allowed: np.ndarray,
        data: CntInput,
        gc: np.ndarray,
        settings: CntSettings,
    ) -> tuple[np.ndarray, np.ndarray]:
        wanted = allowed.copy()
        for k in np.flatnonzero(allowed):
            members, second = candidates.members[int(k)], candidates.sides[int(k)]
            wanted[k] = all(
                same_split(row, members, second, settings.min_split_size)
                for row in data.previous_splits
            )
        return candidates.separations, wanted


RULES: dict[str, CntRule] = {"relative": RelativeRule(), "paper": PaperRule()}
