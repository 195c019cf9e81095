"""`population`: runs on synthetic populations of many sizes, in processes of their own.

`population` (run only when named): populations of `--population_sizes` synthetic clients
(20 train + 10 test examples of 32 features, 4 planted groups) in TFF's SQL format, written once
into `--population_dir`; FedAvg, FedPer and FedGroup (lazy cold start) trained on each by
`binaries/train.py` in a process of their own per run, on each of `--population_executions`,
20 clients a round for `--population_rounds` rounds, 1,000 sampled clients evaluated every 10
rounds. Per run: start-up seconds (summary.json's phases before round 1), seconds per round,
seconds per evaluation and peak memory (the run's processes); the issue's goals, and a plot
(`--population_plot`). `--population_dry_run` writes the populations and prints the runs'
commands only."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup
from tff_clustered.cli.benchmarks.population_goals import goal_checks
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.data.population import PopulationSpec, population_file
from tff_clustered.report import figures

ROOT = REPOSITORY
TRAIN_PY = os.path.join(ROOT, "binaries", "train.py")

flags.DEFINE_list(
    "population_sizes", ["1000", "10000", "100000", "1000000"], "Clients of each population."
)
flags.DEFINE_string(
    "population_dir",
    "/tmp/tff_clustered_population",
    "Where the population files are written once and reused (their names hold their sizes and "
    "parameters), and the runs' folders.",
)
flags.DEFINE_integer("population_rounds", 20, "Rounds of each population run.", lower_bound=2)
flags.DEFINE_list(
    "population_executions", ["in_process", "tff"], "Executions of the population runs."
)
flags.DEFINE_list(
    "population_algorithms", ["fedavg", "fedper", "fedgroup"], "Algorithms of the population runs."
)
flags.DEFINE_bool(
    "population_dry_run", False, "Only write the populations and print the runs' commands."
)
flags.DEFINE_string(
    "population_plot",
    os.path.join(ROOT, "docs", "performance_population.png"),
    "The population benchmark's plot (PNG).",
)

CLIENTS_PER_ROUND = 20
EVAL_CLIENTS = 1000
EVAL_EVERY = 10
# summary.json's phases that come before round 1 and grow with the population if anything
# does: start-up. Importing and starting TFF's runtime cost the same at any size.
STARTUP_PHASES = ("validation", "loading", "building", "cold_start")
POLL_SECONDS = 0.2  # how often a run's resident memory is read


@flags.validator("population_sizes", "population sizes must be whole numbers >= 1")
def whole_sizes(sizes: list[str]) -> bool:
    return bool(sizes) and all(s.isdigit() and int(s) >= 1 for s in sizes)


@flags.validator("population_executions", "population executions are in_process and tff")
def known_executions(executions: list[str]) -> bool:
    return bool(executions) and set(executions) <= {"in_process", "tff"}


def algorithm_flags(algorithm: str, spec: PopulationSpec) -> list[str]:
    """An algorithm's own flags: FedGroup assigns newcomers when first sampled (a cold start
    of the whole population would pre-train every client), into as many groups as planted."""
    if algorithm == "fedgroup":
        return ["--cold_start=lazy", f"--num_clusters={spec.num_groups}"]
    return []


def train_command(
    data_file: str, spec: PopulationSpec, algorithm: str, execution: str, output_dir: str
) -> list[str]:
    """The `binaries/train.py` command of one population run: the population's file read by
    client id (`--dataset=tff_sql`), client state where `--client_store=auto` puts it."""
    return [
        sys.executable,
        TRAIN_PY,
        f"--algorithm={algorithm}",
        "--dataset=tff_sql",
        f"--data_dir={data_file}",
        f"--num_classes={spec.num_classes}",
        "--model=mlp",
        "--hidden_units=16",
        f"--eval_clients={EVAL_CLIENTS}",
        f"--eval_every={EVAL_EVERY}",
        "--client_store=auto",
        f"--clients_per_round={CLIENTS_PER_ROUND}",
        "--local_epochs=1",
        f"--rounds={FLAGS.population_rounds}",
        f"--execution={execution}",
        f"--seed={FLAGS.seed}",
        f"--output_dir={output_dir}",
        *algorithm_flags(algorithm, spec),
    ]


def tree_resident_mb(pid: int) -> float:
    """Resident memory of process `pid` and all its descendants (TFF's worker), MB (Linux
    /proc); 0 for a process that has gone."""
    total, pending, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 2**20


def run_measured(command: list[str], log_path: str) -> dict[str, Any]:
    """Runs `command` (its output to `log_path`) to its end: its exit code, wall seconds, the
    peak of its processes' summed resident memory (read every `POLL_SECONDS`), and the largest
    one process's peak (`ru_maxrss` of the child, from `os.wait4`, its waited-for children
    included)."""
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        peak_mb = 0.0
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            peak_mb = max(peak_mb, tree_resident_mb(process.pid))
            time.sleep(POLL_SECONDS)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit_code": process.returncode,
        "wall_s": round(time.perf_counter() - started, 2),
        "peak_mb": round(peak_mb, 1),
        "max_process_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def median(values: list[float]) -> Optional[float]:
    """The median to 4 decimals; None without values."""
    return round(statistics.median(values), 4) if values else None


def run_figures(output_dir: str, rounds: int) -> dict[str, Any]:
    """Start-up, round and evaluation seconds of a finished run, from its summary.json's
    `phases` and its metrics.csv: seconds per round is the median of rounds 2 on (round 1
    builds the round), training only (`round_seconds - eval_seconds`); seconds per evaluation
    the median over the evaluated rounds after round 0, and of it the seconds that gave the
    evaluated clients their clusters (`eval_assign_s`: FedGroup's cold start of the evaluated
    clients not assigned yet)."""
    with open(os.path.join(output_dir, "summary.json")) as f:
        phases = json.load(f)["phases"]
    with open(os.path.join(output_dir, "metrics.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["round"]) >= 1]
    training = [
        float(r["round_seconds"]) - float(r["eval_seconds"]) for r in rows if int(r["round"]) >= 2
    ]
    evaluated = [r for r in rows if int(r["round"]) % EVAL_EVERY == 0 or int(r["round"]) == rounds]
    assigning = [float(r.get("eval_assign_seconds") or 0.0) for r in evaluated]
    return {
        "startup_s": round(sum(phases.get(p, 0.0) for p in STARTUP_PHASES), 2),
        "round_s": median(training),
        "first_round_s": round(float(rows[0]["round_seconds"]), 3) if rows else None,
        "eval_s": median([float(r["eval_seconds"]) for r in evaluated]),
        "eval_assign_s": median(assigning),
        "phases": {k: round(v, 2) for k, v in phases.items() if isinstance(v, float)},
    }


def log_tail(path: str, lines: int = 5) -> str:
    """The last lines of a run's log, for a failed run's report entry."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:]).strip()


