"""FeSEM: federated stochastic EM over client models, with K cluster centres.

FeSEM (Long et al., "Multi-Center Federated Learning: Clients Clustering for Better
Personalization", World Wide Web 2023): federated stochastic EM over client models.

Initialization (Alg. 1, "Initialize K, {W_i}, {W~^(k)}"): every client runs one local update
from the common w0 (plain SGD, `--fesem_init_epochs`), giving W_i; K-means from
`--fesem_restarts` random initial centers, best run by intra-cluster distance, gives the
initial assignments and centers W~^(k) (the mean of each cluster's W_i). By default
(`--fesem_init=directions`, ours) K-means runs on the directions of the updates W_i - w0: with
`models` (the paper's) it runs on the W_i themselves, where how far a client moved (its data's
size and scale) outweighs where it went, and K-means then isolates the few clients that moved
furthest and puts the rest in one cluster. `random` (the FedGroup authors' code) starts from K
independently initialised centers; a client without a cluster joins the one nearest w0.
`--fesem_estep_on=previous` (also theirs) runs the E-step before training, on the model of the
last round the client trained.

Alg. 1 then repeats E-step, M-step, local update. We run the same sequence from its local
update on, so that the E-step always sees models trained from the current centers (never a
stale or untrained one, which partial participation would otherwise give). Each round, for the
sampled clients:

* local update (Alg. 2): from the center of its cluster, giving its new W_i;
* E-step (Eq. 8): it joins the center nearest (squared L2 over the trainable parameters) to
  its new W_i;
* M-step (Eq. 9): each center with members becomes the mean of their new W_i: unweighted as in
  the paper (`--fesem_weighting=uniform`), or weighted by n_i as the authors' code ran it
  (`num_examples`). A center without members this round is kept.

With all clients taking part this is exactly Alg. 1.

`--fesem_estep=client` (for `--aggregator=dp`) moves the E-step onto the client: each sampled
client is sent every center, trains from its own, joins the center nearest its new W_i and
sends W_i - W~^(k*) into cluster k*'s sum (`NearestCentreAfterTraining`); each center adds its
cluster's mean update through the round's own aggregate (clipped and noised with a private
aggregator). With the plain mean this is Eq. 9, W~^(k) + mean_i (W_i - W~^(k)) = mean_i W_i,
and no individual model reaches the server, only each client's pick k*. The initialization
stays on the server.

The Eq. 7 distance term, off by default,
adds (mu_i/2)||W - W~^(k)||^2 to the local loss: `--fesem_reg=constant` uses mu_i =
--fesem_mu for all clients; `--fesem_reg=paper` uses mu_i = 2 lambda n_avg / n_i
(`--fesem_lambda`), Eq. 7 divided by alpha_i."""

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
    Releases,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
)
from tff_clustered.algorithms.cold_starts import clusters_of_local_models, independent_clusters
from tff_clustered.algorithms.ifca import DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP
from tff_clustered.federated.distributions import NearestCentreAfterTraining
from tff_clustered.federated.signature import CLIENT_WEIGHTINGS
from tff_clustered.options import option
from tff_clustered.search_space import Choice


