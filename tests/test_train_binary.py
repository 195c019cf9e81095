"""`binaries/train.py` end to end: results, outputs, resume after a kill, Ctrl-C, bad input,
and no TFF worker left behind."""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    ROOT,
    SHARED_LEAF_FILE,
    finished_runs,
    run_binary,
    runs_in_one_process,
    started_runs,
    worker_pids_with_tag,
)

from tff_clustered.loop.phases import PHASES
from tff_clustered.run_folder import LOCK_NAME, RunFolder
from tff_clustered.runs import checkpoint
from tff_clustered.runs.state_encoding import decode_tree

TRAIN = os.path.join("binaries", "train.py")
QUICK = ["--rounds=12", "--clients_per_round=5", "--local_epochs=1", "--checkpoint_every=2"]


def read_csv(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in rows]


def assert_no_worker_left(tag: str) -> None:
    deadline = time.monotonic() + 10
    while worker_pids_with_tag(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_pids_with_tag(tag) == [], "a TFF worker_binary outlived its run"


DEFAULT_RUN_FLAGS = os.path.join("configs", "default_run.flags")


def test_default_run_recovers_the_planted_groups_and_beats_fedavg(tmp_path: object) -> None:
    """`make run`: FedGroup on digits' 4 planted label-permutation groups, then FedAvg on the
    same clients. One global model cannot fit four label permutations; one model per
    recovered group can."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert f"--flagfile={DEFAULT_RUN_FLAGS}" in f.read()  # what this test runs
    tag = uuid.uuid4().hex
    out = str(tmp_path / "default")
    done = run_binary(
        [TRAIN, f"--flagfile={DEFAULT_RUN_FLAGS}", f"--output_dir={out}"],
        {"TFF_CLUSTERED_RUN_TAG": tag},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_worker_left(tag)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["config"]["algorithm"] == "fedgroup"
    clusters = summary["results"]["clusters"]
    assert clusters["planted_groups"] == 4 and clusters["clusters_in_use"] == 4, clusters
    assert clusters["adjusted_rand_vs_planted"] >= 0.9, clusters
    baseline = json.load(open(os.path.join(out, "baseline-fedavg", "summary.json")))
    assert baseline["config"]["algorithm"] == "fedavg"
    assert baseline["results"]["clusters"]["adjusted_rand_vs_planted"] == 0.0  # one model
    ours, theirs = summary["results"]["final_accuracy"], baseline["results"]["final_accuracy"]
    assert ours >= theirs + 0.3, (ours, theirs)
    # --cold_start=auto: the 40 clients are all in the group cold start (alpha*m = 80)
    assert summary["config"]["algorithm_choices"] == {"cold_start": "eager"}
    for line in (
        "adjusted Rand",
        "fedgroup - fedavg: final accuracy +",
        "membership.png",
        "fedgroup: --cold_start=eager: 0 newcomers to pre-train <= 500",
    ):
        assert line in done.stdout, done.stdout

    rows = read_csv(os.path.join(out, "metrics.csv"))
    assert [int(r["round"]) for r in rows] == list(range(51))
    for column in (
        "accuracy",
        "loss",
        "train_loss",
        "cluster_size_0",
        "round_seconds",
        "train_seconds",
        "eval_seconds",
        "checkpoint_seconds",
    ):
        assert column in rows[0]
    for row in rows[1:]:  # the round's time, split: training, server work, evaluation
        parts = [float(row[f"{part}_seconds"]) for part in ("train", "server", "eval")]
        assert parts[0] > 0 and min(parts) >= 0
        assert sum(parts) <= float(row["round_seconds"]) + 1e-3
        assert (float(row["checkpoint_seconds"]) > 0) == (int(row["round"]) % 5 == 0)
    for picture in ("curves.png", "membership.png", "similarity.png"):
        with open(os.path.join(out, picture), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # Where the wall time went, from the top of train.py: every phase, adding up to the wall.
    phases = summary["phases"]
    assert_phases_add_up(phases, PHASES)
    assert phases["cold_start"] > 0  # FedGroup's pre-training and clustering, before round 1
    parts = phases["parts"]
    assert parts["tracing"] > 0
    assert parts["training"] + parts["server"] <= phases["rounds"]
    assert parts["training"] == pytest.approx(
        sum(float(r["train_seconds"]) for r in rows[1:]), 1e-4
    )
    assert phases["checkpoints"] == pytest.approx(
        sum(float(r["checkpoint_seconds"]) for r in rows), 1e-4
    )
    assert re.search(r"^time: imports [\d.]+ s, .*; wall [\d.]+ s", done.stdout, re.M)
    # The baseline's phases count from its own start, in the same process: no imports, no
    # runtime start (the first run's), and FedAvg's cold start is its (empty) init.
    later = [p for p in PHASES if p not in ("imports", "runtime")]
    assert_phases_add_up(baseline["phases"], later)


def assert_phases_add_up(phases: dict, names: list) -> None:
    """Exactly `names` timed, none negative, and with `unaccounted` they make `wall`: what
    falls between phases is a small part of it (5%: tiny gaps, even on a loaded machine)."""
    assert [p for p in PHASES if p in phases] == list(names), phases
    assert min(phases[p] for p in names) >= 0, phases
    assert 0 <= phases["unaccounted"] <= 0.05 * phases["wall"], phases


def test_killed_run_resumes_to_the_same_final_metrics(tmp_path: object) -> None:
    check_killed_run_resumes(tmp_path, QUICK)


def test_killed_dp_run_resumes_to_the_same_final_metrics(tmp_path: object) -> None:
    """--aggregator=dp with adaptive clipping: the noise is a function of the seed and the
    round, and the clips are in the checkpoint, so a killed run resumes to the uninterrupted
    run's metrics (the clip columns included) and its aggregator state."""
    dp = [
        "--algorithm=ifca",
        "--num_clusters=2",
        "--aggregator=dp",
        "--dp_noise_multiplier=0.5",
        "--dp_clip=0.5",
        "--dp_clipping=adaptive",
    ]
    reference, out = check_killed_run_resumes(tmp_path, [*QUICK, *dp])
    rows = read_csv(os.path.join(out, "metrics.csv"))
    assert {"dp_clip_cluster_0", "dp_unclipped_fraction_cluster_1"} <= rows[1].keys()
    assert len({r["dp_clip_cluster_0"] for r in rows[1:]}) > 1  # the clip moved
    states = [saved_state(folder) for folder in (reference, out)]
    assert states[0].round_num == states[1].round_num == 12
    np.testing.assert_array_equal(
        states[0].aggregator_state["clip"], states[1].aggregator_state["clip"]
    )
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["config"]["client_weighting"] == "uniform"
    assert summary["config"]["training"]["aggregator"]["name"] == "dp"
    # the privacy account goes on across the kill: the same ledger, the same epsilons
    assert states[0].privacy.classes == states[1].privacy.classes
    assert float(rows[-1]["epsilon"]) == pytest.approx(summary["privacy"]["epsilon"], rel=1e-5)
    assert summary["privacy"]["epsilon"] > 0


def saved_state(folder: str) -> object:
    """The run state in `folder`'s checkpoint, whatever its settings."""
    meta, arrays = checkpoint._read(RunFolder(folder).checkpoint)
    return decode_tree(meta["state"], arrays)


def check_killed_run_resumes(tmp_path: object, flags: list) -> tuple[str, str]:
    """A run of `flags` killed (SIGKILL) after round 5 and resumed ends as the run left alone
    does: metrics, results, per-client rows and TensorBoard points. Returns the two folders
    (uninterrupted, resumed). The resumption and then the uninterrupted run share a process
    (one TensorFlow import), started while the run to kill starts: the resumption is its
    first run, as in a process of its own."""
    reference = str(tmp_path / "reference")
    out = str(tmp_path / "killed")
    runs = started_runs(
        ["wait", [*flags, f"--output_dir={out}", "--resume"], [*flags, f"--output_dir={reference}"]]
    )
    try:
        tag = uuid.uuid4().hex
        env = dict(os.environ, TFF_CLUSTERED_RUN_TAG=tag, TF_CPP_MIN_LOG_LEVEL="2")
        process = subprocess.Popen(
            [sys.executable, TRAIN, *flags, f"--output_dir={out}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        metrics = os.path.join(out, "metrics.csv")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if os.path.exists(metrics) and len(read_csv(metrics)) >= 6:  # rounds 0..5 done
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run finished before it could be killed"
        assert worker_pids_with_tag(tag), "the tagged worker should be running now"
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert_no_worker_left(tag)  # PR_SET_PDEATHSIG: the worker dies with its parent
        assert len(read_csv(metrics)) < 13
    except BaseException:
        runs.kill()
        runs.communicate()
        raise
    resumed, done = finished_runs(runs)  # the resumption starts now
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in resumed.stdout
    assert without_timing(read_csv(metrics)) == without_timing(
        read_csv(os.path.join(reference, "metrics.csv"))
    )
    ours = json.load(open(os.path.join(out, "summary.json")))["results"]
    theirs = json.load(open(os.path.join(reference, "summary.json")))["results"]
    assert ours["final_accuracy"] == theirs["final_accuracy"]
    assert ours["max_accuracy"] == theirs["max_accuracy"]
    # per-client rows and TensorBoard points: each round exactly once, as uninterrupted
    assert read_csv(os.path.join(out, "clients.csv")) == read_csv(
        os.path.join(reference, "clients.csv")
    )
    assert tensorboard_scalars(out, "accuracy") == tensorboard_scalars(reference, "accuracy")
    return reference, out


def tensorboard_scalars(folder: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every `tag` scalar in the folder's event files, in file order."""
    points = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, float(tf.make_ndarray(value.tensor))))
    return points


def tensorboard_images(folder: str) -> dict[str, list[int]]:
    """Steps of every image summary in the folder's event files, by tag."""
    steps: dict[str, list[int]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "images":
                    steps.setdefault(value.tag, []).append(event.step)
    return steps


def test_outputs_hold_per_client_and_per_cluster_results(runs_in_one: dict) -> None:
    """IFCA: every client is scored every round (one not assigned yet with its lowest-loss
    cluster); the paper's `accuracy` pools the assigned ones only; clients.csv adds up to both
    and to the per-cluster accuracies."""
    out, done = runs_in_one["outputs"]
    assert done.returncode == 0, done.stderr[-2000:]
    clients = read_csv(str(out / "clients.csv"))
    metrics = read_csv(str(out / "metrics.csv"))

    def pooled(rows: list) -> float:
        n = [int(c["test_examples"]) for c in rows]
        return sum(float(c["accuracy_cluster"]) * k for c, k in zip(rows, n)) / sum(n)

    assert metrics[0]["num_eval_clients"] == "0" and metrics[0]["accuracy"] == "nan"
    for row in metrics:
        rows = [c for c in clients if c["round"] == row["round"]]
        assert len(rows) == 40
        assert abs(pooled(rows) - float(row["accuracy_cluster"])) < 1e-4
        assigned = [c for c in rows if c["assigned"] == "1"]
        assert len(assigned) == int(row["num_eval_clients"])
        if assigned:
            assert abs(pooled(assigned) - float(row["accuracy"])) < 1e-4
        for k in {c["cluster"] for c in rows}:
            members = [c for c in rows if c["cluster"] == k]
            assert abs(pooled(members) - float(row[f"cluster_accuracy_{k}"])) < 1e-4
    assert all(row["clients_changed_cluster"] != "" for row in metrics[1:])
    steps = [s for s, _ in tensorboard_scalars(str(out), "accuracy_cluster")]
    assert steps == [0, 1, 2, 3]
    for picture in ("membership.png", "cluster_accuracy.png", "labels.png", "curves.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
    assert tensorboard_images(str(out)) == {"membership": [3], "labels": [3]}  # IFCA: no matrix


def start_as_job(args: list[str], background: bool = False, **env: str) -> subprocess.Popen:
    """train.py with `args`, stdout and stderr piped, as a terminal's foreground job, or with
    `background` as long runs are started, `(nohup train.py ... &)`: SIGINT and SIGHUP
    ignored. A shell starts background jobs with SIGINT ignored and a child inherits that, so
    a suite started with `&` would see Ctrl-C ignored: a foreground job gets SIGINT's default
    back. TensorFlow's log level is a shell's (unset) unless given: importing TensorFlow sets
    TF_CPP_MIN_LOG_LEVEL=1 in this process's environment, and a child that inherits it prints
    TensorFlow's import-time errors, as a user asking for them would."""
    inherited = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}

    def as_the_shell_starts_it() -> None:
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN if background else signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, TRAIN, *args],
        cwd=ROOT,
        env=dict(inherited, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=as_the_shell_starts_it,
    )


@pytest.mark.parametrize(
    "signum, code, said",
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "terminated"),
        (signal.SIGHUP, 129, "hung up"),  # the terminal or SSH session closed
    ],
)
def test_ctrl_c_sigterm_or_sighup_stop_cleanly_with_one_line_and_no_worker(
    tmp_path: object, signum: int, code: int, said: str
) -> None:
    """The run stops between two steps, keeps its checkpoint and stops its worker before the
    process exits (no worker is alive once the exit code is known), and removes the clients'
    files it wrote for the worker (a signal left them in the temporary folder: issue 64)."""
    tag = uuid.uuid4().hex
    out, temporary = str(tmp_path / "interrupted"), tmp_path / "tmp"
    temporary.mkdir()
    process = start_as_job(
        [*QUICK, "--rounds=200", f"--output_dir={out}", "--client_data=read_on_worker"],
        TFF_CLUSTERED_RUN_TAG=tag,
        TF_CPP_MIN_LOG_LEVEL="2",
        TMPDIR=str(temporary),
    )
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(out, "checkpoint.npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_pids_with_tag(tag), "the tagged worker should be running now"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == (
        f"{said}; the last checkpoint is kept, continue with --resume"
    )
    assert "Traceback" not in stderr, stderr[-2000:]
    assert os.path.exists(os.path.join(out, "checkpoint.npz"))
    assert worker_pids_with_tag(tag) == [], "the worker outlived its run"
    assert not list(temporary.glob("tff_clustered-clients-*")), "the clients' files are left"


