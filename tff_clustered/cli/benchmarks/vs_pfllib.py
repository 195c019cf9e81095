"""`vs_pfllib`: our FedAvg against PFLlib's, whole processes on the same data, ours / PFLlib.

`vs_pfllib`: our FedAvg (`binaries/train.py`, on TFF's runtime and in process) against
PFLlib's unmodified FedAvg (its `main.py`, torch on the CPU) on the same data and model: the
embedded digits upscaled to 28x28 (nearest pixel, values / 16), 2 classes per client, 100
training and 25 test examples each, an MLP 784-100-10, SGD at 0.05, batches of 10. The data is
written once in both formats (LEAF JSON for us, PFLlib's per-client .npz files for it), then
each workload runs as a whole process of each system in turn, `--vs_pfllib_cycles` times, and
each row prints ours / PFLlib per cycle (lower is faster for us). Seconds per round leave
evaluation out (ours: metrics.csv's round less eval seconds; PFLlib: its `Budget` less its
`evaluate`), medians over the rounds after the first; start-up is process start to the end of
round 1 less one such round (imports, data, building, tracing, TFF's worker: everything before
the steady rounds); whole process is the wall time of the process. Our runs skip round 0's
evaluation (`--noeval_at_start`), PFLlib evaluates once, at its round 0. Ours read the LEAF
files as users do: the first cycle parses them and keeps their arrays beside them
(`data/leaf_cache.py`), later cycles read those.

PFLlib is not on PyPI and needs torch: `--pfllib_dir` names a checkout (its `system/` is
copied into the work folder, its checkout is not touched) and `--pfllib_python` a Python that
has torch. Without them, it is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Optional

import numpy as np
import orjson
from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup
from tff_clustered.cli.launch import REPOSITORY

flags.DEFINE_string("pfllib_dir", None, "vs_pfllib: a checkout of PFLlib (its system/main.py).")
flags.DEFINE_string("pfllib_python", None, "vs_pfllib: a Python that has torch, to run PFLlib.")
flags.DEFINE_integer(
    "pfllib_threads",
    1,
    "vs_pfllib: torch's threads for PFLlib (0: torch's default, 2 on 2 cores). 1 is PFLlib's "
    "faster setting on a shared 2-core machine: at 2, its rounds took 10-30x longer here.",
    lower_bound=0,
)
flags.DEFINE_integer("vs_pfllib_cycles", 3, "vs_pfllib: runs of each system.", lower_bound=1)
flags.DEFINE_string(
    "vs_pfllib_dir",
    None,
    "vs_pfllib: work folder for the data and runs (default: a temporary one).",
)
EXECUTIONS = ("tff", "in_process")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pfllib_driver.py")
# Steps of digits' 8x8 pixels (0..16) as values in [0, 1], upscaled to 28x28 by nearest pixel.
UPSCALE = (np.arange(28) * 8) // 28
TRAIN_EXAMPLES, TEST_EXAMPLES = 100, 25


@dataclasses.dataclass(frozen=True)
class Workload:
    """One run of each system: `num_clients` clients, `per_round` a round, `rounds` rounds."""

    key: str
    num_clients: int
    per_round: int
    local_epochs: int
    rounds: int


WORKLOADS = (
    Workload("c100_r20_e5", 100, 20, 5, 10),
    Workload("c100_r100_e1", 100, 100, 1, 6),
    Workload("c1000_r100_e1", 1000, 100, 1, 6),
)
flags.DEFINE_list(
    "vs_pfllib_workloads", [w.key for w in WORKLOADS], "vs_pfllib: the workloads to run."
)
# The table's rows: (what, the workload, the figure: "round", "startup" or "whole").
ROWS = (
    ("20 of 100 clients a round, 5 local epochs", "c100_r20_e5", "round"),
    ("100 of 100 clients, 1 local epoch", "c100_r100_e1", "round"),
    ("100 of 1,000 clients, 1 local epoch", "c1000_r100_e1", "round"),
    ("start-up to round 1 (20 of 100)", "c100_r20_e5", "startup"),
    ("start-up, 1,000 clients of LEAF JSON", "c1000_r100_e1", "startup"),
    ("10 rounds, whole process (20 of 100)", "c100_r20_e5", "whole"),
)


def skip_reason(pfllib_dir: Optional[str], python: Optional[str]) -> Optional[str]:
    """Why PFLlib cannot run here (None: it can): no checkout, or no Python with torch."""
    if not pfllib_dir or not os.path.isfile(os.path.join(pfllib_dir, "system", "main.py")):
        return (
            f"no PFLlib checkout at --pfllib_dir={pfllib_dir or ''} (it needs system/main.py): "
            "clone https://github.com/TsingZ0/PFLlib and pass its folder"
        )
    if not python:
        return "no --pfllib_python: give a Python that has torch (pip install torch in a venv)"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"--pfllib_python={python} cannot import torch: install torch in that Python"
    return None


def digits_clients(num_clients: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    """`(x_train, y_train, x_test, y_test)` per client: two classes each (client k: k % 10 and
    another), examples drawn with replacement from the digits of its classes, 28x28 in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:, UPSCALE][:, :, UPSCALE] / 16.0).astype(np.float32)
    by_class = [np.flatnonzero(digits.target == c) for c in range(10)]
    rng = np.random.default_rng(seed)
    clients = []
    for k in range(num_clients):
        first = k % 10
        classes = (first, (first + 1 + (k // 10) % 9) % 10)
        parts = []
        for count in (TRAIN_EXAMPLES, TEST_EXAMPLES):
            labels = np.repeat(classes, count // 2 + 1)[:count]
            picks = np.array([rng.choice(by_class[c]) for c in labels])
            parts += [images[picks], digits.target[picks].astype(np.int64)]
        clients.append(tuple(parts))
    return clients


def write_leaf(folder: str, clients: Sequence[tuple[np.ndarray, ...]]) -> None:
    """The clients as LEAF JSON: `train/data.json` and `test/data.json`, x rows of 784."""
    for split, (x_at, y_at) in (("train", (0, 1)), ("test", (2, 3))):
        users = [f"c{k:04d}" for k in range(len(clients))]
        blob = {
            "users": users,
            "num_samples": [len(c[y_at]) for c in clients],
            "user_data": {
                user: {"x": c[x_at].reshape(len(c[x_at]), -1).tolist(), "y": c[y_at].tolist()}
                for user, c in zip(users, clients)
            },
        }
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        with open(os.path.join(folder, split, "data.json"), "wb") as f:
            f.write(orjson.dumps(blob))


def write_pfllib(folder: str, clients: Sequence[tuple[np.ndarray, ...]]) -> None:
    """The clients as PFLlib's generators write them: `train/K.npz` and `test/K.npz`, each
    `data={'x': (n, 1, 28, 28) float32, 'y': int64}` compressed."""
    for split, (x_at, y_at) in (("train", (0, 1)), ("test", (2, 3))):
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        for k, c in enumerate(clients):
            data = {"x": c[x_at][:, None], "y": c[y_at]}
            with open(os.path.join(folder, split, f"{k}.npz"), "wb") as f:
                np.savez_compressed(f, data=data)


def steady_round(seconds: Sequence[float]) -> float:
    """A steady round's seconds: the median of the rounds after the first."""
    return statistics.median(seconds[1:])


def our_run(work: Workload, execution: str, data_dir: str, out: str) -> dict[str, float]:
    """Our FedAvg as a `train.py` process: seconds per round, start-up, whole process."""
    command = [
        sys.executable,
        os.path.join(REPOSITORY, "binaries", "train.py"),
        "--algorithm=fedavg",
        "--dataset=leaf",
        f"--data_dir={data_dir}",
        "--model=mlp",
        "--hidden_units=100",
        "--learning_rate=0.05",
        "--batch_size=10",
        f"--local_epochs={work.local_epochs}",
        f"--clients_per_round={work.per_round}",
        f"--rounds={work.rounds}",
        f"--eval_every={work.rounds}",
        "--noeval_at_start",
        "--checkpoint_every=0",
        f"--execution={execution}",
        f"--output_dir={out}",
        "--overwrite",
    ]
    whole = timed_process(command)
    with open(os.path.join(out, "summary.json")) as f:
        phases = json.load(f)["phases"]
    with open(os.path.join(out, "metrics.csv")) as f:
        header, *lines = [line.rstrip("\n").split(",") for line in f]
    rows = [dict(zip(header, line)) for line in lines]
    rounds = [float(r["round_seconds"]) - float(r["eval_seconds"]) for r in rows]
    before = ("imports", "validation", "runtime", "loading", "building", "cold_start")
    startup = sum(phases.get(p, 0.0) for p in before) + rounds[0] - steady_round(rounds)
    return {"round": steady_round(rounds), "startup": startup, "whole": whole}


def pfllib_run(work: Workload, system: str, dataset: str, out_json: str) -> dict[str, float]:
    """PFLlib's FedAvg as its `main.py` process (`pfllib_driver.py`): the same figures."""
    command = [
        FLAGS.pfllib_python,
        DRIVER,
        system,
        out_json,
        str(FLAGS.pfllib_threads),
        "--",
        *("-data", dataset, "-m", "DNN", "-ncl", "10", "-lbs", "10", "-lr", "0.05"),
        *("-gr", str(work.rounds - 1), "-ls", str(work.local_epochs), "-dev", "cpu"),
        *("-jr", str(work.per_round / work.num_clients), "-nc", str(work.num_clients)),
        *("-eg", str(work.rounds + 1), "-algo", "FedAvg"),
    ]
    whole = timed_process(command)
    with open(out_json) as f:
        times = json.load(f)
    rounds = list(times["budget_s"])
    rounds[0] -= times["evaluate_s"][0]  # round 0's evaluation
    startup = times["first_round_s"] + rounds[0] - steady_round(rounds)
    return {"round": steady_round(rounds), "startup": startup, "whole": whole}


def timed_process(command: list[str]) -> float:
    """Runs `command` (its output kept for a failure's message); its wall seconds."""
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:3])} ... failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return seconds


def prepared(folder: str, work: Workload) -> tuple[str, str, str]:
    """The workload's data in both formats under `folder` (written once) and PFLlib's copied
    `system/`: (our LEAF folder, PFLlib's system folder, PFLlib's dataset name)."""
    dataset = f"MNIST_digits28_{work.num_clients}"  # "MNIST" in the name: PFLlib's 784-input DNN
    leaf_dir = os.path.join(folder, "leaf", dataset)
    pfllib_data = os.path.join(folder, "pfllib", "dataset", dataset)
    if not os.path.isdir(pfllib_data):
        clients = digits_clients(work.num_clients, FLAGS.seed)
        write_leaf(leaf_dir, clients)
        write_pfllib(pfllib_data, clients)
    system = os.path.join(folder, "pfllib", "system")
    if not os.path.isdir(system):
        shutil.copytree(os.path.join(FLAGS.pfllib_dir, "system"), system)
    return leaf_dir, system, dataset


def one_cycle(folder: str, works: Sequence[Workload]) -> dict[str, dict[str, dict[str, float]]]:
    """Each workload run by each system once, in turn: {workload: {system: figures}}."""
    cycle: dict[str, dict[str, dict[str, float]]] = {}
    for work in works:
        leaf_dir, system, dataset = prepared(folder, work)
        runs = cycle.setdefault(work.key, {})
        for execution in EXECUTIONS:
            out = os.path.join(folder, "runs", f"{work.key}-{execution}")
            runs[execution] = our_run(work, execution, leaf_dir, out)
        out_json = os.path.join(folder, "runs", f"{work.key}-pfllib.json")
        runs["pfllib"] = pfllib_run(work, system, dataset, out_json)
    return cycle


def ratio_range(cycles: Sequence[dict], key: str, execution: str, figure: str) -> str:
    """Ours / PFLlib over the cycles, as "low-high" (one value when they agree to 0.01)."""
    ratios = [c[key][execution][figure] / c[key]["pfllib"][figure] for c in cycles if key in c]
    low, high = min(ratios), max(ratios)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def table_lines(cycles: Sequence[dict]) -> list[str]:
    """The markdown table: one row per figure whose workload ran, ours / PFLlib per execution
    (a range over the cycles), and the median seconds of each system."""
    lines = [
        "| work | ours / PFLlib, TFF's runtime | ours / PFLlib, in process | seconds: ours TFF, "
        "ours in process, PFLlib (medians) |",
        "|---|---|---|---|",
    ]
    for what, key, figure in ROWS:
        if not any(key in c for c in cycles):
            continue
        ratios = [ratio_range(cycles, key, execution, figure) for execution in EXECUTIONS]
        seconds = [
            statistics.median(c[key][system][figure] for c in cycles if key in c)
            for system in (*EXECUTIONS, "pfllib")
        ]
        lines.append(
            f"| {what} | {ratios[0]} | {ratios[1]} | {' / '.join(f'{s:.2f}' for s in seconds)} |"
        )
    return lines


def vs_pfllib(setup: Setup) -> dict:
    """The benchmark (see the module docstring); skipped, with the reason, where PFLlib or
    torch is missing."""
    del setup  # its own data and model: the workload flags do not apply
    reason = skip_reason(FLAGS.pfllib_dir, FLAGS.pfllib_python)
    if reason:
        print(f"vs_pfllib skipped: {reason}")
        return {"skipped": reason}
    unknown = sorted(set(FLAGS.vs_pfllib_workloads) - {w.key for w in WORKLOADS})
    if unknown:
        raise ValueError(
            f"--vs_pfllib_workloads: unknown {unknown}; choose from {[w.key for w in WORKLOADS]}"
        )
    works = [w for w in WORKLOADS if w.key in FLAGS.vs_pfllib_workloads]
    folder = FLAGS.vs_pfllib_dir or tempfile.mkdtemp(prefix="vs_pfllib-")
    cycles = []
    for number in range(FLAGS.vs_pfllib_cycles):
        cycles.append(one_cycle(folder, works))
        print(f"vs_pfllib cycle {number + 1} of {FLAGS.vs_pfllib_cycles} done (load {load()})")
    print("\n".join(table_lines(cycles)))
    return {"cycles": cycles, "table": table_lines(cycles), "folder": folder}


def load() -> str:
    """The machine's load averages (1, 5, 15 minutes), to state beside the figures."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


BENCHMARK = Benchmark(vs_pfllib, by_default=False, in_tff_runtime=False)
