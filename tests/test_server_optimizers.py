"""The finalizer's server optimizer (FedOpt): its step (`server_step`) on NumPy models, per
cluster, and in a run (FedAvgM against FedAvg, FedGroup with server momentum, a resumed run,
refusals)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf
from conftest import checkpoint_round_trip

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_digits_clusters
from tff_clustered.federated.server_optimizers import ServerOptimizer, server_step
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec

BEFORE = np.array([[1.0, 2.0, 3.0, 10.0], [0.0, 0.0, 0.0, 5.0]], np.float32)
MEAN_UPDATE = np.array([[0.1, 0.2, -0.1, 7.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
TRAINABLE = 3  # the last value of each flat model stands for a BatchNorm statistic


def step(
    spec: ServerOptimizer,
    state: Optional[dict],
    before: np.ndarray,
    after: np.ndarray,
    updated: list,
    trainable_values: int,
) -> tuple[np.ndarray, Optional[dict]]:
    """The finalizer's `server_step` on flat NumPy cluster models (the first
    `trainable_values` of each trainable, the rest a state tensor), its state chosen as the
    loop chooses it (`state_or_initial`): the models after the step and the new state."""
    state = spec.state_or_initial(state, len(before), trainable_values)
    if state is None:
        return after, None
    t = trainable_values
    models, new_state = server_step(spec, 1)(
        (tf.constant(before[:, :t]), tf.constant(before[:, t:])),
        (tf.constant(after[:, :t]), tf.constant(after[:, t:])),
        tf.constant(np.asarray(updated, bool)),
        {key: tf.constant(value) for key, value in state.items()},
    )
    flat = np.concatenate([np.asarray(m) for m in models], axis=1).astype(np.float32)
    return flat, {key: np.asarray(value) for key, value in new_state.items()}


def test_sgd_at_learning_rate_one_adds_the_mean_update_and_keeps_no_state() -> None:
    models, state = step(ServerOptimizer(), None, BEFORE, BEFORE + MEAN_UPDATE, [1, 0], TRAINABLE)
    np.testing.assert_array_equal(models, BEFORE + MEAN_UPDATE)
    assert state is None


def test_server_momentum_per_cluster_leaves_untrained_clusters_and_statistics_alone() -> None:
    """v <- beta v + Delta; x <- x + eta v, over two rounds, on cluster 0 only (no client
    trained in cluster 1); the statistic (last value) is the aggregator's mean either way."""
    spec = ServerOptimizer("sgdm", learning_rate=0.5, momentum=0.9)
    updated = np.array([True, False])
    models, state = step(spec, None, BEFORE, BEFORE + MEAN_UPDATE, updated, TRAINABLE)
    delta = MEAN_UPDATE[0, :TRAINABLE]
    np.testing.assert_allclose(models[0, :TRAINABLE], BEFORE[0, :TRAINABLE] + 0.5 * delta)
    assert models[0, TRAINABLE] == BEFORE[0, TRAINABLE] + MEAN_UPDATE[0, TRAINABLE]
    np.testing.assert_array_equal(models[1], BEFORE[1])
    assert state is not None and state["accumulator"].shape == (2, TRAINABLE)
    again, state = step(spec, state, models, models + MEAN_UPDATE, updated, TRAINABLE)
    velocity = 0.9 * delta + delta
    np.testing.assert_allclose(again[0, :TRAINABLE], models[0, :TRAINABLE] + 0.5 * velocity)
    np.testing.assert_allclose(state["accumulator"][0], -velocity, rtol=1e-5)  # of pseudo-gradients
    np.testing.assert_array_equal(state["accumulator"][1], 0.0)


def test_adam_moves_each_value_by_about_the_learning_rate_on_its_first_step() -> None:
    """FedAdam's first step with bias correction: m/(sqrt(v) + tau) = g/(|g| + tau), so each
    trained value moves by lr * |g|/(|g| + tau) in the update's direction."""
    spec = ServerOptimizer("adam", learning_rate=0.01, epsilon=1e-3)
    models, state = step(spec, None, BEFORE, BEFORE + MEAN_UPDATE, [True, True], TRAINABLE)
    g = np.abs(MEAN_UPDATE[0, :TRAINABLE])
    expected = BEFORE[0, :TRAINABLE] + 0.01 * np.sign(MEAN_UPDATE[0, :TRAINABLE]) * g / (g + 1e-3)
    np.testing.assert_allclose(models[0, :TRAINABLE], expected, rtol=1e-3)
    np.testing.assert_allclose(models[1], BEFORE[1])  # a zero update moves nothing
    assert state is not None and list(state["step"]) == [1, 1]


