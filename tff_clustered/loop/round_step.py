"""One training round as one step of the loop (`RoundStep`).

One training round as one step: the built round's call, the clients whose update diverged
left out, the client store updated, and what the algorithm sees of the round (`RoundResult`).
`run` changes the store only; the cluster models and server optimizer state it returns are the
caller's to keep (`orchestration.Experiment.train_round`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.algorithms.base import RoundResult
from tff_clustered.federated.distributions import Distribution
from tff_clustered.loop.client_store import ClientStore
from tff_clustered.loop.divergence import check_diverged_clients, check_finite
from tff_clustered.loop.round_calls import RoundCalls
from tff_clustered.loop.training_call import TrainRequest


@dataclasses.dataclass(frozen=True)
class RoundOutcome:
    """What a round did: `result` for the algorithm (the clients whose update stayed finite),
    the aggregated `cluster_models` and the server optimizer's state, how many clients were
    sampled, the seconds the round's call and bookkeeping took, and the aggregator's new state
    (None for the mean) and measurements (one row per real cluster each)."""

    result: RoundResult
    cluster_models: np.ndarray
    optimizer_state: Optional[dict[str, np.ndarray]]
    num_sampled: int
    seconds: float
    aggregator_state: Optional[dict[str, np.ndarray]] = None
    measurements: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_dropped(self) -> int:
        return self.num_sampled - len(self.result.client_ids)


@dataclasses.dataclass(frozen=True)
class RoundStep:
    """Runs training rounds through `calls` for an algorithm that distributes models by
    `distribution`; stops the run when more than `max_diverged_fraction` of a round's clients
    diverge; returns each client's model update when `with_deltas`."""

    calls: RoundCalls
    distribution: Distribution
    max_diverged_fraction: float
    with_deltas: bool
    # What of the aggregator's settings may make a model non-finite (its `divergence_hint`).
    divergence_hint: str = ""

    def run(self, request: TrainRequest, store: ClientStore) -> RoundOutcome:
        started = time.perf_counter()
        trained = self.calls.train(request, store)
        outputs = trained.outputs
        # a round of no client (an empty Poisson sample of a private run) runs for its
        # aggregator's server side alone: its noise on the empty sums, the optimizer's step
        no_client = np.zeros(0, np.int32)
        clusters = self.distribution.clusters(request.keys, outputs) if outputs else no_client
        # Diverged clients were left out of the aggregate; they are left out of the store and
        # of what the algorithm sees too.
        finite = np.array([bool(o["finite"]) for o in outputs])
        kept = check_diverged_clients(
            finite,
            request.client_ids,
            request.round_num,
            request.training.learning_rate,
            self.max_diverged_fraction,
            self.divergence_hint,
        )
        outputs = [outputs[i] for i in kept]
        client_ids, clusters = [request.client_ids[i] for i in kept], clusters[kept]
        check_finite(
            trained.cluster_models,
            request.round_num,
            "aggregation",
            clusters,
            client_ids,
            self.divergence_hint,
        )
        store_out = request.fed_round.io.store_out
        for client, output in zip(client_ids, outputs):
            store.update(client, store_out, output["stored"])
        result = round_result(
            request.round_num,
            client_ids,
            clusters,
            outputs,
            request.cluster_models,
            self.with_deltas,
        )
        return RoundOutcome(
            result,
            trained.cluster_models,
            trained.optimizer_state,
            len(finite),
            time.perf_counter() - started,
            trained.aggregator_state,
            trained.measurements,
        )


def empty_round_row(learning_rate: float, num_clusters: int) -> dict[str, Any]:
    """The row of a round that sampled no client (Poisson sampling may): the algorithm is not
    asked, nothing trains or is sent, no assignment changes (nor, outside a private run, any
    model or state: a private run's `RoundStep.run` of no client moves them by its noise), and
    the training loss is NaN (no example was seen)."""
    return {
        "learning_rate": learning_rate,
        "train_loss": math.nan,
        "num_sampled": 0,
        "dropped_clients": 0,
        "train_seconds": 0.0,
        "server_seconds": 0.0,
        "floats_communicated": 0,
        "bits_communicated": 0,
        "clients_changed_cluster": 0,
        **{f"sampled_cluster_{k}": 0 for k in range(num_clusters)},
    }


def round_result(
    round_num: int,
    client_ids: Sequence[str],
    clusters: np.ndarray,
    outputs: Sequence[dict],
    cluster_models_before: np.ndarray,
    with_deltas: bool,
) -> RoundResult:
    """What an algorithm sees of a round: its clients' outputs as arrays, one row per client."""
    metric_names = outputs[0].get("metrics", {}) if outputs else {}
    return RoundResult(
        round_num=round_num,
        client_ids=tuple(client_ids),
        clusters=np.asarray(clusters, np.int32),
        num_examples=np.array([float(o["num_examples"]) for o in outputs]),
        loss_sums=np.array([float(o["loss_sum"]) for o in outputs]),
        model_deltas=np.stack([np.asarray(o["model_delta"]) for o in outputs])
        if with_deltas and outputs
        else None,
        cluster_models_before=cluster_models_before,
        client_metrics={
            name: np.stack([np.asarray(o["metrics"][name]) for o in outputs])
            for name in metric_names
        },
    )
