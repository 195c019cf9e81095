"""FL+HC: FedAvg, one hierarchical clustering of the local updates, then FedAvg per cluster.

FL+HC (Briggs, Fan, Andras, "Federated learning with hierarchical clustering of local updates
to improve training on non-IID data", IJCNN 2020): FedAvg, then one hierarchical clustering of
the clients' local updates, then independent FedAvg within each cluster.

The paper's procedure:

1. federated learning (FedAvg on a random subset of clients each round) of one global model
   for n rounds (`--flhc_cluster_round`);
2. after round n, every client (all of them, not a sample) trains the global model locally
   (`--flhc_local_epochs` epochs of plain SGD) and sends its update dW_i;
3. the server clusters the updates by agglomerative hierarchical clustering: Euclidean
   distance, `--flhc_linkage` (ward by default; average, complete, single), the dendrogram cut
   at a distance threshold (`--flhc_distance_threshold`) or, our addition for comparisons
   with the other clustered methods, into `--num_clusters` clusters (one of the two; neither:
   3 clusters);
4. each cluster then trains its own model by FedAvg, independently of the others, for the
   remaining rounds; every cluster model starts as the global model of round n.

The clustering is on the trainable part of the flat updates (model state, e.g. BatchNorm
statistics, is left out). With `--flhc_cluster_round=0` the clustering happens before round 1,
on updates from the initial model. Clients are scored with their cluster's model (the
paper's figure) and with the global kind (the mean of the cluster models).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
    check_cluster_count,
)
from tff_clustered.algorithms.ifca import DEFAULT_CLUSTERS
from tff_clustered.clustering import hierarchical
from tff_clustered.options import option


class FLHC(Algorithm):
    """FedAvg, one hierarchical clustering of local updates, then FedAvg per cluster."""

    name = "flhc"
    models_from_aggregate = False  # it clusters every client's individual local update
    model_kinds = ("cluster", "global")
    paper = (
        "Briggs, Fan, Andras, Federated learning with hierarchical clustering of local updates "
        "to improve training on non-IID data, IJCNN 2020"
    )

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: Optional[int] = option(
            None,
            f"FL+HC: clusters to cut the dendrogram into (unset: {DEFAULT_CLUSTERS}, unless "
            "--flhc_distance_threshold cuts it).",
        )
        flhc_distance_threshold: Optional[float] = option(
            None,
            "FL+HC: cut the dendrogram at this merge height (instead of --num_clusters).",
        )
        flhc_linkage: str = option(
            "ward", "FL+HC linkage of the hierarchical clustering.", hierarchical.LINKAGES
        )
        flhc_cluster_round: int = option(
            10, "FL+HC: FedAvg rounds before the clustering (0: cluster before round 1)."
        )
        flhc_local_epochs: int = option(
            1, "FL+HC: local epochs of every client's update at the clustering round."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        o = self.options
        check(
            [
                (
                    o.num_clusters is None or o.flhc_distance_threshold is None,
                    "flhc: give --num_clusters or --flhc_distance_threshold, not both",
                ),
                (
                    o.num_clusters is None or o.num_clusters >= 1,
                    "flhc: num_clusters must be >= 1",
                ),
                (
                    o.flhc_distance_threshold is None
                    or (o.flhc_distance_threshold > 0 and np.isfinite(o.flhc_distance_threshold)),
                    "flhc_distance_threshold must be > 0",
                ),
                (o.flhc_cluster_round >= 0, "flhc_cluster_round must be >= 0"),
                (o.flhc_local_epochs >= 1, "flhc_local_epochs must be >= 1"),
            ]
        )

    @property
    def cut(self) -> tuple[Optional[int], Optional[float]]:
        """(cluster count, distance threshold): exactly one is set."""
        threshold = self.options.flhc_distance_threshold
        if threshold is not None:
            return None, float(threshold)
        return self.options.num_clusters or DEFAULT_CLUSTERS, None

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        count, _ = self.cut
        if count is not None:
            check_cluster_count(self.name, count, run)
        if self.options.flhc_cluster_round == 0:
            return self.cluster(run, run.initial_model, 0, queries)
        return Decision(assignment={c: 0 for c in run.client_ids}, state=None)

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """FedAvg (the loop's per-cluster aggregation) every round; after round n, step 2-3."""
        if result.round_num == self.options.flhc_cluster_round:
            return self.cluster(run, view.cluster_models[0], result.round_num, queries)
        return Decision(metrics={"num_clusters": float(view.num_clusters)})

    def cluster(
        self, run: RunInfo, global_model: np.ndarray, round_num: int, queries: Queries
    ) -> Decision:
        """Steps 2-4: every client's local update from the global model, hierarchical
        clustering of the updates, one cluster model per cluster, each the global model."""
        ids = list(run.client_ids)
        updates = queries.local_updates(
            ids, global_model, self.options.flhc_local_epochs, round_num
        )
        points = updates[:, : run.num_trainable_values]
        count, threshold = self.cut
        linkage = self.options.flhc_linkage
        tree = hierarchical.dendrogram(points, linkage)  # built once for the cut and the log
        labels = hierarchical.hierarchical_clusters(points, linkage, count, threshold, tree)
        num_clusters = int(labels.max()) + 1
        heights = hierarchical.merge_heights(points, linkage, tree)
        metrics = {"num_clusters": float(num_clusters), "flhc_clustered": 1.0}
        if len(heights):  # the dendrogram's top merges: where a distance threshold would cut
            metrics["flhc_top_merge_height"] = float(heights[-1])
            metrics["flhc_median_merge_height"] = float(np.median(heights))
        return Decision(
            assignment=dict(zip(ids, labels.tolist())),
            cluster_models=np.repeat(
                np.asarray(global_model, np.float32)[None, :], num_clusters, axis=0
            ),
            metrics=metrics,
            similarity=Similarity(
                "Euclidean distance of the local updates (FL+HC)",
                tuple(ids),
                hierarchical.euclidean_distances(points),
                tuple(labels.tolist()),
                round_num,
            ),
        )
