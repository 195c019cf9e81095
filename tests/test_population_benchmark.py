"""The population benchmark's data and its dry run: a synthetic population written in TFF's SQL
format reads back through TFF's own `SqlClientData`, example for example as TFF's writer
writes it, and `benchmark.py --benchmarks=population --population_dry_run` writes a population
and prints the runs' commands (the runs themselves are the benchmark's, not the suite's)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from conftest import run_binary

from tff_clustered import atomic_files
from tff_clustered.cli.benchmarks.population_goals import goal_checks
from tff_clustered.data import population

SPEC = population.PopulationSpec(30, seed=3)
ELEMENT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([SPEC.num_features], tf.float32), y=tf.TensorSpec([], tf.int64)
)


def stored_protos(path: Path, split: str) -> dict[str, list[bytes]]:
    """Each client's serialized examples of `split`, in the order they were inserted."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute(
            "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? "
            "ORDER BY rowid",
            (split,),
        ).fetchall()
    protos: dict[str, list[bytes]] = collections.defaultdict(list)
    for cid, proto in rows:
        protos[cid].append(proto)
    return protos


def test_population_file_reads_back_through_tff(tmp_path: Path) -> None:
    """30 clients: TFF's `SqlClientData` lists every client in both splits with its example
    counts, parses each client's examples back to the generator's arrays, and the stored
    bytes are those of TFF's own writer (`save_to_sql_client_data`, one split at a time)."""
    path, written = population.population_file(SPEC, str(tmp_path))
    assert written and os.path.basename(path) == SPEC.file_name
    assert population.population_file(SPEC, str(tmp_path)) == (path, False)  # reused
    ids = [population.client_id(i) for i in range(SPEC.num_clients)]
    for split in population.SPLITS:
        raw = tff.simulation.datasets.SqlClientData(path, split)
        assert raw.client_ids == ids
        parsed = tff.simulation.datasets.load_and_parse_sql_client_data(
            path, ELEMENT_SPEC, split_name=split
        )
        for index in (0, 17, 29):
            x, y = population.client_arrays(SPEC, index)[split]
            examples = list(parsed.create_tf_dataset_for_client(ids[index]))
            assert len(examples) == SPEC.examples(split)
            np.testing.assert_array_equal(np.stack([e["x"] for e in examples]), x)
            np.testing.assert_array_equal([int(e["y"]) for e in examples], y)
            assert examples[0]["x"].dtype == tf.float32 and examples[0]["y"].dtype == tf.int64
    with sqlite3.connect(path) as connection:
        metadata = connection.execute(
            "SELECT split_name, COUNT(*), MIN(num_examples), MAX(num_examples) "
            "FROM client_metadata GROUP BY split_name ORDER BY split_name"
        ).fetchall()
    assert metadata == [("test", 30, 10, 10), ("train", 30, 20, 20)]
    # planted groups: a client's labels follow its own group's map, not another group's
    maps = population.group_maps(SPEC)
    for index in range(8):
        x, y = population.client_arrays(SPEC, index)["train"]
        group = index % SPEC.num_groups
        np.testing.assert_array_equal(y, np.argmax(x @ maps[group], axis=1))
        assert (y != np.argmax(x @ maps[(group + 1) % SPEC.num_groups], axis=1)).any()

    by_tff = tmp_path / "by_tff.sqlite"
    tff.simulation.datasets.save_to_sql_client_data(
        ids,
        lambda cid: population.client_dataset(SPEC, "train", cid),
        str(by_tff),
        split_names_by_client_id={cid: "train" for cid in ids},
    )
    assert stored_protos(by_tff, "train") == stored_protos(Path(path), "train")


