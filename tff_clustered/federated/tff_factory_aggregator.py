"""Any `tff.aggregators` factory as the round's aggregator, one instance per cluster.

`TffFactoryPerCluster(factory)` takes a `tff.aggregators.WeightedAggregationFactory` (e.g.
`tff.aggregators.MeanFactory()`, `tff.learning.robust_aggregator(...)`) or an
`UnweightedAggregationFactory` (e.g. `tff.learning.dp_aggregator(...)`). The round creates one
`tff.templates.AggregationProcess` from it for the clients' shared update type and, for each
cluster k, calls that process's `next(state_k, value_k[, weight_k])` inside the round's
federated computation (the cluster-coordinate aggregation of Google's HypCluster benchmark,
`build_coordinate_aggregator` in google-research/federated's personalization_benchmark):

* `value_k` is each client's shared update when it trained in cluster k, zeros otherwise;
* `weight_k` (weighted factories) its weight in cluster k (its examples or 1, as the round
  weighs clients; 0 for another cluster's client and for a client whose update diverged).

TFF cannot select a subset of CLIENTS inside one computation, so every cluster's process sees
every client of the round, the others masked. For a weighted factory whose state and result
read only weighted sums (`MeanFactory`; `clipping_factory` with a fixed norm) this is exactly
the factory run on the cluster's own clients: a masked client adds 0 with weight 0. Where a
factory reads every client, the masked ones count:

* adaptive clipping or zeroing (`robust_aggregator`'s estimates of the update-norm quantile)
  counts a masked client's zero update as a client below its norm, so each cluster's norm
  moves as if it held every client of the round, its own ones' norms and zeros for the rest;
* a clipped or zeroed count counts clients of every cluster (a zero update is never clipped);
* an unweighted mean (`UnweightedMeanFactory`) divides by the round's number of clients, not
  the cluster's; DP's (`tff.learning.dp_aggregator`) divides by its fixed expected count
  whatever the cluster's clients, and adds its noise to every cluster each round. The run
  claims no epsilon for it (the account of a factory's noise is yours).

A cluster no client trained in this round (weighted: total weight 0; unweighted: no client of
it) keeps its model and its process's state bit for bit (its process still runs on the masked
clients, and what it measured is reported). The K states live in the server state's
`aggregator` slot as `{"state": {path: [K, ...]}}`, each leaf of the process's state (path:
its names joined by "/") stacked along a cluster axis, so the loop keeps and checkpoints them
as it keeps any aggregator's (`loop.aggregation`). Each process's scalar measurements become
`{path: [K]}` (metrics.csv's `path_cluster_k`); non-scalar or string ones are left out.

A factory runs only as a TFF computation on one worker: the in-process execution and a round
split over several workers (whose partial sums a factory's state update cannot be cut into)
refuse it before any training (`executions.Execution.check_aggregator`), and so is a factory with a
secure sum (`tff.learning.secure_aggregator()`), which TFF 0.87's C++ worker cannot run.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import factory_inspection
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.round_functions import RoundFunctions
from tff_clustered.federated.server_state import Finalized
from tff_clustered.frameworks import tff, to_type


def is_factory(obj: object) -> bool:
    """Whether `obj` is a `tff.aggregators` factory (weighted or unweighted); TFF is not
    imported to tell: a program that made one has imported it."""
    return tff.imported and isinstance(
        obj,
        (tff.aggregators.WeightedAggregationFactory, tff.aggregators.UnweightedAggregationFactory),
    )


@dataclasses.dataclass(frozen=True)
class TffFactoryPerCluster(ClusterAggregator):
    """One instance of the `tff.aggregators` factory `factory` per cluster (see the module
    docstring). `description` names it in the run's settings (summary.json, checkpoints; a
    resumed run must give the same): default, the factory's class. The settings also record
    its `parameters`, so a resumed run with other ones is refused."""

    factory: Any
    description: str = ""

    name: ClassVar[str] = "tff_factory"
    tff_computation_only: ClassVar[bool] = True
    summary: ClassVar[str] = (
        "any tff.aggregators factory, one instance per cluster (a Python object: the Python "
        "API's only, on one TFF worker)"
    )
    named: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not is_factory(self.factory):
            raise TypeError(
                "TffFactoryPerCluster takes a tff.aggregators.WeightedAggregationFactory or "
                f"UnweightedAggregationFactory, got {type(self.factory).__name__}; give e.g. "
                "tff.aggregators.MeanFactory() or tff.learning.robust_aggregator()"
            )
        super().__post_init__()  # description a string
        if not self.description:
            kind = type(self.factory)
            object.__setattr__(self, "description", f"{kind.__module__}.{kind.__qualname__}")

    @classmethod
    def record(cls, options: Optional[TffFactoryPerCluster] = None) -> dict[str, Any]:
        """The factory as its description (a Python object is not a value a file holds) and,
        beside it, its parameters (`factory_inspection.factory_parameters`): the readable ones
        by path, and the paths of those inside TFF computations, which cannot be read."""
        if options is None:
            return {"factory": None}
        parameters = options.parameters
        return {
            "factory": options.description,
            "factory_parameters": dict(parameters.values),
            "factory_parameters_unread": list(parameters.unread),
        }

    def resume_warning(self) -> str:
        """The factory's parameters a checkpoint could not record (inside TFF computations)."""
        return factory_inspection.unread_warning(self.description, self.parameters)

    @property
    def weighted(self) -> bool:
        return isinstance(self.factory, tff.aggregators.WeightedAggregationFactory)

    def check_workers(self, num_workers: int = 1) -> None:
        """Also refuses a factory with a secure sum (`tff.learning.secure_aggregator()`,
        `tff.aggregators.SecureSumFactory`...): TFF 0.87's C++ worker has no secure intrinsic
        and would fail in round 1 ("Cannot embed a federated value")."""
        super().check_workers(num_workers)
        if self.secure_intrinsics:
            raise ValueError(
                f"the tff.aggregators factory {self.description} sums securely "
                f"({', '.join(self.secure_intrinsics)}), which TFF's C++ worker cannot run; "
                'use aggregator="secure" (or tff_clustered.ClusterSecure(...)): the robust '
                "aggregator with TFF's secure sum's arithmetic, per cluster"
            )

    @functools.cached_property
    def secure_intrinsics(self) -> tuple[str, ...]:
        """The secure-sum intrinsics the factory's process calls (built for a small value: a
        secure sum nested anywhere is seen); none when the process cannot be built for that
        value (the run's own build names the factory's error)."""
        try:
            process = self.process(tff.TensorType(np.float32, [2]))
        except Exception:  # the factory's own error comes with the real type
            return ()
        return factory_inspection.secure_intrinsics(process)

    @functools.cached_property
    def parameters(self) -> factory_inspection.FactoryParameters:
        """The factory's parameters the run's settings record (`factory_inspection`)."""
        return factory_inspection.factory_parameters(self.factory)

    def process(self, value_type: tff.types.Type) -> tff.templates.AggregationProcess:
        """The factory's process for one cluster's values of `value_type`."""
        if self.weighted:
            return self.factory.create(value_type, tff.TensorType(np.float32))
        return self.factory.create(value_type)

    def federated_part(
        self, fns: RoundFunctions, client_result_type: tff.types.Type
    ) -> FactoryRoundPart:
        """The round's aggregator as federated code (`tff_execution.TffExecution`), for the
        clients' results of `client_result_type` (one client's `ClientResult`)."""
        process = self.process(to_type(fns.shared_spec))
        return FactoryRoundPart(fns, process, client_result_type.outputs)

    def state_or_initial(
        self, state: Optional[Mapping[str, np.ndarray]], num_clusters: int
    ) -> Optional[collections.OrderedDict]:
        """`state` while each entry holds `num_clusters` rows, else None: the built round's
        initial state (the process's, which depends on the update's type)."""
        if state is None or any(len(np.asarray(v)) != num_clusters for v in state.values()):
            return None
        return collections.OrderedDict((key, np.asarray(value)) for key, value in state.items())