def test_a_run_stopped_before_its_first_checkpoint_says_none_is_kept(tmp_path: object) -> None:
    """Its line says that no checkpoint was written yet, not "the last checkpoint is kept,
    continue with --resume" (issue 64 probe): there is none to continue from."""
    out = tmp_path / "early_stop"
    process = start_as_job(
        [*QUICK, "--rounds=200", "--checkpoint_every=1000", f"--output_dir={out}"],
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    deadline = time.monotonic() + 300
    while not (out / "metrics.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == (
        "terminated; no checkpoint was written yet; run the command again to start over"
    )
    assert not (out / "checkpoint.npz").exists()


def test_a_run_started_in_the_background_ends_with_its_accounted_wall_and_no_worker(
    tmp_path: object,
) -> None:
    """`(nohup train.py ... &)` ignores SIGINT, and a worker inherited that: it ignored the
    SIGINT that stops it and was killed 10 s later, the run ending 11.5 s after its accounted
    wall (issue 64). Now it ends within seconds of its time line, its worker gone."""
    tag = uuid.uuid4().hex
    process = start_as_job(
        ["--algorithm=fedavg", "--rounds=2", f"--output_dir={tmp_path / 'background'}"],
        background=True,
        TFF_CLUSTERED_RUN_TAG=tag,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",  # each line read when it is printed
    )
    assert process.stdout is not None
    timed_at = None
    for line in process.stdout:
        if line.startswith("time: "):  # the run's phases and wall, logged as it ends
            timed_at = time.monotonic()
    _, stderr = process.communicate(timeout=120)
    ended_after_s = time.monotonic() - (timed_at or 0.0)
    assert process.returncode == 0 and timed_at is not None, stderr[-2000:]
    assert worker_pids_with_tag(tag) == [], "the worker outlived its run"
    assert ended_after_s < 5.0, f"the process ended {ended_after_s:.1f} s after its time line"


@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_during_start_up_is_one_line_and_never_swallowed(
    tmp_path: object, signum: int, code: int
) -> None:
    """Mid-import (TensorFlow takes seconds to import): no traceback, nothing written."""
    out = tmp_path / "early"
    process = start_as_job([*QUICK, f"--output_dir={out}"])
    time.sleep(1.0)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr[-2000:]
    name = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}.get(signum, "hung up")
    assert stderr.strip() == f"train.py: {name} during start-up; nothing was written"
    assert not out.exists()


