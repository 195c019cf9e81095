"""The round's finalizer, from the per-cluster sums of the clients' updates to the new cluster
models (and the server optimizer's and the aggregator's new states), as a TF function and as
the TFF computations `round.tff_round_parts` and `sharded.py` call.

* The mean (`ClusterMean`, the signature's default): `RoundFunctions.finalize` with each
  cluster's weighted mean update, or `finalize_sums` with the sums (after `sharded.py` has
  added the workers' shares); a cluster no client trained in keeps its model bit for bit.
* Any other aggregator (`cluster_aggregators.py`): `finalize_aggregate`, its `finalize` on the
  sums (noise, the denominators, its state's update), then the mean updates added and the
  server optimizer's step for the clusters it says step (a private aggregator steps every
  cluster in use, with or without a client this round).
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.federated.round_functions import RoundFunctions

to_type = tff.types.tensorflow_to_type


def stats_spec(fns: RoundFunctions) -> tf.TensorSpec:
    """The per-cluster sums of the clients' statistics rows (`[K, stats_width]`)."""
    return tf.TensorSpec([fns.num_clusters, fns.aggregator.stats_width], tf.float32)


def slot_spec(fns: RoundFunctions) -> collections.OrderedDict:
    """The server state's `aggregator` entry of a round whose aggregator is not the mean."""
    return fns.aggregator.slot_spec(fns.num_clusters)


def finalize_aggregate(
    fns: RoundFunctions,
    cluster_models: tuple,
    sums: tuple,
    total_weight: tf.Tensor,
    stats: tf.Tensor,
    optimizer_state: Any,
    aggregator_slot: Any,
) -> collections.OrderedDict:
    """The finalizer of a round whose aggregator is not the mean, from the per-cluster sums of
    the clients' preprocessed updates, weights and statistics: `{cluster_models, optimizer
    (when the round has one), aggregator (its new slot), measurements (each [K]; the realised
    total weights as `cluster_weight`)}`."""
    aggregator = fns.aggregator
    inputs = aggregator_slot["inputs"]
    means, updated, state, measured = aggregator.finalize(
        tuple(sums), total_weight, stats, aggregator_slot["state"], inputs
    )
    models, optimizer = fns.apply_means(tuple(cluster_models), means, updated, optimizer_state)
    finalized = collections.OrderedDict(cluster_models=models)
    if fns.has_optimizer:
        finalized["optimizer"] = optimizer
    finalized["aggregator"] = aggregator.server_slot(state, inputs)
    finalized["measurements"] = collections.OrderedDict(cluster_weight=total_weight, **measured)
    return finalized


def mean_finalizer(fns: RoundFunctions, combine: Callable[..., tuple]) -> tff.Computation:
    """The mean's finalizer as a TFF computation: `combine(cluster_models, update,
    cluster_weight, optimizer_state)` (`fns.finalize` with the means, or `fns.finalize_sums`
    with the sums) -> the cluster models, or `{cluster_models, optimizer}` with a server
    optimizer's state in and out when it keeps one (TFF computations take no optional
    parameters)."""
    k = fns.num_clusters
    finalize_types = [
        to_type(fns.cluster_models_spec),
        to_type(fns.stacked_shared_spec()),
        tff.TensorType(np.float32, [k]),
    ]
    if fns.has_optimizer:
        finalize_types.append(to_type(fns.optimizer_state_spec))
        return tff.tensorflow.computation(*finalize_types)(
            lambda models, update, weight, optimizer: collections.OrderedDict(
                zip(("cluster_models", "optimizer"), combine(models, update, weight, optimizer))
            )
        )
    return tff.tensorflow.computation(*finalize_types)(
        lambda models, update, weight: combine(models, update, weight, {})[0]
    )


def aggregate_finalizer(fns: RoundFunctions) -> tff.Computation:
    """`finalize_aggregate` as a TFF computation `(cluster_models, sums, total_weight, stats,
    aggregator_slot[, optimizer_state])`, the server optimizer's state last when the round
    has one."""
    k = fns.num_clusters
    types = [
        to_type(fns.cluster_models_spec),
        to_type(fns.stacked_shared_spec()),
        tff.TensorType(np.float32, [k]),
        to_type(stats_spec(fns)),
        to_type(slot_spec(fns)),
    ]
    if fns.has_optimizer:
        return tff.tensorflow.computation(*types, to_type(fns.optimizer_state_spec))(
            lambda models, sums, weight, stats, slot, optimizer: finalize_aggregate(
                fns, models, sums, weight, stats, optimizer, slot
            )
        )
    return tff.tensorflow.computation(*types)(
        lambda models, sums, weight, stats, slot: finalize_aggregate(
            fns, models, sums, weight, stats, {}, slot
        )
    )
