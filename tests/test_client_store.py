"""The clients' own models on disk (`client_store.DiskClientStore`): the same reads as the
memory store, checkpoints that name rows instead of holding models, a file that never grows,
and runs that are the same with either store, killed (kill -9) and resumed or not."""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import EXECUTION, ROOT, checkpoint_round_trip, history_rows

from tff_clustered.algorithms import make_algorithm
from tff_clustered.cli import run_flags
from tff_clustered.data import DataSpec, load_digits_clusters
from tff_clustered.loop.client_store import (
    MEMORY_BUDGET_BYTES,
    NO_MODEL,
    DiskClientStore,
    MemoryClientStore,
    StoreIndex,
    checked_store_choice,
    open_store,
    store_kind,
)
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.loop.state import RunState
from tff_clustered.models import model_spec
from tff_clustered.run_folder import CLIENT_STORE_NAME, RunFolder
from tff_clustered.runs import checkpoint, runner
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runtime.context import RuntimeConfig

INITIAL = (np.zeros((3, 2), np.float32), np.ones(4, np.float32))
CLIENTS = tuple(f"c{i}" for i in range(6))


def random_model(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return tuple(rng.normal(size=v.shape).astype(np.float32) for v in INITIAL)


def assert_same_models(a: object, b: object, client_ids: object = CLIENTS) -> None:
    for c in client_ids:
        for x, y in zip(a.model(c), b.model(c)):
            np.testing.assert_array_equal(x, y)


def test_auto_takes_the_disk_store_past_the_budget_and_refuses_other_names() -> None:
    values = 700
    per_client = values * 4 * 2
    assert store_kind("auto", MEMORY_BUDGET_BYTES // per_client, values) == "memory"
    assert store_kind("auto", MEMORY_BUDGET_BYTES // per_client + 1, values) == "disk"
    assert store_kind("disk", 2, values) == "disk" and store_kind("memory", 10**9, 1) == "memory"
    with pytest.raises(ValueError, match="client_store='ram': choose one of auto, memory, disk"):
        checked_store_choice("ram")
    with pytest.raises(TypeError, match="client_store must be one of"):
        checked_store_choice(1)


def test_the_disk_store_reads_what_the_memory_store_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    memory, disk = MemoryClientStore(INITIAL), DiskClientStore(INITIAL, CLIENTS, str(tmp_path))
    assert not (tmp_path / CLIENT_STORE_NAME).exists()  # made at the first write
    for step in range(12):
        client = CLIENTS[rng.integers(len(CLIENTS))]
        indices = [1] if step % 3 else [0, 1]
        values = [random_model(rng)[i] for i in indices]
        for store in (memory, disk):
            store.update(client, indices, values)
        if step % 4 == 3:
            disk.record()
    assert_same_models(memory, disk)
    ids = list(reversed(CLIENTS))
    np.testing.assert_array_equal(disk.flat(ids, 7), memory.flat(ids, 7))
    assert dict(disk.trained()).keys() == memory.models.keys()


def test_a_checkpoint_names_rows_that_later_writes_leave_alone(tmp_path: Path) -> None:
    """Models written after a checkpoint go to the other slot: a store reopened from the
    checkpoint's index (a kill -9 after those writes) holds the checkpoint's models."""
    rng = np.random.default_rng(1)
    disk = DiskClientStore(INITIAL, CLIENTS, str(tmp_path))
    kept = MemoryClientStore(INITIAL)
    for client in CLIENTS[:4]:
        model = random_model(rng)
        disk.put(client, model)
        kept.put(client, model)
    index = disk.record()
    assert index.slots.tolist() == [0, 0, 0, 0, NO_MODEL, NO_MODEL]
    for _ in range(3):  # written since: slot 1, overwritten in place
        for client in CLIENTS[1:6]:
            disk.put(client, random_model(rng))
    assert disk.current.tolist() == [0, 1, 1, 1, 0, 0]
    reopened = DiskClientStore(INITIAL, CLIENTS, str(tmp_path), index)
    assert_same_models(reopened, kept)
    assert reopened.model("c5") is reopened.initial
    reopened.put("c0", random_model(rng))  # the next checkpoint's rows: the other slot again
    assert reopened.current[0] == 1


def test_the_file_never_grows_and_a_checkpoint_holds_no_model(tmp_path: Path) -> None:
    clients = tuple(f"c{i}" for i in range(2000))
    initial = (np.zeros((1024, 2), np.float32),)  # a row of 8 KiB: pages of its own
    rng = np.random.default_rng(2)
    disk = DiskClientStore(initial, clients, str(tmp_path))
    sizes, checkpoints = [], []
    for _ in range(4):
        for client in rng.choice(clients, 50, replace=False):
            disk.put(str(client), (rng.normal(size=(1024, 2)).astype(np.float32),))
        saved = checkpoint_round_trip(RunState(client_models=disk.record()), tmp_path)
        np.testing.assert_array_equal(saved.client_models.slots, disk.saved)
        sizes.append(os.path.getsize(disk.path))
        checkpoints.append(os.path.getsize(RunFolder(str(tmp_path)).checkpoint))
    assert sizes == [len(clients) * 2 * 2048 * 4] * 4
    assert os.stat(disk.path).st_blocks * 512 < sizes[0] / 4  # untouched clients' rows: holes
    # the index: a byte and a checksum of 4 a client, no model (a row: 8 KiB)
    assert max(checkpoints) < 4000 + 5 * len(clients)


@pytest.mark.parametrize("replaced_by", ["zeros", "another run's store"])
def test_a_damaged_or_foreign_store_is_refused_on_resume(tmp_path: Path, replaced_by: str) -> None:
    """The probe: a zero-filled `client_store.bin`, or another run's of the same size, was
    used by `--resume` without a word. The checkpoint's index holds each named row's CRC-32."""
    rng = np.random.default_rng(5)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    disk = DiskClientStore(INITIAL, CLIENTS, str(ours))
    other = DiskClientStore(INITIAL, CLIENTS, str(theirs))
    for client in CLIENTS[:4]:
        disk.put(client, random_model(rng))
        other.put(client, random_model(rng))
    index = checkpoint_round_trip(RunState(client_models=disk.record()), ours).client_models
    other.record()
    assert_same_models(DiskClientStore(INITIAL, CLIENTS, str(ours), index), disk)  # as left
    size = os.path.getsize(disk.path)
    if replaced_by == "zeros":
        with open(disk.path, "wb") as f:
            f.write(bytes(size))
    else:
        os.replace(other.path, disk.path)
    with pytest.raises(ValueError) as refused:
        DiskClientStore(INITIAL, CLIENTS, str(ours), index)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"{disk.path} does not hold the client models the checkpoint names")
    assert "4 of 4 clients' rows differ" in said and "start over in a new --output_dir" in said
    assert os.path.getsize(disk.path) == size  # the size check alone passes


def test_a_full_disk_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The probe's full disk killed the run with SIGBUS: a write into the mapping that the
    file system could not back. Each row's blocks are reserved before it is written, so a full
    disk is the reservation's ENOSPC (faked here), refused before the write."""
    rng = np.random.default_rng(4)
    disk = DiskClientStore(INITIAL, CLIENTS, str(tmp_path))
    disk.put("c0", random_model(rng))  # the real reservation
    reserved = []

    def full(fd: int, offset: int, length: int) -> None:
        reserved.append((offset, length))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(SystemExit) as stopped:
        with run_flags.reported_errors(
            lambda: "the last checkpoint is kept, continue with --resume"
        ):
            disk.put("c1", random_model(rng))
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and said.startswith(f"error: {disk.path}: no space left"), said
    assert "--client_store=memory" in said and "another disk" in said
    assert "fix the folder" not in said  # the store's own fix, said once
    assert disk.current[1] == NO_MODEL  # nothing written
    (offset, length) = reserved[0]  # c1's slot 0 is row 1: its whole pages
    row_bytes = 10 * 4
    assert offset <= row_bytes and 2 * row_bytes <= offset + length and offset % mmap.PAGESIZE == 0
    assert offset + length <= os.path.getsize(disk.path)  # never past the end: it never grows


def test_a_run_resumes_with_the_other_store(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    memory = MemoryClientStore(INITIAL, {c: random_model(rng) for c in CLIENTS[:3]})
    disk = open_store("disk", INITIAL, CLIENTS, str(tmp_path), memory.record())
    assert_same_models(disk, memory)
    back = open_store("memory", INITIAL, CLIENTS, str(tmp_path), disk.record())
    assert_same_models(back, memory)
    assert back.models.keys() == memory.models.keys()


def test_a_store_index_that_does_not_fit_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    index = StoreIndex(slots=np.array([0, NO_MODEL], np.int8), num_values=10)
    with pytest.raises(ValueError, match="does not fit this run's 6 clients of 10 values"):
        DiskClientStore(INITIAL, CLIENTS, str(tmp_path), index)
    index = StoreIndex(slots=np.zeros(6, np.int8), num_values=10)
    with pytest.raises(ValueError, match=f"{CLIENT_STORE_NAME} is missing: it holds the client"):
        DiskClientStore(INITIAL, CLIENTS, str(tmp_path), index)


# -- whole runs --------------------------------------------------------------------------------

QUICK = TrainingConfig(rounds=3, clients_per_round=5, local_epochs=1, learning_rate=0.1, seed=1)


@pytest.mark.parametrize("algorithm", ["fedper", "ditto"])
def test_the_disk_store_gives_the_memory_stores_run(algorithm: str, tmp_path: Path) -> None:
    data = load_digits_clusters(num_clients=10, num_groups=2, seed=1)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    runs = []
    for kind in ("memory", "disk"):
        exp = Experiment(
            data,
            model,
            make_algorithm(algorithm),
            QUICK,
            execution=RunExecution(RuntimeConfig(EXECUTION), client_store=kind).in_folder(
                str(tmp_path)
            ),
        )
        exp.start()
        list(exp.rounds())
        runs.append(exp)
    memory, disk = runs
    assert isinstance(disk.store, DiskClientStore) and memory.store.models
    assert history_rows(disk) == history_rows(memory)
    assert_same_models(disk.store, memory.store, data.client_ids)
    np.testing.assert_array_equal(disk.state.cluster_models, memory.state.cluster_models)


# A run of train.py's runner that kills itself (SIGKILL, as kill -9) once round KILLED_AT has
# written its clients' models, after the checkpoint of round KILLED_AT - 1.
KILLED_AT = 3
KILLED_RUN = """
import json, os, signal, sys
from tff_clustered.runs import runner
from tff_clustered.loop.execution import RunExecution
from tff_clustered.runtime.context import RuntimeConfig
from tff_clustered.loop import round_step
from test_client_store import store_run_spec
ARGUMENT = json.loads(sys.argv[1])
train = round_step.RoundStep.run

def run_then_die(self, request, store):
    outcome = train(self, request, store)
    if request.round_num == ARGUMENT["killed_at"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return outcome

round_step.RoundStep.run = run_then_die
disk = RunExecution(RuntimeConfig(execution="in_process"), client_store="disk")
runner.run(store_run_spec(ARGUMENT["algorithm"]), ARGUMENT["output_dir"], disk, checkpoint_every=2,
           log=lambda line: None)
"""
STATEFUL = ("fedper", "ditto", "fesem", "fedtsdp")


def store_run_spec(algorithm: str) -> RunSpec:
    """A few rounds of tiny data and a tiny MLP."""
    return RunSpec(
        algorithm=algorithm,
        data=DataSpec(dataset="digits", num_clients=10),
        model_choice=ModelChoice(hidden_units=8),
        training=TrainingConfig(rounds=5, clients_per_round=4, local_epochs=1, seed=2),
    )


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple]]:
    """Each algorithm of `STATEFUL` run by `KILLED_RUN` in its own process, all started at once
    (TensorFlow's import is most of a process's time): algorithm -> (output folder, process,
    its stderr file)."""
    root = tmp_path_factory.mktemp("killed")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    runs = {}
    for algorithm in STATEFUL:
        out = str(root / algorithm)
        argument = json.dumps({"algorithm": algorithm, "output_dir": out, "killed_at": KILLED_AT})
        stderr = open(root / f"{algorithm}.stderr", "w+")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN, argument],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        runs[algorithm] = (out, process, stderr)
    yield runs
    for _, process, stderr in runs.values():
        if process.poll() is None:
            process.kill()
        process.wait()
        stderr.close()


