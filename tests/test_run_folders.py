"""A run folder holding a run is never written over unasked (`--resume` continues it,
`--overwrite` replaces it; the Python API's `resume=` and `overwrite=` alike), a run that trains
no round says so and leaves a checkpoint, and summary.json always has `results.final_accuracy`
(NaN with the reason where no trained round scored an assigned client)."""

from __future__ import annotations

import json
import math
import os

import pytest
from conftest import DP_POISSON_DIGITS, TRAIN_IN_ONE_PROCESS, run_binary

from tff_clustered.report import reporting
from tff_clustered.run_folder import RUN_OUTPUTS, RunFolder
from tff_clustered.runs import checkpoint

# A target that round 1 passes is refused before the run, on round 1's eligible clients: with
# half of FedGroup's clients joining late, round 1 samples 10 of the other 20 (the refusal took
# all 40, so this run stopped before round 1: issue 63). With the refusal off (the step
# UNCHECKED_TARGET), the run reaches that state: what a run folder holding it does is tested.
STOPPED_BEFORE_ROUND_1 = [
    *DP_POISSON_DIGITS,
    "--algorithm=fedgroup",
    "--rounds=3",
    "--dp_noise_multiplier=1.0",
    "--target_epsilon=3.5",
    "--newcomer_fraction=0.5",
    "--newcomer_round=3",
    "--dp_cold_start=raw",
]
# IFCA scoring a sample of 3 of 40 clients after one round of 2 clients: none of the sample
# trained, so none has an assignment (seed 0's sample and round: disjoint).
IFCA_SAMPLE_NOT_TRAINED = [
    "--algorithm=ifca",
    "--dataset=digits",
    "--rounds=1",
    "--clients_per_round=2",
    "--local_epochs=1",
    "--eval_clients=3",
    "--execution=in_process",
]

# train.py's main run once per step in one process (conftest's TRAIN_IN_ONE_PROCESS); a step
# ["DELETE", path] deletes a file instead. Each run: its stdout lines, then its exit code and
# stderr as a JSON line.
RUN_STEPS = (
    TRAIN_IN_ONE_PROCESS
    + """
import os
from tff_clustered.loop import accounting
for step in ARGUMENT:
    if step[0] == "DELETE":
        os.unlink(step[1])
        continue
    if step[0] == "UNCHECKED_TARGET":  # the up-front refusal off from here on
        accounting.refuse_target_below_one_round = lambda *args: None
        continue
    run_train(step)
"""
)


def run_steps(steps: list[list[str]]) -> list[tuple[int, str, list[str]]]:
    """Each run's exit code, stderr and stdout lines."""
    done = run_binary(["-c", RUN_STEPS, json.dumps(steps)])
    assert done.returncode == 0, done.stderr[-3000:]
    runs, printed = [], []
    for line in done.stdout.splitlines():
        if line.startswith("[") and line.endswith("]"):
            code, stderr = json.loads(line)
            runs.append((code, stderr, printed))
            printed = []
        else:
            printed.append(line)
    assert len(runs) == sum(step[0] not in ("DELETE", "UNCHECKED_TARGET") for step in steps)
    return runs


def summary_of(folder: RunFolder) -> dict:
    with open(folder.summary_json) as f:
        return json.load(f)


def test_a_run_stopped_before_round_1_says_so_and_is_never_overwritten_unasked(
    tmp_path: object,
) -> None:
    out = RunFolder(str(tmp_path / "stopped"))
    ifca = RunFolder(str(tmp_path / "ifca"))
    command = [*STOPPED_BEFORE_ROUND_1, f"--output_dir={out.path}"]
    refused, *runs = run_steps(
        [
            command,  # refused: round 1 passes the target
            ["UNCHECKED_TARGET"],
            command,  # 0: stops before round 1
            command,  # 1: the same again, without --resume: refused
            [*command, "--resume"],  # 2: resumes where it stopped: nothing more to train
            [*command, "--overwrite", "--resume"],  # 3: both: refused
            [*command, "--overwrite"],  # 4: replaced by a new run
            ["DELETE", out.checkpoint],
            [*command, "--resume"],  # 5: a finished run without a checkpoint: refused
            [*IFCA_SAMPLE_NOT_TRAINED, f"--output_dir={ifca.path}"],  # 6
        ]
    )
    code, stderr, _ = refused
    assert code == 2 and "(10 of the 20 clients eligible in round 1)" in stderr, stderr[-3000:]
    code, stderr, printed = runs[0]
    assert code == 0, stderr[-3000:]
    assert any("no final accuracy: no round was trained" in line for line in printed), printed
    assert not any("final accuracy 0." in line for line in printed), printed
    (last,) = [line for line in printed if line.startswith("outputs in ")]
    listed = "metrics.csv, clients.csv, summary.json, checkpoint.npz, TensorBoard events;"
    assert last.startswith(f"outputs in {out.path}: {listed}"), last
    results = summary_of(out)["results"]
    assert math.isnan(results["final_accuracy"]) and math.isnan(results["max_accuracy"])
    assert results[reporting.ACCURACY_UNDEFINED] == reporting.NO_ROUND_TRAINED
    first = open(out.summary_json, "rb").read()

    code, stderr, _ = runs[1]
    assert code == 2 and stderr.count("\n") == 1, stderr[-3000:]
    assert "already holds a run (checkpoint.npz, summary.json" in stderr
    assert "--resume" in stderr and "--overwrite" in stderr
    code, stderr, printed = runs[2]
    assert code == 0, stderr[-3000:]
    assert any("no round was trained" in line for line in printed), printed
    code, stderr, _ = runs[3]
    assert code == 2 and "pass one" in stderr and stderr.count("\n") == 1, stderr[-3000:]
    code, stderr, _ = runs[4]
    assert code == 0, stderr[-3000:]
    assert len(out.event_files()) == 1  # the replaced run's events are gone
    code, stderr, _ = runs[5]
    assert code == 2 and stderr.count("\n") == 1, stderr[-3000:]
    assert "holds a finished run (summary.json) but no checkpoint.npz to resume from" in stderr
    assert summary_of(out)["config"] == json.loads(first)["config"]  # still there

    code, stderr, printed = runs[6]
    assert code == 0, stderr[-3000:]
    results = summary_of(ifca)["results"]
    assert math.isnan(results["final_accuracy"])
    assert results[reporting.ACCURACY_UNDEFINED] == reporting.NO_ASSIGNED_CLIENT
    assert 0 <= results["all_clients_cluster"]["final_accuracy"] <= 1  # every sampled client
    assert any("no final accuracy: no evaluated client had" in line for line in printed)
    (last,) = [line for line in printed if line.startswith("outputs in ")]
    for name in RUN_OUTPUTS:  # the last line names a run output only when it exists
        assert (name in last) == os.path.exists(ifca.file(name)), (name, last)