# -- the process's state and measurements as flat leaves -------------------------------------


def leaf_types(structure: tff.types.Type, prefix: str = "") -> list[tuple[str, tff.TensorType]]:
    """The tensors of a (nested) struct type in order, each with its path (names, or indices
    where unnamed, joined by "/")."""
    if isinstance(structure, tff.TensorType):
        return [(prefix, structure)]
    leaves = []
    for index, (name, element) in enumerate(tff.structure.iter_elements(structure)):
        key = name if name is not None else str(index)
        leaves.extend(leaf_types(element, f"{prefix}/{key}" if prefix else key))
    return leaves


def pack(structure: tff.types.Type, leaves: Sequence[tf.Tensor]) -> Any:
    """`leaves` (in `leaf_types` order) in the nesting of `structure`: named structs as
    OrderedDicts, unnamed ones as tuples."""
    remaining = list(leaves)

    def build(element: tff.types.Type) -> Any:
        if isinstance(element, tff.TensorType):
            return remaining.pop(0)
        parts = [(name, build(e)) for name, e in tff.structure.iter_elements(element)]
        if parts and all(name is not None for name, _ in parts):
            return collections.OrderedDict(parts)
        return tuple(value for _, value in parts)

    return build(structure)


def flat_leaves(value: Any) -> list[tf.Tensor]:
    """The tensors of a nested value (TFF structs, Python containers) in `leaf_types` order:
    containers' own order, never `tf.nest`'s sorted keys."""
    if isinstance(value, (tf.Tensor, np.ndarray)):
        return [tf.convert_to_tensor(value)]
    struct = tff.structure.from_container(value, recursive=True)
    return [tf.convert_to_tensor(t) for t in tff.structure.flatten(struct)]


