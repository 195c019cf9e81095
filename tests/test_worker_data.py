"""Clients whose examples TFF's worker reads itself (`--client_data=read_on_worker`): the round
takes each client's id and number of examples, the worker reads the rows from the population's
file of TFF's SQL format, and a run equals the run whose clients are sent as arrays."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from conftest import held_exclusively

from tff_clustered.data import client_files, load_dataset, sqlite_files, tff_sql
from tff_clustered.data.fingerprint import file_digest
from tff_clustered.data.population import PopulationSpec, write_population_sql
from tff_clustered.data.spec import DataSpec
from tff_clustered.data.sqlite_files import locked_database
from tff_clustered.data.worker_reader import WorkerReader, worker_reader
from tff_clustered.federated import executions, sharded
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runs.runner import spec_experiment
from tff_clustered.runtime.context import RuntimeConfig, tff_runtime

SHARDED_ROUND = sharded.sharded_round
POPULATION = PopulationSpec(num_clients=12, train_examples=7, test_examples=5, num_features=6)


@pytest.fixture(scope="module")
def population_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("population") / POPULATION.file_name)
    write_population_sql(POPULATION, path)
    return path


def run(algorithm: str, path: str, client_data: str, monkeypatch: Any) -> dict:
    """A 2-round run on TFF's runtime: its history (without timings), final state, the
    rounds' TFF parts and every client input `next` was given."""
    spec = RunSpec(
        algorithm=algorithm,
        data=DataSpec(dataset="tff_sql", data_dir=path, num_classes=POPULATION.num_classes),
        training=TrainingConfig(
            rounds=2, clients_per_round=5, local_epochs=2, batch_size=3, eval_every=1
        ),
    )
    parts, inputs = [], []

    def recorded(round_parts: Any) -> Any:
        parts.append(round_parts)
        built = SHARDED_ROUND(round_parts)
        train = built.next
        built.next = lambda state, clients, hparams: (
            inputs.extend(clients) or train(state, clients, hparams)
        )
        return built

    monkeypatch.setattr(sharded, "sharded_round", recorded)
    with tff_runtime(RuntimeConfig(client_data=client_data)):
        experiment = spec_experiment(spec)
        experiment.start()
        history = [
            {k: v for k, v in row.items() if "seconds" not in k} for row in experiment.rounds()
        ]
    read_train = {c for split, c in experiment.data.source._cache if split == "train"}
    own_models = {c: experiment.store.model(c) for c in experiment.data.client_ids}
    return dict(
        history=history,
        models=experiment.state.cluster_models,
        own_models=own_models,
        parts=parts,
        inputs=inputs,
        read=read_train,
    )


@pytest.mark.parametrize("algorithm", ["fedavg", "fedper"])
def test_a_run_reading_on_the_worker_equals_the_run_sending_arrays(
    algorithm: str, population_file: str, monkeypatch: Any
) -> None:
    sent = run(algorithm, population_file, "sent", monkeypatch)
    read = run(algorithm, population_file, "read_on_worker", monkeypatch)
    assert read["history"] == sent["history"]
    np.testing.assert_array_equal(read["models"], sent["models"])
    for client, own in sent["own_models"].items():  # FedPer's heads
        for a, b in zip(read["own_models"][client], own):
            np.testing.assert_array_equal(a, b)
    # The orchestrator sent ids, not examples: the round's client input and every value given.
    for parts in read["parts"]:
        data_type = parts.next.type_signature.parameter[1].member.data
        assert str(data_type) == "<client_id=str,num_examples=int64>"
    assert sent["inputs"] and read["inputs"]
    assert all(set(c.data) == {"client_id", "num_examples"} for c in read["inputs"])
    assert all(set(c.data) == {"x", "y"} for c in sent["inputs"])
    # ... and read no client's training examples here beyond the first (the check at start).
    assert len(read["read"]) == 1 and len(sent["read"]) > 1


def test_auto_reads_on_the_worker_what_was_measured_faster(population_file: str) -> None:
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=POPULATION.num_classes)
    reader = worker_reader(data)
    assert reader is not None and reader.held_here
    assert reader.mean_values == POPULATION.train_examples * POPULATION.num_features
    assert not executions.reads_on_worker("auto", reader)  # small clients, held here
    assert executions.reads_on_worker("read_on_worker", reader)
    assert not executions.reads_on_worker("sent", reader)
    large = dataclasses.replace(reader, mean_values=executions.READ_ON_WORKER_VALUES)
    assert executions.reads_on_worker("auto", large)
    population = dataclasses.replace(reader, held_here=False)  # read from the file here anyway
    assert executions.reads_on_worker("auto", population)
    held = tff_sql.load_tff_sql(population_file, POPULATION.num_classes, lazy=False)
    assert worker_reader(held) is None  # no file to read: sent
    assert worker_reader(load_dataset("digits")) is None


