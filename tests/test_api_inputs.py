"""The Python API refuses malformed input as the command line does: before any TensorFlow work,
with one line of ValueError or TypeError naming the problem (the client, the argument or the
option) and the fix.

`tff_clustered.run` never reaches its runtime in this module: `api.tff_runtime` is replaced by
one that raises `ReachedTheRun`, so an input the checks let through fails the test at once
(and quickly) instead of training. Hypothesis runs derandomized with few examples, so the
suite sees the same cases every time in a few seconds.
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tff_clustered
from tff_clustered.algorithms import ALGORITHMS, make_options
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.state import RunState
from tff_clustered.models.description import architecture
from tff_clustered.options import base_type, field_types
from tff_clustered.run_folder import RunFolder
from tff_clustered.runs import api, checkpoint

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FEATURES = 3


class ReachedTheRun(Exception):
    """The checks let an input through to the runtime."""


@pytest.fixture(autouse=True, scope="module")
def runs_stop_before_the_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`run` stops at the runtime, and writes (its folder's lock) only under a temporary
    folder."""

    def no_runtime(*args: Any, **kwargs: Any) -> None:
        raise ReachedTheRun("the input reached the run")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "tff_runtime", no_runtime)
        patch.chdir(tmp_path_factory.mktemp("runs"))
        yield


def dense_model(outputs: int = 2, *tail: tf.keras.layers.Layer, **dense: Any) -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
            tf.keras.layers.Dense(outputs, **dense),
        ]
        + list(tail)
    )


def clients_of(sizes: list[int], seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        f"c{i}": (rng.normal(size=(n, FEATURES)).astype(np.float32), np.arange(n) % 2)
        for i, n in enumerate(sizes)
    }


def assert_named_error(call: Callable[[], object], *names: str) -> str:
    """`call` fails with one line of ValueError or TypeError naming one of `names`, with a fix
    (after a ";", or as what the value "must be" or is "one of")."""
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    assert any(name in message for name in names), (names, message)
    assert any(fix in message for fix in (";", "must be", "one of")), f"no fix: {message}"
    return message


def run(train: Any = None, output_dir: str = "run", **kwargs: Any) -> api.RunResult:
    kwargs.setdefault("model_fn", dense_model)
    kwargs.setdefault("log", lambda _: None)
    algorithm = kwargs.pop("algorithm", "fedavg")
    train = clients_of([4, 5, 6]) if train is None else train
    return tff_clustered.run(algorithm, train=train, output_dir=output_dir, **kwargs)


def test_well_formed_input_of_every_accepted_kind_reaches_the_run() -> None:
    clients = clients_of([4, 5])
    x, y = clients["c1"]
    mixed: dict[Any, Any] = dict(clients)
    mixed[7] = (x.tolist(), y.reshape(-1, 1))  # an int id, nested lists, (n, 1) labels
    mixed[np.str_("d")] = {"x": x.astype(np.float64), "y": y.astype(np.float32)}
    mixed["e"] = (x > 0, y.astype(bool))
    with pytest.raises(ReachedTheRun):
        run(
            mixed,
            algorithm="ifca",
            options={"num_clusters": np.int64(2)},
            training=TrainingConfig(rounds=np.int64(2), learning_rate=np.float32(0.5)),
            seed=np.int64(1),
            planted_groups={"c0": 0, "c1": 1, 7: 0, "d": 1, "e": 0},
        )
    client_data = tff.simulation.datasets.TestClientData(
        {c: collections.OrderedDict(x=x, y=y) for c, (x, y) in clients.items()}
    )
    with pytest.raises(ReachedTheRun):
        run(client_data)


# --------------------------------------------------------------------------------------------
# Malformed clients: each corruption of one client of a valid dataset is refused by name.


