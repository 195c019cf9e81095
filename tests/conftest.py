"""Shared fixtures. TFF tests share one execution context, stopped at the end of the session."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "testdata")
SHARED_LEAF_FILE = os.path.join(ROOT, "..", "shared", "data", "leaf_synthetic_1_1", "mytest.json")
# LEAF splits read by the tests are kept (data/leaf_cache.py) in a folder of this session, not
# in the user's cache folder; subprocesses inherit it.
os.environ.setdefault("TFF_CLUSTERED_CACHE", tempfile.mkdtemp(prefix="tff_clustered_cache-"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that read a module-scoped fixture (often whole runs, built once and read by
    several tests) are one group: `make test`'s `--dist loadgroup` runs a group on one worker,
    so such a fixture is built once rather than on each worker its tests were spread over.
    Groups start first (xdist orders its units by size); every other test goes to whichever
    worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        fixtures = info.name2fixturedefs.values() if info is not None else ()
        if any(defs and defs[-1].scope == "module" for defs in fixtures):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(scope="session")
def tff_context() -> Iterator[object]:
    from tff_clustered.runtime.context import tff_runtime

    with tff_runtime() as runtime:
        yield runtime


def binary_env(env_extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment of a binary run by a test: this one's with `env_extra` (None: unset),
    TensorFlow's C++ logs at level 2 unless given."""
    env = dict(os.environ, **(env_extra or {}))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return {k: v for k, v in env.items() if v is not None}


