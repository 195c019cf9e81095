"""FeSEM (Long et al., "Multi-Center Federated Learning: Clients Clustering for Better
Personalization", WWW journal 2023): federated stochastic EM over client models.

K independently initialised centers. Each round, E-step (Eq. 8): every sampled client joins
the center nearest (squared L2) to its most recent local model (w0 before it first trains);
local update from that center; M-step (Eq. 9): each center becomes the unweighted mean of its
members' new local models (the core's per-cluster mean with uniform weights; centers without
members are kept). Clients keep their latest local model (stateful clients).

The Eq. 7 distance term, off by default, adds (mu_i/2)||W - W~^(k)||^2 to the local loss:
`--fesem_reg=constant` uses mu_i = --fesem_mu for all clients; `--fesem_reg=paper` uses
mu_i = 2 lambda n_avg / n_i (`--fesem_lambda`), Eq. 7 divided by alpha_i."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    Queries,
    RunInfo,
    ServerView,
    check,
    independent_clusters,
)
from tff_clustered.algorithms.ifca import DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP
from tff_clustered.options import option


class FeSEM(Algorithm):
    name = "fesem"
    paper = "Long et al., Multi-Center Federated Learning, World Wide Web 2023"
    client_weighting = "uniform"  # Eq. 9: unweighted mean of members
    keep_client_models = True  # W_i, the E-step's input

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: Optional[int] = option(None, NUM_CLUSTERS_HELP)
        fesem_mu: float = option(0.0, "FeSEM distance term strength (constant mode).")
        fesem_reg: str = option(
            "constant",
            "FeSEM distance term: --mu, or 2 lambda n_avg/n_i.",
            ("constant", "paper"),
        )
        fesem_lambda: float = option(0.0, "FeSEM lambda of the paper-mode distance term.")

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check(
            [
                (self.num_clusters >= 1, f"{self.name}: num_clusters must be >= 1"),
                (self.options.fesem_lambda >= 0, "fesem_lambda must be >= 0"),
                (self.prox_mu >= 0, f"{self.name}: mu must be >= 0"),
            ]
        )

    @property
    def num_clusters(self) -> int:
        return self.options.num_clusters or DEFAULT_CLUSTERS

    @property
    def prox_mu(self) -> float:
        if self.options.fesem_reg == "paper":
            return 2.0 * self.options.fesem_lambda
        return float(self.options.fesem_mu)

    def prox_scales(self, run: RunInfo, client_ids: Sequence[str]) -> np.ndarray:
        """Paper mode: mu_i / (2 lambda) = n_avg / n_i, so smaller clients stay closer."""
        if self.options.fesem_reg != "paper":
            return np.ones(len(client_ids))
        sizes = run.train_sizes
        n_avg = sum(sizes.values()) / len(sizes)
        return np.array([n_avg / sizes[c] for c in client_ids])

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        return independent_clusters(run, queries, self.num_clusters)

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        """E-step (Eq. 8) on the sampled clients' latest local models."""
        clusters = clustering.nearest_centers(
            queries.client_models(client_ids), view.cluster_models
        )
        return Plan(
            clusters.astype(np.int32),
            prox_scales=self.prox_scales(run, client_ids),
            decision=Decision(assignment=dict(zip(client_ids, clusters))),
        )