def corrupted(kind: str, x: np.ndarray, y: np.ndarray, data: st.DataObject) -> tuple[Any, str]:
    """The client's `(x, y)` value with the corruption `kind`, and a word its error must say."""
    n = len(y)
    if kind == "fewer_labels":
        return (x, y[: -data.draw(st.integers(1, n))]), "labels"
    if kind == "more_labels":
        return (x, np.concatenate([y, y[: data.draw(st.integers(1, n))]])), "labels"
    if kind == "non_finite_label":
        bad = y.astype(np.float64)
        bad[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from([np.nan, np.inf]))
        return (x, bad), "NaN or infinity"
    if kind == "fractional_label":
        return (x, y + data.draw(st.sampled_from([0.5, 0.25]))), "whole numbers"
    if kind == "negative_label":
        return (x, y - data.draw(st.integers(2, 5))), "negative"
    if kind == "one_hot_labels":
        return (x, np.eye(data.draw(st.integers(2, 4)))[y]), "one-hot"
    if kind == "string_labels":
        return (x, np.array([f"class{v}" for v in y])), "not numbers"
    if kind == "ragged_inputs":
        rows = x.tolist()
        rows[data.draw(st.integers(0, n - 1))] = rows[0][: data.draw(st.integers(0, FEATURES - 1))]
        return (rows, y), "ragged"
    if kind == "string_inputs":
        return (x.astype(str), y), "numbers"
    if kind == "no_features":
        return (np.zeros((n, 0), np.float32), y), "at least one feature"
    if kind == "scalar_inputs":
        return (float(x[0, 0]), y), "one number"
    if kind == "non_finite_inputs":
        bad = x.copy()
        bad[data.draw(st.integers(0, n - 1)), 0] = data.draw(st.sampled_from([np.nan, -np.inf]))
        return (bad, y), "NaN or infinity"
    if kind == "not_a_pair":
        return data.draw(st.sampled_from([None, 3, "xy", (x,), (x, y, y), x])), "(x, y) pair"
    if kind == "missing_key":
        return {"x": x, "label": y}, "x_key= and y_key="
    raise AssertionError(kind)


CLIENT_CORRUPTIONS = [
    "fewer_labels",
    "more_labels",
    "non_finite_label",
    "fractional_label",
    "negative_label",
    "one_hot_labels",
    "string_labels",
    "ragged_inputs",
    "string_inputs",
    "no_features",
    "scalar_inputs",
    "non_finite_inputs",
    "not_a_pair",
    "missing_key",
]


@SETTINGS
@given(
    sizes=st.lists(st.integers(2, 6), min_size=1, max_size=4),
    kind=st.sampled_from(CLIENT_CORRUPTIONS),
    data=st.data(),
)
def test_a_malformed_client_is_refused_naming_it(
    sizes: list[int], kind: str, data: st.DataObject
) -> None:
    clients = clients_of(sizes)
    victim = data.draw(st.sampled_from(sorted(clients)))
    clients[victim], problem = corrupted(kind, *clients[victim], data)
    message = assert_named_error(lambda: run(clients), problem)
    assert repr(victim) in message, message


@SETTINGS
@given(
    sizes=st.lists(st.integers(2, 6), min_size=1, max_size=4),
    kind=st.sampled_from(["same_id_as_int", "id_of_another_type", "no_clients", "one_example"]),
    data=st.data(),
)
def test_malformed_client_ids_and_counts_are_refused(
    sizes: list[int], kind: str, data: st.DataObject
) -> None:
    clients: dict[Any, Any] = clients_of(sizes)
    if kind == "same_id_as_int":  # 1 and "1" would be one client, one's data lost
        number = data.draw(st.integers(0, 99))
        clients[str(number)], clients[number] = clients["c0"], clients["c0"]
        problem = f"both client '{number}'"
    elif kind == "id_of_another_type":
        clients[data.draw(st.sampled_from([("c", 1), 1.5, None, True]))] = clients["c0"]
        problem = "not a string or an int"
    elif kind == "no_clients":
        clients = {}
        problem = "no clients"
    else:
        x, y = clients["c0"]
        clients["c0"] = (x[:1], y[:1])
        problem = "at least 2"
    assert_named_error(lambda: run(clients), problem)


# --------------------------------------------------------------------------------------------
# Malformed arguments of run, its options and TrainingConfig.

# Values that are not an int: a bool, a whole float (refused, not rounded), a fractional one,
# a string of digits, a word, a list.
NOT_INTS = st.sampled_from([True, False, 2.0, 2.7, -0.5, "2", "abc", [2], float("nan")])
NOT_FLOATS = st.sampled_from([True, "0.1", "fast", [0.1], None])
NOT_STRS = st.sampled_from([3, 0.5, None, True, ["a"]])
NOT_BOOLS = st.sampled_from([1, 0, "yes", "False", None, 1.0])
NOT_OF_KIND = {int: NOT_INTS, float: NOT_FLOATS, str: NOT_STRS, bool: NOT_BOOLS}


