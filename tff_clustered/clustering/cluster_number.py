"""FedAC's cluster number tuning (CNT, Alg. 3): clusters merged into the nearest, or split.

FedAC's cluster number tuning (CNT, Alg. 3 of Zhang et al., "FedAC: A Adaptive Clustered
Federated Learning Framework for Heterogeneous Data", arXiv:2403.16460), NumPy only: merge
clusters into their nearest, split clusters in two, by one of two rules (a cnt_steps.CntRule):

* the paper's (`rule="paper"`, PaperRule): merge when G_c < a, split when G_c > b, with
  (a, b) = (0.2, 0.8) from Sec. 5.5. G_c is computed once per call (a snapshot); merges
  (smallest G_c first) go to the centre nearest in squared L2 in full dimension; splits go
  largest G_c first.
* ours, the default (`rule="relative"`, RelativeRule): the decisions compare clusters with
  their own members' spread instead of G_c = Dist_intra / Dist_inter. G_c < a also holds for
  distinct, well-separated groups as soon as members gather around their centres, which
  FedAC's mu pull makes them do. A cluster merges into its nearest when the two are not
  clearly apart (`separation` < 2: a test of their means against the members' pooled
  spread, ~1 for two halves of one group); a cluster splits when its two sides are clearly
  apart (separation > 4) and two-sided along their main axis (`bimodality` > 3/4, more than
  a cut of any symmetric unimodal group). Pulling members toward their centres can only
  raise a pair's separation (no merge of groups it did not already allow) and leaves a
  split's statistics unchanged.

Both rules share the rest (choices the paper leaves open): splits are seeded by the member
least LrCos-similar to its centre and the member least similar to that one, followed by one
reassignment pass (cnt_statistics.split_sides); K stays within [K_min, K_max]; a split that
leaves a side with fewer than s_min members is cancelled, and a cluster touched by a merge in
the same call is not split.

tune_cluster_number runs as named steps (cnt_steps) over a working set of clusters: start,
merge (the rule's next_merge until it has none), consider a split of every untouched cluster,
split those the rule wants, and collect the result."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from tff_clustered.clustering.cnt_settings import DEFAULT_CNT_SETTINGS, CntSettings
from tff_clustered.clustering.cnt_statistics import gc_from_spread
from tff_clustered.clustering.cnt_steps import (
    RULES,
    CntInput,
    SplitCandidates,
    WorkingClusters,
    candidate_marks,
    checked_previous,
    consider_splits,
    merge_clusters,
    nearest_separations,
    pooled_fallback_variance,
    relative_allowed,
    split_cluster,
    start_clusters,
)
from tff_clustered.clustering.common import (
    check_same_dim,
    checked_labels,
    checked_matrix,
    checked_weights,
    drop_empty_clusters,
)
from tff_clustered.clustering.low_rank_cosine import PcaMap, checked_reduced, project


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

    def metrics(self) -> dict[str, float]:
        """The call's summary for a round's metrics: merges and splits made, the mean G_c, the
        smallest merge separation, the largest split separation and bimodality (each over its
        finite values, NaN when there are none), and the number of allowed splits."""
        marks = self.split_candidates
        return {
            "merges": float(len(self.merges)),
            "splits": float(len(self.splits)),
            "gc_mean": _finite_statistic(np.mean, self.gc),
            "merge_separation_min": _finite_statistic(np.min, self.merge_separations),
            "split_separation_max": _finite_statistic(np.max, self.split_separations),
            "split_bimodality_max": _finite_statistic(np.max, self.split_bimodalities),
            "split_candidates": float(len(np.unique(marks[marks >= 0] // 2))),
        }


def _finite_statistic(reduce: Callable[[np.ndarray], Any], values: np.ndarray) -> float:
    """`reduce` over the finite values, NaN when there are none."""
    finite = values[np.isfinite(values)]
    return float(reduce(finite)) if len(finite) else float("nan")


def _result(
    clusters: WorkingClusters,
    pca_map: PcaMap,
    gc: np.ndarray,
    merge_separations: np.ndarray,
    candidates: SplitCandidates,
    marks: np.ndarray,
) -> CntResult:
    """The final clusters, renumbered: surviving input clusters in their order, then one new
    cluster per split."""
    c = clusters.centers
    all_centers = np.concatenate([c, np.reshape(clusters.new_centers, (-1, c.shape[1]))])
    keep = np.concatenate([clusters.alive, np.ones(len(clusters.new_centers), bool)])
    labels, kept = drop_empty_clusters(clusters.labels, len(all_centers))
    if not np.array_equal(kept, np.flatnonzero(keep)):
        raise AssertionError("CNT bookkeeping: a live cluster lost all its members")
    final = all_centers[kept]
    return CntResult(
        labels,
        final,
        project(pca_map, final),
        gc,
        tuple(clusters.merges),
        tuple(clusters.splits),
        merge_separations,
        candidates.separations,
        candidates.bimodalities,
        marks,
    )


# Long: Alg. 3 in its order (checks, merges, splits, the record), and a docstring that states
# each choice the paper leaves open; the steps themselves are the functions it calls.
def tune_cluster_number(
    models: np.ndarray,
    centers: np.ndarray,
    assign: np.ndarray,
    pca_map: PcaMap,
    reduced_models: Optional[np.ndarray] = None,
    settings: CntSettings = DEFAULT_CNT_SETTINGS,
    weights: Optional[np.ndarray] = None,
    previous_splits: Optional[np.ndarray] = None,
) -> CntResult:
    """Cluster number tuning (Alg. 3): merge clusters into their closest cluster, split
    clusters into 2 (K grows by 1 per split), by `settings.rule` (PaperRule, RelativeRule).

    With `previous_splits` (the `split_candidates` of earlier calls, one row per call, or one
    1-D array), a relative split also needs every one of those calls to have allowed the same
    split of the members they share with this one (at least `min_split_size` on each side):
    in FedAC the clients that trained in a round have just moved together, away from the
    stale ones, so a pure cluster can look two-sided along that line until other members
    train (FedAC asks for the same split over a full pass over the clients).

    Deterministic. `reduced_models` are the projections of `models` with `pca_map` (computed
    when None); the reduced centres that seed splits are projected here. Choices (the paper
    leaves them open):
    * G_c is one snapshot per call (gc_ratios); K < 2 returns the input unchanged (G_c NaN);
    * merges stop at K = min_clusters; splits skip clusters removed or grown by a merge in this
      call, need 2 * min_split_size members, are seeded as in split_sides, are cancelled when a
      side has fewer than min_split_size members and stop at K = max_clusters; the relative
      statistics of each candidate split (Q in the reduced space, where the seeding works) are
      computed whatever the rule, for the record;
    * new centres are member means (weighted by `weights` when given, as in m_step); the
      separations count members, unweighted, around those centres; two singletons are
      compared with the pooled spread of all clusters (of all models when every cluster is a
      singleton).
    Labels of the result: surviving input clusters in their order, then one new cluster per
    split."""
    x = checked_matrix(models, "models")
    c = checked_matrix(centers, "centers").astype(np.float64)
    check_same_dim(x, c, "models", "centers")
    labels = checked_labels(assign, len(x), len(c))
    w = checked_weights(weights, len(x))
    z = checked_reduced(reduced_models, x, pca_map)
    previous = checked_previous(previous_splits, len(x))
    if len(c) < 2:
        nan = np.full(len(c), np.nan)
        none = np.full(len(x), -1, np.int32)
        return CntResult(labels, c, project(pca_map, c), nan, (), (), nan, nan, nan, none)
    rule = RULES[settings.rule]
    clusters = start_clusters(x, c, labels)
    gc = gc_from_spread(clusters.spread / clusters.counts, c)
    data = CntInput(x, z, w, previous, pooled_fallback_variance(x, clusters.spread))
    merge_separations = nearest_separations(clusters, data.fallback_variance)[1]
    while clusters.count > settings.min_clusters:
        pair = rule.next_merge(clusters, data, gc, settings)
        if pair is None:
            break
        merge_clusters(clusters, data, *pair)
    candidates = consider_splits(clusters, data, pca_map, settings.min_split_size)
    allowed = relative_allowed(candidates, settings)
    score, wanted = rule.split_wishes(candidates, allowed, data, gc, settings)
    for k in np.argsort(-np.where(np.isnan(score), -np.inf, score), kind="stable"):
        if clusters.count >= settings.max_clusters:
            break
        if int(k) in candidates.sides and wanted[k]:
            split_cluster(clusters, data, int(k), candidates.sides[int(k)])
    marks = candidate_marks(len(x), candidates, allowed)
    return _result(clusters, pca_map, gc, merge_separations, candidates, marks)
