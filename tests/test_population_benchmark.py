"""The population benchmark's data and its dry run: a synthetic population written in TFF's SQL
format reads back through TFF's own `SqlClientData`, example for example as TFF's writer
writes it, and `benchmark.py --benchmarks=population --population_dry_run` writes a population
and prints the runs' commands (the runs themselves are the benchmark's, not the suite's)."""

from __future__ import annotations

import collections
import json
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from conftest import ROOT, run_binary

from tff_clustered.data import population

sys.path.insert(0, os.path.join(ROOT, "binaries"))
from benchmarks.population_goals import goal_checks  # noqa: E402

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
