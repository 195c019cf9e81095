"""CGPFL: personal models pulled toward K context models, one per cluster (IJCAI 2022).

CGPFL (Tang, Guo, Guo, "Personalized Federated Learning with Contextualized Generalization",
IJCAI 2022): personal models pulled toward K context models, one per cluster of clients.

The paper learns K generalized ("context") models w_k and a personalized model v_i per client,
linked by a Moreau-envelope objective f_i(v_i) + (lambda/2)||v_i - w_k||^2 for the context k
of client i, the clients being grouped into contexts. Our operational reading, which this file
implements:

* state: K context models w_k on the server (the cluster models); every client keeps its own
  personal model v_i across rounds (stateful clients; one never sampled still holds the
  initial model w0);
* local update: each sampled client receives its context's whole model w_k and trains its own
  v_i (not a copy of w_k) by SGD on CE(v_i) + (lambda/2)||v_i - w_k||^2 (`--cgpfl_lambda`
  > 0; `--momentum` as given), then uploads v_i;
* re-assignment: each sampled client joins the context model nearest to its new v_i (squared
  L2 over the trainable parameters) among the K models it was trained against;
* server step (pFedMe-style): w_k <- (1 - beta) w_k + beta * mean of the new v_i of the
  sampled clients now in context k (unweighted, `--cgpfl_beta`; 1: the members' mean). A
  context without sampled members keeps its model; knowledge is shared only within a context
  (there is no global model);
* initialisation (as FeSEM's): every client runs one local update from w0 (plain SGD,
  `--cgpfl_init_epochs`), K-means (best of 20 restarts) on those models gives the first
  contexts, each context model the mean of its members' models.

Clients are scored with their personal model v_i (first) and with their context's model.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    Releases,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
)
from tff_clustered.algorithms.cold_starts import clusters_of_local_models
from tff_clustered.algorithms.ifca import DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP
from tff_clustered.federated import client_work
from tff_clustered.options import option

KMEANS_RESTARTS = 20  # as FeSEM's default --fesem_restarts


def context_step(
    previous: np.ndarray, personal: np.ndarray, labels: np.ndarray, beta: float
) -> np.ndarray:
    """The server step: w_k <- (1 - beta) w_k + beta * (unweighted mean of the personal models
    labelled k); a context model without members is kept. float64, (K, D)."""
    previous = np.asarray(previous, np.float64)
    means = clustering.mean_per_cluster(personal, labels, previous)
    members = np.bincount(labels, minlength=len(previous)) > 0
    mixed = (1.0 - beta) * previous + beta * means
    return np.where(members[:, None], mixed, previous)


class CGPFL(Algorithm):
    """Personal models pulled toward the nearest of K context models (K-means at the start)."""

    name = "cgpfl"
    models_from_aggregate = False  # its contexts move by the clients' individual personal models
    model_kinds = ("personal", "cluster")
    paper = (
        "Tang, Guo, Guo, Personalized Federated Learning with Contextualized Generalization, "
        "IJCAI 2022"
    )
    keep_client_models = True
    releases = Releases(
        cold_start=("CGPFL's start: the first contexts, K-means of every client's local model",),
        outside=("CGPFL's personal models: each client's own, which its context averages",),
    )
    refused = {
        **Algorithm.refused,
        "mu": "CGPFL's pull toward the context model is --cgpfl_lambda",
    }

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: int = option(DEFAULT_CLUSTERS, NUM_CLUSTERS_HELP)
        cgpfl_lambda: float = option(
            0.5, "CGPFL lambda (> 0): pull of each personal model toward its context model."
        )
        cgpfl_beta: float = option(
            1.0, "CGPFL beta: context model <- (1 - beta) itself + beta members' mean."
        )
        cgpfl_init_epochs: int = option(
            1, "CGPFL: local epochs of every client's initial update from w0."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        o = self.options
        check(
            [
                (self.num_clusters >= 1, "cgpfl: num_clusters must be >= 1"),
                (
                    o.cgpfl_lambda > 0 and np.isfinite(o.cgpfl_lambda),
                    "cgpfl_lambda must be > 0 (0 would be local training: --algorithm=local)",
                ),
                (o.cgpfl_beta > 0 and np.isfinite(o.cgpfl_beta), "cgpfl_beta must be > 0"),
                (o.cgpfl_init_epochs >= 1, "cgpfl_init_epochs must be >= 1"),
            ]
        )

    @property
    def num_clusters(self) -> int:
        return int(self.options.num_clusters)

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        """The personal model's local update: from v_i, pulled toward the received w_k."""
        return client_work.LocalSGD(
            prox_mu=float(self.options.cgpfl_lambda),
            momentum=float(momentum),
            from_own_model=True,
        )

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Every client's model after one local update from w0; K-means (best of restarts) on
        them gives the first contexts, each context model its members' mean."""
        return clusters_of_local_models(
            self.name, run, queries, self.num_clusters, self.options.cgpfl_init_epochs,
            KMEANS_RESTARTS,
        )  # fmt: skip

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """Re-assigns the sampled clients to the context nearest their new personal model, then
        the server step on the contexts the clients trained against (it replaces the round's
        own per-cluster mean)."""
        contexts = result.cluster_models_before
        personal = queries.client_models(result.client_ids)
        width = run.num_trainable_values
        distances = clustering.squared_center_distances(personal[:, :width], contexts[:, :width])
        labels = np.argmin(distances, axis=1).astype(np.int32)
        new_contexts = context_step(contexts, personal, labels, self.options.cgpfl_beta)
        return Decision(
            assignment=dict(zip(result.client_ids, labels.tolist())),
            cluster_models=new_contexts.astype(np.float32),
            metrics=self.metrics(personal, new_contexts, labels, width),
            similarity=Similarity.to_centers(
                "L2 distance of personal models to the context models",
                result.client_ids,
                np.sqrt(np.maximum(distances, 0.0)),
                labels,
                result.round_num,
                "context",
            ),
        )

    @staticmethod
    def metrics(
        personal: np.ndarray,
        contexts: np.ndarray,
        labels: np.ndarray,
        width: int,
    ) -> dict[str, float]:
        """The mean distance of the sampled personal models to their new context model (how
        far personalisation keeps them) and how many contexts the sampled clients joined."""
        gaps = personal[:, :width].astype(np.float64) - contexts[labels, :width]
        return {
            "cgpfl_personal_distance": float(np.linalg.norm(gaps, axis=1).mean()),
            "cgpfl_sampled_contexts": float(len(set(labels.tolist()))),
        }
