"""Runs with `--aggregator=dp` (DP-FedAvg per cluster, adaptive clipping, noise on): the TFF
round and the in-process round give the same run, as they do for the mean
(tests/test_in_process.py), because the noise is stateless and seeded the same on both; for
IFCA and FeSEM's client-side E-step, with the clients' own picks of their cluster."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_in_process import CONFIG, TOLERANCE, numbers

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_dataset
from tff_clustered.loop.config import AggregatorConfig
from tff_clustered.models import model_spec
from tff_clustered.orchestration import Experiment

pytestmark = pytest.mark.usefixtures("tff_context")
DP = AggregatorConfig(
    "dp", noise_multiplier=0.5, clip=0.5, clipping="adaptive", clip_learning_rate=0.5
)
OPTIONS = {
    "fedavg": {},
    "ifca": {"num_clusters": 2},
    "fesem": {"num_clusters": 2, "fesem_estep": "client"},  # its E-step on the client
}


def run(algorithm: str, execution: str) -> Experiment:
    data = load_dataset("digits_dirichlet", seed=CONFIG.seed, num_clients=12, dirichlet_beta=0.2)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    config = dataclasses.replace(CONFIG, aggregator=DP)
    exp = Experiment(
        data, model, make_algorithm(algorithm, **OPTIONS[algorithm]), config, execution=execution
    )
    exp.start()
    list(exp.rounds())
    return exp


@pytest.mark.parametrize("algorithm", sorted(OPTIONS))
def test_a_dp_run_is_the_same_on_both_executions(algorithm: str) -> None:
    tff_run, local_run = run(algorithm, "tff"), run(algorithm, "in_process")
    assert local_run.state.assignment == tff_run.state.assignment
    if algorithm != "fedavg":  # the clients' picks, and so the rows they were clipped into
        assert len(set(tff_run.state.assignment.values()) - {-1}) == 2
    np.testing.assert_allclose(
        local_run.state.cluster_models, tff_run.state.cluster_models, atol=TOLERANCE
    )
    clips = tff_run.state.aggregator_state["clip"]
    np.testing.assert_allclose(local_run.state.aggregator_state["clip"], clips, rtol=1e-6)
    assert not np.allclose(clips, DP.clip)  # adaptive: the clips moved
    for ours, theirs in zip(local_run.state.history, tff_run.state.history, strict=True):
        a, b = numbers(ours), numbers(theirs)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-3, nan_ok=True), key
    trained = tff_run.state.history[1:]
    for k in range(len(clips)):
        assert f"dp_clip_cluster_{k}" in trained[0]
        fractions = [row[f"dp_unclipped_fraction_cluster_{k}"] for row in trained]
        assert all(0.0 <= f <= 1.0 for f in fractions)