def test_reading_on_the_worker_data_that_is_not_a_tff_sql_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Data in memory is read on a local worker from files (`tests/test_client_files.py`)
    unless they would not fit the temporary folder: then it can only be sent."""
    monkeypatch.setattr(client_files, "FREE_SPACE_SHARE", 1e-12)
    spec = RunSpec(algorithm="fedavg", training=TrainingConfig(rounds=1, clients_per_round=2))
    with tff_runtime(RuntimeConfig(client_data="read_on_worker")):
        with pytest.raises(ValueError, match="read_on_worker reads a file of TFF's SQL format"):
            spec_experiment(spec)
    with pytest.raises(ValueError, match="has none"):
        RuntimeConfig(execution="in_process", client_data="read_on_worker")
    with pytest.raises(ValueError, match="client_data must be one of"):
        RuntimeConfig(client_data="lazy")


# A client's rows damaged in the file: the UPDATE, and the one-line error's problem.
DAMAGED_CLIENT = {
    "count": (
        "UPDATE client_metadata SET num_examples = 9 "
        "WHERE client_id = 'c0000002' AND split_name = 'train'",
        "not as many examples as client_metadata lists; regenerate the file",
    ),
    "undecodable": (
        "UPDATE examples SET serialized_example_proto = x'0a03ffffff' WHERE rowid = (SELECT "
        "min(rowid) FROM examples WHERE client_id = 'c0000002' AND split_name = 'train')",
        "a record is not a tf.train.Example of x (3 floats) and y (an int64 label); "
        "regenerate the file",
    ),
}


@pytest.mark.parametrize("damage", ["count", "undecodable", "locked"])
def test_a_read_failing_on_the_worker_is_one_line_naming_it(
    tmp_path: Any, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks of a first read here run on the worker: a client whose rows are not as many
    as `client_metadata` lists, or whose record is not an Example (its bytes are not UTF-8),
    stops the round with a one-line error naming it and the file; a file another process
    locked after the start, one line naming the file as locked and the fix."""
    monkeypatch.setattr(sqlite_files, "BUSY_TIMEOUT_SECONDS", 0.05)  # a read here: at once
    population = PopulationSpec(num_clients=4, train_examples=5, test_examples=2, num_features=3)
    path = str(tmp_path / population.file_name)
    write_population_sql(population, path)
    if damage in DAMAGED_CLIENT:
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute(DAMAGED_CLIENT[damage][0])
            db.commit()
    spec = RunSpec(
        algorithm="fedavg",
        data=DataSpec(dataset="tff_sql", data_dir=path, num_classes=population.num_classes),
        training=TrainingConfig(rounds=1, clients_per_round=4, eval_every=5),
    )
    with tff_runtime(RuntimeConfig(client_data="read_on_worker")):
        experiment = spec_experiment(spec)
        experiment.start()
        experiment.data.arrays_of("test", experiment.data.client_ids)  # scored here: read now
        held = held_exclusively(path) if damage == "locked" else contextlib.nullcontext()
        with held, pytest.raises(ValueError) as raised:
            list(experiment.rounds())
    # The worker read the training examples, not this process (beyond the first client's).
    assert [c for split, c in experiment.data.source._cache if split == "train"] == ["c0000000"]
    if damage == "locked":
        assert str(raised.value) == str(locked_database(path))
    else:
        assert (
            str(raised.value)
            == f"client 'c0000002' (train) in {path}: " + (DAMAGED_CLIENT[damage][1])
        )


# A writer killed after its commit: its writes stay in the -wal file, not checkpointed.
WRITE_TO_WAL_AND_DIE = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA journal_mode=WAL")
db.execute(
    "UPDATE examples SET serialized_example_proto = ? WHERE rowid = ?",
    (bytes.fromhex(sys.argv[2]), int(sys.argv[3])),
)
db.commit()
os._exit(0)
"""


def test_reading_on_the_worker_leaves_a_wal_mode_file_as_it_was(tmp_path: Any) -> None:
    """The worker opens the file read-only: it reads a WAL-mode file's writes still in the
    -wal file, and leaves the file and its -wal file as they were (a read-write connection
    closing last would checkpoint the writes into the file and delete the -wal file, which
    another worker opening it at that moment sees as "database is locked")."""
    population = PopulationSpec(num_clients=4, train_examples=5, test_examples=2, num_features=3)
    path = str(tmp_path / population.file_name)
    write_population_sql(population, path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        (row, blob) = db.execute(
            "SELECT rowid, serialized_example_proto FROM examples WHERE client_id = 'c0000001' "
            "AND split_name = 'train' ORDER BY rowid LIMIT 1"
        ).fetchone()
    example = tf.train.Example.FromString(blob)
    labels = example.features.feature["y"].int64_list.value
    labels[0] = (labels[0] + 1) % population.num_classes
    relabelled = example.SerializeToString()
    subprocess.run(
        [sys.executable, "-c", WRITE_TO_WAL_AND_DIE, path, relabelled.hex(), str(row)], check=True
    )
    wal = path + "-wal"
    assert os.path.getsize(wal) > 0
    before = {p: file_digest(p) for p in (path, wal)}
    reader = WorkerReader(path, "train", (3,), population.num_classes)
    read = reader.read(reader.reference("c0000001", population.train_examples))
    assert int(read["y"][0]) == labels[0]  # the write still in the -wal file
    assert {p: file_digest(p) for p in (path, wal)} == before