def run_binary(
    args: list[str], env_extra: dict[str, str | None] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=binary_env(env_extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# digits (40 clients) under DP-FedAvg with Poisson sampling of 10 a round (q = 1/4), in process.
DP_POISSON_DIGITS = [
    "--algorithm=fedavg",
    "--dataset=digits",
    "--clients_per_round=10",
    "--execution=in_process",
    "--aggregator=dp",
    "--client_sampling=poisson",
]


# Another process holding a SQLite file locked (`BEGIN EXCLUSIVE`) until its stdin closes.
HOLD_EXCLUSIVELY = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def held_exclusively(path: str) -> Iterator[None]:
    """While inside, another process holds the SQLite file `path` with `BEGIN EXCLUSIVE`."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_EXCLUSIVELY, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        yield
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)


# The start of a `python -c` script that runs a binary's main (train.py's, or BINARY's given as
# sys.argv[2]) in this one process, as `app.run` would, importing TensorFlow once for several
# runs: `ARGUMENT` is the JSON of sys.argv[1], and `run_train(argv)` prints each run's exit
# code and stderr as one JSON line.
TRAIN_IN_ONE_PROCESS = """
import contextlib, io, json, sys
ARGUMENT = json.loads(sys.argv[1])
BINARY = sys.argv[2] if len(sys.argv) > 2 else "train"
sys.argv = [BINARY + ".py"]
from tff_clustered.cli import launch
train = launch.imported(BINARY)
from absl import app, flags
from tff_clustered.cli import exits
from tff_clustered.runtime import signals

def run_train(argv):
    flags.FLAGS.unparse_flags()
    stderr = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(stderr):
        try:
            app.run(train.main, argv=[BINARY + ".py", *argv], flags_parser=exits.parse_flags)
        except SystemExit as e:
            code = e.code
    print(json.dumps([code, stderr.getvalue()]), flush=True)
"""

# `TRAIN_IN_ONE_PROCESS` running BINARY's main once per argv of ARGUMENT, in order, each run's
# exit code, stderr and stdout printed as one JSON line `["run", code, stderr, stdout]`; an
# argv "wait" waits for a line on stdin instead (`started_runs`).
EACH_RUN = (
    TRAIN_IN_ONE_PROCESS
    + """
for argv in ARGUMENT:
    if argv == "wait":
        sys.stdin.readline()
        continue
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run_train(argv)
    *stdout, result = printed.getvalue().splitlines()
    print(json.dumps(["run", *json.loads(result), "\\n".join(stdout)]), flush=True)
"""
)


def runs_in_one_process(
    argvs: list[list[str]],
    binary: str = "train",
    env_extra: dict[str, str | None] | None = None,
    timeout: float = 900,
) -> list[subprocess.CompletedProcess]:
    """`binaries/BINARY.py` run with each of `argvs` in turn, all in one process (TensorFlow
    imported once, not per run): each run's exit code, stdout and stderr, as if it had been a
    process of its own (its Python-level output; TensorFlow's C++ logs are the process's)."""
    done = run_binary(["-c", EACH_RUN, json.dumps(argvs), binary], env_extra, timeout)
    return each_run(done, argvs, binary)


def started_runs(
    argvs: list, binary: str = "train", env_extra: dict[str, str | None] | None = None
) -> subprocess.Popen:
    """`runs_in_one_process` started, not waited for: each "wait" among `argvs` waits for a
    line on the process's stdin (`finished_runs` sends them)."""
    return subprocess.Popen(
        [sys.executable, "-c", EACH_RUN, json.dumps(argvs), binary],
        cwd=ROOT,
        env=binary_env(env_extra),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished_runs(
    process: subprocess.Popen, timeout: float = 900
) -> list[subprocess.CompletedProcess]:
    """The runs of a `started_runs` process, its waits let go now, once it has finished."""
    argvs = json.loads(process.args[3])
    stdout, stderr = process.communicate("go\n" * argvs.count("wait"), timeout=timeout)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return each_run(done, [argv for argv in argvs if argv != "wait"], process.args[4])


def each_run(
    done: subprocess.CompletedProcess, argvs: list[list[str]], binary: str
) -> list[subprocess.CompletedProcess]:
    """The runs an `EACH_RUN` process `done` ran, one CompletedProcess each."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('["run"')]
    assert len(results) == len(argvs), done.stdout[-3000:] + done.stderr[-3000:]
    return [
        subprocess.CompletedProcess([f"{binary}.py", *argv], code, stdout, stderr)
        for argv, (_, code, stderr, stdout) in zip(argvs, results)
    ]


def worker_pids_with_tag(tag: str) -> list[int]:
    """Live `worker_binary` processes whose environment carries `RUN_TAG=tag`."""
    from tff_clustered.runtime.context import WORKER_TAG_ENV

    needle = f"{WORKER_TAG_ENV}={tag}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"worker_binary" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


# What runs the rounds of the algorithms' own tests: the same TF functions as the TFF runtime
# (`tests/test_in_process.py` checks every algorithm gives the TFF round's results), without a
# call into the TFF worker per round, which is most of a short run's time. The binaries' tests
# and test_in_process.py run the TFF runtime.
EXECUTION = "in_process"


def mlp_experiment(
    algorithm: str, data: object, config: object, round_metrics: tuple = (), **options: object
) -> object:
    """`algorithm` with `options` on `data` with a 16-unit MLP, started (no round run yet)."""
    from tff_clustered.algorithms import make_algorithm
    from tff_clustered.loop.execution import RunExecution
    from tff_clustered.loop.orchestration import Experiment
    from tff_clustered.models import model_spec

    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(
        data,
        model,
        make_algorithm(algorithm, **options),
        config,
        execution=RunExecution.of(EXECUTION),
        round_metrics=list(round_metrics),
    )
    exp.start()
    return exp


def checkpoint_round_trip(state: object, folder: object) -> object:
    """`state` written as a checkpoint file and read back (what a resumed run gets)."""
    from tff_clustered.run_folder import RunFolder
    from tff_clustered.runs import checkpoint

    path = RunFolder(str(folder)).checkpoint
    checkpoint.save(path, state, {"run": "test"})
    return checkpoint.load(path, {"run": "test"})


def history_rows(exp: object) -> list[dict]:
    """A run's history without timings, NaN (no client evaluated yet) as None, so that two
    runs' rows compare with ==."""
    import math

    return [
        {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in r.items()
            if not k.endswith("_seconds")
        }
        for r in exp.state.history
    ]


def ari_with_plant(exp: object) -> float:
    """Adjusted Rand index of the assigned clients' clusters against the planted groups."""
    from sklearn.metrics import adjusted_rand_score

    ids = [c for c in exp.data.client_ids if exp.state.assignment[c] >= 0]
    return adjusted_rand_score(
        [exp.data.true_clusters[c] for c in ids], [exp.state.assignment[c] for c in ids]
    )


def load_script(relative_path: str) -> ModuleType:
    """A script of the repository (binaries/, scripts/) imported as a module, by its path."""
    path = os.path.join(ROOT, relative_path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