BAD_FLAGS = [
    (["--learning_rate=-1"], "learning_rate must be > 0"),
    (["--clients_per_round=500"], "exceeds the 40 clients"),
    (["--dataset=leaf"], "needs --data_dir"),
    (["--algorithm=fedavg", "--num_clusters=3"], "one model"),
    (["--algorithm=fedgroup", "--mu=1"], "use --algorithm=fedgrouprox"),
    (["--algorithm=ifca", "--mu=1"], "takes no --mu"),
    (["--algorithm=fedgroup_madc", "--fesem_mu=1"], "takes no --fesem_mu"),
    (["--lr_schedule=warmup"], "--lr_schedule=warmup: value should be one of"),
    (["--rounds=0"], "--rounds=0: 0 is not a positive integer"),
    (["--baseline=fedfoo"], "--baseline=fedfoo: value should be one of"),
    (["--algorithm=criticalfl_dfl", "--criticalfl_threshold=nan"], "give a finite number"),
    (["--workers=127.0.0.1:99999"], "port 99999 is not a TCP port"),
    # DP numbers outside the accountant's and float32's range (issue 49, items 11, 14, 15)
    (["--aggregator=dp", "--dp_noise_multiplier=1e-300"], "(--dp_noise_multiplier) must be 0"),
    (["--aggregator=dp", "--dp_noise_multiplier=1e-20"], "(--dp_noise_multiplier) must be 0"),
    (["--aggregator=dp", "--target_epsilon=1e300"], "--target_epsilon must be in [0, 1e+06]"),
    (["--aggregator=dp", "--dp_noise_multiplier=1", "--dp_clip=1e300"], "(--dp_clip) must be"),
    # Privacy flags that would do nothing (issue 64, item 12)
    (
        ["--algorithm=ifca", "--aggregator=dp", "--dp_noise_multiplier=1", "--dp_cold_start=raw"],
        "--algorithm=ifca takes no --dp_cold_start: it has no cold start",
    ),
    # ... also given at their default value, with an aggregator that does not use them
    (
        ["--algorithm=fesem", "--num_clusters=2", "--dp_cold_start=private"],
        "--dp_cold_start set with --aggregator=mean, which does not use them: add --aggregator=dp",
    ),
    (["--dp_clipping=fixed"], "--dp_clipping set with --aggregator=mean"),
]


