"""The settings of FedAC's cluster number tuning: the rule, its bounds and the limits on K.

The settings of FedAC's cluster number tuning (CNT, Alg. 3 of Zhang et al., "FedAC: A
Adaptive Clustered Federated Learning Framework for Heterogeneous Data", arXiv:2403.16460): the
rule, its bounds and the limits on K, with our defaults and the paper's (a, b), each checked
once, here."""

from __future__ import annotations

import dataclasses

# G_c bounds (a, b) (Sec. 5.5); K_min, K_max, s_min are not in the paper (our defaults).
GC_LOWER = 0.2
GC_UPPER = 0.8
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
# CNT's decision rules: "relative" (ours, the default) bounds the separation of two member sets
# (see `separation`), "paper" is Alg. 3's G_c < a / G_c > b.
CNT_RULES = ("relative", "paper")


@dataclasses.dataclass(frozen=True)
class CntSettings:
    """Cluster number tuning's settings. `rule="paper"`: merge below G_c `lower` (a), split
    above `upper` (b) (Alg. 3; Sec. 5.5: 0.2, 0.8). `rule="relative"` (ours, the default):
    merge a cluster into its nearest when their `separation` is below `merge_separation`,
    split one whose considered split has sides separated by more than `split_separation` and
    a `bimodality` above `unimodal_bimodality`. Both: K stays in [`min_clusters`,
    `max_clusters`]; a split leaving a side with fewer than `min_split_size` members is
    cancelled (the last three are ours).

    Equal bounds are allowed: lower = upper (or merge_separation = split_separation) leaves
    no band in which a cluster is kept as it is, and lower = upper = 0 only splits; a fixed
    number of clusters is min_clusters = max_clusters. Every bound is checked here, once; the
    messages name FedAC's flags for each field."""

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
            raise ValueError(
                f"the CNT rule must be one of {CNT_RULES}, got {self.rule!r} (--fedac_cnt)"
            )
        if not 0 <= self.lower <= self.upper:
            raise ValueError(
                f"need 0 <= lower <= upper for the G_c bounds (a, b), got ({self.lower}, "
                f"{self.upper}): set --gc_lower at most --gc_upper, both non-negative"
            )
        if not 0 <= self.merge_separation <= self.split_separation:
            raise ValueError(
                "need 0 <= merge_separation <= split_separation, got "
                f"({self.merge_separation}, {self.split_separation}): set "
                "--fedac_merge_separation at most --fedac_split_separation, both non-negative"
            )
        if not 0 <= self.unimodal_bimodality <= 1:
            raise ValueError(
                f"the bimodality bound must be in [0, 1], got {self.unimodal_bimodality}: set "
                "--fedac_bimodality in [0, 1]"
            )
        if not 1 <= self.min_clusters <= self.max_clusters:
            raise ValueError(
                f"need 1 <= min_clusters <= max_clusters, got {self.min_clusters}, "
                f"{self.max_clusters}: set --fedac_min_clusters at least 1 and at most "
                "--fedac_max_clusters"
            )
        if self.min_split_size < 1:
            raise ValueError(
                f"min_split_size must be at least 1, got {self.min_split_size}: set "
                "--fedac_min_split_size at least 1"
            )


# The default settings (the relative rule with our bounds).
DEFAULT_CNT_SETTINGS = CntSettings()
