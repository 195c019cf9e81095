"""The Python API (`tff_clustered.run`) on a user's own clients and Keras model, and the
example script that shows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, TESTDATA, run_binary, worker_pids_with_tag

import tff_clustered
from tff_clustered.data import DataError
from tff_clustered.loop.phases import PHASES
from tff_clustered.runs import api
from tff_clustered.runs.checkpoint import CheckpointError


def two_group_clients(num_clients: int = 8, seed: int = 0) -> dict:
    """Blobs whose label depends on the sign of x0, reversed in the second group."""
    rng = np.random.default_rng(seed)
    clients = {}
    for i in range(num_clients):
        x = rng.normal(size=(30, 4)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        clients[f"c{i}"] = (x, 1 - y if i % 2 else y)
    return clients


def small_model() -> tf.keras.Model:
    return tf.keras.Sequential(
        [tf.keras.layers.InputLayer(input_shape=(4,)), tf.keras.layers.Dense(2)]
    )


def test_the_example_script_recovers_the_groups_and_beats_fedavg(tmp_path: object) -> None:
    tag = uuid.uuid4().hex
    done = run_binary(
        ["examples/own_data.py", "--rounds=12", f"--output_dir={tmp_path}"],
        {"TFF_CLUSTERED_RUN_TAG": tag},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ifca: final accuracy" in done.stdout, done.stdout
    assert re.search(r"ifca: .*adjusted Rand against the two groups 1\.000", done.stdout)
    gain = float(re.search(r"ifca - fedavg: ([-+.\d]+)", done.stdout).group(1))
    assert gain >= 0.2, done.stdout
    summary = json.load(open(os.path.join(tmp_path, "ifca", "summary.json")))
    assert summary["results"]["clusters"]["cluster_sizes"] == [8, 8]
    assert worker_pids_with_tag(tag) == []


def test_run_on_a_dict_of_arrays_in_process_returns_models_and_resumes(tmp_path: object) -> None:
    clients = two_group_clients()
    groups = {c: i % 2 for i, c in enumerate(clients)}
    training = tff_clustered.TrainingConfig(
        rounds=4, clients_per_round=8, local_epochs=2, batch_size=10, learning_rate=0.5
    )
    kwargs = dict(
        train=clients,
        model_fn=small_model,
        options={"num_clusters": 2},
        training=training,
        output_dir=str(tmp_path / "ifca"),
        execution="in_process",
        planted_groups=groups,
        log=lambda _: None,
    )
    result = tff_clustered.run("ifca", **kwargs)
    assert result.summary["config"]["algorithm"] == "ifca"
    assert len(result.history) == 5 and result.cluster_models.shape[0] == 2
    assert result.summary["results"]["clusters"]["adjusted_rand_vs_planted"] == 1.0
    # Each cluster's model, as a Keras model, classifies its own group's clients.
    for client, (x, y) in clients.items():
        model = result.cluster_model(result.assignment[client])
        assert np.mean(np.argmax(model(x).numpy(), axis=1) == y) >= 0.8, client
    again = tff_clustered.run("ifca", resume=True, **kwargs)  # finished: the same results
    for key in ("final_accuracy", "max_accuracy", "clusters"):
        assert again.summary["results"][key] == result.summary["results"][key]
    # The time of each session, from the call: the resumed one trained no round again.
    first, resumed = result.summary["phases"], again.summary["phases"]
    assert resumed == json.load(open(os.path.join(tmp_path, "ifca", "summary.json")))["phases"]
    for phases in (first, resumed):
        timed = [phases[p] for p in PHASES if p in phases]
        assert min(timed) >= 0
        assert 0 <= phases["unaccounted"] <= 0.05 * phases["wall"], phases
    assert PHASES[1:] == tuple(p for p in PHASES if p in first)  # all but imports
    assert first["parts"]["training"] > 0 and "training" not in resumed["parts"]
    np.testing.assert_array_equal(again.cluster_models, result.cluster_models)
    # A lost clients.csv: the resume says which rows are lost and ends, leaving no stale picture.
    folder = os.path.join(tmp_path, "ifca")
    assert os.path.exists(os.path.join(folder, "membership.png"))
    os.unlink(os.path.join(folder, "clients.csv"))
    said: list[str] = []
    tff_clustered.run("ifca", resume=True, **dict(kwargs, log=said.append))
    assert any("clients.csv is missing" in line and "(0 to 4)" in line for line in said), said
    assert not os.path.exists(os.path.join(folder, "membership.png"))
    other = dict(clients, c0=(clients["c0"][0] + 1, clients["c0"][1]))
    with pytest.raises(CheckpointError, match="fingerprint"):
        tff_clustered.run("ifca", resume=True, **dict(kwargs, train=other))


@pytest.mark.parametrize(
    "model_fn, message",
    [
        (lambda: tf.keras.Sequential([tf.keras.layers.Dense(3)]), "must return 2 logits"),
        (lambda: tf.keras.Sequential([tf.keras.layers.Dense(2, "softmax")]), "return logits"),
        (lambda: tf.keras.Sequential([tf.keras.layers.Reshape((7,))]), "cannot take"),
    ],
)
def test_a_model_that_does_not_fit_the_data_is_refused(model_fn: object, message: str) -> None:
    data = api.federated_data(two_group_clients())
    with pytest.raises(ValueError, match=message):
        api.keras_model_spec(model_fn, data)


def test_client_data_with_other_keys_needs_x_key_and_y_key() -> None:
    import collections

    import tensorflow_federated as tff

    x = np.zeros((5, 4), np.float32)
    clients = tff.simulation.datasets.TestClientData(
        {"a": collections.OrderedDict(pixels=x, label=np.zeros(5, np.int32))}
    )
    with pytest.raises(DataError, match="x_key= and y_key="):
        api.federated_data(clients)
    data = api.federated_data(clients, x_key="pixels", y_key="label", num_classes=2)
    assert data.train_sizes["a"] + data.test_sizes["a"] == 5 and data.num_classes == 2
    with pytest.raises(ValueError, match="its options"):
        tff_clustered.run(
            "fedavg",
            train=clients,
            model_fn=small_model,
            output_dir="unused",
            options={"num_clusters": 2},
            x_key="pixels",
            y_key="label",
        )


def test_the_quickstart_notebook_runs_and_recovers_the_groups(tmp_path: object) -> None:
    # Its code cells in order, as Jupyter would run them, with fewer rounds and the outputs in
    # tmp_path; no Jupyter needed (its display cell falls back to a print).
    with open(os.path.join(ROOT, "examples", "quickstart.ipynb")) as f:
        notebook = json.load(f)
    source = "\n\n".join(
        "".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"
    )
    settings = {
        "ROUNDS = 20": "ROUNDS = 12",
        'OUTPUT_DIR = os.path.join(ROOT, "runs", "notebook")': f"OUTPUT_DIR = {str(tmp_path)!r}",
    }
    for setting, value in settings.items():
        assert setting in source, setting
        source = source.replace(setting, value)
    script = tmp_path / "notebook.py"
    script.write_text(source)
    done = run_binary([str(script)], {"MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"ifca +final accuracy .*adjusted Rand vs the groups 1\.000", done.stdout)
    gain = float(re.search(r"IFCA - FedAvg: ([-+.\d]+)", done.stdout).group(1))
    assert gain >= 0.2, done.stdout
    assert os.path.isfile(tmp_path / "ifca" / "membership.png")


def test_the_api_runs_a_dataset_and_model_by_their_records_as_the_runner_does(
    tmp_path: object,
) -> None:
    """`run` takes the records the flags fill (`DataSpec`, `ModelChoice`) and gives the run
    `binaries/train.py`'s runner gives for the same records: one way to name a dataset and a
    model, typed once."""
    from tff_clustered.data import DataSpec
    from tff_clustered.loop.execution import RunExecution
    from tff_clustered.runs import runner
    from tff_clustered.runs.run_spec import ModelChoice, RunSpec

    data = DataSpec("digits", num_clients=6)
    model = ModelChoice("mlp", hidden_units=8)
    training = tff_clustered.TrainingConfig(rounds=2, clients_per_round=3, local_epochs=1)
    by_api = tff_clustered.run(
        "fedper",
        data,
        model,
        output_dir=str(tmp_path / "api"),
        training=training,
        execution="in_process",
        log=lambda _: None,
    )
    spec = RunSpec("fedper", data, model, training=training)
    by_runner = runner.run(
        spec, str(tmp_path / "runner"), RunExecution.of("in_process"), log=lambda _: None
    )
    assert len(by_api.history) == len(by_runner["history"]) == 3  # rounds 0-2
    for mine, theirs in zip(by_api.history, by_runner["history"]):
        assert mine["accuracy"] == theirs["accuracy"]
        assert mine.get("train_loss") == theirs.get("train_loss")
    assert by_api.cluster_model(0).count_params() > 0
    # one run's folder, whichever made it: the API resumes the runner's (train.py's) run
    again = tff_clustered.run(
        "fedper",
        data,
        model,
        output_dir=str(tmp_path / "runner"),
        training=training,
        execution="in_process",
        resume=True,
        log=lambda _: None,
    )
    assert again.history[-1]["accuracy"] == by_runner["history"][-1]["accuracy"]
    with pytest.raises(ValueError, match="already a DataSpec"):
        tff_clustered.run("fedavg", data, model, output_dir=str(tmp_path / "x"), test={})


def test_given_clients_are_held_as_their_own_arrays_and_split_as_before() -> None:
    """`{client: (x, y)}` is held without a copy of its examples: each split's arrays are the
    seeded shuffle `split_train_test` makes of the client's examples (x float32, y int32), as
    they were when the splits were copied, gathered from the given arrays when asked for; given
    test sets are the user's own arrays."""
    from tff_clustered.data.federated_data import split_train_test
    from tff_clustered.seeds import DataStream, data_rng

    clients = two_group_clients(5)
    data = api.federated_data(clients, seed=3)
    rng = data_rng(3, DataStream.GIVEN_CLIENTS_SPLIT)
    for client, (x, y) in clients.items():
        for split, (xs, ys) in zip(("train", "test"), split_train_test(x, y, 0.8, rng)):
            arrays = data.arrays(split, client)
            np.testing.assert_array_equal(arrays["x"], xs)
            np.testing.assert_array_equal(arrays["y"], ys)
            assert arrays["x"].dtype == np.float32 and arrays["y"].dtype == np.int32
        assert data.train_sizes[client] + data.test_sizes[client] == len(y)
    assert all(x is clients[c][0] for c, x in zip(clients, data.train_arrays.xs, strict=True))
    assert data.client_index == {c: i for i, c in enumerate(clients)}
    given_test = api.federated_data(clients, test=clients)
    assert all(given_test.arrays("test", c)["x"] is x for c, (x, _) in clients.items())