def test_a_change_in_the_number_of_clusters_restarts_the_state() -> None:
    spec = ServerOptimizer("sgdm", momentum=0.9)
    _, state = step(spec, None, BEFORE, BEFORE + MEAN_UPDATE, [True, True], TRAINABLE)
    three = np.concatenate([BEFORE, BEFORE[:1]])
    models, state = step(spec, state, three, three, [True, True, True], TRAINABLE)
    np.testing.assert_array_equal(models, three)  # no update and a fresh (zero) momentum
    assert state is not None and state["accumulator"].shape == (3, TRAINABLE)


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(name="rmsprop"), "server_optimizer must be one of"),
        (dict(learning_rate=0.0), "server_learning_rate must be > 0"),
        (dict(name="sgdm", momentum=1.0), "server_momentum must be in [0, 1)"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        ServerOptimizer(**settings)


CONFIG = TrainingConfig(
    rounds=8, clients_per_round=8, local_epochs=1, learning_rate=0.05, seed=2, eval_every=8
)


def run(
    algorithm: str, config: TrainingConfig = CONFIG, groups: int = 1, **options: object
) -> Experiment:
    """`algorithm` on 16 digits clients in `groups` label-permutation groups, in process."""
    data = load_digits_clusters(num_clients=16, num_groups=groups, seed=config.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **options),
        config,
        execution=RunExecution.of("in_process"),
    )
    exp.start()
    return exp


def test_fedavgm_learns_faster_than_fedavg_at_a_small_client_learning_rate() -> None:
    """Server momentum 0.9 sums past updates (up to 10x the step): at a client learning rate
    too small for 8 rounds, FedAvgM ends with a clearly lower training loss than FedAvg."""
    fedavgm, fedavg = run("fedavgm"), run("fedavg")
    list(fedavgm.rounds()), list(fedavg.rounds())
    assert fedavgm.server_optimizer == ServerOptimizer("sgdm")
    assert fedavg.state.server_optimizer_state is None
    loss_m, loss = fedavgm.state.history[-1]["train_loss"], fedavg.state.history[-1]["train_loss"]
    assert loss_m < 0.8 * loss, (loss_m, loss)
    assert fedavgm.state.history[-1]["accuracy"] > fedavg.state.history[-1]["accuracy"] + 0.05


def test_fedgroup_with_server_momentum_keeps_one_state_per_group_and_resumes(
    tmp_path: Path,
) -> None:
    """FedGroup's groups form as without momentum; each group has its own momentum (groups
    move apart); a run resumed from a checkpoint midway ends where the straight one does."""
    config = dataclasses.replace(
        CONFIG,
        rounds=4,
        learning_rate=0.05,
        server_optimizer=ServerOptimizer("sgdm", momentum=0.5),
    )
    options = dict(num_clusters=2, pretrain_epochs=3)
    straight = run("fedgroup", config, groups=2, **options)
    list(straight.rounds())
    state = straight.state.server_optimizer_state
    assert state is not None and state["accumulator"].shape == (
        2,
        straight.run.num_trainable_values,
    )
    assert not np.allclose(state["accumulator"][0], state["accumulator"][1])
    planted = straight.data.true_clusters
    pairs = {(planted[c], k) for c, k in straight.state.assignment.items()}
    assert len(pairs) == len({k for _, k in pairs}) == 2  # each planted group is one cluster
    first = run("fedgroup", config, groups=2, **options)
    rounds = first.rounds()
    for _ in range(3):  # rounds 0, 1, 2
        next(rounds)
    saved = checkpoint_round_trip(first.snapshot(), tmp_path)
    resumed = Experiment(
        first.data, first.model, first.algorithm, config, execution=RunExecution.of("in_process")
    )
    resumed.restore(saved)
    list(resumed.rounds())
    np.testing.assert_array_equal(resumed.state.cluster_models, straight.state.cluster_models)
    for key, value in straight.state.server_optimizer_state.items():
        np.testing.assert_array_equal(resumed.state.server_optimizer_state[key], value)


def test_a_decentralized_algorithm_refuses_a_server_optimizer() -> None:
    config = dataclasses.replace(CONFIG, server_optimizer=ServerOptimizer("sgdm"))
    with pytest.raises(ValueError, match="decentralized: no server aggregates"):
        run("fedavg_dfl", config)


def test_fedavgm_refuses_another_server_optimizer() -> None:
    config = dataclasses.replace(CONFIG, server_optimizer=ServerOptimizer("adam"))
    with pytest.raises(ValueError, match="use --algorithm=fedavg"):
        run("fedavgm", config)


def test_fedadam_steps_by_its_own_rate_whatever_the_update_scale() -> None:
    """Adam moves each value by about eta_s a round however small the mean update is: at a
    client learning rate 10x too small for 8 rounds, FedAdam (eta_s 0.03) is well ahead of
    FedAvg, whose step is the tiny update itself."""
    config = dataclasses.replace(CONFIG, learning_rate=0.005)
    fedadam, fedavg = run("fedadam", config, fedadam_learning_rate=0.03), run("fedavg", config)
    list(fedadam.rounds()), list(fedavg.rounds())
    assert fedadam.server_optimizer == ServerOptimizer("adam", learning_rate=0.03)
    assert fedadam.state.server_optimizer_state is not None
    adam, plain = fedadam.state.history[-1], fedavg.state.history[-1]
    assert adam["train_loss"] < 0.95 * plain["train_loss"], (adam, plain)
    assert adam["accuracy"] > plain["accuracy"] + 0.15, (adam, plain)


def test_fedadam_refuses_the_generic_server_optimizer_flags() -> None:
    config = dataclasses.replace(CONFIG, server_optimizer=ServerOptimizer("sgd", 0.5))
    with pytest.raises(ValueError, match="--fedadam_learning_rate"):
        run("fedadam", config)
