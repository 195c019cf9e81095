"""IFCA: each client joins the cluster model of lowest loss on its data (NeurIPS 2020).

IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020),
as run in FedGroup's comparison: m independently initialised cluster models; every round each
sampled client receives all m, joins the one with the lowest loss on its training data (Alg. 2,
Eq. 2 of FedTSDP's related work), and each cluster averages its members (example-weighted)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    Queries,
    Releases,
    RoundResult,
    RunInfo,
    ServerView,
    check,
)
from tff_clustered.algorithms.cold_starts import independent_clusters
from tff_clustered.federated.distributions import LowestLossCluster
from tff_clustered.options import option

DEFAULT_CLUSTERS = 3
NUM_CLUSTERS_HELP = "Clusters K: cluster models trained side by side."


class IFCA(Algorithm):
    """m cluster models sent to each client, which trains the one of lowest loss on its data."""

    name = "ifca"
    model_kinds = ("cluster",)  # independently initialised: their mean means nothing
    paper = "Ghosh et al., An Efficient Framework for Clustered Federated Learning, NeurIPS 2020"
    distribution = LowestLossCluster()  # the round's clients pick (federated/distributions.py)
    releases = Releases(
        outside=(
            "IFCA's cluster picks: each sampled client's lowest-loss cluster, sent to the server",
        )
    )

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: int = option(DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP)

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check([(self.num_clusters >= 1, f"{self.name}: num_clusters must be >= 1")])

    @property
    def num_clusters(self) -> int:
        return int(self.options.num_clusters)

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        return independent_clusters(self.name, run, queries, self.num_clusters)

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        """Every sampled client receives all cluster models and trains the one of lowest loss
        on its training data (ties: lowest index); the round itself makes the pick."""
        return Plan(clusters=None)

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """A client stays in the cluster it picked until it is sampled again."""
        return Decision(assignment=dict(zip(result.client_ids, result.clusters.tolist())))