def typed_fields(cls: type) -> list[tuple[str, type]]:
    return [(name, base_type(hint)) for name, hint in field_types(cls)]


TRAINING_FIELDS = [(n, k) for n, k in typed_fields(TrainingConfig) if k in NOT_OF_KIND]
OPTION_FIELDS = [
    (algorithm, name, kind)
    for algorithm, cls in ALGORITHMS.items()
    for name, kind in typed_fields(cls.Options)
]


@SETTINGS
@given(field=st.sampled_from(TRAINING_FIELDS), data=st.data())
def test_training_config_refuses_a_value_of_another_type(
    field: tuple[str, type], data: st.DataObject
) -> None:
    name, kind = field
    value = data.draw(NOT_OF_KIND[kind])
    message = assert_named_error(lambda: TrainingConfig(**{name: value}), name)
    assert message.startswith(f"TrainingConfig: {name} must be"), message


def test_training_config_keeps_plain_python_values() -> None:
    config = TrainingConfig(rounds=np.int64(3), learning_rate=np.float32(0.5), momentum=0)
    assert type(config.rounds) is int and type(config.learning_rate) is float
    assert config.momentum == 0  # an int is a float
    assert_named_error(lambda: TrainingConfig(rounds=2.0), "write 2")
    assert_named_error(lambda: TrainingConfig(server_optimizer="adam"), "ServerOptimizer")


@SETTINGS
@given(field=st.sampled_from(OPTION_FIELDS), data=st.data())
def test_every_algorithm_option_refuses_a_value_of_another_type(
    field: tuple[str, str, type], data: st.DataObject
) -> None:
    algorithm, name, kind = field
    value = data.draw(NOT_OF_KIND[kind])
    message = assert_named_error(lambda: make_options(algorithm, **{name: value}), name)
    assert algorithm in message, message


def test_options_given_as_their_dataclass_are_checked_too() -> None:
    assert_named_error(lambda: ALGORITHMS["ifca"].Options(num_clusters=2.7), "num_clusters")
    assert_named_error(
        lambda: run(algorithm="ifca", options={"num_clusters": 0}), "num_clusters must be >= 1"
    )


RUN_ARGUMENT_CORRUPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"algorithm": 3}, "algorithm"),
    ({"algorithm": "fedsomething"}, "unknown algorithm"),
    ({"training": {"rounds": 2}}, "TrainingConfig"),
    ({"options": [("num_clusters", 2)]}, "mapping"),
    ({"options": {1: 2}}, "strings"),
    ({"options": {"num_clusters": 2}}, "num_clusters"),  # fedavg takes none
    ({"algorithm": "ifca", "options": {"num_clusters": "abc"}}, "num_clusters"),
    ({"algorithm": "ifca", "options": {"num_clusters": 2.7}}, "num_clusters"),
    ({"resume": "yes"}, "resume"),
    ({"checkpoint_every": 1.5}, "checkpoint_every"),
    ({"checkpoint_every": -1}, "checkpoint_every"),
    ({"execution": "gpu"}, "execution"),
    ({"client_store": "ram"}, "client_store"),
    ({"client_store": True}, "client_store"),
    ({"output_dir": None}, "output_dir"),
    ({"log": "stdout"}, "log"),
    ({"model_name": 3}, "model_name"),
    ({"test_fraction": 1.5}, "test_fraction"),
    ({"test_fraction": "0.2"}, "test_fraction"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"num_classes": 0}, "num_classes"),
    ({"num_classes": "3"}, "num_classes"),
    ({"num_classes": 1}, "outside"),  # the labels 0 and 1 need 2 classes
    ({"x_key": 0}, "x_key"),
    ({"planted_groups": [0, 1]}, "planted_groups"),
    ({"planted_groups": {"c0": 0}}, "planted_groups"),
    ({"num_cluster": 2}, "num_cluster"),  # a typo: no such argument
    ({"test": {"c0": (np.zeros((2, FEATURES)), [0, 1])}}, "only one of train/test"),
]


@SETTINGS
@given(case=st.sampled_from(RUN_ARGUMENT_CORRUPTIONS))
def test_a_malformed_argument_of_run_is_refused_naming_it(case: tuple[dict, str]) -> None:
    arguments, name = case
    assert_named_error(lambda: run(**arguments), name)


