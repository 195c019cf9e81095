"""The round run on TFF's runtime: its parts as TFF computations placed by federated operators.

`TffExecution` is how `round.ComposedRound` runs on TFF: the distributor's selection broadcast
(or `tff.federated_select`ed for peers), `client_update` `federated_map`ped over the clients,
the aggregator (`SummedAggregation`: the per-cluster sums, one `tff.federated_aggregate`, then
the finalizer at the server; or a `tff.aggregators` factory's own process,
`tff_factory_aggregator.FactoryRoundPart`) and the new state `federated_zip`ped. `TffRoundParts`
holds the built computations: `next` (the whole round), and for `sharded.py` `partial_next`
(distributor, client work and the clients' sums, which add up over any split of the clients)
and `finalize` (the finalizer from merged sums), and `evaluate`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated.clustered_mean import ClusterSums
from tff_clustered.federated.round import ComposedRound
from tff_clustered.federated.round_functions import RoundFunctions
from tff_clustered.federated.round_inputs import ClientInput, WorkerData
from tff_clustered.federated.server_state import ClientSums, ServerState, nothing_aggregated
from tff_clustered.frameworks import tff, to_type


def sequence_type(element_spec: object) -> tff.SequenceType:
    return tff.SequenceType(to_type(element_spec))


def server_constant(value: object) -> object:
    """`tff.federated_value(value, tff.SERVER)` for a structure of arrays, made by a TF
    computation: TFF serializes a literal array value by value (as a Python list, at every
    build of a round), a TF constant as its bytes."""
    make = tff.tensorflow.computation(lambda: tf.nest.map_structure(tf.constant, value))
    return tff.federated_eval(make, tff.SERVER)


class SummedAggregation:
    """The aggregator of the round on TFF as sums: the clients' results summed per cluster
    (`ClusterSums` and their statistics rows), then `RoundFunctions.finalize` at the server."""

    def __init__(self, fns: RoundFunctions) -> None:
        self.fns = fns
        self.sum_updates = ClusterSums(to_type(fns.shared_spec), fns.num_clusters)
        self.finalizer = finalizer_computation(fns)

    def initial_slot(self) -> object:
        return server_constant(self.fns.aggregator.initial_slot(self.fns.num_clusters))

    def client_sums(self, trained: Any) -> object:
        """The per-cluster sums of the clients' results (`ClientSums`, SERVER-placed)."""
        sums, total_weight = self.sum_updates(trained.delta, trained.cluster_weight)
        stats = tff.federated_sum(trained.stats)
        return tff.federated_zip(ClientSums(sums, total_weight, stats))

    def aggregate(self, state: Any, trained: Any) -> object:
        sums = self.client_sums(trained)
        inputs = (state.cluster_models, sums, state.optimizer, state.aggregator)
        return tff.federated_map(self.finalizer, inputs)


def finalizer_computation(fns: RoundFunctions) -> tff.Computation:
    """`RoundFunctions.finalize` as a TFF computation `(cluster_models, ClientSums, optimizer,
    aggregator slot) -> Finalized`."""
    types = (
        to_type(fns.cluster_models_spec),
        to_type(fns.sums_spec),
        to_type(fns.optimizer_state_spec),
        to_type(fns.slot_spec),
    )
    return tff.tensorflow.computation(*types)(
        lambda models, sums, optimizer, slot: fns.finalize(models, *sums, optimizer, slot)
    )