def test_a_checkpoint_from_before_the_one_pass_digest_resumes_on_its_data_only(
    tmp_path: object,
) -> None:
    """testdata/api_checkpoint_before_given_digest/ holds the checkpoint and CSVs made at 98d55b8 by
    `run("fedavg", train=two_group_clients(), model_fn=small_model, training=TrainingConfig(
    rounds=2, clients_per_round=4, local_epochs=1, batch_size=10, learning_rate=0.5, seed=0),
    execution="in_process", checkpoint_every=1)`: its data fingerprint is the digest of every
    split array, which a resume computes again instead of the one-pass digest."""
    folder = os.path.join(tmp_path, "run")
    os.makedirs(folder)
    made = os.path.join(TESTDATA, "api_checkpoint_before_given_digest")
    for name in ("checkpoint.npz", "metrics.csv", "clients.csv"):
        shutil.copy(os.path.join(made, name), folder)
    kwargs = dict(
        model_fn=small_model,
        training=tff_clustered.TrainingConfig(
            rounds=2, clients_per_round=4, local_epochs=1, batch_size=10, learning_rate=0.5, seed=0
        ),
        execution="in_process",
        checkpoint_every=1,
        output_dir=folder,
        resume=True,
        log=lambda line: None,
    )
    result = tff_clustered.run("fedavg", train=two_group_clients(), **kwargs)
    assert result.summary["results"]["final_accuracy"] == pytest.approx(0.5833333333333334)
    assert "training" not in result.summary["phases"]["parts"]  # nothing trained again
    other = two_group_clients()
    other["c3"][0][0, 0] += 1.0
    with pytest.raises(CheckpointError, match="fingerprint"):
        tff_clustered.run("fedavg", train=other, **kwargs)
