"""The round's parts as plain TF functions, before any runtime wraps them: the distributor
(`distributors.py`), one client's work (the signature's `ClientWork`, `client_work.py`) with
the bookkeeping around it (a diverged client's update zeroed, its weight in its cluster), the
finalizer (each cluster's mean update added to its shared variables) and a client's scoring.
The aggregator between them is `clustered_mean.py` for the mean, or the signature's
`ClusterAggregator`'s TF functions (`cluster_aggregators.py`, `finalizers.py`).
`round.tff_round_parts` makes these TFF computations; `in_process.in_process_round` runs the
very same functions in this process."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import client_work, local_training, server_optimizers
from tff_clustered.federated.batching import ArrayBatches
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.clustered_mean import cluster_mean
from tff_clustered.federated.distributors import ClientSide, Distributor
from tff_clustered.federated.round_inputs import client_seed, round_hparams
from tff_clustered.federated.signature import ModelLayout, RoundIO, RoundSignature
from tff_clustered.models.functional import FunctionalModel


def example_count(data: dict) -> int:
    """Examples in one client's arrays (the length of the first)."""
    return len(next(iter(data.values())))


def python_server_state(
    cluster_models: Sequence[Any],
    anchor: Optional[Sequence[Any]],
    optimizer: Optional[Mapping[str, Any]] = None,
    aggregator: Any = (),
) -> collections.OrderedDict:
    """The round's server state as the TFF round returns it, for executions that build it in
    Python: cluster models, the anchor and the server optimizer's state when the round has
    them, the aggregator's slot (empty for the mean; `ClusterAggregator.server_slot`)."""
    state = collections.OrderedDict(cluster_models=tuple(cluster_models))
    if anchor is not None:
        state["anchor"] = tuple(anchor)
    if optimizer is not None:
        state["optimizer"] = collections.OrderedDict(optimizer)
    state["aggregator"] = aggregator
    return state


