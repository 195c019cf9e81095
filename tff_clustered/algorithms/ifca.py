"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020),
as run in FedGroup's comparison (spec A.9): m independently initialised cluster models; every
round each sampled client receives all m, joins the one with the lowest loss on its training
data, and each cluster averages its members (example-weighted)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tff_clustered.algorithms.base import IndependentClusters

if TYPE_CHECKING:
    from tff_clustered.orchestration import Experiment


class IFCA(IndependentClusters):
    name = "ifca"
    paper = "Ghosh et al., An Efficient Framework for Clustered Federated Learning, NeurIPS 2020"
    models_sent_per_client = "all"

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        """Each sampled client joins its lowest-training-loss cluster (ties: lowest index)."""
        clusters = np.argmin(experiment.client_losses(client_ids), axis=1).astype(np.int32)
        experiment.state.assignment.update(zip(client_ids, clusters.tolist()))
        return clusters
