"""The round's parts as plain TF functions, before any execution runs them.

`RoundFunctions` holds, for one model and `RoundSignature`, the four parts of a round in the
order of `tff.learning.templates.compose_learning_process` (distributor, client work,
aggregator, finalizer), and the specs of what they take:

* distributor: the signature's `Distributor` (`distributors.py`);
* client work: `client_update`, one client's work (the signature's `ClientWork`,
  `client_work.py`) with the bookkeeping around it (a diverged client's update zeroed, its
  weight in its cluster) and the aggregator's client side (`ClusterAggregator.preprocess`),
  giving a `server_state.ClientResult`;
* aggregator: the per-cluster sums of the client results (`clustered_mean.add_to_cluster`, the
  statistics rows summed), then `ClusterAggregator.finalize_slot` on the server;
* finalizer: `finalize`, from the sums: the aggregator's server side, each cluster's mean update
  added to its shared variables, then the server optimizer's step (`apply_means`).

`round.py` composes them into a round; each execution (`round_tff.py`, `sharded.py`,
`in_process.py`) only runs them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import client_work, local_training, server_optimizers
from tff_clustered.federated.batching import ArrayBatches
from tff_clustered.federated.cluster_aggregators import checked_output
from tff_clustered.federated.distributors import ClientSide, Distributor, Received
from tff_clustered.federated.round_inputs import ClientInput, ClientSeed
from tff_clustered.federated.round_specs import RoundSpecs
from tff_clustered.federated.server_state import ClientResult, Finalized
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.models.functional import FunctionalModel


@dataclasses.dataclass(frozen=True, eq=False)
class RoundFunctions(RoundSpecs):
    """The TF functions of one signature's round, beside the specs of what they take
    (`RoundSpecs`; see the module docstring). The TFF round makes them
    `tff.tensorflow.computation`s placed by federated operators; the in-process round runs
    the very same functions as graphs.

    * `distributor.select_shared(cluster_models, key)` is federated_select's select function
      (peers' rows; the per-client evaluation), `distributor.every_cluster_shared(
      cluster_models)` what is broadcast to a client that takes its cluster's row or picks
      one, `distributor.receive` the client's side of both, `distributor.settle` the cluster
      the update counts in and the row it is taken against, after the work;
    * `client_update(distributed, stored, data, key, client_scalar, seed, hparams, anchor,
      size) -> ClientResult`: `distributed` is a dataset of the one selection, or every
      cluster's shared variables; `size`: the client holds the first `size` rows of `data`
      (padded arrays, masked batches: `ArrayBatches`; exact for a `rows_independent` model),
      None for all of them; `train_client(distributed, client, hparams, anchor)` is the same
      for one `round_inputs.client_input`;
    * `finalize(cluster_models, sums, total_weight, stats, optimizer_state, slot) ->
      Finalized`; `apply_means(cluster_models, mean_deltas, updated, optimizer_state)` its
      last step (the identity optimizer keeps `{}` as its state);
    * `client_evaluate(selected, stored, data, batch_size, size)`: one client's scores.
    """

    # -- distributor ------------------------------------------------------------------------
    @functools.cached_property
    def distributor(self) -> Distributor:
        signature = self.signature
        return signature.distribution.distributor(
            self.io.shared,
            self.shared_spec,
            self.num_clusters,
            self.mean_loss,
            self.model.features,
            len(signature.shared),
        )

    @property
    def sends_every_cluster(self) -> bool:
        return self.distributor.sends_every_cluster

    @property
    def routes_rows(self) -> bool:
        return self.distributor.relays

    # -- client work --------------------------------------------------------------------------
    def forward(
        self,
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple]:
        return self.model.apply(weights, state, x, training, seed)

    def join(self, selected: Sequence[tf.Tensor], stored: Sequence[tf.Tensor]) -> tuple:
        """(weights, state) of the start model, and (weights, state) of the whole own model
        when the work reads it."""
        io, num_trainable = self.io, self.layout.num_trainable
        variables: list = [None] * self.layout.num_variables
        own: list = [None] * self.layout.num_variables
        for i, t in zip(io.store_in, stored):
            variables[i] = t
            own[i] = t
        for i, t in zip(io.shared, selected):
            variables[i] = t
        if not self.signature.work.reads_own_model:
            own = []
        return (
            tuple(variables[:num_trainable]),
            tuple(variables[num_trainable:]),
            tuple(own[:num_trainable]),
            tuple(own[num_trainable:]),
        )

    def mean_loss(self, selected: tuple, stored: tuple, batches: Any) -> tf.Tensor:
        weights, state, _, _ = self.join(selected, stored)
        scores = local_training.evaluate_client(self.forward, weights, batches, state)
        return scores.loss_sum / tf.maximum(scores.num_examples, 1.0)

    def client_update(
        self,
        distributed: object,
        stored: tuple,
        data: object,
        key: tf.Tensor,
        client_scalar: tf.Tensor,
        seed: ClientSeed,
        hparams: dict,
        anchor: tuple,
        size: Optional[tf.Tensor] = None,
    ) -> ClientResult:
        """The distributor's client side, the client's work, then its result
        (`client_result`)."""
        dataset = ArrayBatches(
            data,
            hparams["batch_size"],
            hparams["epochs"],
            seed.shuffle,
            hparams["max_steps"],
            size=size,
        )
        side = ClientSide(distributed, stored, data, key, hparams, size)
        received = self.distributor.receive(side)
        weights, state, own_weights, own_state = self.join(received.selected, stored)
        signature = self.signature
        result = signature.work(
            self.forward,
            client_work.ClientInputs(
                weights,
                state,
                own_weights,
                own_state,
                dataset,
                hparams["learning_rate"],
                client_scalar,
                seed.dropout,
                tuple(anchor),
                signature.anchor,
                round_num=hparams["round_num"],
                total_rounds=hparams["total_rounds"],
                routed=received.routed,
            ),
        )
        return self.client_result(side, received, weights + state, result, seed, hparams)

    def client_result(
        self,
        side: ClientSide,
        received: Received,
        start: tuple,
        result: client_work.ClientResult,
        seed: ClientSeed,
        hparams: dict,
    ) -> ClientResult:
        """A trained client's `ClientResult`: its update against the row it counts in, its
        weight, both through the aggregator's client side, its outputs and statistics row."""
        io, k, signature = self.io, self.num_clusters, self.signature
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
        settled = self.distributor.settle(side, received, tuple(trained[i] for i in io.shared))
        cluster = tf.where(finite, settled.cluster, received.cluster)
        shared_delta = tuple(
            tf.where(finite, trained[i] - row, tf.zeros_like(row))
            for i, row in zip(io.shared, settled.selected)
        )
        weight = result.num_examples if signature.client_weighting == "num_examples" else 1.0
        weight = weight * tf.cast(finite, tf.float32)
        shared_delta, weight, stats = checked_output(
            self.aggregator,
            "preprocess",
            self.aggregator.preprocess(
                hparams.get("aggregator", {}), shared_delta, cluster, weight, seed.dropout
            ),
            ("delta", "weight", "stats"),
            (shared_delta, weight, tf.TensorSpec([self.aggregator.stats_width], tf.float32)),
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
        row = tf.one_hot(cluster, k, dtype=tf.float32)[:, None]
        return ClientResult(shared_delta, cluster_weight, outputs, row * stats[None, :])

    def train_client(
        self,
        distributed: Any,
        client: ClientInput,
        hparams: dict,
        anchor: tuple,
        size: Any = None,
    ) -> ClientResult:
        """`client_update` of one `ClientInput`."""
        return self.client_update(
            distributed,
            tuple(client.stored),
            client.data,
            client.key,
            client.scalar,
            client.seed,
            hparams,
            anchor,
            size,
        )

    # -- finalizer ----------------------------------------------------------------------------
    @functools.cached_property
    def server_step(self) -> Callable[..., tuple]:
        return server_optimizers.server_step(
            self.signature.server_optimizer, self.layout.num_trainable
        )

    def apply_means(
        self, cluster_models: tuple, mean_deltas: tuple, updated: tf.Tensor, optimizer_state: Any
    ) -> tuple:
        """Each cluster's mean update added to its shared variables, then the server
        optimizer's step for the clusters `updated` names: `(cluster_models, optimizer)`."""
        added = list(cluster_models)
        for i, delta in zip(self.io.shared, mean_deltas):
            added[i] = cluster_models[i] + delta
        return self.server_step(cluster_models, tuple(added), updated, optimizer_state)

    def finalize(
        self,
        cluster_models: tuple,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        optimizer_state: Any,
        aggregator_slot: Any,
    ) -> Finalized:
        """The aggregator's server side on the per-cluster sums (`finalize_slot`), then
        `apply_means` for the clusters it says step; measurements: the realised total weights
        as `cluster_weight`, then the aggregator's."""
        means, updated, slot, measured = self.aggregator.finalize_slot(
            tuple(sums), total_weight, stats, aggregator_slot
        )
        models, optimizer = self.apply_means(tuple(cluster_models), means, updated, optimizer_state)
        measurements = collections.OrderedDict(cluster_weight=total_weight, **measured)
        return Finalized(models, optimizer, slot, measurements)

    # -- scoring ------------------------------------------------------------------------------
    def client_evaluate(
        self,
        selected: tf.data.Dataset,
        stored: tuple,
        data: object,
        batch_size: tf.Tensor,
        size: Optional[tf.Tensor] = None,
    ) -> dict:
        weights, state, own_weights, own_state = self.join(
            self.distributor.first_row(selected), stored
        )
        if self.signature.work.reads_own_model:  # the client's own (personal) model it uses
            weights, state = own_weights, own_state
        dataset = ArrayBatches(data, batch_size, size=size)
        return local_training.evaluate_client(self.forward, weights, dataset, state)._asdict()


def round_functions(
    model: FunctionalModel,
    input_spec: dict,
    signature: RoundSignature,
    initial_variables: Sequence[np.ndarray],
) -> RoundFunctions:
    """The round's TF functions for one model and signature (see `RoundFunctions`)."""
    shapes = ModelLayout.of(model).shapes
    if [tuple(np.shape(v)) for v in initial_variables] != list(shapes):
        raise ValueError("initial variables do not match the model's variable shapes")
    return RoundFunctions(model, signature, input_spec, tuple(initial_variables))
