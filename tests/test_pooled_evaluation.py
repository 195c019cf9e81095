"""Pooled evaluation (`Experiment.score_pooled`: one call per model over every client's
examples) gives each client the results of the per-client path (`Experiment.score`), for every
model kind, models with state (BatchNorm) and a single-logit model, on both executions."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_dataset, load_digits_clusters
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.evaluation import server_models
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec
from tff_clustered.models.keras_models import ModelSpec

pytestmark = pytest.mark.usefixtures("tff_context")
TESTDATA = os.path.join(os.path.dirname(__file__), os.pardir, "testdata")
CONFIG = TrainingConfig(rounds=2, clients_per_round=6, learning_rate=0.1, batch_size=8, seed=3)


def trained(
    algorithm: str, data: FederatedData, model: ModelSpec, execution: str, **options: object
) -> Experiment:
    config = dataclasses.replace(CONFIG, clients_per_round=min(6, len(data.client_ids)))
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **options),
        config,
        execution=RunExecution.of(execution),
    )
    exp.start()
    list(exp.rounds())
    return exp


def assert_same_results(pooled: dict, per_client: dict) -> None:
    assert list(pooled) == list(per_client)
    for client, expected in per_client.items():
        got = pooled[client]
        assert got["num_examples"] == expected["num_examples"] > 0, client
        assert got["num_correct"] == expected["num_correct"], client
        np.testing.assert_allclose(got["loss_sum"], expected["loss_sum"], rtol=1e-4, err_msg=client)


def per_client(exp: Experiment, models: np.ndarray, keys: np.ndarray, split: str) -> dict:
    whole = exp.calls.whole_model_round(len(models))
    return exp.calls.score(whole, models, keys, exp.data.client_ids, split=split)


def from_probabilities(exp: Experiment, model: np.ndarray, client_ids: list) -> dict:
    """Per-client sums computed from the server-side inference (`predict_probabilities`)."""
    results = {}
    for c in client_ids:
        arrays = exp.data.arrays("test", c)
        probabilities = exp.queries.predict_probabilities(model[None], arrays["x"])[0]
        picked = probabilities[np.arange(len(arrays["y"])), arrays["y"]]
        results[c] = {
            "loss_sum": float(-np.log(picked).sum()),
            "num_correct": float((probabilities.argmax(1) == arrays["y"]).sum()),
            "num_examples": float(len(arrays["y"])),
        }
    return results


@pytest.mark.parametrize("execution", ["tff", "in_process"])
def test_pooled_scores_equal_per_client_scores_for_each_kind(execution: str) -> None:
    data = load_digits_clusters(num_clients=10, num_groups=2, seed=3)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    exp = trained("ifca", data, model, execution, num_clusters=2)
    ids = exp.data.client_ids
    clusters = np.arange(len(ids)) % 2  # both models score clients, interleaved
    for kind in ("global", "cluster"):
        models, keys = server_models(exp.state.cluster_models, kind, clusters)
        for split in ("test", "train"):
            assert_same_results(
                exp.calls.score_pooled(models, keys, ids, split),
                per_client(exp, models, keys, split),
            )
    # the whole evaluation row, through the pooled path, is what the per-client path pools to
    row = exp.evaluate()
    clusters = exp.algorithm.evaluation_clusters(exp.run, exp.view(), list(ids), exp.queries)
    models, keys = server_models(exp.state.cluster_models, "cluster", clusters)
    expected = per_client(exp, models, keys, "test")
    total = sum(r["num_examples"] for r in expected.values())
    correct = sum(r["num_correct"] for r in expected.values())
    assert row["accuracy_cluster"] == pytest.approx(correct / total, abs=1e-12)


def test_pooled_scores_of_a_model_with_batchnorm_state() -> None:
    data = load_dataset("cifar10", data_dir=os.path.join(TESTDATA, "cifar10_tiny"), num_clients=4)
    model = model_spec("resnet18", data.input_shape, data.num_classes, resnet_width=4)
    config = dataclasses.replace(CONFIG, clients_per_round=4)
    exp = Experiment(
        data, model, make_algorithm("fedavg"), config, execution=RunExecution.of("in_process")
    )
    exp.start()
    state_size = sum(int(np.prod(s)) for s in exp.layout.state_shapes)
    assert state_size  # BatchNorm moving statistics go with the model
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "global", np.zeros(len(ids), np.int32))
    # moving means and variances away from their initial 0 and 1, so that they matter
    models = models.copy()
    models[:, -state_size:] = np.random.default_rng(0).uniform(0.5, 2.0, state_size)
    pooled = exp.calls.score_pooled(models, keys, ids, "test")
    assert_same_results(pooled, from_probabilities(exp, models[0], ids))
    initial = exp.calls.score_pooled(
        server_models(exp.state.cluster_models, "global", keys)[0], keys, ids, "test"
    )
    assert [pooled[c]["loss_sum"] for c in ids] != [initial[c]["loss_sum"] for c in ids]


@pytest.mark.parametrize("execution", ["tff", "in_process"])
def test_a_personal_head_is_scored_pooled_as_client_by_client(execution: str) -> None:
    """FedPer's personal kind: the shared layers run once on every client's examples and each
    client's own head (from the store) on its rows, one call: each client's correct count is
    the per-client path's (the logits are its bit for bit), its loss to float rounding."""
    data = load_digits_clusters(num_clients=6, num_groups=2, seed=4)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    exp = trained("fedper", data, model, execution)
    ids = exp.data.client_ids
    clusters = np.zeros(len(ids), np.int32)
    models, keys = server_models(exp.state.cluster_models, "cluster", clusters)
    fed_round = exp.current_round()
    assert exp.calls.row_head_start(fed_round) == 2  # the top Dense layer's kernel
    personal = exp.evaluator.score_kind("personal", models, keys, ids, exp.store, fed_round)
    assert_same_results(personal, exp.calls.score(fed_round, models, keys, ids, exp.store))
    whole = exp.calls.score_pooled(models, keys, ids)  # the shared base with the initial head
    assert [personal[c]["num_correct"] for c in ids] != [whole[c]["num_correct"] for c in ids]