def scalar_measurements(measurement_type: tff.types.Type) -> list[tuple[int, str]]:
    """The numeric scalar leaves of a process's measurements: (position, path)."""
    return [
        (i, path)
        for i, (path, leaf) in enumerate(leaf_types(measurement_type))
        if len(leaf.shape) == 0 and np.dtype(leaf.dtype).kind in "biuf"
    ]


# -- the round's part -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FactoryRoundPart:
    """The aggregator and finalizer of a round whose aggregator is a `TffFactoryPerCluster`,
    as federated code `tff_execution.TffExecution` calls, as it calls its
    `SummedAggregation`: `initial_slot()` (SERVER-placed: K copies of the process's initial
    state) and `aggregate(state, trained)` -> the finalizer's SERVER-placed
    `server_state.Finalized`."""

    fns: RoundFunctions
    process: tff.templates.AggregationProcess
    outputs_type: tff.types.Type  # one client's outputs (`ClientResult.outputs`)

    @property
    def num_clusters(self) -> int:
        return self.fns.num_clusters

    @property
    def aggregator(self) -> TffFactoryPerCluster:
        return self.fns.aggregator

    @property
    def state_type(self) -> tff.types.Type:
        return self.process.initialize.type_signature.result.member

    def slot_spec(self) -> collections.OrderedDict:
        """TF specs of the server state's `aggregator` slot."""
        k = self.num_clusters
        state = collections.OrderedDict(
            (path, tf.TensorSpec([k, *leaf.shape], leaf.dtype))
            for path, leaf in leaf_types(self.state_type)
        )
        inputs = self.aggregator.initial_slot(k)["inputs"]
        return collections.OrderedDict(
            state=state,
            inputs=tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), inputs),
        )

    def initial_slot(self) -> object:
        """The slot of the round's initial server state: the process's initial state K times."""
        k, paths = self.num_clusters, [p for p, _ in leaf_types(self.state_type)]
        inputs = self.aggregator.initial_slot(k)["inputs"]

        @tff.tensorflow.computation(self.state_type)
        def replicated(state: Any) -> collections.OrderedDict:
            stacked = collections.OrderedDict(
                (path, tf.stack([leaf] * k)) for path, leaf in zip(paths, flat_leaves(state))
            )
            constant = tf.nest.map_structure(tf.constant, inputs)
            return collections.OrderedDict(state=stacked, inputs=constant)

        return tff.federated_map(replicated, self.process.initialize())

    def aggregate(self, state: Any, trained: Any) -> object:
        """Each cluster's process on its masked clients, then the finalizer (federated)."""
        fns, k, process = self.fns, self.num_clusters, self.process
        shared_delta, cluster_weight = trained.delta, trained.cluster_weight
        weighted = self.aggregator.weighted
        value_type = to_type(fns.shared_spec)
        # A diverged client (its update zeroed) is in no cluster: masked in every process.
        cluster_of = tff.tensorflow.computation(self.outputs_type)(
            lambda o: tf.where(o["finite"], o["cluster"], -1)
        )
        clusters = tff.federated_map(cluster_of, trained.outputs)
        members = tff.federated_sum(
            tff.federated_map(
                tff.tensorflow.computation(tf.int32)(lambda c: tf.one_hot(c, k, dtype=tf.float32)),
                clusters,
            )
        )
        results, states, measurements = [], [], []
        for cluster in range(k):
            row_state = tff.federated_map(self.row_state(cluster), state.aggregator.state)
            value = tff.federated_map(
                self.masked_value(cluster, value_type), (shared_delta, clusters)
            )
            if weighted:
                weight = tff.federated_map(self.weight_in(cluster), cluster_weight)
                step = process.next(row_state, value, weight)
            else:
                step = process.next(row_state, value)
            results.append(step.result)
            states.append(step.state)
            measurements.append(step.measurements)
        inputs = [
            state.cluster_models,
            tff.federated_zip(tuple(results)),
            tff.federated_zip(tuple(states)),
            tff.federated_zip(tuple(measurements)),
            state.aggregator,
            tff.federated_sum(cluster_weight),
            members,
            state.optimizer,
        ]
        return tff.federated_map(self.finalizer(), tuple(inputs))

    def row_state(self, cluster: int) -> tff.Computation:
        """Cluster `cluster`'s process state from the stacked leaves."""
        structure, paths = self.state_type, [p for p, _ in leaf_types(self.state_type)]
        stacked_type = to_type(self.slot_spec()["state"])

        @tff.tensorflow.computation(stacked_type)
        def row(stacked: Any) -> Any:
            return pack(structure, [stacked[path][cluster] for path in paths])

        return row

    def weight_in(self, cluster: int) -> tff.Computation:
        """A client's weight in cluster `cluster` (its row's entry: 0 for another's client)."""
        return tff.tensorflow.computation(tff.TensorType(np.float32, [self.num_clusters]))(
            lambda cluster_weight: cluster_weight[cluster]
        )

    def masked_value(self, cluster: int, value_type: tff.types.Type) -> tff.Computation:
        """A client's update for cluster `cluster`'s process: its own, or zeros when it
        trained in another cluster."""

        @tff.tensorflow.computation(value_type, tf.int32)
        def masked(delta: Any, client_cluster: tf.Tensor) -> tuple:
            mine = tf.equal(client_cluster, cluster)
            return tuple(tf.where(mine, t, tf.zeros_like(t)) for t in delta)

        return masked

    def finalizer(self) -> tff.Computation:
        """`finalize_rows` as a TFF computation."""
        fns, k = self.fns, self.num_clusters
        step_type = self.process.next.type_signature.result
        types = [
            to_type(fns.cluster_models_spec),
            tff.StructType([step_type.result.member] * k),
            tff.StructType([self.state_type] * k),
            tff.StructType([step_type.measurements.member] * k),
            to_type(self.slot_spec()),
            tff.TensorType(np.float32, [k]),
            tff.TensorType(np.float32, [k]),
            to_type(fns.optimizer_state_spec),
        ]
        return tff.tensorflow.computation(*types)(self.finalize_rows)

    def finalize_rows(
        self,
        models: Any,
        results: Any,
        states: Any,
        measured: Any,
        slot: Any,
        total_weight: tf.Tensor,
        members: tf.Tensor,
        optimizer: Any,
    ) -> Finalized:
        """The finalizer from each cluster's process step (`results`, `states`, `measured`,
        one per cluster): each updated cluster's result added and the server optimizer's step
        taken; the others keep their model and process state."""
        k = self.num_clusters
        updated = total_weight > 0 if self.aggregator.weighted else members > 0
        rows = [flat_leaves(results[c]) for c in range(k)]
        means = tuple(
            where_rows(updated, tf.stack([row[i] for row in rows]), 0) for i in range(len(rows[0]))
        )
        new_models, new_optimizer = self.fns.apply_means(tuple(models), means, updated, optimizer)
        new_leaves = [flat_leaves(states[c]) for c in range(k)]
        new_state = collections.OrderedDict(
            (path, where_rows(updated, tf.stack([row[i] for row in new_leaves]), old))
            for i, (path, old) in enumerate(slot["state"].items())
        )
        measured_leaves = [flat_leaves(measured[c]) for c in range(k)]
        reported = collections.OrderedDict(cluster_weight=total_weight)
        measurement_type = self.process.next.type_signature.result.measurements.member
        for i, path in scalar_measurements(measurement_type):
            reported[path] = tf.stack([row[i] for row in measured_leaves])
        new_slot = collections.OrderedDict(state=new_state, inputs=slot["inputs"])
        return Finalized(new_models, new_optimizer, new_slot, reported)


def where_rows(rows: tf.Tensor, stacked: tf.Tensor, otherwise: Any) -> tf.Tensor:
    """`stacked`'s rows that `rows` ([K] bool) names, `otherwise`'s elsewhere."""
    shaped = tf.reshape(rows, [-1] + [1] * (len(stacked.shape) - 1))
    other = tf.broadcast_to(tf.cast(otherwise, stacked.dtype), tf.shape(stacked))
    return tf.where(shaped, stacked, other)
