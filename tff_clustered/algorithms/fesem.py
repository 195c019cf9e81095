"""FeSEM (Long et al., "Multi-Center Federated Learning: Clients Clustering for Better
Personalization", WWW journal 2023): federated stochastic EM over client models.

K independently initialised centers. Each round, E-step (Eq. 8): every sampled client joins
the center nearest (squared L2) to its most recent local model (w0 before it first trains);
local update from that center; M-step (Eq. 9): each center becomes the unweighted mean of its
members' new local models (centers without members are kept).

The Eq. 7 distance term, off by default (spec B.4), adds (mu_i/2)||W - W~^(k)||^2 to the local
loss: `--fesem_reg=constant` uses mu_i = --mu for all clients; `--fesem_reg=paper` uses
mu_i = 2 lambda n_avg / n_i (`--fesem_lambda`), Eq. 7 divided by alpha_i."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import AlgorithmOptions, IndependentClusters

if TYPE_CHECKING:
    from tff_clustered.orchestration import Experiment


class FeSEM(IndependentClusters):
    name = "fesem"
    paper = "Long et al., Multi-Center Federated Learning, World Wide Web 2023"
    needs_model_deltas = True
    client_weighting = "uniform"  # Eq. 9: unweighted mean of members

    def __init__(self, options: Optional[AlgorithmOptions] = None) -> None:
        super().__init__(options)
        self.local_models: dict[str, np.ndarray] = {}  # W_i, flattened
        self._round_start: np.ndarray = np.zeros((0, 0))

    def default_prox_mu(self, options: AlgorithmOptions) -> float:
        if options.fesem_reg == "paper":
            return 2.0 * options.fesem_lambda
        return options.prox_mu or 0.0

    def prox_scales(self, experiment: Experiment, client_ids: Sequence[str]) -> list[float]:
        """Paper mode: mu_i / (2 lambda) = n_avg / n_i, so smaller clients stay closer."""
        if self.options.fesem_reg != "paper":
            return super().prox_scales(experiment, client_ids)
        sizes = experiment.data.train_sizes
        n_avg = sum(sizes.values()) / len(sizes)
        return [n_avg / sizes[c] for c in client_ids]

    def setup(self, experiment: Experiment) -> None:
        super().setup(experiment)
        self.local_models = {}

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        """E-step (Eq. 8) on the sampled clients' latest local models."""
        w0 = experiment.initial_flat()
        models = np.stack([self.local_models.get(c, w0) for c in client_ids])
        self._round_start = experiment.cluster_models_matrix()
        clusters = clustering.nearest_centers(models, self._round_start)
        experiment.state.assignment.update(zip(client_ids, clusters.tolist()))
        return clusters

    def after_round(
        self,
        experiment: Experiment,
        round_num: int,
        client_ids: Sequence[str],
        client_outputs: Sequence[dict],
    ) -> None:
        """Store each participant's new local model W_i = W~^(k) + its update; the M-step
        (unweighted mean per center) was the core's aggregation with uniform weights."""
        for cid, out in zip(client_ids, client_outputs):
            k = experiment.state.assignment[cid]
            self.local_models[cid] = (self._round_start[k] + np.asarray(out["model_delta"])).astype(
                np.float32
            )

    def state_dict(self) -> dict[str, Any]:
        return {"local_models": self.local_models}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.local_models = dict(state["local_models"])