def test_row_heads_start_where_dense_layers_run_to_the_output() -> None:
    """A head run row by row starts at a Dense layer from which only Dense layers on vectors
    and parameter-free activations follow: not below a BatchNorm layer, not at a Conv2D."""
    import tensorflow as tf

    from tff_clustered.models.functional import functional_model

    layers = tf.keras.layers

    def starts(*stack: tf.keras.layers.Layer, shape: tuple = (5,)) -> tuple:
        model = tf.keras.Sequential([tf.keras.Input(shape), *stack])
        return functional_model(model).row_head_starts

    assert starts(layers.Dense(4, activation="relu"), layers.Dense(3)) == (0, 2)
    assert starts(layers.Dense(4), layers.ReLU(), layers.Dense(3, use_bias=False)) == (0, 2)
    assert starts(layers.Dense(4), layers.BatchNormalization(), layers.Dense(3)) == (4,)
    conv = (layers.Conv2D(2, 3), layers.Flatten(), layers.Dense(3))
    assert starts(*conv, shape=(6, 6, 1)) == (2,)


def test_pooled_scores_of_a_single_logit_model() -> None:
    sent140 = os.path.join(TESTDATA, "sent140_tiny")
    glove = os.path.join(sent140, "glove_tiny.300d.txt")
    data = load_dataset("sent140", sent140, glove_path=glove, seed=0)
    model = model_spec("lstm", data.input_shape, data.num_classes)
    config = dataclasses.replace(CONFIG, clients_per_round=1)
    exp = Experiment(
        data, model, make_algorithm("fedavg"), config, execution=RunExecution.of("in_process")
    )
    exp.start()
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "global", np.zeros(len(ids), np.int32))
    assert_same_results(
        exp.calls.score_pooled(models, keys, ids), from_probabilities(exp, models[0], ids)
    )


def test_pooled_examples_go_to_the_worker_once_and_again_after_its_executor_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tensorflow_federated as tff

    from tff_clustered.loop import scoring_calls

    data = load_digits_clusters(num_clients=8, num_groups=2, seed=5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    exp = trained("ifca", data, model, "tff", num_clusters=2)
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "cluster", np.arange(len(ids)) % 2)
    first = exp.calls.score_pooled(models, keys, ids)
    held = exp.calls.pooled_rows("test", ids).examples
    assert not any(isinstance(v, np.ndarray) for v in held)  # references to the worker's values
    split = exp.calls._pooled_splits["test"]
    sent = split.examples.__self__  # the split's `WorkerArrays`
    assert sent.sends == 1  # every evaluation of the run (and this call) reused one send
    assert exp.calls.score_pooled(models, keys, ids) == first
    assert sent.sends == 1
    # TFF's context drops its executor after an error: the examples are sent again
    tff.framework.get_context_stack().current.executor_factory.clean_up_executor({})
    assert exp.calls.score_pooled(models, keys, ids) == first
    assert sent.sends == 2
    # a split too large to keep is pooled per call, with the same results
    monkeypatch.setattr(scoring_calls, "POOLED_SPLIT_MAX_BYTES", 0)
    exp.calls._pooled_splits.clear()
    assert exp.calls.score_pooled(models, keys, ids) == first
    assert exp.calls._pooled_splits["test"] is None


def test_pooled_examples_reach_the_worker_from_inside_a_running_event_loop() -> None:
    """A notebook's cells run inside an event loop: sending the pooled examples must not need
    one of its own there."""
    import asyncio

    import tensorflow_federated as tff

    from tff_clustered.federated.resident import WorkerArrays

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    held = WorkerArrays((x,), (tff.TensorType(np.float32, [None, 3]),))

    async def from_a_cell() -> tuple:
        return held.values()

    (value,) = asyncio.run(from_a_cell())
    assert not isinstance(value, np.ndarray) and held.sends == 1
