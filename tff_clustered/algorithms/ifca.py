"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020),
as run in FedGroup's comparison (spec A.9): m independently initialised cluster models; every
round each sampled client receives all m, joins the one with the lowest loss on its training
data, and each cluster averages its members (example-weighted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions

if TYPE_CHECKING:
    from tff_clustered.orchestration import Experiment

DEFAULT_CLUSTERS = 3


def independent_cluster_models(experiment: Experiment, num_clusters: int) -> np.ndarray:
    """One freshly initialised model per cluster, each from its own seed (spec A.14-#24)."""
    from tff_clustered.models.keras_models import initial_weights
    from tff_clustered.orchestration import ALGORITHM, derived_seed

    return np.stack(
        [
            flat.flatten(
                initial_weights(
                    experiment.model, derived_seed(experiment.config.seed, ALGORITHM, k)
                )
            )
            for k in range(num_clusters)
        ]
    )


class IFCA(Algorithm):
    name = "ifca"
    paper = "Ghosh et al., An Efficient Framework for Clustered Federated Learning, NeurIPS 2020"
    models_sent_per_client = "all"

    def default_num_clusters(self, options: AlgorithmOptions) -> int:
        return options.num_clusters or DEFAULT_CLUSTERS

    def setup(self, experiment: Experiment) -> None:
        experiment.set_cluster_models_matrix(
            independent_cluster_models(experiment, self.num_clusters)
        )
        # A client counts in evaluation once it has been sampled (spec A.11).
        experiment.state.assignment = {c: -1 for c in experiment.data.client_ids}

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        """Each sampled client joins its lowest-training-loss cluster (ties: lowest index)."""
        clusters = np.argmin(experiment.client_losses(client_ids), axis=1).astype(np.int32)
        experiment.state.assignment.update(zip(client_ids, clusters.tolist()))
        return clusters