def population_run(
    data_file: str, spec: PopulationSpec, algorithm: str, execution: str
) -> dict[str, Any]:
    """One run in a fresh folder under `--population_dir`: its command, what `run_measured`
    measures and, if it finished, `run_figures`."""
    name = f"n{spec.num_clients}-{algorithm}-{execution}"
    output_dir = os.path.join(FLAGS.population_dir, "runs", name)
    shutil.rmtree(output_dir, ignore_errors=True)
    os.makedirs(output_dir)
    command = train_command(data_file, spec, algorithm, execution, output_dir)
    entry: dict[str, Any] = {
        "clients": spec.num_clients,
        "algorithm": algorithm,
        "execution": execution,
        "command": " ".join(command),
    }
    log_path = os.path.join(FLAGS.population_dir, "runs", f"{name}.log")
    entry.update(run_measured(command, log_path))
    if entry["exit_code"] == 0:
        entry.update(run_figures(output_dir, FLAGS.population_rounds))
    else:
        entry["error"] = log_tail(log_path)
    return entry


def write_plot(path: str, runs: list[dict[str, Any]]) -> None:
    """Start-up, seconds per round, seconds per evaluation and peak memory against the
    population's size (log x axis), one line per algorithm (a colour) and execution (solid in
    process, dashed on TFF's runtime)."""
    plt = figures.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    panels = (
        ("startup_s", "start-up (s)"),
        ("round_s", "s / round"),
        ("eval_s", f"s / evaluation of {EVAL_CLIENTS:,}"),
        ("peak_mb", "peak memory (MB)"),
    )
    cases = sorted({(r["algorithm"], r["execution"]) for r in runs})
    algorithms = sorted({algorithm for algorithm, _ in cases})
    for ax, (key, label) in zip(axes, panels):
        for algorithm, execution in cases:
            points = sorted(
                (r["clients"], r[key])
                for r in runs
                if (r["algorithm"], r["execution"]) == (algorithm, execution)
                and r.get(key) is not None
            )
            if points:
                ax.plot(
                    *zip(*points),
                    marker="o",
                    color=f"C{algorithms.index(algorithm)}",
                    linestyle="-" if execution == "in_process" else "--",
                    label=f"{algorithm} ({execution})",
                )
        ax.set(xscale="log", xlabel="clients", title=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"population benchmark: {CLIENTS_PER_ROUND} clients a round, "
        f"{FLAGS.population_rounds} rounds, MLP 32-16-10"
    )
    figures.save_figure(fig, path)