MODELS_THAT_DO_NOT_FIT: list[tuple[Callable[[], Any], str]] = [
    (lambda: dense_model(2, tf.keras.layers.Softmax()), "softmax"),
    (lambda: dense_model(2, tf.keras.layers.Activation("softmax")), "softmax"),
    (lambda: dense_model(2, tf.keras.layers.Activation(tf.nn.softmax)), "softmax"),
    (lambda: dense_model(2, activation="softmax"), "softmax"),
    (lambda: dense_model(2, activation="sigmoid"), "sigmoid"),
    (lambda: dense_model(2, tf.keras.layers.Activation("sigmoid")), "sigmoid"),
    (
        lambda: tf.keras.Sequential(
            [
                dense_model(4),
                tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.layers.Softmax()]),
            ]
        ),
        "softmax",
    ),
    (lambda: dense_model(3), "must return 2 logits"),
    (lambda: tf.keras.Sequential([tf.keras.layers.Reshape((7,))]), "cannot take"),
    (lambda: [dense_model()], "not a tf.keras.Model"),
    (lambda: tf.keras.Sequential([tf.keras.layers.Flatten()]), "must return 2 logits"),
    # issue 49, item 10: TFF's builder takes an LSTM with dropout, then fails in round 1
    (
        lambda: tf.keras.Sequential(
            [
                tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
                tf.keras.layers.Reshape((FEATURES, 1)),
                tf.keras.layers.LSTM(4, dropout=0.2),
                tf.keras.layers.Dense(2),
            ]
        ),
        "dropout not supported",
    ),
    # issue 49, item 14: NaN initial weights are bad input, not a learning rate too high
    (lambda: dense_model(2, kernel_initializer=tf.keras.initializers.Constant(np.nan)), "NaN"),
    (lambda: dense_model(2, bias_initializer=tf.keras.initializers.Constant(np.inf)), "NaN"),
]


@pytest.mark.parametrize("model_fn, problem", MODELS_THAT_DO_NOT_FIT)
def test_a_model_that_does_not_return_logits_is_refused(
    model_fn: Callable[[], Any], problem: str
) -> None:
    assert_named_error(lambda: run(model_fn=model_fn), problem)


def test_a_model_instead_of_its_builder_is_refused() -> None:
    assert_named_error(lambda: run(model_fn=dense_model()), "model_fn must be a function")


def test_resuming_with_a_model_of_another_size_names_both_sizes(tmp_path: Any) -> None:
    clients = clients_of([4, 5, 6])
    data = api.federated_data(clients)
    settings = api.run_settings("fedavg", make_options("fedavg"), TrainingConfig(), data, "custom")
    made_with = api.model_values(dense_model())  # 3 * 2 + 2
    state = RunState(round_num=1, cluster_models=np.zeros((1, made_with), np.float32))
    output_dir = str(tmp_path)
    checkpoint.save(RunFolder(output_dir).checkpoint, state, settings)

    def wider() -> tf.keras.Model:
        return tf.keras.Sequential(
            [tf.keras.layers.InputLayer(input_shape=(FEATURES,)), tf.keras.layers.Dense(5)]
            + [tf.keras.layers.Dense(2)]
        )

    message = assert_named_error(
        lambda: run(clients, output_dir, model_fn=wider, resume=True), "model of 8 values"
    )
    assert f"this model_fn's has {api.model_values(wider()):,}" in message
    assert "another output_dir" in message and output_dir in message
    with pytest.raises(ReachedTheRun):  # the model that made it resumes
        run(clients, output_dir, resume=True)
    with pytest.raises(ReachedTheRun):  # another model in a new folder starts afresh
        run(clients, str(tmp_path / "new"), model_fn=wider)


