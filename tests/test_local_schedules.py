"""Local schedules: true freezing in `train_client`, phases of their own budget (`PhasedSGD`),
and FedRep, whose client trains its head alone and then its body; and LG-FedAvg, FedPer's
split reversed (local body, global head)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_digits_clusters
from tff_clustered.federated import client_work, local_training
from tff_clustered.federated.batching import ArrayBatches
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec


def mclr_predict(weights: tuple, x: tf.Tensor, training: bool) -> tf.Tensor:
    return tf.matmul(x, weights[0]) + weights[1]


FORWARD = local_training.stateless(mclr_predict)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(23, 5)).astype(np.float32)
Y = RNG.integers(0, 3, 23).astype(np.int32)
W = RNG.normal(size=(5, 3)).astype(np.float32)
B = RNG.normal(size=3).astype(np.float32)


def numpy_bias_sgd(b: np.ndarray, lr: float, momentum: float, batch: int) -> np.ndarray:
    """SGD with momentum on the bias alone, the kernel W fixed, batches in order."""
    velocity = np.zeros_like(b)
    for i in range(0, len(X), batch):
        logits = X[i : i + batch] @ W + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(p)), Y[i : i + batch]] -= 1
        velocity = momentum * velocity + p.mean(0)
        b = b - lr * velocity
    return b


def test_a_frozen_tensor_gets_no_gradient_no_pull_and_no_momentum() -> None:
    """Only the bias trains: the kernel comes out bit for bit as it went in, though a pull
    acts on every tensor, and the bias follows momentum SGD with the kernel fixed."""
    start = (tf.constant(W), tf.constant(B))
    result = tf.function(local_training.train_client, autograph=False)(
        FORWARD,
        start,
        ArrayBatches(collections.OrderedDict(x=X, y=Y), 4),
        tf.constant(0.1),
        0.9,
        pulls=[local_training.Pull(0.5, (tf.zeros_like(start[0]), tf.zeros_like(start[1])))],
        trainable=(1,),
    )
    np.testing.assert_array_equal(result.weights[0].numpy(), W)
    # the pull on the bias is 0.5 (b - 0): add it to the reference's gradient
    velocity, b = np.zeros_like(B), B.copy()
    for i in range(0, len(X), 4):
        logits = X[i : i + 4] @ W + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(p)), Y[i : i + 4]] -= 1
        velocity = 0.9 * velocity + p.mean(0) + 0.5 * b
        b = b - 0.1 * velocity
    np.testing.assert_allclose(result.weights[1].numpy(), b, rtol=1e-5, atol=1e-6)


def inputs(batches: ArrayBatches) -> client_work.ClientInputs:
    weights = (tf.constant(W), tf.constant(B))
    return client_work.ClientInputs(
        weights, (), (), (), batches, tf.constant(0.1), tf.constant(1.0), tf.constant([1, 2])
    )


def run_work(work: object, epochs: int = 1, max_steps: int = -1) -> client_work.ClientOutputs:
    def call() -> client_work.ClientOutputs:
        data = collections.OrderedDict(x=X, y=Y)
        return work(FORWARD, inputs(ArrayBatches(data, 4, epochs, 7, max_steps)))

    return tf.function(call, autograph=False)()


def test_one_phase_on_every_tensor_is_local_sgd() -> None:
    phased = run_work(client_work.PhasedSGD((client_work.Phase((0, 1)),), momentum=0.5))
    plain = run_work(client_work.LocalSGD(momentum=0.5))
    for a, b in zip(phased.weights, plain.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert float(phased.num_examples) == float(plain.num_examples) == 23.0


def test_head_then_body_phases_each_train_their_own_tensors_for_their_own_budget() -> None:
    """FedRep's schedule on MCLR (head: the bias, body: the kernel): the head phase's 3 epochs
    move only the bias, the body phase then moves only the kernel, for the round's budget
    (here `--local_steps=2` of batch 4: 8 examples counted, not the head phase's 69)."""
    head_only = run_work(client_work.PhasedSGD((client_work.Phase((1,), 3),)), max_steps=2)
    assert float(head_only.num_examples) == 3 * 23.0  # a phase of its own epochs ignores steps
    np.testing.assert_array_equal(head_only.weights[0].numpy(), W)
    both = run_work(
        client_work.PhasedSGD((client_work.Phase((1,), 3), client_work.Phase((0,)))), max_steps=2
    )
    assert float(both.num_examples) == 8.0
    np.testing.assert_array_equal(both.weights[1].numpy(), head_only.weights[1].numpy())
    assert not np.allclose(both.weights[0].numpy(), W)


CONFIG = TrainingConfig(
    rounds=6, clients_per_round=16, local_epochs=1, learning_rate=0.1, seed=1, eval_every=6
)


def run(algorithm: str, **options: object) -> Experiment:
    """16 digits clients in 4 label-permutation groups: a personal head can undo a client's
    permutation, one shared model cannot."""
    data = load_digits_clusters(num_clients=16, num_groups=4, seed=CONFIG.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **options),
        CONFIG,
        execution=RunExecution.of("in_process"),
    )
    exp.start()
    list(exp.rounds())
    return exp


def test_fedrep_personal_heads_beat_fedavg_and_fedper_on_permuted_labels() -> None:
    """Its head trained first, on the received body, each client undoes its permutation
    sooner than FedPer's (head and body in one pass), and far better than one shared model.
    Measured when written (seed 1): FedRep 0.52, FedPer 0.28, FedAvg 0.18."""
    fedrep, fedavg = run("fedrep", fedrep_head_epochs=3), run("fedavg")
    fedper = run("fedper")
    assert fedrep.signature().work == client_work.PhasedSGD(
        (client_work.Phase((2, 3), 3), client_work.Phase((0, 1)))
    )
    accuracy, baseline = fedrep.state.history[-1]["accuracy"], fedavg.state.history[-1]["accuracy"]
    assert accuracy > baseline + 0.2, (accuracy, baseline)
    assert accuracy > fedper.state.history[-1]["accuracy"] + 0.1


def test_fedrep_options_are_checked() -> None:
    with pytest.raises(ValueError, match="fedrep_head_epochs >= 0"):
        make_algorithm("fedrep", fedrep_head_epochs=-1)
    assert make_algorithm("fedrep", personal_layers=2).options.personal_layers == 2
    options = make_algorithm("fedrep").options
    assert dataclasses.asdict(options) == {"personal_layers": None, "fedrep_head_epochs": 10}


def test_lg_fedavg_federates_the_head_only_and_its_local_bodies_beat_fedavg() -> None:
    """The reverse split: only the top layer is shared and averaged; each client's own body
    maps its permuted digits onto the common head. Measured when written (seed 1, 6 rounds):
    LG-FedAvg 0.39, FedAvg 0.18."""
    lg_fedavg, fedavg = run("lg_fedavg"), run("fedavg")
    assert lg_fedavg.state.shared == (2, 3)  # the output layer's kernel and bias
    bodies = [lg_fedavg.queries.client_models([c])[0] for c in lg_fedavg.data.client_ids[:2]]
    assert not np.allclose(bodies[0], bodies[1])  # the clients' own lower layers
    accuracy, baseline = (e.state.history[-1]["accuracy"] for e in (lg_fedavg, fedavg))
    assert accuracy > baseline + 0.1, (accuracy, baseline)
    with pytest.raises(ValueError, match="lg_global_layers >= 1"):
        make_algorithm("lg_fedavg", lg_global_layers=0)
