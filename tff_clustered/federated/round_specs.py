"""The TF specs and initial server state of one model's round of one signature (`RoundSpecs`).

The specs of its values: models, shared variables, client inputs, hyperparameters, the
aggregator's slot."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.round_inputs import (
    ClientInput,
    ClientSeed,
    EvaluationInput,
    client_seed,
    round_hparams,
)
from tff_clustered.federated.server_state import ClientSums, ServerState
from tff_clustered.federated.signature import ModelLayout, RoundIO, RoundSignature
from tff_clustered.models.functional import FunctionalModel


def hparams_spec(aggregator: ClusterAggregator, num_clusters: int) -> collections.OrderedDict:
    """TF specs of a round's hyperparameters (`round_inputs.round_hparams`), of any length,
    with its clients' parameters for an aggregator that `takes_round_inputs`."""
    spec = collections.OrderedDict(
        (name, tf.TensorSpec([None] * np.ndim(v), tf.as_dtype(v.dtype)))
        for name, v in round_hparams(0, 1).items()
    )
    if aggregator.takes_round_inputs:
        spec["aggregator"] = aggregator.params_spec(num_clusters)
    return spec


@dataclasses.dataclass(frozen=True, eq=False)
class RoundSpecs:
    """The specs and initial values of one model's round of one `signature`
    (`initial_variables`: one model's trainable tensors then its state, every cluster's start)."""

    model: FunctionalModel
    signature: RoundSignature
    input_spec: dict
    initial_variables: tuple

    @functools.cached_property
    def layout(self) -> ModelLayout:
        return ModelLayout.of(self.model)

    @functools.cached_property
    def io(self) -> RoundIO:
        return RoundIO.of(self.layout, self.signature)

    @property
    def num_clusters(self) -> int:
        return self.signature.num_clusters

    @property
    def aggregator(self) -> ClusterAggregator:
        return self.signature.aggregator

    @property
    def rows_independent(self) -> bool:
        """The model's `rows_independent`: padded clients are exact."""
        return self.model.rows_independent

    # -- specs and initial values -------------------------------------------------------------
    def specs(self, indices: Sequence[int], lead: tuple[int, ...] = ()) -> tuple:
        shapes = self.layout.shapes
        return tuple(tf.TensorSpec([*lead, *shapes[i]], tf.float32) for i in indices)

    @functools.cached_property
    def cluster_models_spec(self) -> tuple:
        return self.specs(range(self.layout.num_variables), (self.num_clusters,))

    @functools.cached_property
    def shared_spec(self) -> tuple:
        return self.specs(self.io.shared)

    @functools.cached_property
    def store_in_spec(self) -> tuple:
        return self.specs(self.io.store_in)

    @functools.cached_property
    def anchor_spec(self) -> tuple:
        return self.specs(self.signature.anchor)

    @functools.cached_property
    def data_spec(self) -> collections.OrderedDict:
        return collections.OrderedDict(
            (name, tf.TensorSpec([None, *spec.shape[1:]], spec.dtype))
            for name, spec in self.input_spec.items()
        )

    @functools.cached_property
    def key_spec(self) -> tf.TensorSpec:
        return tf.TensorSpec([self.signature.distribution.key_width], tf.int32)

    @functools.cached_property
    def seed_spec(self) -> ClientSeed:
        return ClientSeed(
            *(tf.TensorSpec(np.shape(v), tf.as_dtype(v.dtype)) for v in client_seed(0, 0))
        )

    @functools.cached_property
    def hparams_spec(self) -> collections.OrderedDict:
        return hparams_spec(self.aggregator, self.num_clusters)

    @functools.cached_property
    def initial_cluster_models(self) -> tuple:
        k = self.num_clusters
        return tuple(
            np.repeat(np.asarray(v, np.float32)[None], k, axis=0) for v in self.initial_variables
        )

    @functools.cached_property
    def initial_anchor(self) -> tuple:
        return tuple(
            np.asarray(self.initial_variables[i], np.float32) for i in self.signature.anchor
        )

    @functools.cached_property
    def initial_optimizer_state(self) -> collections.OrderedDict:
        trainable_values = sum(int(np.prod(s)) for s in self.layout.trainable_shapes)
        optimizer = self.signature.server_optimizer
        initial = optimizer.state_or_initial(None, self.num_clusters, trainable_values) or {}
        return collections.OrderedDict(initial)

    @functools.cached_property
    def optimizer_state_spec(self) -> collections.OrderedDict:
        return collections.OrderedDict(
            (key, tf.TensorSpec(value.shape, tf.as_dtype(value.dtype)))
            for key, value in self.initial_optimizer_state.items()
        )

    def initial_state(self, aggregator_slot: Any = None) -> ServerState:
        """The server state before the first round; the aggregator's initial slot unless
        `aggregator_slot` is given (a `tff.aggregators` factory's, built by TFF)."""
        slot = self.aggregator.initial_slot(self.num_clusters)
        return ServerState(
            self.initial_cluster_models,
            self.initial_anchor,
            self.initial_optimizer_state,
            slot if aggregator_slot is None else aggregator_slot,
        )

    @functools.cached_property
    def slot_spec(self) -> Any:
        """TF specs of the server state's `aggregator` slot."""
        return self.aggregator.slot_spec(self.num_clusters)

    @functools.cached_property
    def stats_spec(self) -> tf.TensorSpec:
        """The per-cluster sums of the clients' statistics rows (`[K, stats_width]`)."""
        return tf.TensorSpec([self.num_clusters, self.aggregator.stats_width], tf.float32)

    def stacked_shared_spec(self) -> tuple:
        return self.specs(self.io.shared, (self.num_clusters,))

    @functools.cached_property
    def weight_spec(self) -> tf.TensorSpec:
        """Each cluster's total client weight (`[K]`)."""
        return tf.TensorSpec([self.num_clusters], tf.float32)

    @functools.cached_property
    def sums_spec(self) -> ClientSums:
        """TF specs of the per-cluster sums of a round's client results (`ClientSums`)."""
        return ClientSums(self.stacked_shared_spec(), self.weight_spec, self.stats_spec)

    def zero_sums(self) -> ClientSums:
        """The sums of no client: what a round of none finalizes (an aggregator's noise alone,
        then the server optimizer's step)."""
        return tf.nest.map_structure(lambda t: np.zeros(t.shape, np.float32), self.sums_spec)

    @property
    def selection_spec(self) -> tuple:
        return (tf.TensorSpec([], tf.int32), *self.shared_spec)

    @property
    def evaluation_client_spec(self) -> EvaluationInput:
        """One client's input to `evaluate` (`round_inputs.EvaluationInput`)."""
        return EvaluationInput(self.data_spec, self.key_spec, self.store_in_spec)

    @property
    def client_spec(self) -> ClientInput:
        """One client's input to `next` (`round_inputs.ClientInput`)."""
        scalar = tf.TensorSpec([], tf.float32)
        return ClientInput(
            self.data_spec, self.key_spec, self.store_in_spec, scalar, self.seed_spec
        )