def test_resuming_with_another_model_of_the_same_size_names_what_differs(tmp_path: Any) -> None:
    """Issue 64: a model_fn of the same size but another activation (relu -> tanh) or layer
    class continued the checkpoint's run in the new model; refused, naming the layer and the
    setting. The model that made it resumes; a checkpoint that predates the record (the test
    above) resumes on its size."""
    clients = clients_of([4, 5, 6])
    data = api.federated_data(clients)

    def hidden(activation: str, layer: type = tf.keras.layers.Dense) -> Callable[[], Any]:
        return lambda: tf.keras.Sequential(
            [tf.keras.layers.InputLayer(input_shape=(FEATURES,)), layer(4, activation=activation)]
            + [tf.keras.layers.Dense(2)]
        )

    relu = hidden("relu")
    made = relu()
    settings = api.run_settings(
        "fedavg", make_options("fedavg"), TrainingConfig(), data, "custom", architecture(made)
    )
    state = RunState(round_num=1, cluster_models=np.zeros((1, api.model_values(made)), np.float32))
    output_dir = str(tmp_path)
    checkpoint.save(RunFolder(output_dir).checkpoint, state, settings)
    for other, differs in (
        (hidden("tanh"), "model_architecture.layer 1 Dense.activation: checkpoint 'relu', now "),
        (hidden("relu", MaxNormDense), "layer 1 Dense: checkpoint (this layer), now (none)"),
    ):
        with pytest.raises(checkpoint.CheckpointError, match=re.escape(differs)) as refused:
            run(clients, output_dir, model_fn=other, resume=True)
        assert "\n" not in str(refused.value)
    with pytest.raises(ReachedTheRun):
        run(clients, output_dir, model_fn=relu, resume=True)


def test_a_fedgroup_checkpoint_from_before_cold_start_auto_resumes_with_eager(
    tmp_path: Any,
) -> None:
    """The API as train.py (tests/test_train_binary.py): a FedGroup checkpoint of a run with
    --cold_start=eager, the default before auto, resumes with the options at today's default
    as that run ran, saying so; another value given is refused as another setting."""
    clients = clients_of([4, 5, 6])
    data = api.federated_data(clients)
    made = dense_model()
    eager = make_options("fedgroup", num_clusters=1, cold_start="eager")
    settings = api.run_settings(
        "fedgroup", eager, TrainingConfig(), data, "custom", architecture(made)
    )
    state = RunState(round_num=1, cluster_models=np.zeros((1, api.model_values(made)), np.float32))
    output_dir = str(tmp_path)
    checkpoint.save(RunFolder(output_dir).checkpoint, state, settings)
    said: list[str] = []
    with pytest.raises(ReachedTheRun):
        run(clients, output_dir, algorithm="fedgroup", options={"num_clusters": 1}, resume=True,
            log=said.append)  # fmt: skip
    assert said == [
        f"resuming {RunFolder(output_dir).checkpoint} with --cold_start=eager, which its run had "
        "(the default before --cold_start=auto was); start over (--overwrite) to run with "
        "--cold_start=auto"
    ]
    lazy = {"num_clusters": 1, "cold_start": "lazy"}
    with pytest.raises(checkpoint.CheckpointError, match="cold_start: checkpoint 'eager', now"):
        run(clients, output_dir, algorithm="fedgroup", options=lazy, resume=True)


class MaxNormDense(tf.keras.layers.Dense):
    """A Dense layer of another class (the same weights)."""


def test_a_cold_start_setting_for_an_algorithm_without_a_cold_start_is_refused() -> None:
    """Issue 64: FedAvg and IFCA read no clients' updates at a cold start, so a private
    aggregator's cold-start settings changed for them do nothing: refused naming the setting
    and its flag (the command line refuses the flags: tests/test_train_binary.py)."""
    raw = tff_clustered.ClusterDP(1.0, cold_start_release="raw")
    for algorithm in ("fedavg", "ifca"):
        refused = functools.partial(run, algorithm=algorithm, aggregator=raw)
        message = assert_named_error(refused, "raw")
        assert message.startswith(f"{algorithm} has no cold start that reads clients' updates, "
                                  "so the dp aggregator's cold_start_release='raw' "
                                  "(--dp_cold_start) would do nothing"), message  # fmt: skip
    with pytest.raises(ReachedTheRun):  # the default settings
        run(aggregator=tff_clustered.ClusterDP(1.0))


def test_the_checks_are_the_same_for_a_tff_client_data() -> None:
    strings = tff.simulation.datasets.TestClientData(
        {"a": collections.OrderedDict(x=np.array(["u", "v"]), y=np.array([0, 1]))}
    )
    assert_named_error(lambda: run(strings), "'a'")
    one_hot = tff.simulation.datasets.TestClientData(
        {"a": collections.OrderedDict(x=np.zeros((2, FEATURES)), y=np.eye(2))}
    )
    assert_named_error(lambda: run(one_hot), "one-hot")
