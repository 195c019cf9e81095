"""CFL: a cluster split in two when its members' updates disagree (Sattler et al., TNNLS 2020).

CFL (Sattler et al., "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2020).

All clients start in one cluster trained by FedAvg. After each round, every cluster whose
members' updates have a small mean norm (near a stationary point of the joint objective,
||mean dW|| < eps1) but a large individual norm (some clients are far from theirs,
max ||dW_i|| > eps2) is split in two by the optimal bipartition of the cosine similarities of
its members' updates (Alg. 1; complete-linkage bipartition as in the reference code). Each
half starts from the cluster's model plus its own members' mean update. The cluster count
grows up to `cfl_max_clusters`; splits are allowed from round `cfl_warmup_rounds` on and only
for clusters of more than `cfl_min_size` sampled members.

eps1 and eps2 are absolute update norms (the reference code's 0.4 and 1.6 fit its models and
learning rates; on others every update norm can sit below eps2, and CFL never splits). By
default (`--cfl_criterion=relative`, ours) the criterion is scale-free and follows the run:
split when max_i ||dW_i|| > `cfl_norm_ratio` * ||mean dW|| (default 2, ours; the reference
code's eps2 / eps1 is 4: the clients' updates largely cancel while some stay large) and the
optimal bipartition separates nearest neighbours: every client has a member of its own part
whose update is closer (cosine) than any pair across the parts, by more than the spread (std)
of the cluster's cosines (`clustering.neighbour_separation_gap` > spread).
- Sattler et al.'s separation gap asks every within-part cosine to exceed every cross-part
  one: their condition for a correct split of two groups. With more groups a bipartition puts
  different groups on one side, that gap stays negative and CFL never splits (on 4 planted
  groups: -0.2 to -0.34 in every round).
- The margin is what keeps noise from splitting: on simulated updates that differ by noise
  alone, the nearest-neighbour gap is positive by chance in 2-16 % of clusters of 4-10
  clients, above the spread in under 0.3 % of those of 5 or more.
`--cfl_criterion=absolute` is the paper's eps1/eps2 test. The warm-up defaults to a fifth of
the run (the reference code's 20 rounds are its whole length in short runs;
`--cfl_warmup_rounds` >= 0 sets it).

Every round, for every cluster with sampled members (warm-up included, and whether or not the
tests call for a split), the metrics carry the split statistics, so a run shows how near a
split was: `cfl_mean_norm_{k}` (||mean dW||, unweighted as in the reference code),
`cfl_max_norm_{k}` (max ||dW_i||), `cfl_norm_ratio_{k}` (their ratio, the relative test's
statistic), `cfl_separation_gap_{k}` (the optimal bipartition's nearest-neighbour gap),
`cfl_cosine_spread_{k}` (the std of the cluster's off-diagonal update cosines), and
`cfl_decision_{k}`, a `SplitDecision` code for the test that decided.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
)
from tff_clustered.options import option


class SplitDecision(enum.IntEnum):
    """The `cfl_decision_{k}` metric: whether cluster k split this round and, if not, the first
    test in `CFL.after_round`'s order that held it back."""

    SPLIT = 0
    WARMUP = 1  # round < the warm-up
    MAX_CLUSTERS = 2  # already cfl_max_clusters clusters (counting this round's splits)
    TOO_FEW_MEMBERS = 3  # cfl_min_size sampled members or fewer
    NORMS = 4  # relative: max <= cfl_norm_ratio * mean; absolute: mean >= eps1 or max <= eps2
    GAP = 5  # relative only: nearest-neighbour gap <= cosine spread


@dataclasses.dataclass(frozen=True)
class SplitStatistics:
    """One cluster's split statistics from its sampled members' updates (Alg. 1's
    ||mean dW|| and max ||dW_i||, the optimal bipartition of the update cosines), computed
    whether or not they lead to a split. With one member there is no pair: gap and spread are
    NaN and there is no bipartition."""

    mean_norm: float
    max_norm: float
    cosines: np.ndarray  # (members, members) update cosines
    parts: Optional[tuple[np.ndarray, np.ndarray]]  # the optimal bipartition, indices
    gap: float  # clustering.neighbour_separation_gap of the bipartition
    spread: float  # std of the off-diagonal cosines

    @property
    def norm_ratio(self) -> float:
        """max ||dW_i|| / ||mean dW||: inf when the mean update is zero, NaN when all are."""
        if self.mean_norm > 0:
            return self.max_norm / self.mean_norm
        return math.inf if self.max_norm > 0 else math.nan

    def metrics(self, cluster: int, decision: SplitDecision) -> dict[str, float]:
        """The cluster's columns of metrics.csv."""
        return {
            f"cfl_mean_norm_{cluster}": self.mean_norm,
            f"cfl_max_norm_{cluster}": self.max_norm,
            f"cfl_norm_ratio_{cluster}": self.norm_ratio,
            f"cfl_separation_gap_{cluster}": self.gap,
            f"cfl_cosine_spread_{cluster}": self.spread,
            f"cfl_decision_{cluster}": float(decision),
        }