@dataclasses.dataclass(frozen=True)
class RoundFunctions:
    """The TF functions of one signature's round and the specs of what they take, before any
    execution wraps them. The TFF round makes them `tff.tensorflow.computation`s placed by
    federated operators; the in-process round runs the very same functions as `tf.function`s.

    * `distributor` (`distributors.py`): its `select_shared(cluster_models, key)` is
      federated_select's select function (peers' rows; the per-client evaluation), its
      `every_cluster_shared(cluster_models)` what is broadcast to a client that takes its
      cluster's row or picks one, its `receive` the client's side of both, its `settle`
      the cluster the update counts in and the row it is taken against, after the work;
    * `padded_client_update(distributed, stored, data, key, client_scalar, seed, hparams,
      anchor, size)`: one client's work -> `(shared_delta, cluster_weight, outputs)`, and
      its statistics row for the aggregator (`[K, stats_width]`) last unless the aggregator
      is the mean (`cluster_aggregators.py`; its update and weight are then preprocessed);
      `distributed` is a dataset of the one selection, or every cluster's shared variables;
      `size`: the client holds the first `size` rows of `data` (padded arrays, masked batches:
      `ArrayBatches`; exact for a `rows_independent` model), None for all of them;
      `train_client(distributed, client, hparams, anchor)` is the same for one
      `round_inputs.client_input`;
    * `finalize(cluster_models, mean_deltas, cluster_weight, optimizer_state) ->
      (cluster_models, optimizer_state)`: the finalizer, each cluster's mean update added to
      its shared variables, then the server optimizer's step (`server_optimizers.server_step`;
      the identity when `has_optimizer` is false, with `{}` for its state) for the clusters
      some client trained in; `apply_means(cluster_models, mean_deltas, updated,
      optimizer_state)` the same for the clusters `updated` names;
    * `client_evaluate(selected, stored, data, batch_size, size)`: one client's scores
      (`size`: as for `padded_client_update`).
    The aggregation between them is `clustered_mean`'s `add_to_cluster` and `cluster_mean`.
    """

    signature: RoundSignature
    io: RoundIO
    layout: ModelLayout
    cluster_models_spec: tuple
    shared_spec: tuple
    store_in_spec: tuple
    anchor_spec: tuple
    data_spec: dict
    key_spec: tf.TensorSpec
    seed_spec: dict
    hparams_spec: dict
    initial_cluster_models: tuple
    initial_anchor: tuple
    optimizer_state_spec: Any
    initial_optimizer_state: Any
    distributor: Distributor
    padded_client_update: Callable[..., tuple]
    finalize: Callable[..., tuple]
    apply_means: Callable[..., tuple]
    client_evaluate: Callable[..., dict]
    rows_independent: bool = False  # the model's `rows_independent`: padded clients are exact

    @property
    def num_clusters(self) -> int:
        return self.signature.num_clusters

    @property
    def has_optimizer(self) -> bool:
        return not self.signature.server_optimizer.is_identity

    @property
    def aggregator(self) -> ClusterAggregator:
        return self.signature.aggregator

    def finalize_sums(
        self, cluster_models: tuple, sums: tuple, total_weight: tf.Tensor, optimizer_state: Any
    ) -> tuple:
        """`finalize` from the per-cluster sums of the weighted updates and their weights."""
        mean = cluster_mean(sums, total_weight)
        return self.finalize(cluster_models, mean, total_weight, optimizer_state)

    @property
    def sends_every_cluster(self) -> bool:
        return self.distributor.sends_every_cluster

    @property
    def routes_rows(self) -> bool:
        return self.distributor.relays

    @property
    def selection_spec(self) -> tuple:
        return (tf.TensorSpec([], tf.int32), *self.shared_spec)

    @property
    def evaluation_client_spec(self) -> dict:
        """One client's input to `evaluate` (`round_inputs.evaluation_input`)."""
        return collections.OrderedDict(
            data=self.data_spec, key=self.key_spec, stored=self.store_in_spec
        )

    @property
    def client_spec(self) -> dict:
        """One client's input to `next` (`round_inputs.client_input`)."""
        return collections.OrderedDict(
            data=self.data_spec,
            key=self.key_spec,
            stored=self.store_in_spec,
            scalar=tf.TensorSpec([], tf.float32),
            seed=self.seed_spec,
        )

    def train_client(
        self, distributed: Any, client: dict, hparams: dict, anchor: tuple, size: Any = None
    ) -> tuple:
        """`padded_client_update` of one `client_input`."""
        return self.padded_client_update(
            distributed,
            tuple(client["stored"]),
            client["data"],
            client["key"],
            client["scalar"],
            client["seed"],
            hparams,
            anchor,
            size,
        )

    def stacked_shared_spec(self) -> tuple:
        k = self.num_clusters
        return tuple(tf.TensorSpec([k, *s.shape], s.dtype) for s in self.shared_spec)


def hparams_spec(aggregator: ClusterAggregator, num_clusters: int) -> collections.OrderedDict:
    """TF specs of a round's hyperparameters (`round_inputs.round_hparams`), of any length,
    with the clients' parameters of an aggregator other than the mean."""
    spec = collections.OrderedDict(
        (name, tf.TensorSpec([None] * np.ndim(v), tf.as_dtype(v.dtype)))
        for name, v in round_hparams(0, 1).items()
    )
    if not aggregator.is_mean:
        spec["aggregator"] = aggregator.params_spec(num_clusters)
    return spec


