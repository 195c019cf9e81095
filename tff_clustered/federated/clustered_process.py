"""The cluster-indexed federated core: one round and one evaluation as TFF computations.

Server state holds `num_clusters` full models stacked along a leading cluster axis. A round
(`next`) follows the shape of `tff.learning.templates` (distributor -> client work ->
aggregator -> finalizer):

* distributor: `tff.federated_select` sends each client the **base** tensors of its own
  cluster (its key);
* client work: the client joins them with its **personal** tensors (a CLIENTS-placed input),
  runs local SGD (`client_work.train_client`) and returns its base update;
* aggregator: `ClusteredMeanFactory`, the example-weighted mean per cluster;
* finalizer: adds each cluster's mean update to its base tensors; a cluster with no sampled
  client gets a zero update and keeps its model bit for bit. Personal tensors are never
  aggregated: their slots in the server state stay as initialised.

`tff.learning.templates.compose_learning_process` cannot express this: its `next` takes only
`(state, client_data)` and returns no per-client values, while we need cluster keys and
personal weights in, and personal weights and (for clustering) model updates out. So the
pieces are composed by hand into a `tff.templates.IterativeProcess` whose `next` returns
`(state, client_outputs@CLIENTS, metrics@SERVER)`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.federated import client_work
from tff_clustered.federated.clustered_mean import ClusteredMeanFactory
from tff_clustered.models.keras_models import ModelSpec
from tff_clustered.models.split import ResolvedSplit

to_type = tff.types.tensorflow_to_type  # TF specs -> TFF types (0.87's tff.to_type rejects them)


def sequence_type(element_spec: object) -> tff.SequenceType:
    return tff.SequenceType(to_type(element_spec))


def round_hparams(learning_rate: float) -> dict:
    """The SERVER-placed per-round hyperparameters `next` takes (broadcast to clients)."""
    return collections.OrderedDict(learning_rate=np.float32(learning_rate))


@dataclasses.dataclass
class ClusteredProcess:
    """The built computations plus what is needed to feed them."""

    iterative_process: tff.templates.IterativeProcess
    evaluate: tff.Computation
    split: ResolvedSplit
    num_clusters: int
    weight_shapes: tuple[tuple[int, ...], ...]

    @property
    def initialize(self) -> tff.Computation:
        return self.iterative_process.initialize

    @property
    def next(self) -> tff.Computation:
        return self.iterative_process.next

    def personal_part(self, weights: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(weights[i], np.float32) for i in self.split.personal)


def build_clustered_process(
    model: ModelSpec,
    split: ResolvedSplit,
    num_clusters: int,
    initial_weights: Sequence[np.ndarray],
    prox_mu: float = 0.0,
    momentum: float = 0.0,
    return_model_deltas: bool = False,
    client_weighting: str = "num_examples",
) -> ClusteredProcess:
    """Builds `initialize`/`next` and `evaluate` for one model, split and cluster count.

    `initial_weights` (one model) initialises every cluster; algorithms that start clusters
    differently (IFCA, FedGroup) overwrite `state["cluster_models"]` before round 1.
    `prox_mu` (FedProx) and client `momentum` are fixed for the process; the learning rate
    comes with each round (schedules). `return_model_deltas` adds each client's flattened
    full-model update to its outputs (what server-side clustering needs), at no extra
    training cost. `client_weighting` is `num_examples` (FedAvg) or `uniform` (FeSEM Eq. 9).
    """
    if client_weighting not in ("num_examples", "uniform"):
        raise ValueError(
            f"client_weighting must be num_examples or uniform, got {client_weighting}"
        )
    keras_model = model.build()
    resolved = split
    if len(keras_model.trainable_weights) != resolved.num_tensors:
        raise ValueError("split was resolved for a different model")
    functional = tff.learning.models.functional_model_from_keras(
        keras_model,
        loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(model.input_spec()),
    )
    non_trainable = tuple(functional.initial_weights[1])

    def predict(weights: Sequence[tf.Tensor], x: tf.Tensor, training: bool) -> tf.Tensor:
        return functional.predict_on_batch((tuple(weights), non_trainable), x, training)

    shapes = tuple(tuple(int(d) for d in w.shape) for w in keras_model.trainable_weights)
    if [tuple(np.shape(w)) for w in initial_weights] != list(shapes):
        raise ValueError("initial_weights do not match the model's trainable weight shapes")
    base_idx, personal_idx = resolved.base, resolved.personal
    k = num_clusters

    def specs(indices: Sequence[int], lead: tuple[int, ...] = ()) -> tuple[tf.TensorSpec, ...]:
        return tuple(tf.TensorSpec([*lead, *shapes[i]], tf.float32) for i in indices)

    cluster_models_spec = specs(range(len(shapes)), (k,))
    base_spec, personal_spec = specs(base_idx), specs(personal_idx)
    data_type = sequence_type(collections.OrderedDict(model.input_spec()))
    key_spec = tf.TensorSpec([1], tf.int32)
    hparams_spec = collections.OrderedDict(
        (name, tf.TensorSpec([], tf.float32)) for name in round_hparams(0.0)
    )

    def join(base: Sequence[tf.Tensor], personal: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        weights: list = [None] * len(shapes)
        for i, t in zip(base_idx, base):
            weights[i] = t
        for i, t in zip(personal_idx, personal):
            weights[i] = t
        return weights

    @tff.tensorflow.computation(to_type(cluster_models_spec), tff.TensorType(np.int32))
    def select_base(cluster_models: tuple, key: tf.Tensor) -> tuple:
        # The key leads the selection so that it is never an empty structure (TF datasets
        # cannot hold one), which purely local models (no base tensors) would give.
        return (key, *(tf.gather(cluster_models[i], key) for i in base_idx))

    selection_type = sequence_type((tf.TensorSpec([], tf.int32), *base_spec))

    def first_element(selected: tf.data.Dataset) -> tuple:
        initial = (tf.constant(0), *(tf.zeros(s.shape) for s in base_spec))
        return selected.reduce(initial, lambda _, x: x)[1:]

    @tff.tensorflow.computation(
        selection_type,
        to_type(personal_spec),
        data_type,
        to_type(key_spec),
        tff.TensorType(np.float32),
        to_type(hparams_spec),
    )
    def client_update(
        selected: tf.data.Dataset,
        personal: tuple,
        dataset: tf.data.Dataset,
        key: tf.Tensor,
        prox_scale: tf.Tensor,
        hparams: dict,
    ) -> tuple:
        start = join(first_element(selected), personal)
        result = client_work.train_client(
            predict,
            start,
            dataset,
            hparams["learning_rate"],
            prox_mu=float(prox_mu),
            momentum=float(momentum),
            prox_scale=prox_scale,
        )
        base_delta = tuple(result.weights[i] - start[i] for i in base_idx)
        weight = result.num_examples if client_weighting == "num_examples" else 1.0
        cluster_weight = tf.one_hot(key[0], k, dtype=tf.float32) * weight
        outputs = collections.OrderedDict(
            personal=tuple(result.weights[i] for i in personal_idx),
            num_examples=result.num_examples,
            loss_sum=result.loss_sum,
        )
        if return_model_deltas:
            outputs["model_delta"] = client_work.flatten(
                [w - s for w, s in zip(result.weights, start)]
            )
        return base_delta, cluster_weight, outputs

    aggregator = ClusteredMeanFactory(k).create(to_type(base_spec), tff.TensorType(np.float32, [k]))

    @tff.tensorflow.computation(to_type(cluster_models_spec), to_type(specs(base_idx, (k,))))
    def apply_cluster_updates(cluster_models: tuple, mean_deltas: tuple) -> tuple:
        updated = list(cluster_models)
        for i, delta in zip(base_idx, mean_deltas):
            updated[i] = cluster_models[i] + delta
        return tuple(updated)

    stacked = tuple(np.repeat(np.asarray(w, np.float32)[None], k, axis=0) for w in initial_weights)

    @tff.federated_computation()
    def initialize() -> object:
        return tff.federated_zip(
            collections.OrderedDict(
                cluster_models=tff.federated_value(stacked, tff.SERVER),
                aggregator=aggregator.initialize(),
            )
        )

    state_type = initialize.type_signature.result
    clients = lambda spec: tff.FederatedType(to_type(spec), tff.CLIENTS)  # noqa: E731

    def distribute(cluster_models: object, keys: object) -> object:
        return tff.federated_select(
            keys, tff.federated_value(k, tff.SERVER), cluster_models, select_base
        )

    @tff.federated_computation(
        state_type,
        tff.FederatedType(data_type, tff.CLIENTS),
        clients(key_spec),
        clients(personal_spec),
        tff.FederatedType(np.float32, tff.CLIENTS),
        tff.FederatedType(to_type(hparams_spec), tff.SERVER),
    )
    def next_fn(
        state: object,
        datasets: object,
        keys: object,
        personal: object,
        prox_scales: object,
        hparams: object,
    ) -> object:
        """`prox_scales`: per-client factor of the proximal strength (1.0: plain FedProx)."""
        selected = distribute(state.cluster_models, keys)
        base_delta, cluster_weight, outputs = tff.federated_map(
            client_update,
            (selected, personal, datasets, keys, prox_scales, tff.federated_broadcast(hparams)),
        )
        aggregate = aggregator.next(state.aggregator, base_delta, cluster_weight)
        new_models = tff.federated_map(
            apply_cluster_updates, (state.cluster_models, aggregate.result)
        )
        new_state = tff.federated_zip(
            collections.OrderedDict(cluster_models=new_models, aggregator=aggregate.state)
        )
        return new_state, outputs, aggregate.measurements

    @tff.tensorflow.computation(selection_type, to_type(personal_spec), data_type)
    def client_evaluate(selected: tf.data.Dataset, personal: tuple, dataset: object) -> dict:
        weights = join(first_element(selected), personal)
        return client_work.evaluate_client(predict, weights, dataset)._asdict()

    @tff.federated_computation(
        tff.FederatedType(to_type(cluster_models_spec), tff.SERVER),
        tff.FederatedType(data_type, tff.CLIENTS),
        clients(key_spec),
        clients(personal_spec),
    )
    def evaluate(
        cluster_models: object, datasets: object, keys: object, personal: object
    ) -> object:
        selected = distribute(cluster_models, keys)
        return tff.federated_map(client_evaluate, (selected, personal, datasets))

    return ClusteredProcess(
        iterative_process=tff.templates.IterativeProcess(initialize, next_fn),
        evaluate=evaluate,
        split=resolved,
        num_clusters=k,
        weight_shapes=shapes,
    )
