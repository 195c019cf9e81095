"""`api_population`: the Python API on large in-memory populations, a process per run.

`api_population` (run only when named): for each of `--api_population_sizes` (10,000,
100,000 and 1,000,000) a process of its own builds `{client: (x, y)}` of 20 examples of
32 float32 features (labels from 4 planted groups, as `data/population.py` draws them), 20% of
each client's examples split off as its test set by the API, and runs each of
`--api_population_algorithms` (FedPer, FedGroup at its default cold start) through
`tff_clustered.run`, in process, 20 clients a round for `--api_population_rounds` (5) rounds,
1,000 sampled clients evaluated at the start and the end. Per run: the input's bytes, the peak
resident memory beyond the input (RSS sampled in the run's process, less its RSS once the
input is built and TensorFlow imported), the run's seconds and of them the setup before round
1 with its phases (reading and checking the clients, `loading`; the model's check and the
settings, `validation`; building the rounds; the algorithm's cold start), seconds per round,
per evaluation and of it the cold start of evaluated clients. Each case runs
`--api_population_repeats` times (3), in turns over the populations; its row is the run of the
median wall, with every run's wall and the median's ratio to the median of the run of a tenth
the clients (the API's growth with the population: 1,000,000 against 100,000)."""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup
from tff_clustered.cli.launch import REPOSITORY

flags.DEFINE_list(
    "api_population_sizes",
    ["10000", "100000", "1000000"],
    "Clients of each API population.",
)
flags.DEFINE_list(
    "api_population_algorithms", ["fedper", "fedgroup"], "Algorithms of the API population runs."
)
flags.DEFINE_integer("api_population_rounds", 5, "Rounds of each API run.", lower_bound=2)
flags.DEFINE_integer(
    "api_population_repeats",
    3,
    "Runs of each population and algorithm, in turns over the populations (so the machine's "
    "drift falls on each alike); a row is the run of the median wall, with every run's wall.",
    lower_bound=1,
)

EXAMPLES, FEATURES, CLASSES, GROUPS = 20, 32, 10, 4
CLIENTS_PER_ROUND, EVAL_CLIENTS = 20, 1000
# The phases of a run before its first round (`loop/phases.py`).
SETUP_PHASES = ("loading", "validation", "runtime", "building", "cold_start")
SAMPLE_SECONDS = 0.02  # how often the run's resident memory is read
CHUNK = 10_000  # clients drawn at once


@flags.validator("api_population_sizes", "API population sizes must be whole numbers >= 100")
def whole_sizes(sizes: list[str]) -> bool:
    return bool(sizes) and all(s.isdigit() and int(s) >= 100 for s in sizes)


def population_clients(num_clients: int, seed: int) -> tuple[dict[str, tuple], int]:
    """`{client: (x, y)}` of `num_clients` clients, x float32 (20, 32) and y int64 (20,) views
    into two contiguous arrays (labels `argmax(x @ W_g)` of the client's planted group g), and
    the bytes of those arrays: the input as a user holds it."""
    import numpy as np

    from tff_clustered.data.population import PopulationSpec, group_maps

    maps = group_maps(PopulationSpec(num_clients, num_groups=GROUPS, seed=seed))
    rng = np.random.default_rng(seed)
    x = np.empty((num_clients, EXAMPLES, FEATURES), np.float32)
    y = np.empty((num_clients, EXAMPLES), np.int64)
    for start in range(0, num_clients, CHUNK):
        stop = min(start + CHUNK, num_clients)
        x[start:stop] = rng.standard_normal((stop - start, EXAMPLES, FEATURES), np.float32)
        groups = np.arange(start, stop) % GROUPS
        logits = np.einsum("nef,nfc->nec", x[start:stop], maps[groups].astype(np.float32))
        y[start:stop] = np.argmax(logits, axis=2)
    clients = {f"c{i:07d}": (x[i], y[i]) for i in range(num_clients)}
    return clients, x.nbytes + y.nbytes


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """The largest resident memory of this process while a `with` block runs, read every
    `SAMPLE_SECONDS` by a thread and at the block's end from `ru_maxrss` when that rose in it."""

    def __enter__(self) -> PeakSampler:
        self.peak, self.done = resident_bytes(), threading.Event()
        self.maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self) -> None:
        while not self.done.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if maxrss > self.maxrss_before:  # the high-water mark rose inside the block
            self.peak = max(self.peak, maxrss)


def keras_mlp() -> Any:
    """The population's model: MLP 32-16-10 returning logits."""
    import tensorflow as tf

    return tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )


def run_figures(result: Any, run_seconds: float) -> dict[str, Any]:
    """Seconds of a finished run from its history and phases: per round the median of rounds 2
    on, training only (round 1 builds the round); per evaluation the last round's, and of it
    the cold start of evaluated clients (`eval_assign_seconds`); the round-0 evaluation (the
    `evaluation` phase less the last one: it builds the scoring); the algorithm's cold start
    before round 1."""
    rows = {int(r["round"]): r for r in result.history}
    last = max(rows)
    training = [
        float(r["round_seconds"]) - float(r["eval_seconds"] or 0.0)
        for n, r in rows.items()
        if n >= 2
    ]
    phases = result.summary.get("phases", {})
    eval_s = float(rows[last]["eval_seconds"])
    return {
        "run_s": round(run_seconds, 2),
        "round_s": round(statistics.median(training), 4),
        "eval_s": round(eval_s, 4),
        "eval_cold_start_s": round(float(rows[last].get("eval_assign_seconds") or 0.0), 4),
        "eval0_s": round(float(phases.get("evaluation", 0.0)) - eval_s, 4),
        **{f"{phase}_s": round(float(phases.get(phase, 0.0)), 2) for phase in SETUP_PHASES},
        "setup_s": round(sum(float(phases.get(phase, 0.0)) for phase in SETUP_PHASES), 2),
        "accuracy": rows[last].get("accuracy"),
        "cold_start": result.summary["config"].get("algorithm_options", {}).get("cold_start"),
    }