def round_functions(
    model: FunctionalModel,
    input_spec: dict,
    signature: RoundSignature,
    initial_variables: Sequence[np.ndarray],
) -> RoundFunctions:
    """The round's TF functions for one model and signature (see `RoundFunctions`)."""
    layout = ModelLayout.of(model)
    io = RoundIO.of(layout, signature)
    shapes = layout.shapes
    if [tuple(np.shape(v)) for v in initial_variables] != list(shapes):
        raise ValueError("initial variables do not match the model's variable shapes")
    k = signature.num_clusters
    num_trainable = layout.num_trainable
    work, aggregator = signature.work, signature.aggregator

    def specs(indices: Sequence[int], lead: tuple[int, ...] = ()) -> tuple[tf.TensorSpec, ...]:
        return tuple(tf.TensorSpec([*lead, *shapes[i]], tf.float32) for i in indices)

    def forward(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple]:
        return model.apply(weights, state, x, training, seed)

    shared_spec = specs(io.shared)

    def join(
        selected: Sequence[tf.Tensor], stored: Sequence[tf.Tensor]
    ) -> tuple[tuple, tuple, tuple, tuple]:
        """(weights, state) of the start model, and (weights, state) of the whole own model
        when the work reads it."""
        variables: list = [None] * len(shapes)
        own: list = [None] * len(shapes)
        for i, t in zip(io.store_in, stored):
            variables[i] = t
            own[i] = t
        for i, t in zip(io.shared, selected):
            variables[i] = t
        if not work.reads_own_model:
            own = []
        return (
            tuple(variables[:num_trainable]),
            tuple(variables[num_trainable:]),
            tuple(own[:num_trainable]),
            tuple(own[num_trainable:]),
        )

    def mean_loss(selected: tuple, stored: tuple, batches: Any) -> tf.Tensor:
        weights, state, _, _ = join(selected, stored)
        scores = local_training.evaluate_client(forward, weights, batches, state)
        return scores.loss_sum / tf.maximum(scores.num_examples, 1.0)

    distributor = signature.distribution.distributor(
        io.shared, shared_spec, k, mean_loss, model.features, len(signature.shared)
    )

    def padded_client_update(
        distributed: object,
        stored: tuple,
        data: object,
        key: tf.Tensor,
        client_scalar: tf.Tensor,
        seed: dict,
        hparams: dict,
        anchor: tuple,
        size: Optional[tf.Tensor],
    ) -> tuple:
        dataset = ArrayBatches(
            data,
            hparams["batch_size"],
            hparams["epochs"],
            seed["shuffle"],
            hparams["max_steps"],
            size=size,
        )
        side = ClientSide(distributed, stored, data, key, hparams, size)
        received = distributor.receive(side)
        weights, state, own_weights, own_state = join(received.selected, stored)
        result = work(
            forward,
            client_work.ClientInputs(
                weights,
                state,
                own_weights,
                own_state,
                dataset,
                hparams["learning_rate"],
                client_scalar,
                seed["dropout"],
                tuple(anchor),
                signature.anchor,
                round_num=hparams["round_num"],
                total_rounds=hparams["total_rounds"],
                routed=received.routed,
            ),
        )
        start = weights + state
        trained = tuple(result.weights) + tuple(result.state)
        kept = tuple(result.own_weights) + tuple(result.own_state)
        # A diverged client (NaN or infinity anywhere in what it trained) must not poison its
        # cluster: its update counts as zero with zero weight, and it reports `finite=False`.
        finite = tf.reduce_all(
            [tf.math.is_finite(result.loss_sum)]
            + [tf.reduce_all(tf.math.is_finite(t)) for t in trained + kept]
        )
        # The cluster the update counts in and the row it is taken against: where it started,
        # unless settled after training (FeSEM's client E-step); a diverged client stays.
        settled = distributor.settle(side, received, tuple(trained[i] for i in io.shared))
        cluster = tf.where(finite, settled.cluster, received.cluster)
        shared_delta = tuple(
            tf.where(finite, trained[i] - row, tf.zeros_like(row))
            for i, row in zip(io.shared, settled.selected)
        )
        weight = result.num_examples if signature.client_weighting == "num_examples" else 1.0
        if not aggregator.is_mean:
            shared_delta, weight, stats = aggregator.preprocess(
                hparams["aggregator"],
                shared_delta,
                cluster,
                weight * tf.cast(finite, tf.float32),
                seed["dropout"],
            )
        cluster_weight = tf.one_hot(cluster, k, dtype=tf.float32) * weight
        cluster_weight *= tf.cast(finite, tf.float32)
        outputs = collections.OrderedDict(
            stored=tuple(kept[i] for i in io.store_out),
            num_examples=result.num_examples,
            loss_sum=result.loss_sum,
            cluster=cluster,
            finite=finite,
        )
        if result.metrics:
            outputs["metrics"] = result.metrics
        if signature.return_model_deltas:  # the shared rows: those the update is taken against
            against = dict(zip(io.shared, settled.selected))
            deltas = [t - against.get(i, s) for i, (t, s) in enumerate(zip(trained, start))]
            outputs["model_delta"] = local_training.flatten(deltas)
        if aggregator.is_mean:
            return shared_delta, cluster_weight, outputs
        row = tf.one_hot(cluster, k, dtype=tf.float32)[:, None]
        return shared_delta, cluster_weight, outputs, row * stats[None, :]

    server_step = server_optimizers.server_step(signature.server_optimizer, num_trainable)

    def apply_means(
        cluster_models: tuple, mean_deltas: tuple, updated: tf.Tensor, optimizer_state: Any
    ) -> tuple:
        added = list(cluster_models)
        for i, delta in zip(io.shared, mean_deltas):
            added[i] = cluster_models[i] + delta
        return server_step(cluster_models, tuple(added), updated, optimizer_state)

    def finalize(
        cluster_models: tuple, mean_deltas: tuple, cluster_weight: tf.Tensor, optimizer_state: Any
    ) -> tuple:
        return apply_means(cluster_models, mean_deltas, cluster_weight > 0, optimizer_state)

    def client_evaluate(
        selected: tf.data.Dataset,
        stored: tuple,
        data: object,
        batch_size: tf.Tensor,
        size: Optional[tf.Tensor] = None,
    ) -> dict:
        weights, state, own_weights, own_state = join(distributor.first_row(selected), stored)
        if work.reads_own_model:  # the client's own (personal) model is what it uses
            weights, state = own_weights, own_state
        dataset = ArrayBatches(data, batch_size, size=size)
        return local_training.evaluate_client(forward, weights, dataset, state)._asdict()

    optimizer = signature.server_optimizer
    trainable_values = sum(int(np.prod(s)) for s in layout.trainable_shapes)
    initial_optimizer_state = optimizer.state_or_initial(None, k, trainable_values) or {}
    return RoundFunctions(
        signature=signature,
        io=io,
        layout=layout,
        cluster_models_spec=specs(range(len(shapes)), (k,)),
        shared_spec=shared_spec,
        store_in_spec=specs(io.store_in),
        anchor_spec=specs(signature.anchor),
        data_spec=collections.OrderedDict(
            (name, tf.TensorSpec([None, *spec.shape[1:]], spec.dtype))
            for name, spec in input_spec.items()
        ),
        key_spec=tf.TensorSpec([signature.distribution.key_width], tf.int32),
        seed_spec=collections.OrderedDict(
            (name, tf.TensorSpec(np.shape(v), tf.as_dtype(v.dtype)))
            for name, v in client_seed(0, 0).items()
        ),
        hparams_spec=hparams_spec(aggregator, k),
        initial_cluster_models=tuple(
            np.repeat(np.asarray(v, np.float32)[None], k, axis=0) for v in initial_variables
        ),
        initial_anchor=tuple(
            np.asarray(initial_variables[i], np.float32) for i in signature.anchor
        ),
        optimizer_state_spec=collections.OrderedDict(
            (key, tf.TensorSpec(value.shape, tf.as_dtype(value.dtype)))
            for key, value in initial_optimizer_state.items()
        ),
        initial_optimizer_state=initial_optimizer_state,
        distributor=distributor,
        padded_client_update=padded_client_update,
        finalize=finalize,
        apply_means=apply_means,
        client_evaluate=client_evaluate,
        rows_independent=model.rows_independent,
    )
