"""The round composed once (`round.ComposedRound`) and its typed values (`server_state.py`):
the parts' order whatever the execution, a relay that aggregates nothing, the server state's
named slots with explicit empty values, the clients' sums merged in order, and the mean as an
aggregator like the others (its server side bit for bit the per-cluster mean)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.federated.cluster_aggregators import ClusterMean
from tff_clustered.federated.clustered_mean import cluster_mean
from tff_clustered.federated.round import ComposedRound
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.federated.server_state import (
    ClientSums,
    Finalized,
    ServerState,
    after_round,
    merged_sums,
)
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model


class Trained:
    """What the recording execution's clients trained: their outputs."""

    def __init__(self, outputs: list) -> None:
        self.outputs = outputs


class RecordingExecution:
    """An execution of plain Python values that records the parts it is asked to run."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def train_clients(self, state: Any, clients: Any, hparams: Any) -> Trained:
        self.calls.append("train_clients")
        return Trained([f"out-{c}" for c in clients])

    def aggregate(self, state: ServerState, trained: Trained) -> Finalized:
        self.calls.append("aggregate")
        models = tuple(m + 1 for m in state.cluster_models)
        return Finalized(models, {"step": 1}, "slot", {"cluster_weight": len(trained.outputs)})

    def after_round(self, state: ServerState, finalized: Finalized) -> ServerState:
        self.calls.append("after_round")
        return after_round(state, finalized)

    def nothing_aggregated(self) -> dict:
        self.calls.append("nothing_aggregated")
        return {"cluster_weight": 0}


def test_the_composed_round_runs_distributor_and_work_then_aggregator_and_finalizer() -> None:
    execution = RecordingExecution()
    state = ServerState((np.zeros(2),), anchor=(np.ones(1),))
    new_state, outputs, measurements = ComposedRound(execution).next(state, ["a", "b"], {})
    assert execution.calls == ["train_clients", "aggregate", "after_round"]
    assert outputs == ["out-a", "out-b"]
    assert measurements == {"cluster_weight": 2}
    np.testing.assert_array_equal(new_state.cluster_models[0], [1.0, 1.0])
    assert new_state.optimizer == {"step": 1} and new_state.aggregator == "slot"
    assert new_state.anchor is state.anchor  # the loop's to change, never the round's


def test_a_relay_aggregates_nothing_and_keeps_the_state() -> None:
    execution = RecordingExecution()
    state = ServerState((np.zeros(2),))
    new_state, outputs, measurements = ComposedRound(execution, relays=True).next(state, ["a"], {})
    assert execution.calls == ["train_clients", "nothing_aggregated"]
    assert new_state is state and outputs == ["out-a"]
    assert measurements == {"cluster_weight": 0}


def test_absent_slots_are_explicit_empty_values() -> None:
    state = ServerState((np.zeros([2, 3]),))
    assert state.anchor == () and dict(state.optimizer) == {} and state.aggregator == ()
    assert state._fields == ("cluster_models", "anchor", "optimizer", "aggregator")


def test_the_round_on_tff_carries_the_typed_state() -> None:
    """TFF's `initialize` returns the named slots (the mean's slot and a round without an
    anchor empty; a server optimizer's state in its slot), and `next` takes them back."""
    spec = model_spec("mlp", (5,), 3, hidden_units=4)
    w0 = initial_weights(spec, 1)
    model = functional_model(spec.build(), spec.input_spec())
    momentum = ServerOptimizer("sgdm", learning_rate=1.0, momentum=0.9)
    signature = RoundSignature(2, tuple(range(len(w0))), server_optimizer=momentum)
    parts = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0))
    state_type = parts.next.type_signature.parameter[0].member
    names = [name for name, _ in _elements(state_type)]
    assert names == ["cluster_models", "anchor", "optimizer", "aggregator"]
    assert len(state_type.anchor) == 0 and len(state_type.aggregator) == 0
    assert [name for name, _ in _elements(state_type.optimizer)] == ["accumulator"]


def _elements(struct: Any) -> list:
    return list(tff.structure.iter_elements(struct))


def test_sums_of_shares_add_in_worker_order_as_float32() -> None:
    first = ClientSums((np.array([1.0, 2.0]),), np.array([1.0]), np.zeros([1, 0]))
    second = ClientSums((np.array([0.5, 0.25]),), np.array([2.0]), np.zeros([1, 0]))
    merged = merged_sums([first, second])
    np.testing.assert_array_equal(merged.sums[0], np.float32([1.5, 2.25]))
    assert merged.sums[0].dtype == np.float32
    np.testing.assert_array_equal(merged.total_weight, [3.0])
    assert merged.stats.shape == (1, 0)
    with pytest.raises(IndexError):
        merged_sums([])


def test_the_mean_is_an_aggregator_whose_server_side_is_the_per_cluster_mean() -> None:
    """The same interface as every aggregator (client side the identity, statistics none),
    its finalize bit for bit `cluster_mean` of the sums, stepping the clusters of some weight;
    it takes no round inputs and keeps an empty slot."""
    mean = ClusterMean()
    assert not mean.takes_round_inputs and mean.initial_slot(3) == ()
    assert mean.stats_width == 0
    rng = np.random.default_rng(0)
    sums = (tf.constant(rng.normal(size=[3, 4]).astype(np.float32)),)
    total_weight = tf.constant([2.0, 0.0, 3.0])
    delta, weight, stats = mean.preprocess({}, sums, tf.constant(1), tf.constant(3.0), None)
    assert delta[0] is sums[0] and float(weight) == 3.0 and stats.shape == (0,)
    means, updated, slot, measured = mean.finalize_slot(sums, total_weight, stats, ())
    np.testing.assert_array_equal(means[0], cluster_mean(sums, total_weight)[0])
    np.testing.assert_array_equal(updated, [True, False, True])
    assert slot == () and measured == collections.OrderedDict()
