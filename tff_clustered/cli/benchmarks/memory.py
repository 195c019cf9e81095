"""`memory`: resident memory of this process and of the TFF worker over a run.

`memory` (run only when named): resident memory of this process and of the TFF worker over a
FedAvg digits run of `--memory_rounds` rounds on `--memory_execution`, and its growth per 100
rounds after `--memory_warmup` rounds."""

from __future__ import annotations

import os

import numpy as np
from absl import flags

from tff_clustered.algorithms import make_algorithm
from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup
from tff_clustered.data import load_dataset
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec

flags.DEFINE_integer("memory_rounds", 300, "Rounds of the memory benchmark.", lower_bound=20)
flags.DEFINE_enum(
    "memory_execution", "tff", ["tff", "in_process"], "What runs the memory benchmark's rounds."
)
flags.DEFINE_integer("memory_warmup", 50, "Rounds before memory growth is measured.", lower_bound=0)


def resident_mb(pid: int) -> float:
    """Resident set size of a process, MB (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory_growth(setup: Setup) -> dict:
    """A FedAvg digits run of `memory_rounds` rounds (10 clients a round, evaluated every
    round) on `--memory_execution`: resident memory of this process and of the TFF worker
    (`setup.worker_pid`; none in process) every 10 rounds, and the growth per 100 rounds after
    `memory_warmup` (least-squares slope)."""
    execution, worker_pid = FLAGS.memory_execution, setup.worker_pid
    data = load_dataset("digits", seed=FLAGS.seed)
    spec = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=64)
    config = TrainingConfig(
        rounds=FLAGS.memory_rounds,
        clients_per_round=10,
        local_epochs=1,
        batch_size=10,
        learning_rate=0.1,
        seed=FLAGS.seed,
    )
    experiment = Experiment(
        data, spec, make_algorithm("fedavg"), config, execution=RunExecution.of(execution)
    )
    experiment.start()
    samples = []
    in_worker = execution == "tff" and worker_pid is not None
    for row in experiment.rounds():
        if row["round"] % 10 == 0:
            worker_mb = resident_mb(worker_pid) if in_worker else 0.0
            samples.append((row["round"], resident_mb(os.getpid()), worker_mb))
    measured = np.array([s for s in samples if s[0] >= FLAGS.memory_warmup])
    result: dict = {
        "rounds": FLAGS.memory_rounds,
        "warmup": FLAGS.memory_warmup,
        "execution": execution,
    }
    for column, name in ((1, "python"), (2, "worker")):
        slope = np.polyfit(measured[:, 0], measured[:, column], 1)[0]
        result[f"{name}_mb_per_100_rounds"] = round(float(slope * 100), 2)
        result[f"{name}_mb_at_warmup"] = round(float(measured[0, column]), 1)
        result[f"{name}_mb_at_end"] = round(float(measured[-1, column]), 1)
    result["resident_mb_every_100_rounds"] = [
        {"round": int(r), "python_mb": round(p, 1), "worker_mb": round(w, 1)}
        for r, p, w in samples
        if r % 100 == 0
    ]
    for point in result["resident_mb_every_100_rounds"]:
        print(
            f"  round {point['round']:5d}: python {point['python_mb']:.1f} MB, "
            f"worker {point['worker_mb']:.1f} MB",
            flush=True,
        )
    print(
        f"memory over {FLAGS.memory_rounds} FedAvg digits rounds ({execution}): python "
        f"{result['python_mb_at_warmup']} -> {result['python_mb_at_end']} MB "
        f"({result['python_mb_per_100_rounds']:+.2f} MB/100 rounds), worker "
        f"{result['worker_mb_at_warmup']} -> {result['worker_mb_at_end']} MB "
        f"({result['worker_mb_per_100_rounds']:+.2f} MB/100 rounds) after round "
        f"{FLAGS.memory_warmup}",
        flush=True,
    )
    return result


BENCHMARK = Benchmark(memory_growth, by_default=False)