class FeSEM(Algorithm):
    """K-means of locally trained models, then each round: local update, E-step, M-step."""

    name = "fesem"
    # The server-side E and M steps replace the aggregate with a mean of individual models;
    # the client-side E-step (`--fesem_estep=client`) leaves the centers to the aggregate.
    models_from_aggregate = False
    private_mode = "--fesem_estep=client"
    releases = Releases(
        cold_start=(
            "FeSEM's initialisation: the first assignment and centres, K-means of local models",
        ),
        outside=("FeSEM's cluster picks: the nearest centre each sampled client sends (Eq. 8)",),
    )
    model_kinds = ("cluster", "global")
    paper = "Long et al., Multi-Center Federated Learning, World Wide Web 2023"
    needs_model_deltas = True  # the new W_i = its center + its update, the E-step's input

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: int = option(DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP)
        fesem_mu: float = option(
            0.0,
            "FeSEM distance term strength (constant mode).",
            search=Choice((0.0, 0.001, 0.01, 0.1, 1.0)),
        )
        fesem_reg: str = option(
            "constant",
            "FeSEM distance term: --mu, or 2 lambda n_avg/n_i.",
            ("constant", "paper"),
        )
        fesem_lambda: float = option(0.0, "FeSEM lambda of the paper-mode distance term.")
        fesem_weighting: str = option(
            "uniform",
            "FeSEM M-step mean: uniform (Eq. 9) or by training examples (the authors' code).",
            CLIENT_WEIGHTINGS,
        )
        fesem_estep: str = option(
            "server",
            "FeSEM E-step (Eq. 8): on the server from every client's model, or on the client, "
            "its update sent into its nearest center's aggregate (for --aggregator=dp).",
            ("server", "client"),
        )
        fesem_restarts: int = option(20, "FeSEM: K-means restarts of the initial clustering.")
        fesem_init_epochs: int = option(
            1, "FeSEM: local epochs of every client's initial update from w0."
        )
        fesem_init: str = option(
            "directions",
            "FeSEM's first clusters: K-means of the directions of every client's first local "
            "update (directions, ours), of the locally trained models themselves (models, the "
            "paper's), or K random centers that each client joins by the E-step (random, the "
            "FedGroup authors' code).",
            ("directions", "models", "random"),
            search=Choice(("directions", "models")),
        )
        fesem_estep_on: str = option(
            "trained",
            "FeSEM E-step (Eq. 8) on the model a client trains this round, after its local "
            "update (trained), or on its model of the last round it trained, before this "
            "round's training (previous, the FedGroup authors' code).",
            ("trained", "previous"),
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check(
            [
                (self.num_clusters >= 1, f"{self.name}: num_clusters must be >= 1"),
                (self.options.fesem_lambda >= 0, "fesem_lambda must be >= 0"),
                (self.prox_mu >= 0, f"{self.name}: fesem_mu must be >= 0"),
                (self.options.fesem_restarts >= 1, "fesem_restarts must be >= 1"),
                (self.options.fesem_init_epochs >= 1, "fesem_init_epochs must be >= 1"),
                (
                    not (self.client_estep and self.options.fesem_estep_on == "previous"),
                    "--fesem_estep_on=previous is an E-step on the server: it needs "
                    "--fesem_estep=server",
                ),
            ]
        )
        # The E-step on the previous model reads each client's last trained model.
        self.keep_client_models = self.options.fesem_estep_on == "previous"
        if self.client_estep:  # the round's aggregate is the M-step, weighted as asked
            self.distribution = NearestCentreAfterTraining()
            self.models_from_aggregate = True
            self.needs_model_deltas = False
            self.client_weighting = self.options.fesem_weighting

    @property
    def client_estep(self) -> bool:
        """Whether the E-step runs on the clients (`--fesem_estep=client`)."""
        return self.options.fesem_estep == "client"

    @property
    def num_clusters(self) -> int:
        return int(self.options.num_clusters)

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
        """Every client's W_i from one local update from w0; K-means (best of restarts) on
        them (or on their update directions) gives the first assignment and the centers
        (members' means). `random`: K independently initialised centers, nobody assigned."""
        o = self.options
        if o.fesem_init == "random":
            return independent_clusters(self.name, run, queries, self.num_clusters)
        sizes = [run.train_sizes[c] for c in run.client_ids]
        return clusters_of_local_models(
            self.name, run, queries, self.num_clusters, o.fesem_init_epochs, o.fesem_restarts,
            self._weights(sizes), directions=o.fesem_init == "directions",
        )  # fmt: skip

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        """Each sampled client trains from its current cluster's center. With the E-step on
        the previous model, every sampled client first joins the center nearest the model of
        the last round it trained (w0 if it never did); otherwise only a client without a
        cluster does (its model is w0)."""
        current = np.array([view.assignment.get(c, -1) for c in client_ids], np.int32)
        clusters = current
        width = run.num_trainable_values
        centers = view.cluster_models[:, :width]
        if self.options.fesem_estep_on == "previous":
            previous = queries.client_models(client_ids)[:, :width]  # w0 if never trained
            clusters = clustering.nearest_centers(previous, centers)
        elif (clusters < 0).any():
            start = clustering.nearest_centers(run.initial_model[None, :width], centers)[0]
            clusters = np.where(clusters < 0, start, clusters).astype(np.int32)
        return Plan(
            clusters,
            client_scalars=self.prox_scales(run, client_ids),
            decision=Decision(  # the clients the E-step moved before training
                assignment={c: int(k) for c, k, j in zip(client_ids, clusters, current) if k != j}
            ),
        )

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """E-step (Eq. 8) on the new W_i against the centers they trained from, then M-step
        (Eq. 9) over the new assignment; replaces the round's own per-cluster mean. With the
        E-step on the clients, their picks are the assignment and the round's aggregate
        already moved the centers."""
        if self.client_estep:
            return Decision(assignment=dict(zip(result.client_ids, result.clusters.tolist())))
        centers = result.cluster_models_before
        models = centers[result.clusters] + result.model_deltas
        width = run.num_trainable_values
        distances = clustering.squared_center_distances(models[:, :width], centers[:, :width])
        labels = np.argmin(distances, axis=1).astype(np.int32)  # nearest center
        if self.options.fesem_estep_on == "previous":  # the plan's E-step stands
            labels = np.asarray(result.clusters, np.int32)
        weights = self._weights(result.num_examples)
        return Decision(
            assignment=dict(zip(result.client_ids, labels.tolist())),
            cluster_models=clustering.mean_per_cluster(models, labels, centers, weights),
            similarity=Similarity.to_centers(
                "L2 distance of trained models to the centers (Eq. 8)",
                result.client_ids,
                np.sqrt(np.maximum(distances, 0.0)),
                labels,
                result.round_num,
            ),
        )

    def _weights(self, num_examples: Sequence[float]) -> Optional[np.ndarray]:
        if self.options.fesem_weighting == "uniform":
            return None
        return np.asarray(num_examples, np.float64)