def child_run(num_clients: int, algorithm: str, rounds: int, seed: int, out_path: str) -> None:
    """One measured run in this process (the benchmark's child): the input built, TensorFlow and
    the API imported, then `tff_clustered.run`; its figures written to `out_path` as JSON."""
    clients, input_bytes = population_clients(num_clients, seed)
    import tff_clustered

    options = {"num_clusters": GROUPS} if algorithm == "fedgroup" else {}
    training = tff_clustered.TrainingConfig(
        rounds=rounds,
        clients_per_round=CLIENTS_PER_ROUND,
        eval_clients=EVAL_CLIENTS,
        eval_every=rounds,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as output_dir:
        baseline = resident_bytes()
        started = time.perf_counter()
        with PeakSampler() as peak:
            result = tff_clustered.run(
                algorithm,
                train=clients,
                model_fn=keras_mlp,
                options=options,
                training=training,
                execution="in_process",
                client_store="memory",
                output_dir=output_dir,
                checkpoint_every=0,
            )
        seconds = time.perf_counter() - started
        figures = run_figures(result, seconds)
    figures.update(
        clients=num_clients,
        algorithm=algorithm,
        input_mb=round(input_bytes / 2**20, 1),
        beyond_mb=round((peak.peak - baseline) / 2**20, 1),
        beyond_x=round((peak.peak - baseline) / input_bytes, 2),
    )
    with open(out_path, "w") as f:
        json.dump(figures, f)


def measured_run(num_clients: int, algorithm: str) -> dict[str, Any]:
    """`child_run` in a fresh Python process (so runs share no memory); its figures, or its
    exit code and the tail of its output when it failed."""
    with tempfile.TemporaryDirectory() as folder:
        out_path = os.path.join(folder, "figures.json")
        code = (
            "import sys; from tff_clustered.cli.benchmarks.api_population import child_run; "
            "child_run(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "
            "sys.argv[5])"
        )
        args = [num_clients, algorithm, FLAGS.api_population_rounds, FLAGS.seed, out_path]
        process = subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": REPOSITORY},
        )
        if process.returncode != 0 or not os.path.exists(out_path):
            tail = (process.stdout + process.stderr).strip().splitlines()[-5:]
            return {"clients": num_clients, "algorithm": algorithm, "error": "\n".join(tail)}
        with open(out_path) as f:
            figures = json.load(f)
        figures["stdout"] = [line for line in process.stdout.splitlines() if "cold start" in line]
        return figures


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the median wall among `runs` (of an even number, the lower of the two
    middle ones), with every run's wall (`run_s_all`); the first failed run if one failed."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda run: run["run_s"])
    return {**ordered[(len(ordered) - 1) // 2], "run_s_all": [run["run_s"] for run in ordered]}


def print_table(runs: list[dict[str, Any]]) -> None:
    """The runs as docs/performance.md's Markdown table."""
    columns = (
        "input_mb",
        "beyond_mb",
        "beyond_x",
        "run_s",
        "setup_s",
        "loading_s",
        "validation_s",
        "building_s",
        "cold_start_s",
        "round_s",
        "eval_s",
        "eval_cold_start_s",
    )
    print(
        "| clients | algorithm | cold start | input MB | beyond MB | beyond / input | run s "
        "| setup s | loading s | validation s | building s | cold start s | s/round "
        "| s/evaluation | of which cold start | every run's s | x the run of a tenth the clients |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        if "error" in r:
            print(f"| {r['clients']:,} | {r['algorithm']} | failed: {r['error'][-80:]} |")
            continue
        cells = " | ".join(f"{r[k]:g}" for k in columns)
        walls = ", ".join(f"{s:g}" for s in r["run_s_all"])
        tenth = f"{r['x_tenth']:g}" if "x_tenth" in r else "-"
        print(
            f"| {r['clients']:,} | {r['algorithm']} | {r['cold_start'] or '-'} | {cells} "
            f"| {walls} | {tenth} |"
        )


def api_population_benchmark(setup: Setup) -> dict:
    """Every algorithm on every population, smallest first, each run a process of its own; the
    report's entry. The synthetic workload of `setup` is not used."""
    del setup
    sizes = sorted({int(s) for s in FLAGS.api_population_sizes})
    cases = [(size, algorithm) for size in sizes for algorithm in FLAGS.api_population_algorithms]
    measured: dict[tuple[int, str], list[dict[str, Any]]] = {case: [] for case in cases}
    for _ in range(FLAGS.api_population_repeats):
        for size, algorithm in cases:
            entry = measured_run(size, algorithm)
            measured[size, algorithm].append(entry)
            print(f"  {size:,} clients, {algorithm}: {json.dumps(entry)}", flush=True)
    runs = [median_run(measured[case]) for case in cases]
    for run in runs:
        smaller = measured.get((run["clients"] // 10, run["algorithm"]))
        if smaller and "error" not in run and run["clients"] % 10 == 0:
            run["x_tenth"] = round(run["run_s"] / median_run(smaller).get("run_s", math.nan), 2)
    print_table(runs)
    return {
        "rounds": FLAGS.api_population_rounds,
        "clients_per_round": CLIENTS_PER_ROUND,
        "eval_clients": EVAL_CLIENTS,
        "runs": runs,
    }


BENCHMARK = Benchmark(api_population_benchmark, by_default=False, in_tff_runtime=False)
