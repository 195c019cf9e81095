"""Clients' examples in memory read by TFF's local worker from files written once
(`data/client_files.py`), and a round's client values serialized in one lean pass
(`federated/client_values.py`): the same results and the same bytes as TFF's own sending."""

from __future__ import annotations

import collections
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_clustered.data import client_files, load_dataset
from tff_clustered.data.client_files import ClientFiles, files_refusal, worker_source
from tff_clustered.data.federated_data import DataError
from tff_clustered.federated import executions, round_inputs, sharded
from tff_clustered.federated.client_values import serialized
from tff_clustered.frameworks import tff, to_type
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runs.runner import spec_experiment
from tff_clustered.runtime import context as runtime

SPECS = collections.OrderedDict(
    x=tf.TensorSpec([None, 64], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def fedper_run(monkeypatch: pytest.MonkeyPatch, min_values: float) -> dict:
    """A 2-round FedPer run on the digits on the session's TFF worker (`client_data=auto`),
    its clients read on the worker from files when they hold at least `min_values` values
    (`executions.READ_ON_WORKER_VALUES`): its history, models, the clients' own heads and
    every built round's client data type."""
    monkeypatch.setattr(executions, "READ_ON_WORKER_VALUES", min_values)
    parts: list = []
    original = sharded.sharded_round
    monkeypatch.setattr(sharded, "sharded_round", lambda p: parts.append(p) or original(p))
    spec = RunSpec(
        algorithm="fedper",
        training=TrainingConfig(rounds=2, clients_per_round=6, local_epochs=1, eval_every=1),
    )
    experiment = spec_experiment(spec)
    experiment.start()
    history = [{k: v for k, v in r.items() if "seconds" not in k} for r in experiment.rounds()]
    return dict(
        history=history,
        models=experiment.state.cluster_models,
        heads={c: experiment.store.model(c) for c in experiment.data.client_ids},
        data_types={str(p.next.type_signature.parameter[1].member.data) for p in parts},
        files=experiment.calls.rounds_cache.worker_data,
    )


@pytest.mark.usefixtures("tff_context")
def test_a_run_reading_client_files_equals_the_run_sending_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = fedper_run(monkeypatch, np.inf)
    read = fedper_run(monkeypatch, 0)
    assert sent["files"] is None and isinstance(read["files"], ClientFiles)
    assert read["history"] == sent["history"]
    np.testing.assert_array_equal(read["models"], sent["models"])
    for client, head in sent["heads"].items():
        for a, b in zip(read["heads"][client], head):
            np.testing.assert_array_equal(a, b)
    # The rounds took references; the files of the sampled clients only were written.
    assert read["data_types"] == {"<index=int64,num_examples=int64>"}
    assert sent["data_types"] == {"<x=float32[?,64],y=int32[?]>"}
    files = read["files"]
    assert 0 < len(files.written) <= 12
    assert sorted(os.listdir(files.folder)) == sorted(
        f"{files.index[c]}.{name}" for c in files.written for name in ("x", "y")
    )


def test_the_lean_proto_is_tffs_byte_for_byte() -> None:
    """`serialized` gives the proto TFF's `serialize_value` gives, for clients' inputs with
    arrays, an empty and a filled struct of stored variables, scalars and seeds, and
    references."""
    from tensorflow_federated.python.core.impl.executors import value_serialization

    rng = np.random.default_rng(0)
    stored_spec = (tf.TensorSpec([3, 2], tf.float32),)
    references = ClientFiles(load_dataset("digits"), SPECS).reference_spec
    for stored, data_spec in (((), SPECS), (stored_spec, references)):
        spec = round_inputs.ClientInput(
            data_spec,
            tf.TensorSpec([1], tf.int32),
            stored,
            tf.TensorSpec([], tf.float32),
            round_inputs.ClientSeed(tf.TensorSpec([], tf.int64), tf.TensorSpec([2], tf.int32)),
        )
        clients = []
        for i, n in enumerate((5, 0, 9)):
            data = (
                collections.OrderedDict(
                    x=rng.random((n, 64), dtype=np.float32), y=rng.integers(0, 9, n, np.int32)
                )
                if data_spec is SPECS
                else collections.OrderedDict(index=np.int64(i), num_examples=np.int64(n))
            )
            variables = [rng.random((3, 2), dtype=np.float32) for _ in stored]
            seed = round_inputs.client_seed(10 + i, 20 + i)
            clients.append(round_inputs.client_input(data, i, variables, 0.5 * i, seed))
        federated = tff.FederatedType(to_type(spec), tff.CLIENTS)
        ours = serialized(clients, federated).SerializeToString(deterministic=True)
        theirs, _ = value_serialization.serialize_value(clients, federated)
        assert ours == theirs.SerializeToString(deterministic=True)


def test_a_population_over_the_bound_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are written only within half the temporary folder's free space: a population
    over it is sent under `auto` and refused, naming why, under `read_on_worker`; so are files
    for workers elsewhere."""
    data = load_dataset("digits")
    assert files_refusal(data, SPECS) is None
    source, why = worker_source(data, SPECS)
    assert isinstance(source, ClientFiles) and why is None
    monkeypatch.setattr(client_files, "FREE_SPACE_SHARE", 1e-12)
    source, why = worker_source(data, SPECS)
    assert source is None and "exceed" in why and "free space" in why
    cache = executions.RoundCache(None, SPECS, [], execution="tff")
    cache.read_on_worker(lambda: (source, why), "auto")
    assert cache.worker_data is None
    with pytest.raises(ValueError, match="can only be sent .*exceed .*free space"):
        cache.read_on_worker(lambda: (source, why), "read_on_worker")
    monkeypatch.setattr(runtime, "_ACTIVE_WORKERS", (("10.0.0.5:8000", None),))
    files = ClientFiles(data, SPECS)
    cache.read_on_worker(lambda: (files, None), "auto")
    assert cache.worker_data is None
    with pytest.raises(ValueError, match="--workers are elsewhere"):
        cache.read_on_worker(lambda: (files, None), "read_on_worker")
    monkeypatch.setattr(runtime, "_ACTIVE_WORKERS", (("localhost:8000", None),))
    cache.read_on_worker(lambda: (files, None), "read_on_worker")
    assert cache.worker_data is files


def test_a_client_file_that_changed_is_named() -> None:
    """A client's file of another length stops the read with a one-line error naming it."""
    files = ClientFiles(load_dataset("digits"), SPECS)
    client = files.data.client_ids[0]
    reference = files.reference(client, files.data.train_sizes[client])
    with open(files.path(files.index[client], "x"), "ab") as f:
        f.write(np.zeros((1, 64), np.float32).tobytes())
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        tf.function(files.read)(reference)  # as the worker runs it: a graph
    line = files.failure(str(raised.value))
    assert line is not None and line.startswith(f"client file {files.folder}")
    assert "its file changed while the run ran" in line


def test_the_folder_of_a_killed_run_is_removed_by_the_next(tmp_path: pathlib.Path) -> None:
    """A folder whose process is gone (a SIGKILLed run) goes; a live process's stays."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], stdout=-1)
    dead = tmp_path / f"{client_files.FOLDER_PREFIX}{int(gone.stdout)}-abc"
    alive = tmp_path / f"{client_files.FOLDER_PREFIX}{os.getpid()}-def"
    other = tmp_path / "tff_clustered-clients-notes"
    for folder in (dead, alive, other):
        folder.mkdir()
    client_files.remove_orphaned_folders(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_a_full_temporary_folder_is_one_error_naming_it_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client's file that cannot be written (the disk full: its part is `/dev/full`) is one
    error naming the folder and the fix, its part removed; a refusal for lack of room gives
    sizes in units that do not round them to 0."""
    files = ClientFiles(load_dataset("digits"), SPECS)
    client = files.data.client_ids[0]
    part = files.path(files.index[client], "x") + ".tmp"
    os.symlink("/dev/full", part)
    with pytest.raises(DataError) as raised:
        files.reference(client, files.data.train_sizes[client])
    line = str(raised.value)
    assert f"temporary folder {files.folder} (No space left on device)" in line
    assert "set TMPDIR" in line and "\n" not in line
    assert os.listdir(files.folder) == []
    free = shutil.disk_usage(files.folder)._replace(free=200_000)
    monkeypatch.setattr(client_files.shutil, "disk_usage", lambda _: free)
    why = files_refusal(files.data, SPECS)
    assert why is not None and "(200 KB; set TMPDIR" in why and " 0 MB" not in why