def split_statistics(updates: np.ndarray) -> SplitStatistics:
    """The split statistics of a cluster whose sampled members sent `updates` (members, d)."""
    mean_norm, max_norm = clustering.update_norms(updates)
    cosines = clustering.pairwise_cosine(updates)
    if len(updates) < 2:
        return SplitStatistics(mean_norm, max_norm, cosines, None, math.nan, math.nan)
    first, second = clustering.optimal_bipartition(cosines)
    gap = clustering.neighbour_separation_gap(cosines, first, second)
    spread = float(np.std(cosines[~np.eye(len(updates), dtype=bool)]))
    return SplitStatistics(mean_norm, max_norm, cosines, (first, second), gap, spread)


class CFL(Algorithm):
    """One cluster, split recursively by the optimal bipartition of update cosines."""

    name = "cfl"
    models_from_aggregate = False  # it splits a cluster by its clients' individual updates
    model_kinds = ("cluster", "global")
    paper = (
        "Sattler et al., Clustered Federated Learning: Model-Agnostic Distributed Multitask "
        "Optimization Under Privacy Constraints, IEEE TNNLS 2020"
    )
    needs_model_deltas = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        cfl_eps1: float = option(0.4, "CFL absolute test: split only if ||mean update|| < eps1.")
        cfl_eps2: float = option(1.6, "CFL absolute test: split only if max ||update_i|| > eps2.")
        cfl_min_size: int = option(2, "CFL: split only clusters of more sampled clients.")
        cfl_warmup_rounds: int = option(
            -1, "CFL: no split before this round (-1: a fifth of the run, rounded up)."
        )
        cfl_criterion: str = option(
            "relative",
            "CFL split test: relative (ours: update-norm ratio and a positive nearest-neighbour "
            "gap) or absolute (the paper's eps1/eps2).",
            ("relative", "absolute"),
        )
        cfl_norm_ratio: float = option(
            2.0, "CFL relative test: split if max ||dW_i|| > this * ||mean dW||."
        )
        cfl_max_clusters: int = option(8, "CFL: the most clusters splitting may make.")

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        o = self.options
        check(
            [
                (o.cfl_eps1 > 0 and o.cfl_eps2 > 0, "cfl_eps1 and cfl_eps2 must be > 0"),
                (o.cfl_min_size >= 2, "cfl_min_size must be >= 2"),
                (o.cfl_warmup_rounds >= -1, "cfl_warmup_rounds must be >= 0 (-1: a fifth)"),
                (o.cfl_norm_ratio > 1, "cfl_norm_ratio must be > 1"),
                (o.cfl_max_clusters >= 1, "cfl_max_clusters must be >= 1"),
            ]
        )

    def warmup_rounds(self, run: RunInfo) -> int:
        rounds = self.options.cfl_warmup_rounds
        return rounds if rounds >= 0 else math.ceil(run.total_rounds / 5)

    def norms_call_for_split(self, mean_norm: float, max_norm: float, size: int) -> bool:
        o = self.options
        if o.cfl_criterion == "absolute":
            return clustering.should_split(
                mean_norm, max_norm, size, o.cfl_eps1, o.cfl_eps2, o.cfl_min_size
            )
        return size > o.cfl_min_size and max_norm > o.cfl_norm_ratio * mean_norm

    def split_decision(
        self, run: RunInfo, round_num: int, num_clusters: int, stats: SplitStatistics, size: int
    ) -> SplitDecision:
        """Which of CFL's tests holds a cluster of `size` sampled members back, in order, or
        SPLIT; `num_clusters` counts the clusters after this round's earlier splits."""
        o = self.options
        if round_num < self.warmup_rounds(run):
            return SplitDecision.WARMUP
        if num_clusters >= o.cfl_max_clusters:
            return SplitDecision.MAX_CLUSTERS
        if size <= o.cfl_min_size:
            return SplitDecision.TOO_FEW_MEMBERS
        if not self.norms_call_for_split(stats.mean_norm, stats.max_norm, size):
            return SplitDecision.NORMS
        if o.cfl_criterion == "relative" and not stats.gap > stats.spread:
            return SplitDecision.GAP
        return SplitDecision.SPLIT

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        models = view.cluster_models
        assignment: dict[str, int] = {}
        statistics: dict[str, float] = {}
        similarity = None
        for k in range(view.num_clusters):
            members = np.flatnonzero(result.clusters == k)
            if not len(members):
                continue
            updates = result.model_deltas[members]
            stats = split_statistics(updates)
            decision = self.split_decision(run, result.round_num, len(models), stats, len(members))
            statistics.update(stats.metrics(k, decision))
            if decision != SplitDecision.SPLIT or stats.parts is None:
                continue
            first, second = stats.parts
            split_labels = np.zeros(len(members), np.int32)
            split_labels[second] = 1
            similarity = Similarity(
                f"cosine of updates (cluster {k} split)",
                tuple(result.client_ids[i] for i in members),
                stats.cosines,
                tuple(int(v) for v in split_labels),
                result.round_num,
            )
            before = result.cluster_models_before[k]
            halves = []
            for half in (first, second):
                weights = result.num_examples[members[half]]
                halves.append(before + np.average(updates[half], axis=0, weights=weights))
            models = np.concatenate([models[:k], halves[0][None], models[k + 1 :], halves[1][None]])
            new_index = len(models) - 1
            assignment.update({result.client_ids[members[i]]: new_index for i in second})
        metrics = {**statistics, "num_clusters": float(len(models))}
        if not assignment:
            return Decision(metrics=metrics)
        return Decision(
            assignment=assignment, cluster_models=models, metrics=metrics, similarity=similarity
        )
