"""A `tff.aggregators` factory per cluster (`federated/tff_factory_aggregator.py`): the
weighted mean as the default mean, a fixed clip as that factory on each cluster's own clients,
adaptive clipping's state as the masking makes it, an empty cluster left as it was, and the
Python API's run, resume and refusals."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.federated import client_work
from tff_clustered.federated.round import tff_round_parts
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import client_seed, round_clients, round_hparams
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_factory_aggregator import TffFactoryPerCluster
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model
from tff_clustered.weights import unflatten

SPEC = model_spec("mlp", (5,), 3, hidden_units=4)
W0 = initial_weights(SPEC, 7)
SHAPES = [tuple(np.shape(w)) for w in W0]
KEYS = [0, 1, 0, 1, 1]  # cluster 2 gets no client
SIZES = (6, 9, 4, 7, 5)


def built_round(aggregator: object = None) -> object:
    """The TFF round of 3 clusters of the small MLP, clients returning their updates."""
    signature = RoundSignature(
        3, tuple(range(len(W0))), client_work.LocalSGD(), return_model_deltas=True
    )
    if aggregator is not None:
        signature = dataclasses.replace(signature, aggregator=aggregator)
    functional = functional_model(SPEC.build(), SPEC.input_spec())
    return tff_round_parts(round_functions(functional, SPEC.input_spec(), signature, W0))


def clients(round_num: int) -> list:
    rng = np.random.default_rng(round_num)
    data = [
        collections.OrderedDict(
            x=rng.normal(size=(n, 5)).astype(np.float32) * 3,
            y=rng.integers(0, 3, n).astype(np.int32),
        )
        for n in SIZES
    ]
    return round_clients(
        data,
        [np.array([k], np.int32) for k in KEYS],
        [()] * len(KEYS),
        [1.0] * len(KEYS),
        [client_seed(round_num, i) for i in range(len(KEYS))],
    )


def own_updates(outputs: list, cluster: int) -> list:
    """The updates of the clients that trained in `cluster`, as tensors of the shapes."""
    return [
        tuple(unflatten(np.asarray(o["model_delta"]), SHAPES))
        for o, key in zip(outputs, KEYS)
        if key == cluster
    ]


@pytest.fixture(scope="module")
def mean_round(tff_context: object) -> tuple:
    """One round of the default mean: (state before, state after, outputs, measurements)."""
    fed_round = built_round()
    before = fed_round.initialize()
    return (before, *fed_round.next(before, clients(0), round_hparams(0.5, 3)))


@pytest.mark.usefixtures("tff_context")
def test_mean_factory_per_cluster_is_the_default_mean(mean_round: tuple) -> None:
    """`MeanFactory()` per cluster gives the default mean's cluster models (to float
    tolerance: its sums are TFF's own), the empty cluster 2 bit for bit unchanged, no state."""
    before, after, _, measured = mean_round
    fed_round = built_round(TffFactoryPerCluster(tff.aggregators.MeanFactory()))
    state = fed_round.initialize()
    assert len(state["aggregator"]["state"]) == 0  # MeanFactory keeps none
    hparams = round_hparams(0.5, 3, aggregator_params={})
    new_state, _, factory_measured = fed_round.next(state, clients(0), hparams)
    for ours, mean, start in zip(
        new_state["cluster_models"], after["cluster_models"], before["cluster_models"]
    ):
        np.testing.assert_allclose(ours, mean, rtol=0, atol=1e-6)
        assert np.array_equal(ours[2], start[2])  # no client: kept
        assert not np.array_equal(ours[0], start[0])
    np.testing.assert_array_equal(factory_measured["cluster_weight"], measured["cluster_weight"])
