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
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec

pytestmark = pytest.mark.usefixtures("tff_context")
DP = AggregatorConfig(
    "dp", noise_multiplier=0.5, clip=0.5, clipping="adaptive", clip_learning_rate=0.5
)
OPTIONS = {
    "fedavg": {},
    "ifca": {"num_clusters": 2},
    "fesem": {"num_clusters": 2, "fesem_estep": "client"},  # its E-step on the client
}


def experiment(
    algorithm: str, execution: str, aggregator: AggregatorConfig = DP, rounds: int = CONFIG.rounds
) -> Experiment:
    """`algorithm` with `aggregator` on 12 digits clients, started, its rounds not run."""
    data = load_dataset("digits_dirichlet", seed=CONFIG.seed, num_clients=12, dirichlet_beta=0.2)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    config = dataclasses.replace(CONFIG, aggregator=aggregator, rounds=rounds)
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **OPTIONS[algorithm]),
        config,
        execution=RunExecution.of(execution),
    )
    exp.start()
    return exp


def run(algorithm: str, execution: str, aggregator: AggregatorConfig = DP) -> Experiment:
    """`experiment` with all its rounds run."""
    exp = experiment(algorithm, execution, aggregator)
    list(exp.rounds())
    return exp


def assert_same_runs(local_run: Experiment, tff_run: Experiment) -> None:
    """The two runs' assignments, cluster models, aggregator states and metrics agree (float
    sums in another order)."""
    assert local_run.state.assignment == tff_run.state.assignment
    np.testing.assert_allclose(
        local_run.state.cluster_models, tff_run.state.cluster_models, atol=TOLERANCE
    )
    for key, value in tff_run.state.aggregator_state.items():
        np.testing.assert_allclose(local_run.state.aggregator_state[key], value, rtol=1e-6)
    for ours, theirs in zip(local_run.state.history, tff_run.state.history, strict=True):
        a, b = numbers(ours), numbers(theirs)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-3, nan_ok=True), key


@pytest.mark.parametrize("algorithm", sorted(OPTIONS))
def test_a_dp_run_is_the_same_on_both_executions(algorithm: str) -> None:
    tff_run, local_run = run(algorithm, "tff"), run(algorithm, "in_process")
    assert_same_runs(local_run, tff_run)
    if algorithm != "fedavg":  # the clients' picks, and so the rows they were clipped into
        assert len(set(tff_run.state.assignment.values()) - {-1}) == 2
    clips = tff_run.state.aggregator_state["clip"]
    assert not np.allclose(clips, DP.options.clip)  # adaptive: the clips moved
    trained = tff_run.state.history[1:]
    for k in range(len(clips)):
        assert f"dp_clip_cluster_{k}" in trained[0]
        fractions = [row[f"dp_unclipped_fraction_cluster_{k}"] for row in trained]
        assert all(0.0 <= f <= 1.0 for f in fractions)