def test_bad_flags_exit_non_zero_with_a_clear_message(runs_in_one: dict) -> None:
    """Each case as train.py runs it: exit 2 (absl's own rejections included), the message,
    nothing written, no worker left. The last case is the same command started twice: the
    folder is held as the first run would hold it. (`test_help_ends_without_a_traceback`
    checks that the process ends without TFF's exit-time traceback.)"""
    held = runs_in_one["held"]
    assert runs_in_one["held_listing"] == [LOCK_NAME]
    expected = [*BAD_FLAGS, (["--rounds=1"], held_message(held))]
    results = runs_in_one["bad_flags"]
    assert len(results) == len(expected)
    for (given, message), (out, done) in zip(expected, results):
        assert done.returncode == 2, (given, done.stderr[-2000:])
        assert message in done.stderr, (given, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (given, done.stderr[-2000:])
        assert not os.path.exists(out / "metrics.csv")
    assert_no_worker_left(runs_in_one["tag"])


def held_message(folder: str) -> str:
    """train.py's refusal of a run folder this test process holds."""
    return f"{folder} is in use by another run (pid {os.getpid()}); wait for it"


def test_help_ends_without_a_traceback() -> None:
    done = run_binary([TRAIN, "--help"], {})
    assert done.returncode == 0 and "--algorithm" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_divergence_stops_with_a_clear_error_and_no_nan_output(runs_in_one: dict) -> None:
    out, done = runs_in_one["divergence"]
    assert done.returncode == 2, done.stderr[-2000:]
    assert "round 1:" in done.stderr and "lower --learning_rate" in done.stderr
    assert "Traceback" not in done.stderr
    metrics = (out / "metrics.csv").read_text() if (out / "metrics.csv").exists() else ""
    assert "nan" not in metrics.lower()
    assert_no_worker_left(runs_in_one["tag"])


# TensorFlow's own logging left at its defaults, as a user's shell has it.
TF_DEFAULT_LOGS = {"TF_CPP_MIN_LOG_LEVEL": None, "AUTOGRAPH_VERBOSITY": None}


@pytest.fixture(scope="module")
def two_round_run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One short default run shared by the tests below: (output folder, finished process)."""
    out = str(tmp_path_factory.mktemp("two_rounds") / "run")
    done = run_binary([TRAIN, *QUICK, "--rounds=2", f"--output_dir={out}"], TF_DEFAULT_LOGS)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, done


def test_tensorflow_logs_are_hidden_unless_asked_for(
    tmp_path: object, two_round_run: tuple
) -> None:
    """TensorFlow's C++ lines (CUDA factories, oneDNN, grappler...) and AutoGraph notes stay
    out of a default run's output; --tf_logs shows them."""
    done = two_round_run[1]
    quiet = done.stdout + done.stderr
    assert "tensorflow/" not in quiet and "AutoGraph" not in quiet
    assert len(quiet.splitlines()) <= 4, quiet
    # (In process: TFF's import and worker are not needed to see TensorFlow's own lines.)
    shown = ["--rounds=1", "--execution=in_process", "--tf_logs"]
    done = run_binary([TRAIN, *shown, f"--output_dir={tmp_path / 'shown'}"], TF_DEFAULT_LOGS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensorflow/" in done.stdout + done.stderr


def with_a_nan_weight(folder: str) -> str:
    """A copy of the run in `folder` whose checkpoint has one cluster model value NaN."""
    path = os.path.join(folder, "checkpoint.npz")
    with np.load(path, allow_pickle=False) as data:
        entries = {name: data[name] for name in data.files}
    meta = json.loads(entries[checkpoint.META_ENTRY].tobytes().decode())
    name = meta["state"]["fields"]["cluster_models"]["ndarray"]
    entries[name] = entries[name].copy()
    entries[name].flat[0] = np.nan
    with open(path, "wb") as f:
        np.savez(f, **entries)
    return path


def test_a_refused_run_writes_nothing_in_the_run_folder(runs_in_one: dict) -> None:
    """A run not asked to continue the folder's run, a resume under other settings, and a
    resume of a damaged checkpoint (one NaN weight: no run checkpoints one, and resumed it
    was blamed on the learning rate) are refused before a TFF worker writes its log there
    (`runs_in_one`: the cases in `two_round_run`'s folder and a damaged copy of it)."""
    (again, other, nan), before = runs_in_one["refused"], runs_in_one["refused_before"]
    assert again.returncode == 2 and "--resume" in again.stderr
    assert other.returncode == 2 and "rounds" in other.stderr  # other settings: refused
    assert nan.returncode == 2 and nan.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint {before['damaged_checkpoint']} is damaged: a cluster model in it "
        "has NaN or infinite values, which no run checkpoints; restore the file from a copy, "
        "or start over with --overwrite or in a new --output_dir"
    )
    listed = before["listed"]
    assert {folder: sorted(os.listdir(folder)) for folder in listed} == listed
    assert open(os.path.join(before["out"], "metrics.csv")).read() == before["metrics"]


@pytest.fixture(scope="module")
def runs_in_one(tmp_path_factory: pytest.TempPathFactory, two_round_run: tuple) -> dict:
    """The module's train.py runs that need no process of their own, all in one (TensorFlow
    imported once, not per run) with one TFF_CLUSTERED_RUN_TAG: IFCA's outputs, a divergence,
    a short run on the real LEAF file when ../shared/data holds it,
    the `BAD_FLAGS` cases and one on a folder held as a first run would hold it, and runs
    refused in `two_round_run`'s folder or a damaged copy of it (what they must leave as it
    was is read before they run)."""
    root = tmp_path_factory.mktemp("in_one_process")
    out = two_round_run[0]
    damaged = str(root / "damaged")
    shutil.copytree(out, damaged)
    before = {
        "out": out,
        "damaged_checkpoint": with_a_nan_weight(damaged),
        "listed": {folder: sorted(os.listdir(folder)) for folder in (out, damaged)},
        "metrics": open(os.path.join(out, "metrics.csv")).read(),
    }
    named = {
        "outputs": ["--algorithm=ifca", "--num_clusters=4", "--rounds=3"],
        "divergence": ["--algorithm=fedavg", "--learning_rate=1e8", "--rounds=3"],
    }
    if os.path.exists(SHARED_LEAF_FILE):
        named["leaf"] = leaf_flags(root / "leaf_data")
    folders = {name: root / name for name in named}
    refused = [
        [*QUICK, "--rounds=2", f"--output_dir={out}"],
        [*QUICK, "--rounds=3", f"--output_dir={out}", "--resume"],
        [*QUICK, "--rounds=2", f"--output_dir={damaged}", "--resume"],
    ]
    held = str(root / "held")
    bad_folders = [root / f"bad_{i}" for i in range(len(BAD_FLAGS))]
    bad_flags = [[*given, f"--output_dir={f}"] for (given, _), f in zip(BAD_FLAGS, bad_folders)]
    bad_flags.append(["--rounds=1", f"--output_dir={held}"])
    tag = uuid.uuid4().hex
    with checkpoint.hold_run_folder(held):
        done = runs_in_one_process(
            [
                *([*flags, f"--output_dir={folders[name]}"] for name, flags in named.items()),
                *refused,
                *bad_flags,
            ],
            env_extra={"TFF_CLUSTERED_RUN_TAG": tag},
        )
    results = dict(zip(named, done))
    rest = done[len(named) :]
    return {
        **{name: (folders[name], results[name]) for name in named},
        "refused": rest[: len(refused)],
        "refused_before": before,
        "bad_flags": list(zip([*bad_folders, Path(held)], rest[len(refused) :])),
        "held": held,
        "held_listing": sorted(os.listdir(held)),
        "tag": tag,
    }


@pytest.mark.skipif(not os.path.exists(SHARED_LEAF_FILE), reason="../shared/data not present")
def test_short_training_run_on_the_real_leaf_file(runs_in_one: dict) -> None:
    out, done = runs_in_one["leaf"]
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_csv(os.path.join(out, "metrics.csv"))
    assert float(rows[-1]["accuracy"]) > float(rows[0]["accuracy"])


def test_a_fedgroup_checkpoint_from_before_cold_start_auto_resumes_with_eager(
    tmp_path: object,
) -> None:
    """FedGroup's --cold_start was eager until auto became its default: a checkpoint of then
    records eager (as one of --cold_start=eager does now), and resuming it with today's default
    continues the run as it ran, eager, saying so, though auto would be lazy for this run (38
    newcomers against 5 client trainings and alpha*m = 2). A --cold_start given otherwise is
    refused as another setting."""
    out = str(tmp_path / "fedgroup")
    run = [
        "--algorithm=fedgroup",
        "--num_clusters=2",
        "--pretrain_scale=1",
        "--rounds=1",
        "--clients_per_round=5",
        "--local_epochs=1",
        "--execution=in_process",
        f"--output_dir={out}",
    ]
    cases = [
        [*run, "--cold_start=eager"],
        [*run, "--resume"],
        [*run, "--resume", "--cold_start=lazy"],
    ]
    made, resumed, lazy = runs_in_one_process(cases)
    assert made.returncode == 0 and resumed.returncode == 0, (made.stderr[-2000:], resumed.stderr)
    said = resumed.stdout
    assert (
        f"resuming {RunFolder(out).checkpoint} with --cold_start=eager, which its run had (the "
        "default before --cold_start=auto was); start over (--overwrite) to run with "
        "--cold_start=auto"
    ) in said
    assert "--cold_start=lazy" not in said  # auto was not resolved: the run is eager
    with open(RunFolder(out).summary_json) as f:
        config = json.load(f)["config"]
    assert config["algorithm_options"]["cold_start"] == "eager"
    assert config["algorithm_choices"] == {}
    assert lazy.returncode == 2, lazy.stderr[-2000:]
    assert "cold_start: checkpoint 'eager', now 'lazy'" in lazy.stderr, lazy.stderr[-2000:]


def leaf_flags(folder: Path) -> list[str]:
    """A short run on the real LEAF file (../shared/data), its splits linked into `folder`."""
    for split in ("train", "test"):
        os.makedirs(folder / split)
        os.symlink(os.path.abspath(SHARED_LEAF_FILE), folder / split / "mytest.json")
    return [
        "--dataset=leaf",
        f"--data_dir={folder}",
        "--num_classes=10",
        "--model=mclr",
        "--algorithm=fedavg",
        "--rounds=5",
        "--local_epochs=1",
        "--learning_rate=0.01",
    ]
