"""A training round's row of metrics.csv.

A training round's row of metrics.csv: its training loss, clients and seconds, what it sent
(model values, `floats_communicated`, and bits, `bits_communicated`), the round metrics and
the algorithm's own, the aggregator's measurements, the clients that changed cluster and the
sampled ones per cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tff_clustered.algorithms.base import Algorithm, Decision
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.loop.round_step import RoundOutcome
from tff_clustered.loop.training_call import TrainRequest

FLOAT_BITS = 32  # a model value downloaded, or uploaded as float32


def training_row(
    algorithm: Algorithm,
    aggregator: ClusterAggregator,
    tensor_sizes: Sequence[int],
    request: TrainRequest,
    outcome: RoundOutcome,
    decision: Decision,
    metric_rows: Sequence[Mapping[str, Any]],
    server_seconds: float,
    clients_changed_cluster: int,
) -> dict[str, Any]:
    """The round's row (see the module docstring). `tensor_sizes`: values in each of the
    model's tensors; `metric_rows`: the round metrics' columns. The bits count every
    downloaded value at 32 and each client's upload as `aggregator` encodes it; an algorithm
    that counts its own values (decentralized peers, always the mean) sends them at 32 bits."""
    result, signature = outcome.result, request.fed_round.signature
    num_before = len(request.cluster_models)
    num_examples = result.num_examples.sum()
    shared = [tensor_sizes[i] for i in signature.shared]
    sent = (
        outcome.num_sampled,
        sum(shared),
        num_before,
        sum(tensor_sizes[i] for i in signature.anchor),
    )
    row: dict[str, Any] = {
        "learning_rate": request.training.learning_rate,
        "train_loss": float(result.loss_sums.sum() / max(num_examples, 1.0)),
        "num_sampled": outcome.num_sampled,
        "dropped_clients": outcome.num_dropped,
        "train_seconds": outcome.seconds,
        "server_seconds": server_seconds,
        "floats_communicated": algorithm.values_sent_per_round(*sent),
        "bits_communicated": algorithm.values_sent_per_round(
            *sent, value_bits=FLOAT_BITS, upload_bits=aggregator.upload_bits(shared)
        ),
    }
    for metrics in metric_rows:
        row.update(metrics)
    row.update(decision.metrics)
    if "floats_communicated" in decision.metrics:
        row["bits_communicated"] = FLOAT_BITS * decision.metrics["floats_communicated"]
    row.update(aggregator.measurement_columns(outcome.measurements, num_before))
    row["clients_changed_cluster"] = clients_changed_cluster
    sampled = np.bincount(result.clusters, minlength=num_before)
    row.update({f"sampled_cluster_{k}": int(n) for k, n in enumerate(sampled)})
    return row
