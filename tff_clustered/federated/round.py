"""The cluster-indexed federated round, composed from swappable parts and built per signature.

Server state holds `num_clusters` models stacked along a leading cluster axis. A round follows
`tff.learning.templates` (distributor -> client work -> aggregator -> finalizer):

* distributor (`distributors.py`): each client trains the **shared** variables of its own
  cluster (its key): every cluster's are broadcast and the client takes its key's row (a
  reference on the worker, where `tff.federated_select` would build a dataset per client);
  the client joins them with the rest of its **own stored model** (a CLIENTS-placed input
  from the per-client store). A client work that reads its whole stored model (Ditto's
  personal model) gets all of it as well. The signature's `Distribution` (`distributions.py`)
  chooses another distributor: every cluster's shared variables broadcast, the client training
  the one of lowest loss on its data (IFCA), or the rows a peer's key names, its own first
  (decentralized peers; nothing is aggregated then). `anchor` broadcasts an extra server model
  (some trainable tensors, held in the server state) that the client work reads as an anchor
  (FedAC's global embedding);
* client work: a `ClientWork` parameter, a pure TF function (`client_work.LocalSGD`,
  `client_work.DittoSGD`, ...). A client is sent its examples as arrays (any length) and
  builds its batches itself from the round's hyperparameters and its shuffle seed
  (`batching.ArrayBatches`, the stateless order of `batching.batch_order`, no tf.data pipeline
  per client): the worker never deserializes a `tf.data` graph per client and round, and the
  training loop is a `tf.while_loop` that runs where the graph is placed (a GPU in the
  in-process execution), not inside tf.data's CPU-only runtime;
* aggregator: the signature's `ClusterAggregator` (`cluster_aggregators.py`). The default
  `ClusterMean` is `ClusteredMeanFactory`, the weighted mean per cluster of the shared
  variables' updates (weights: examples processed, or 1 per client); another one (a private
  one: `cluster_dp.ClusterDP`) preprocesses each client's update on the client, sums it into
  its cluster's row with a statistics row, and finishes the sums on the server
  (`finalizers.finalize_aggregate`), its state in the server state;
* finalizer: adds each cluster's mean update to its shared variables, then takes the
  signature's server optimizer step per cluster (`server_optimizers.server_step`: FedAvgM,
  FedAdam; its state is part of the server state), inside the computation. A cluster no
  sampled client trained in gets a zero update and keeps its model (and optimizer state) bit
  for bit; non-shared variables of the server models are never touched by the aggregator.

Variables are the model's trainable tensors followed by its state tensors (BatchNorm moving
statistics); a state tensor is shared exactly when the trainable tensor that owns it (its BN
layer's gamma) is. Which variables are shared and how many clusters there are are per-round
data: `executions.RoundCache` builds one round per `RoundSignature` and reuses it whenever the
signature comes back (FedTSDP's moving boundary, CFL's growing cluster count).

`tff.learning.templates.compose_learning_process` cannot express this round: its `next` takes
only `(state, client_data)` and returns nothing per client, while we need cluster keys and
stored client variables in, and stored client variables and model updates out. So the parts
are composed by hand into `initialize` and a `next` that returns
`(state, client_outputs@CLIENTS, measurements@SERVER)`.

The parts are plain TF functions (`round_functions.py`) before any runtime wraps them: `tff_round`
makes them TFF computations, and `in_process.in_process_round` runs the same functions with
the same aggregation math as `tf.function`s inside this process (a GPU, when TensorFlow sees
one). Both give the same results for the same seeds.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.federated import finalizers
from tff_clustered.federated.clustered_mean import ClusteredMeanFactory, ClusterSums
from tff_clustered.federated.round_functions import RoundFunctions, round_functions
from tff_clustered.federated.round_inputs import WorkerData
from tff_clustered.federated.signature import ModelLayout, RoundIO, RoundSignature
from tff_clustered.federated.tff_factory_aggregator import factory_round_part
from tff_clustered.models.functional import FunctionalModel

to_type = tff.types.tensorflow_to_type  # TF specs -> TFF types (0.87's tff.to_type rejects them)


def sequence_type(element_spec: object) -> tff.SequenceType:
    return tff.SequenceType(to_type(element_spec))


def server_constant(value: object) -> object:
    """`tff.federated_value(value, tff.SERVER)` for a structure of arrays, made by a TF
    computation: TFF serializes a literal array value by value (as a Python list, at every
    build of a round), a TF constant as its bytes."""
    make = tff.tensorflow.computation(lambda: tf.nest.map_structure(tf.constant, value))
    return tff.federated_eval(make, tff.SERVER)


@dataclasses.dataclass
class FederatedRound:
    """A built round of one signature: `initialize() -> state`, `next(state, clients, hparams)
    -> (state, client_outputs, measurements)` (`clients`: one `round_inputs.client_input` each) and
    `evaluate(cluster_models, clients, batch_size) -> client results` (`clients`: one
    `round_inputs.evaluation_input` each), whichever
    execution runs them (TFF computations, or `in_process.InProcessRound`)."""

    initialize: Callable[..., Any]
    next: Callable[..., Any]
    evaluate: Callable[..., Any]
    signature: RoundSignature
    io: RoundIO
    layout: ModelLayout
    # `evaluate` with each client's scores those of a call of its own, bit for bit, whatever
    # else the call holds: what decisions score with (an argmin over losses must not turn on
    # rounding). None: `evaluate` itself scores each client on its own (TFF's computations).
    evaluate_exactly: Optional[Callable[..., Any]] = None


def build_round(
    model: FunctionalModel,
    input_spec: dict,
    signature: RoundSignature,
    initial_variables: Sequence[np.ndarray],
) -> FederatedRound:
    """Builds `initialize`/`next` and `evaluate` as TFF computations for one model and
    signature. `initial_variables` (one model's trainable tensors then its state) initialise
    every cluster in `initialize`; the orchestration passes its own server state to `next`."""
    return tff_round(round_functions(model, input_spec, signature, initial_variables))


@dataclasses.dataclass(frozen=True)
class TffRoundParts:
    """The round's TFF computations. `next` is the whole round on one worker; `partial_next`
    (same arguments) stops after the clients' work and returns, besides the client outputs,
    the per-cluster weighted sums of their updates and the per-cluster total weight (both
    SERVER-placed), and `finalize(cluster_models, sums, total_weight) -> cluster_models` (with
    a server optimizer's state: `(..., optimizer) -> {cluster_models, optimizer}`) turns
    sums, added up over any split of the clients, into the new cluster models. `next` equals
    `partial_next` followed by `finalize` (`sharded.py` runs them on several workers). With an
    aggregator other than the mean, `partial_next` returns `(sums, total_weight, stats,
    outputs)` and `finalize` is `finalizers.aggregate_finalizer`'s.

    `partial_next`, `finalize` and `evaluate` are built (traced and serialized) when first
    used, from `builders`: a run on one worker never uses the first two, and FedTSDP builds a
    round for every split it shrinks to, often without evaluating it."""

    initialize: tff.Computation
    next: tff.Computation
    functions: RoundFunctions
    builders: Mapping[str, Callable[[], tff.Computation]]
    # Where the workers read each client's examples themselves; None: they are sent.
    worker_data: Optional[WorkerData] = None

    @functools.cached_property
    def partial_next(self) -> tff.Computation:
        return self.builders["partial_next"]()

    @functools.cached_property
    def finalize(self) -> tff.Computation:
        return self.builders["finalize"]()

    @functools.cached_property
    def evaluate(self) -> tff.Computation:
        return self.builders["evaluate"]()

    def as_round(self) -> FederatedRound:
        fns = self.functions
        return FederatedRound(
            initialize=self.initialize,
            next=self.next,
            evaluate=self.evaluate,
            signature=fns.signature,
            io=fns.io,
            layout=fns.layout,
        )


def tff_round(fns: RoundFunctions) -> FederatedRound:
    """The round's functions composed as TFF computations (see the module docstring)."""
    return tff_round_parts(fns).as_round()


def tff_round_parts(fns: RoundFunctions, worker_data: Optional[WorkerData] = None) -> TffRoundParts:
    """The TFF computations of the round (`TffRoundParts`). With `worker_data`, `next` (and
    `partial_next`) take each client's reference instead of its arrays and the worker reads the
    client's examples itself (`round_inputs.WorkerData`) before its work."""
    signature, k = fns.signature, fns.num_clusters
    has_anchor = bool(signature.anchor)
    cluster_models_type = to_type(fns.cluster_models_spec)
    select_shared = tff.tensorflow.computation(cluster_models_type, tff.TensorType(np.int32))(
        fns.distributor.select_shared
    )
    every_cluster_shared = tff.tensorflow.computation(cluster_models_type)(
        fns.distributor.every_cluster_shared
    )
    # One selection for every client (one cluster): broadcast, as the selection itself.
    one_selection = fns.distributor.same_for_every_client(k)
    selection_type = (
        to_type(fns.selection_spec) if one_selection else sequence_type(fns.selection_spec)
    )
    first_selection = tff.tensorflow.computation(cluster_models_type)(
        lambda cluster_models: fns.distributor.select_shared(cluster_models, tf.constant(0))
    )
    stacked_shared_type = to_type(fns.stacked_shared_spec())
    distributed_type = stacked_shared_type if fns.sends_every_cluster else selection_type

    client_spec, with_arrays = fns.client_spec, lambda client: client
    if worker_data is not None:
        client_spec = collections.OrderedDict(client_spec, data=worker_data.reference_spec)

        def with_arrays(client: dict) -> dict:
            arrays = worker_data.read(client["data"])
            data = {n: tf.cast(arrays[n], s.dtype) for n, s in fns.data_spec.items()}
            return collections.OrderedDict(client, data=collections.OrderedDict(data))

    client_type = to_type(client_spec)
    hparams_type = to_type(fns.hparams_spec)
    # TFF computations take no default arguments: the anchor is a parameter only when sent.
    if has_anchor:
        client_update = tff.tensorflow.computation(
            distributed_type, client_type, hparams_type, to_type(fns.anchor_spec)
        )(
            lambda distributed, client, hparams, anchor: fns.train_client(
                distributed, with_arrays(client), hparams, anchor
            )
        )
    else:
        client_update = tff.tensorflow.computation(distributed_type, client_type, hparams_type)(
            lambda distributed, client, hparams: fns.train_client(
                distributed, with_arrays(client), hparams, ()
            )
        )
    key_of = tff.tensorflow.computation(client_type)(lambda client: client["key"])

    # The aggregator: the mean's own factory, a `tff.aggregators` factory per cluster
    # (`tff_factory_aggregator.py`), or another aggregator's TF functions
    # (`cluster_aggregators.py`): its clients' statistics summed beside their updates, its
    # finalizer from the sums (`finalizers.finalize_aggregate`), its state in the server state.
    is_mean = fns.aggregator.is_mean
    factory_part = factory_round_part(fns, client_update.type_signature.result[2])
    if is_mean:
        aggregator = ClusteredMeanFactory(k).create(
            to_type(fns.shared_spec), tff.TensorType(np.float32, [k])
        )
    has_optimizer = fns.has_optimizer
    # The finalizer: from the cluster means (the whole round) or the per-cluster sums (after
    # `sharded.py` has added the workers' shares).
    finalize_round = (
        finalizers.mean_finalizer(fns, fns.finalize)
        if is_mean
        else None
        if factory_part
        else finalizers.aggregate_finalizer(fns)
    )

    def server_state(
        cluster_models: object, anchor: object, optimizer: object, aggregator_state: object
    ) -> object:
        parts = collections.OrderedDict(cluster_models=cluster_models)
        if has_anchor:
            parts["anchor"] = anchor
        if has_optimizer:
            parts["optimizer"] = optimizer
        parts["aggregator"] = aggregator_state
        return tff.federated_zip(parts)

    @tff.federated_computation()
    def initialize() -> object:
        return server_state(
            server_constant(fns.initial_cluster_models),
            server_constant(fns.initial_anchor) if has_anchor else None,
            server_constant(fns.initial_optimizer_state) if has_optimizer else None,
            aggregator.initialize()
            if is_mean
            else factory_part.initial_slot()
            if factory_part
            else server_constant(fns.aggregator.initial_slot(k)),
        )

    state_type = initialize.type_signature.result

    def distribute(cluster_models: object, keys: object) -> object:
        if one_selection:
            return tff.federated_broadcast(tff.federated_map(first_selection, cluster_models))
        return tff.federated_select(
            keys, tff.federated_value(k, tff.SERVER), cluster_models, select_shared
        )

    next_parameter_types = (
        state_type,
        tff.FederatedType(client_type, tff.CLIENTS),
        tff.FederatedType(hparams_type, tff.SERVER),
    )

    def train_clients(
        state: object, clients: object, hparams: object
    ) -> tuple[object, object, object]:
        """Distributor and client work: `(shared_delta, cluster_weight, outputs)@CLIENTS`.
        `clients`: each client's `round_inputs.client_input`."""
        if fns.sends_every_cluster:
            distributed = tff.federated_broadcast(
                tff.federated_map(every_cluster_shared, state.cluster_models)
            )
        else:
            distributed = distribute(state.cluster_models, tff.federated_map(key_of, clients))
        client_args = [distributed, clients, tff.federated_broadcast(hparams)]
        if has_anchor:
            client_args.append(tff.federated_broadcast(state.anchor))
        return tff.federated_map(client_update, tuple(client_args))

    def after_client_work(finish: Callable[..., Any]) -> tff.Computation:
        """A computation with `next`'s parameters: distributor and client work
        (`train_clients`), then `finish(state, shared_delta, cluster_weight, outputs)` (and
        the clients' statistics last for an aggregator other than the mean)."""

        @tff.federated_computation(*next_parameter_types)
        def computation(state: object, clients: object, hparams: object) -> object:
            return finish(state, *train_clients(state, clients, hparams))

        return computation

    def aggregate_and_apply(
        state: object, shared_delta: object, cluster_weight: object, outputs: object
    ) -> object:
        """Aggregator and finalizer: the whole round."""
        if fns.routes_rows:  # a relay: the mailbox is the peers' to rewrite, nothing is summed
            nothing = collections.OrderedDict(cluster_weight=np.zeros([k], np.float32))
            return state, outputs, tff.federated_value(nothing, tff.SERVER)
        aggregate = aggregator.next(state.aggregator, shared_delta, cluster_weight)
        inputs = [state.cluster_models, aggregate.result, aggregate.measurements.cluster_weight]
        if has_optimizer:
            finalized = tff.federated_map(finalize_round, (*inputs, state.optimizer))
            new_models, optimizer = finalized.cluster_models, finalized.optimizer
        else:
            new_models, optimizer = tff.federated_map(finalize_round, tuple(inputs)), None
        anchor = state.anchor if has_anchor else None
        new_state = server_state(new_models, anchor, optimizer, aggregate.state)
        return new_state, outputs, aggregate.measurements

    def aggregate_privately(
        state: object, shared_delta: object, cluster_weight: object, outputs: object, stats: object
    ) -> object:
        """Aggregator and finalizer of an aggregator other than the mean: the whole round."""
        if factory_part:  # each cluster's process on the clients, masked
            finalized = factory_part.aggregate(state, shared_delta, cluster_weight, outputs)
        else:
            total, total_weight, stats_total = client_sums(shared_delta, cluster_weight, stats)
            inputs = [state.cluster_models, total, total_weight, stats_total, state.aggregator]
            if has_optimizer:
                inputs.append(state.optimizer)
            finalized = tff.federated_map(finalize_round, tuple(inputs))
        optimizer = finalized.optimizer if has_optimizer else None
        anchor = state.anchor if has_anchor else None
        new_state = server_state(finalized.cluster_models, anchor, optimizer, finalized.aggregator)
        return new_state, outputs, finalized.measurements

    def client_sums(shared_delta: object, cluster_weight: object, *stats: object) -> tuple:
        """The per-cluster sums of the clients' updates and weights, and of their statistics
        for an aggregator other than the mean (SERVER-placed)."""
        total, total_weight = ClusterSums(to_type(fns.shared_spec), k)(shared_delta, cluster_weight)
        return (total, total_weight, *(tff.federated_sum(s) for s in stats))

    def sums_only(
        state: object, shared_delta: object, cluster_weight: object, outputs: object, *stats: object
    ) -> object:
        """A share of the clients, up to their per-cluster sums (merged by `sharded.py`)."""
        return (*client_sums(shared_delta, cluster_weight, *stats), outputs)

    def build_evaluate() -> tff.Computation:
        """Evaluation: the same distributor, then each client's joined model on its data."""
        batch_size_type = tff.TensorType(np.int64)
        evaluated_type = to_type(fns.evaluation_client_spec)
        client_evaluate = tff.tensorflow.computation(
            selection_type, evaluated_type, batch_size_type
        )(
            lambda selected, client, batch_size: fns.client_evaluate(
                selected, tuple(client["stored"]), client["data"], batch_size
            )
        )
        key_of_evaluated = tff.tensorflow.computation(evaluated_type)(lambda client: client["key"])

        @tff.federated_computation(
            tff.FederatedType(cluster_models_type, tff.SERVER),
            tff.FederatedType(evaluated_type, tff.CLIENTS),
            tff.FederatedType(batch_size_type, tff.SERVER),
        )
        def evaluate(cluster_models: object, clients: object, batch_size: object) -> object:
            """Each client's arrays (`round_inputs.evaluation_input`) scored in ordered batches of
            `batch_size` with its key's model."""
            keys = None if one_selection else tff.federated_map(key_of_evaluated, clients)
            selected = distribute(cluster_models, keys)
            return tff.federated_map(
                client_evaluate, (selected, clients, tff.federated_broadcast(batch_size))
            )

        return evaluate

    return TffRoundParts(
        initialize=initialize,
        next=after_client_work(aggregate_and_apply if is_mean else aggregate_privately),
        functions=fns,
        builders={
            "partial_next": lambda: after_client_work(sums_only),
            "finalize": lambda: (
                finalizers.mean_finalizer(fns, fns.finalize_sums) if is_mean else finalize_round
            ),
            "evaluate": build_evaluate,
        },
        worker_data=worker_data,
    )