def without_seconds(history: list[dict]) -> list[dict]:
    return [
        {
            k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in row.items()
            if not k.endswith("_seconds")
        }
        for row in history
    ]


@pytest.mark.parametrize("algorithm", STATEFUL)
def test_a_killed_run_on_the_disk_store_resumes_to_the_uninterrupted_run(
    algorithm: str, killed_runs: dict[str, tuple]
) -> None:
    """kill -9 after a round wrote models past the last checkpoint, then --resume: the rows
    written since are ignored, and the run ends as one on the memory store that never stopped
    (its rows, server models, clusters and every client's own model)."""
    spec = store_run_spec(algorithm)
    in_process = RuntimeConfig(execution="in_process")
    reference = runner.spec_experiment(spec, RunExecution(in_process, client_store="memory"))
    reference.start()
    list(reference.rounds())
    out, process, stderr = killed_runs[algorithm]
    process.wait(timeout=300)
    stderr.seek(0)
    assert process.returncode == -signal.SIGKILL, stderr.read()[-3000:]
    saved = checkpoint.load(RunFolder(out).checkpoint, spec.settings())
    assert saved.round_num == KILLED_AT - 1 and isinstance(saved.client_models, StoreIndex)
    disk = RunExecution(in_process, client_store="disk", store_folder=out)
    summary, resumed = runner.run_experiment(
        lambda: runner.spec_experiment(spec, disk),
        spec.settings(),
        out,
        disk.timer,
        checkpoint_every=2,
        resume=True,
        log=lambda line: None,
    )
    assert isinstance(resumed.store, DiskClientStore)
    assert without_seconds(summary["history"]) == without_seconds(reference.state.history)
    np.testing.assert_array_equal(resumed.state.cluster_models, reference.state.cluster_models)
    assert resumed.state.assignment == reference.state.assignment
    assert_same_models(resumed.store, reference.store, reference.data.client_ids)