class TffExecution:
    """How `round.ComposedRound` runs on TFF (see the module docstring). With `worker_data`,
    each client's input carries a reference instead of its arrays and the worker reads the
    client's examples itself (`round_inputs.WorkerData`) before its work."""

    def __init__(self, fns: RoundFunctions, worker_data: Optional[WorkerData] = None) -> None:
        self.fns, self.worker_data = fns, worker_data
        k = fns.num_clusters
        self.cluster_models_type = to_type(fns.cluster_models_spec)
        # One selection for every client (one cluster): broadcast, as the selection itself.
        self.one_selection = fns.distributor.same_for_every_client(k)
        self.selection_type = (
            to_type(fns.selection_spec) if self.one_selection else sequence_type(fns.selection_spec)
        )
        client_spec = fns.client_spec
        if worker_data is not None:
            client_spec = client_spec._replace(data=worker_data.reference_spec)
        self.client_type = to_type(client_spec)
        self.hparams_type = to_type(fns.hparams_spec)
        distributed_type = (
            to_type(fns.stacked_shared_spec()) if fns.sends_every_cluster else self.selection_type
        )
        self.client_update = tff.tensorflow.computation(
            distributed_type, self.client_type, self.hparams_type, to_type(fns.anchor_spec)
        )(self.train_client)
        self.aggregation = (
            fns.aggregator.federated_part(fns, self.client_update.type_signature.result)
            if fns.aggregator.tff_computation_only
            else SummedAggregation(fns)
        )

    def with_arrays(self, client: ClientInput) -> ClientInput:
        """The client's input with its arrays (read on the worker when it holds a reference)."""
        if self.worker_data is None:
            return client
        arrays = self.worker_data.read(client.data)
        data = {n: tf.cast(arrays[n], s.dtype) for n, s in self.fns.data_spec.items()}
        return client._replace(data=collections.OrderedDict(data))

    def train_client(self, distributed: Any, client: Any, hparams: Any, anchor: Any) -> Any:
        return self.fns.train_client(distributed, self.with_arrays(client), hparams, anchor)

    def initialize(self) -> object:
        fns = self.fns
        return tff.federated_zip(
            ServerState(
                server_constant(fns.initial_cluster_models),
                server_constant(fns.initial_anchor),
                server_constant(fns.initial_optimizer_state),
                self.aggregation.initial_slot(),
            )
        )

    def distribute(self, cluster_models: object, keys: object) -> object:
        """Each client's selection of the cluster models: one for all, or its key's rows."""
        fns = self.fns
        if self.one_selection:
            first = tff.tensorflow.computation(self.cluster_models_type)(
                lambda models: fns.distributor.select_shared(models, tf.constant(0))
            )
            return tff.federated_broadcast(tff.federated_map(first, cluster_models))
        select = tff.tensorflow.computation(self.cluster_models_type, tff.TensorType(np.int32))(
            fns.distributor.select_shared
        )
        k = tff.federated_value(fns.num_clusters, tff.SERVER)
        return tff.federated_select(keys, k, cluster_models, select)

    def train_clients(self, state: Any, clients: Any, hparams: Any) -> object:
        fns = self.fns
        if fns.sends_every_cluster:
            every = tff.tensorflow.computation(self.cluster_models_type)(
                fns.distributor.every_cluster_shared
            )
            distributed = tff.federated_broadcast(tff.federated_map(every, state.cluster_models))
        else:
            key_of = tff.tensorflow.computation(self.client_type)(lambda client: client.key)
            distributed = self.distribute(state.cluster_models, tff.federated_map(key_of, clients))
        broadcast = (tff.federated_broadcast(hparams), tff.federated_broadcast(state.anchor))
        return tff.federated_map(self.client_update, (distributed, clients, *broadcast))

    def aggregate(self, state: Any, trained: Any) -> object:
        return self.aggregation.aggregate(state, trained)

    def after_round(self, state: Any, finalized: Any) -> object:
        slots = (finalized.cluster_models, state.anchor, finalized.optimizer, finalized.aggregator)
        return tff.federated_zip(ServerState(*slots))

    def nothing_aggregated(self) -> object:
        return tff.federated_value(nothing_aggregated(self.fns.num_clusters), tff.SERVER)

    def partial_next(self, state: Any, clients: Any, hparams: Any) -> tuple[object, object]:
        """A share of the clients, up to their per-cluster sums (merged by `sharded.py`)."""
        trained = self.train_clients(state, clients, hparams)
        return self.aggregation.client_sums(trained), trained.outputs

    def evaluate(self, cluster_models: Any, clients: Any, batch_size: Any) -> object:
        """Each client's arrays (`round_inputs.evaluation_input`) scored in ordered batches of
        `batch_size` with its key's model (the same distributor as training)."""
        fns, evaluated_type = self.fns, to_type(self.fns.evaluation_client_spec)
        client_evaluate = tff.tensorflow.computation(
            self.selection_type, evaluated_type, tff.TensorType(np.int64)
        )(
            lambda selected, client, size: fns.client_evaluate(
                selected, tuple(client.stored), client.data, size
            )
        )
        key_of = tff.tensorflow.computation(evaluated_type)(lambda client: client.key)
        keys = None if self.one_selection else tff.federated_map(key_of, clients)
        selected = self.distribute(cluster_models, keys)
        return tff.federated_map(
            client_evaluate, (selected, clients, tff.federated_broadcast(batch_size))
        )

    def next_types(self) -> tuple:
        return (
            self.initialize_computation.type_signature.result,
            tff.FederatedType(self.client_type, tff.CLIENTS),
            tff.FederatedType(self.hparams_type, tff.SERVER),
        )

    @functools.cached_property
    def initialize_computation(self) -> tff.Computation:
        return tff.federated_computation()(self.initialize)


@dataclasses.dataclass
class TffRoundParts:
    """The round's TFF computations. `next` is the whole round on one worker (the composed
    round traced as one federated computation); `partial_next` (same arguments) stops after
    the clients' work and returns their `ClientSums` (SERVER-placed) and outputs, and
    `finalize(cluster_models, sums, optimizer, aggregator slot) -> Finalized` turns sums,
    added up over any split of the clients, into the new slots: `next` equals `partial_next`
    then `finalize` (`sharded.py` runs them on several workers).

    `next`, `partial_next`, `finalize` and `evaluate` are built (traced and serialized) when
    first used: a run on one worker never uses `partial_next` or `finalize`, and FedTSDP
    builds a round for every split it shrinks to, often without evaluating it."""

    execution: TffExecution

    @property
    def functions(self) -> RoundFunctions:
        return self.execution.fns

    @property
    def worker_data(self) -> Optional[WorkerData]:
        return self.execution.worker_data

    @property
    def initialize(self) -> tff.Computation:
        return self.execution.initialize_computation

    @functools.cached_property
    def next(self) -> tff.Computation:
        composed = ComposedRound(self.execution, self.functions.routes_rows)
        return tff.federated_computation(*self.execution.next_types())(composed.next)

    @functools.cached_property
    def partial_next(self) -> tff.Computation:
        types = self.execution.next_types()
        return tff.federated_computation(*types)(self.execution.partial_next)

    @functools.cached_property
    def finalize(self) -> tff.Computation:
        return finalizer_computation(self.functions)

    @functools.cached_property
    def evaluate(self) -> tff.Computation:
        fns = self.functions
        return tff.federated_computation(
            tff.FederatedType(to_type(fns.cluster_models_spec), tff.SERVER),
            tff.FederatedType(to_type(fns.evaluation_client_spec), tff.CLIENTS),
            tff.FederatedType(tff.TensorType(np.int64), tff.SERVER),
        )(self.execution.evaluate)


def tff_round_parts(fns: RoundFunctions, worker_data: Optional[WorkerData] = None) -> TffRoundParts:
    """The TFF computations of the round (`TffRoundParts`)."""
    return TffRoundParts(TffExecution(fns, worker_data))