@pytest.mark.parametrize("finishing_first", ["second", "first"])
def test_two_writers_of_one_population_file_never_report_a_file_they_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finishing_first: str
) -> None:
    """Two writers of the same population file at once (threads here, processes alike), each
    paused mid-write while the other runs: whichever finishes first writes the file and says
    so, the other keeps it and says it did not write it; both end without an error, and the
    folder holds the whole file and no temporary file. `finishing_first`: the writer that
    started second (it runs to the end while the first is paused), or the first (resumed
    while the second is paused mid-write)."""
    spec = population.PopulationSpec(6, train_examples=2, test_examples=1, num_features=4)
    monkeypatch.setattr(population, "CLIENTS_PER_BATCH", 2)  # three batches: a middle to pause at
    paused = {name: threading.Event() for name in ("first", "second")}
    resumed = {name: threading.Event() for name in ("first", "second")}
    rows = population.client_rows

    def pausing_rows(*args: object) -> object:
        name = threading.current_thread().name
        if name in paused and args[1].start == 2:  # type: ignore[attr-defined]
            paused[name].set()
            assert resumed[name].wait(60)
        return rows(*args)

    monkeypatch.setattr(population, "client_rows", pausing_rows)
    results: dict[str, object] = {}

    def write(name: str) -> threading.Thread:
        def target() -> None:
            try:
                results[name] = population.population_file(spec, str(tmp_path))
            except Exception as error:  # the test reports it, not the thread
                results[name] = error

        thread = threading.Thread(target=target, name=name)
        thread.start()
        return thread

    first = write("first")
    assert paused["first"].wait(60)
    second = write("second")
    if finishing_first == "second":
        resumed["second"].set()
        second.join(60)
        resumed["first"].set()
    else:
        assert paused["second"].wait(60)
        resumed["first"].set()
        first.join(60)
        resumed["second"].set()
    first.join(60)
    second.join(60)
    path = str(tmp_path / spec.file_name)
    later = "first" if finishing_first == "second" else "second"
    assert results == {finishing_first: (path, True), later: (path, False)}
    assert os.listdir(tmp_path) == [spec.file_name]
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM client_metadata").fetchone() == (12,)
        assert db.execute("SELECT count(*) FROM examples").fetchone() == (18,)


def test_a_killed_writers_temporary_file_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    spec = population.PopulationSpec(3, train_examples=2, test_examples=1, num_features=4)
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = f"{atomic_files.TEMP_PREFIX}{done.stdout.strip()}-abcd1234"
    alive = f"{atomic_files.TEMP_PREFIX}{os.getpid()}-abcd1234"
    for name in (dead, alive):
        (tmp_path / name).write_bytes(b"partial")
    assert population.population_file(spec, str(tmp_path)) == (str(tmp_path / spec.file_name), True)
    assert sorted(os.listdir(tmp_path)) == sorted([spec.file_name, alive])


def test_population_dry_run_writes_the_population_and_prints_the_runs(tmp_path: Path) -> None:
    """`--population_dry_run` at 100 clients: the file, then one train.py command per
    algorithm and execution on it, in the JSON report."""
    done = run_binary(
        [
            "binaries/benchmark.py",
            "--benchmarks=population",
            "--population_sizes=100",
            "--population_dry_run",
            f"--population_dir={tmp_path}",
        ],
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])["population"]
    data_file = str(tmp_path / population.PopulationSpec(100).file_name)
    assert [f["path"] for f in report["files"]] == [data_file]
    assert os.path.isfile(data_file)
    commands = [run["command"] for run in report["runs"]]
    assert len(commands) == 6  # 3 algorithms x 2 executions
    assert all(f"--data_dir={data_file}" in c and "--dataset=tff_sql" in c for c in commands)
    assert sum("--cold_start=lazy" in c for c in commands) == 2


def test_goal_checks_judge_ratios_and_split_out_the_evaluated_clients_cold_start() -> None:
    """The goals read the runs' figures: a round at 10^6 against 10^3, and an evaluation
    against a round, whole and (where the evaluation gave clients their clusters) without the
    cold start."""

    def run(clients: int, round_s: float, eval_s: float, assign_s: float) -> dict:
        return dict(
            clients=clients,
            algorithm="fedgroup",
            execution="in_process",
            round_s=round_s,
            eval_s=eval_s,
            eval_assign_s=assign_s,
        )

    checks = goal_checks([run(1000, 0.05, 1.0, 0.97), run(1_000_000, 0.07, 1.2, 0.0)])
    found = {(c["goal"]): (c["value"], c["met"]) for c in checks}
    assert found["s/round at 10^6 / at 10^3"] == (1.4, False)
    assert found["s/evaluation / s/round at 1,000"] == (20.0, False)
    assert found["s/scoring / s/round at 1,000"] == (0.6, True)
    assert "s/scoring / s/round at 1,000,000" not in found  # nothing to split out there