@pytest.mark.parametrize("name", ["summary.json", "metrics.csv", "client_store.bin"])
def test_any_run_output_makes_a_folder_a_run_to_keep(tmp_path: object, name: str) -> None:
    folder = RunFolder(str(tmp_path))
    with open(folder.file(name), "w") as f:
        f.write("x")
    with pytest.raises(checkpoint.CheckpointError, match=f"already holds a run \\({name}\\)"):
        checkpoint.refuse_held_run_folder(folder.path)
    checkpoint.refuse_held_run_folder(folder.path, overwrite=True)
    if name == "summary.json":  # finished: nothing to resume from
        with pytest.raises(checkpoint.CheckpointError, match="no checkpoint.npz to resume"):
            checkpoint.refuse_held_run_folder(folder.path, resume=True)
    else:  # stopped before its first checkpoint: resume starts it over
        checkpoint.refuse_held_run_folder(folder.path, resume=True)
    with pytest.raises(ValueError, match="pass one"):
        checkpoint.refuse_held_run_folder(folder.path, resume=True, overwrite=True)


def test_overwrite_deletes_the_run_and_nothing_else(tmp_path: object) -> None:
    folder = RunFolder(str(tmp_path))
    kept = [folder.file("notes.txt"), folder.file("baseline-fedavg")]
    os.mkdir(kept[1])
    for name in [*RUN_OUTPUTS, "curves.png", "events.out.tfevents.1.host", "notes.txt"]:
        with open(folder.file(name), "w") as f:
            f.write("x")
    folder.remove_run()
    assert sorted(os.listdir(folder.path)) == ["baseline-fedavg", "notes.txt"]


def test_the_api_refuses_a_folder_holding_a_run_as_the_command_line(tmp_path: object) -> None:
    import numpy as np
    import tensorflow as tf

    import tff_clustered

    folder = RunFolder(str(tmp_path))
    with open(folder.summary_json, "w") as f:
        f.write("{}")
    rng = np.random.default_rng(0)
    clients = {
        f"c{i}": (rng.normal(size=(6, 4)).astype(np.float32), np.arange(6) % 2) for i in range(3)
    }

    def model() -> tf.keras.Model:
        return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])

    quick = tff_clustered.TrainingConfig(rounds=1, clients_per_round=3, local_epochs=1)
    for given, error, message in [
        ({}, checkpoint.CheckpointError, "already holds a run"),
        ({"resume": True}, checkpoint.CheckpointError, "no checkpoint.npz to resume"),
        ({"resume": True, "overwrite": True}, ValueError, "pass one"),
        ({"overwrite": "yes"}, TypeError, "overwrite"),
    ]:
        with pytest.raises(error, match=message):
            tff_clustered.run(
                "fedavg", clients, model, output_dir=folder.path, training=quick, **given
            )
    assert open(folder.summary_json).read() == "{}"


def test_the_summary_always_has_a_final_accuracy() -> None:
    trained = [
        {
            "round": 0,
            "accuracy": math.nan,
            "accuracy_cluster": 0.3,
            "client_accuracy_mean_cluster": 0.3,
        },
        {
            "round": 1,
            "accuracy": math.nan,
            "accuracy_cluster": 0.6,
            "client_accuracy_mean_cluster": 0.5,
        },
    ]
    results = reporting.summarize(trained)
    assert math.isnan(results["final_accuracy"])
    assert results[reporting.ACCURACY_UNDEFINED] == reporting.NO_ASSIGNED_CLIENT
    assert results["all_clients_cluster"]["final_accuracy"] == 0.6
    untrained = [{"round": 0, "accuracy": 0.25, "loss": 2.0, "client_accuracy_mean": 0.25}]
    results = reporting.summarize(untrained)
    assert math.isnan(results["final_accuracy"])
    assert results[reporting.ACCURACY_UNDEFINED] == reporting.NO_ROUND_TRAINED
    scored = [*untrained, {"round": 1, "accuracy": 0.5, "loss": 1.0, "client_accuracy_mean": 0.4}]
    results = reporting.summarize(scored)
    assert results["final_accuracy"] == 0.5 and reporting.ACCURACY_UNDEFINED not in results