def print_table(runs: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    """The runs as a Markdown table (docs/performance.md's), then the goals."""
    print(
        "| clients | algorithm | execution | start-up s | s/round | s/evaluation "
        "| of which cold start | peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        cells = [r.get(k) for k in ("startup_s", "round_s", "eval_s", "eval_assign_s", "peak_mb")]
        shown = ["failed" if v is None else f"{v:g}" for v in cells]
        print(f"| {r['clients']:,} | {r['algorithm']} | {r['execution']} | {' | '.join(shown)} |")
    for c in checks:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[c["met"]]
        print(
            f"goal {c['goal']} ({c['algorithm']}, {c['execution']}): {c['value']} "
            f"(limit {c['limit']}): {verdict}",
            flush=True,
        )


def population_benchmark(setup: Setup) -> dict:
    """Writes each population (unless cached), then runs every algorithm on every execution
    on it, largest populations last; the report's entry. The synthetic workload of `setup` is
    not used: the runs are processes of their own."""
    del setup
    report: dict[str, Any] = {
        "rounds": FLAGS.population_rounds,
        "clients_per_round": CLIENTS_PER_ROUND,
        "eval_clients": EVAL_CLIENTS,
        "eval_every": EVAL_EVERY,
        "files": [],
        "runs": [],
    }
    for size in sorted({int(s) for s in FLAGS.population_sizes}):
        spec = PopulationSpec(size, seed=FLAGS.seed)
        started = time.perf_counter()
        data_file, written = population_file(spec, FLAGS.population_dir)
        seconds = time.perf_counter() - started
        report["files"].append(
            {
                "clients": size,
                "path": data_file,
                "mb": round(os.path.getsize(data_file) / 2**20, 1),
                "written_s": round(seconds, 2) if written else None,
            }
        )
        print(
            f"population of {size:,} clients: {data_file} "
            f"({f'written in {seconds:.1f} s' if written else 'reused'})",
            flush=True,
        )
        for algorithm in FLAGS.population_algorithms:
            for execution in FLAGS.population_executions:
                if FLAGS.population_dry_run:
                    output_dir = os.path.join(FLAGS.population_dir, "runs", "dry_run")
                    command = train_command(data_file, spec, algorithm, execution, output_dir)
                    print(" ".join(command), flush=True)
                    report["runs"].append({"command": " ".join(command)})
                    continue
                entry = population_run(data_file, spec, algorithm, execution)
                report["runs"].append(entry)
                print(
                    f"  {size:,} clients, {algorithm} ({execution}): "
                    + json.dumps({k: v for k, v in entry.items() if k not in ("command",)}),
                    flush=True,
                )
    if FLAGS.population_dry_run:
        return report
    report["goals"] = goal_checks(report["runs"])
    print_table(report["runs"], report["goals"])
    write_plot(FLAGS.population_plot, report["runs"])
    report["plot"] = FLAGS.population_plot
    return report


BENCHMARK = Benchmark(population_benchmark, by_default=False, in_tff_runtime=False)
