"""Records runs of `binaries/train.py` and compares reruns with them bit for bit.

A refactoring that must not change any result is checked in three steps: record the matrix of
runs at the code before the change, rerun the same commands at the code after it, and compare
the final checkpoints and CSVs array by array and value by value:

    python scripts/compare_run_outputs.py record --out /tmp/baseline          # before
    python scripts/compare_run_outputs.py compare --baseline /tmp/baseline --out /tmp/after
    python scripts/compare_run_outputs.py diff /tmp/baseline /tmp/after       # no rerun

`record` runs the matrix (`matrix`: every algorithm the train binary offers under each
execution, the dp, robust, compression and secure aggregators for a few algorithms, two TFF
workers, a run killed after round 1 and resumed) into DIR/<case>/ and writes DIR/manifest.json:
each case's command, its seconds and the sha256 of each compared file, and the machine (CPU
model and flags, the TensorFlow, TFF and NumPy versions, TensorFlow's numerics variables).
`compare` reruns the baseline manifest's commands (not today's matrix) into DIR2 and prints
one line per case: `ok`, `DIFFERS` with the first differing field, or `FAILED` (a case that
does not run, or is missing, is a failure, never a skip); it exits 1 unless every case is ok.
`--only PATTERN` (a regular expression searched in the case names) narrows any of the three;
`--root CHECKOUT` runs another checkout's `binaries/train.py` (a branch without this script).

Bits are comparable only on the same numerics: TensorFlow's CPU kernels round differently by
instruction set, oneDNN setting and version (docs/reproducibility.md), so `compare` and
`diff` refuse a baseline recorded on another CPU or TensorFlow build.

A checkpoint is read as the package writes it (`tff_clustered/runs/checkpoint.py`: an `.npz`
of arrays whose entry `meta.json` holds the state as JSON, each array referenced by entry
name), with the file format alone, not the package's loader: the comparison must outlive the
code it checks (only the machine's description comes from `comparison/numerics.py`, and the
tables of what changed without changing a result from the package: `state_encoding.RELOCATED`,
`checkpoint.ADDED_SETTINGS`). The JSON trees are walked together; at each `{"ndarray": name}`
the two arrays' dtypes, shapes and bytes must be equal. Only the fields in `EXEMPT_SUFFIXES`
are left out (see there); a state class that moved to another module (`TreeComparison`), and a
setting recorded by one run's code and predated by the other's at the value that one's run had
(`first_difference_in_settings`: the settings a resume accepts), are reported beside `ok`,
not as a difference: the values are compared as ever.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from tff_clustered.comparison.numerics import NUMERICS_VARIABLES, cpuinfo_fields
from tff_clustered.runs.checkpoint import MODEL_ARCHITECTURE, predated_settings
from tff_clustered.runs.state_encoding import COLUMN_DICTS, RELOCATED, column_dict

# The repository whose code is run: this script's, or `--root` (another checkout's code
# compared with this script, e.g. a branch that does not hold it yet).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join("binaries", "train.py")  # relative to ROOT
WORKER = os.path.join("binaries", "worker.py")
MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.npz"
META_ENTRY = "meta.json"  # the checkpoint's JSON entry (tff_clustered/checkpoint.py)
# The files compared, when a run writes them: the final checkpoint, the per-round metrics,
# the per-client rows and the disk client store's rows (the checkpoint holds their index).
COMPARED = (CHECKPOINT, "metrics.csv", "clients.csv", "client_store.bin")
# Fields that legitimately differ between two runs of the same code, by name suffix; the only
# ones left out of the comparison. `_seconds`: wall-clock durations (train_seconds,
# server_seconds, eval_seconds, eval_assign_seconds, checkpoint_seconds, round_seconds), as
# metrics.csv columns and as the same rows kept in the checkpoint's history. No other field
# differs between two runs: the runs write no timestamp, host name or absolute path into these
# files (their data's root is the same path in both), which `compare` of unchanged code
# against its own baseline checks. The npz file's bytes are not compared (its zip entries
# carry the time they were written): its arrays and JSON are.
EXEMPT_SUFFIXES = ("_seconds",)
# What every case shares: the embedded digits (40 clients in 4 planted groups), 3 rounds, one
# local epoch: seconds of training each.
COMMON = ("--dataset=digits", "--rounds=3", "--local_epochs=1", "--seed=0")
# Each round samples 6 of the 40 clients (the seeded sampling is part of what is compared)...
SAMPLED = ("--clients_per_round=6",)
# ...but decentralized algorithms train every peer every round: 12 peers, all each round.
EVERY_PEER = ("--num_clients=12", "--clients_per_round=12")
ALGORITHM_FLAGS = {
    name: EVERY_PEER
    for name in (
        "criticalfl_dfl",
        "dfedavgm",
        "dispfl",
        "fedavg_dfl",
        "fedper_dfl",
        "local_dfl",
        "uapdfl",
    )
}
EXECUTIONS = ("tff", "in_process")
AGGREGATORS = {
    "dp": ("--aggregator=dp", "--dp_noise_multiplier=0.5", "--dp_clipping=adaptive"),
    "robust": ("--aggregator=robust",),
    # The MLP's 64x64 kernel (4096 values) is quantized, its other tensors sent as float32.
    "compression": ("--aggregator=compression", "--quantization_threshold=1000"),
    "secure": ("--aggregator=secure",),
}
# FedAvg, a clustered method (IFCA), FedGroup (clusters formed at a cold start) and one with a
# server optimizer (FedAdam): each takes every aggregator.
AGGREGATOR_ALGORITHMS = ("fedavg", "ifca", "fedgroup", "fedadam")
# On two workers: every aggregator with these (the round split over the workers' shares).
TWO_WORKER_AGGREGATOR_ALGORITHMS = ("fedavg", "ifca")
WORKERS_PLACEHOLDER = "--workers={workers}"
OUTPUT_PLACEHOLDER = "--output_dir={out}"
RUN_TIMEOUT_S = 900.0


class Case(NamedTuple):
    """One run of the train binary: `args` after the binary (with `OUTPUT_PLACEHOLDER`, and
    `WORKERS_PLACEHOLDER` on two workers), and for a resumed case the round after which the
    first run is killed (SIGKILL) before `--resume` finishes it."""

    name: str
    args: tuple[str, ...]
    kill_after_round: Optional[int] = None

    @property
    def workers(self) -> int:
        return 2 if WORKERS_PLACEHOLDER in self.args else 1

    def to_json(self) -> dict[str, Any]:
        return {"args": list(self.args), "kill_after_round": self.kill_after_round}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Case:
        return cls(name, tuple(data["args"]), data.get("kill_after_round"))


def case(name: str, algorithm: str, *args: str, kill_after_round: Optional[int] = None) -> Case:
    """`algorithm`'s case: `COMMON`, its own `ALGORITHM_FLAGS` (else `SAMPLED`), `args`."""
    own = ALGORITHM_FLAGS.get(algorithm, SAMPLED)
    flags = (f"--algorithm={algorithm}", *COMMON, *own, *args, OUTPUT_PLACEHOLDER)
    return Case(name, flags, kill_after_round)


def matrix(algorithms: Sequence[str]) -> list[Case]:
    """Every algorithm under each execution; each aggregator under each execution for
    `AGGREGATOR_ALGORITHMS`; every algorithm on two TFF workers, with every aggregator for
    `TWO_WORKER_AGGREGATOR_ALGORITHMS`; FedAvg killed after round 1 and resumed."""
    cases = [
        case(f"{algorithm}-{execution}", algorithm, f"--execution={execution}")
        for algorithm in algorithms
        for execution in EXECUTIONS
    ]
    cases += [
        case(
            f"{algorithm}-{execution}-{name}",
            algorithm,
            f"--execution={execution}",
            *flags,
        )
        for algorithm in AGGREGATOR_ALGORITHMS
        for name, flags in AGGREGATORS.items()
        for execution in EXECUTIONS
    ]
    cases += [
        case(
            f"{algorithm}-tff-2workers",
            algorithm,
            "--execution=tff",
            WORKERS_PLACEHOLDER,
        )
        for algorithm in algorithms
    ]
    cases += [
        case(
            f"{algorithm}-tff-2workers-{name}",
            algorithm,
            "--execution=tff",
            WORKERS_PLACEHOLDER,
            *flags,
        )
        for algorithm in TWO_WORKER_AGGREGATOR_ALGORITHMS
        for name, flags in AGGREGATORS.items()
    ]
    cases.append(
        case(
            "fedavg-tff-resumed",
            "fedavg",
            "--execution=tff",
            "--checkpoint_every=1",
            kill_after_round=1,
        )
    )
    return cases


def offered_algorithms() -> list[str]:
    """The train binary's `--algorithm` choices, as its flag parser lists them."""
    done = subprocess.run(
        [sys.executable, TRAIN, "--algorithm=?"],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    found = re.search(r"--algorithm=\?: value should be one of <([^>]*)>", done.stderr)
    if found is None:
        raise SystemExit(f"cannot read the --algorithm choices of {TRAIN}:\n{done.stderr}")
    return found.group(1).split("|")


# -- the machine -------------------------------------------------------------------------------

VERSIONED = ("tensorflow", "tensorflow-federated", "numpy")


def machine() -> dict[str, str]:
    """What the bits depend on besides the code: the CPU's model and flags, the Python and
    library versions and TensorFlow's numerics variables (tff_clustered/comparison/numerics.py)."""
    fields = cpuinfo_fields()
    found = {
        "cpu": fields.get("model name") or platform.processor() or "unknown",
        "cpu_flags": fields.get("flags", "unknown"),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    for package in VERSIONED:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    for variable in NUMERICS_VARIABLES:
        found[variable] = os.environ.get(variable, "unset")
    return found


def refuse_other_machine(recorded: dict[str, str]) -> None:
    """Exits naming each difference when the baseline was recorded on another machine or
    TensorFlow build: its bits are not this machine's to compare."""
    here = machine()
    differing = [k for k in recorded.keys() | here.keys() if recorded.get(k) != here.get(k)]
    if differing:
        details = "; ".join(
            f"{k}: baseline {recorded.get(k)!r}, here {here.get(k)!r}" for k in sorted(differing)
        )
        raise SystemExit(
            f"refused: the baseline was recorded on another CPU or TensorFlow build ({details}). "
            "Results are bit-for-bit comparable only on the same numerics; record a baseline "
            "here, at the code before the change."
        )


def code_version() -> str:
    """The commit of ROOT, `+dirty` when its tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


# -- running -----------------------------------------------------------------------------------


def run_env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def command(args: Sequence[str], out: str, workers: str) -> list[str]:
    """The case's command line with its output folder and workers filled in."""
    filled = [
        a.replace("{out}", out) if a == OUTPUT_PLACEHOLDER else a.replace("{workers}", workers)
        for a in args
    ]
    return [sys.executable, TRAIN, *filled]


def read_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_case(case: Case, out: str, workers: str) -> tuple[float, str]:
    """Runs `case` into `out` (replaced); its seconds, and an error ('' when it ran)."""
    if os.path.exists(out):
        subprocess.run(["rm", "-rf", out], check=True)
    started = time.perf_counter()
    argv = command(case.args, out, workers)
    if case.kill_after_round is not None:
        error = run_until_killed(argv, out, case.kill_after_round)
        if error:
            return time.perf_counter() - started, error
        argv = [*argv, "--resume"]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return seconds, f"exit code {done.returncode}: {last}"
    if case.kill_after_round is not None and "resuming" not in done.stdout:
        return seconds, "the resumed run did not resume from a checkpoint"
    return seconds, ""


def run_until_killed(argv: list[str], out: str, round_num: int) -> str:
    """Starts `argv` and kills it (SIGKILL, as a lost machine) once its checkpoint holds round
    `round_num`; an error when it ended before that."""
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=run_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if checkpointed_round(os.path.join(out, CHECKPOINT)) >= round_num:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return ""
        time.sleep(0.02)
    if process.poll() is None:
        process.kill()
        process.wait()
    return f"the run ended (exit code {process.returncode}) before round {round_num} to kill it"


def checkpointed_round(path: str) -> int:
    """The round a checkpoint holds (its state's `round_num`), -1 when there is none yet (it
    is written atomically: a file there is whole)."""
    if not os.path.exists(path):
        return -1
    meta, _ = read_checkpoint(path)
    return int(meta["state"]["fields"]["round_num"])


def pick_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_worker() -> tuple[subprocess.Popen, str]:
    """A TFF worker service on loopback (`binaries/worker.py`), and its address."""
    port = pick_port()
    process = subprocess.Popen(
        [sys.executable, WORKER, f"--port={port}"],
        cwd=ROOT,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if "listening" not in line:
        stop_worker(process)
        raise SystemExit(f"the TFF worker on port {port} did not start: {line!r}")
    return process, f"127.0.0.1:{port}"


def stop_worker(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_cases(cases: Sequence[Case], out_dir: str, jobs: int) -> dict[str, dict[str, Any]]:
    """Runs `cases` into out_dir/<case>/: the one-worker cases `jobs` at a time, then the
    two-worker ones one at a time on two worker services started for them. Each case's
    record: its seconds, its error ('' when it ran) and its compared files' sha256."""
    records: dict[str, dict[str, Any]] = {}

    def one(case: Case, workers: str) -> None:
        cpu = children_cpu_seconds()
        seconds, error = run_case(case, os.path.join(out_dir, case.name), workers)
        records[case.name] = {
            **case.to_json(),
            "code": code_version(),
            "seconds": round(seconds, 1),
            # the runs' own CPU time (their TFF worker's included); exact with --jobs=1
            "cpu_seconds": round(children_cpu_seconds() - cpu, 1),
            "error": error,
            "sha256": digests(os.path.join(out_dir, case.name)),
        }
        print(
            f"{case.name}: {'ran' if not error else 'FAILED ' + error} ({seconds:.1f} s)",
            flush=True,
        )

    alone = [c for c in cases if c.workers == 1]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(one, c, "") for c in alone]:
            future.result()
    shared = [c for c in cases if c.workers == 2]
    if shared:
        services = []
        try:
            services = [start_worker() for _ in range(2)]
            addresses = ",".join(address for _, address in services)
            for c in shared:
                one(c, addresses)
        finally:
            for process, _ in services:
                stop_worker(process)
    return {c.name: records[c.name] for c in cases}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def digests(folder: str) -> dict[str, str]:
    found = {}
    for name in COMPARED:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                found[name] = hashlib.sha256(f.read()).hexdigest()
    return found


# -- comparing ---------------------------------------------------------------------------------


def exempt(name: Any) -> bool:
    return isinstance(name, str) and name.endswith(EXEMPT_SUFFIXES)


def first_difference_in_csv(ours: str, theirs: str) -> Optional[str]:
    """The first differing cell (row, column) of two CSV files, exempt columns left out;
    None when they agree."""
    a, b = read_rows(ours), read_rows(theirs)
    columns_a = [c for c in (a[0].keys() if a else []) if not exempt(c)]
    columns_b = [c for c in (b[0].keys() if b else []) if not exempt(c)]
    if columns_a != columns_b:
        return f"columns {columns_a} != {columns_b}"
    if len(a) != len(b):
        return f"{len(a)} rows != {len(b)} rows"
    for i, (row_a, row_b) in enumerate(zip(a, b)):
        for column in columns_a:
            if row_a[column] != row_b[column]:
                return f"row {i} column {column}: {row_a[column]!r} != {row_b[column]!r}"
    return None


def read_checkpoint(path: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The checkpoint's JSON (format, settings, state, data source) and its arrays by entry
    name, read as `tff_clustered/checkpoint.py` reads them (no pickle)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    meta = json.loads(arrays.pop(META_ENTRY).tobytes().decode())
    return meta, arrays


class TreeComparison:
    """Two checkpoints' JSON trees walked together (`first_difference`), with their arrays by
    entry name. A state class that moved to another module, by `state_encoding.RELOCATED` (the
    one table of moves, by which checkpoints written before the move still load), is not a
    difference of the results: it is collected in `moved` and reported beside `ok`."""

    def __init__(self, arrays_a: dict[str, np.ndarray], arrays_b: dict[str, np.ndarray]) -> None:
        self.arrays_a, self.arrays_b = arrays_a, arrays_b
        self.moved: set[str] = set()

    def first_difference(self, a: Any, b: Any, at: str) -> Optional[str]:
        """The first field where the trees differ (at an `{"ndarray": name}` node, the arrays'
        dtypes, shapes and bytes), exempt dict keys left out; None when they agree."""
        if isinstance(a, dict) and isinstance(b, dict):
            return self.first_difference_in_node(a, b, at)
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return f"{at}: {len(a)} items != {len(b)}"
            if all(is_pair(x) for x in a) and all(is_pair(y) for y in b):  # a dict's pairs
                kept_a = [x for x in a if not exempt(x[0])]
                kept_b = [y for y in b if not exempt(y[0])]
                if [x[0] for x in kept_a] != [y[0] for y in kept_b]:
                    return f"{at}: keys {[x[0] for x in kept_a]} != {[y[0] for y in kept_b]}"
                items = ((f"{at}[{x[0]!r}]", x[1], y[1]) for x, y in zip(kept_a, kept_b))
            else:
                items = ((f"{at}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b)))
            return self.first_in_items(items)
        if type(a) is not type(b) or a != b:
            if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
                return None
            return f"{at}: {a!r} != {b!r}"
        return None

    def first_difference_in_node(self, a: dict, b: dict, at: str) -> Optional[str]:
        """An array, a column pair of a long dict, a state class or a JSON object."""
        if set(a) == {"ndarray"} and set(b) == {"ndarray"}:
            return first_difference_in_arrays(
                self.arrays_a[a["ndarray"]], self.arrays_b[b["ndarray"]], at
            )
        if set(a) | set(b) <= set(COLUMN_DICTS) and len(a) == len(b) == 1:
            return self.first_difference_in_column_dicts(a, b, at)
        if list(a) != list(b):
            return f"{at}: keys {sorted(a)} != {sorted(b)}"
        if set(a) == {"dataclass", "fields"} and a["dataclass"] != b["dataclass"]:
            if RELOCATED.get(a["dataclass"]) != b["dataclass"]:
                return f"{at}.dataclass: {a['dataclass']!r} != {b['dataclass']!r}"
            self.moved.add(f"{a['dataclass']} -> {b['dataclass']}")
            return self.first_difference(a["fields"], b["fields"], f"{at}.fields")
        return self.first_in_items((f"{at}.{k}", a[k], b[k]) for k in a)

    def first_in_items(self, items: Iterator[tuple[str, Any, Any]]) -> Optional[str]:
        for at, x, y in items:
            found = self.first_difference(x, y, at)
            if found:
                return found
        return None

    def first_difference_in_column_dicts(self, a: dict, b: dict, at: str) -> Optional[str]:
        """Two long str -> int dicts kept as arrays, either way a checkpoint keeps them
        (`state_encoding.COLUMN_DICTS`: one of before the keys were kept as text compares with
        one of after by its keys and values, not its bytes)."""
        ((kind_a, body_a),), ((kind_b, body_b),) = a.items(), b.items()
        keys_a, values_a = column_dict(kind_a, body_a, self.arrays_a)
        keys_b, values_b = column_dict(kind_b, body_b, self.arrays_b)
        return first_difference_in_arrays(
            values_a, values_b, f"{at}.values"
        ) or first_difference_in_arrays(
            np.array(keys_a, dtype=str), np.array(keys_b, dtype=str), f"{at}.keys"
        )


def is_pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)


def first_difference_in_arrays(a: np.ndarray, b: np.ndarray, at: str) -> Optional[str]:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{at}: array {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
    if a.tobytes() != b.tobytes():
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        index = next(
            i
            for i in range(flat_a.size)
            if flat_a[i : i + 1].tobytes() != flat_b[i : i + 1].tobytes()
        )
        return f"{at}: array element {index}: {flat_a[index]!r} != {flat_b[index]!r}"
    return None


def first_difference_in_checkpoint(ours: str, theirs: str, notes: list[str]) -> Optional[str]:
    """The checkpoints' first difference (`TreeComparison`); the classes that moved are
    added to `notes`."""
    try:
        meta_a, arrays_a = read_checkpoint(ours)
        meta_b, arrays_b = read_checkpoint(theirs)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        return f"unreadable checkpoint: {e}"
    comparison = TreeComparison(arrays_a, arrays_b)
    settings = [meta.pop("settings", None) for meta in (meta_a, meta_b)]
    found = first_difference_in_settings(comparison, *settings, notes)
    found = found or comparison.first_difference(meta_a, meta_b, "checkpoint")
    notes.extend(f"class moved: {move}" for move in sorted(comparison.moved))
    if found is None and len(arrays_a) != len(arrays_b):
        return f"checkpoint: {len(arrays_a)} arrays != {len(arrays_b)}"
    return found


def first_difference_in_settings(
    comparison: TreeComparison, baseline: Any, rerun: Any, notes: list[str]
) -> Optional[str]:
    """The first difference of two checkpoints' settings (their JSON), compared flat
    (`flat_settings`) in any order. A setting one run's code records and the other's predates
    is none when it has the value the older run had (`checkpoint.predated_settings`, the rule
    a resume follows), and is added to `notes`; a setting in one run only otherwise, or a
    value that differs, is the difference."""
    if not (is_settings(baseline) and is_settings(rerun)):
        return comparison.first_difference(baseline, rerun, "checkpoint.settings")
    a, b = flat_settings(baseline), flat_settings(rerun)
    for older, predated in (
        ("the baseline", predated_settings(a, b)),
        ("the rerun", predated_settings(b, a)),
    ):
        if predated:
            names = sorted({setting_name(key) for key in predated})
            notes.append(f"settings {older} predates: {', '.join(names)}")
            a, b = ({k: v for k, v in side.items() if k not in predated} for side in (a, b))
    only = sorted(a.keys() ^ b.keys())
    if only:
        side = "the baseline" if only[0] in a else "the rerun"
        return f"checkpoint.settings.{only[0]}: in {side} only"
    for key in sorted(a):
        found = comparison.first_difference(a[key], b[key], f"checkpoint.settings.{key}")
        if found:
            return found
    return None


def setting_name(key: str) -> str:
    """A flat setting as a note names it: the model's layers as one (`MODEL_ARCHITECTURE`)."""
    return key.split(".")[0] if key.startswith(f"{MODEL_ARCHITECTURE}.") else key


def is_settings(encoded: Any) -> bool:
    """Whether `encoded` is a JSON-encoded dict (a checkpoint's settings, or a dict in them)."""
    return isinstance(encoded, dict) and set(encoded) == {"dict"}


def flat_settings(encoded: Any, prefix: str = "") -> dict[str, Any]:
    """A checkpoint's settings as its JSON encodes them (each dict `{"dict": [[key, value],
    ...]}`), flat as `checkpoint.py` compares them: `training.aggregator.name` -> the value's
    JSON."""
    flat: dict[str, Any] = {}
    for key, value in encoded["dict"]:
        if is_settings(value):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def first_difference_in_bytes(ours: str, theirs: str) -> Optional[str]:
    with open(ours, "rb") as f, open(theirs, "rb") as g:
        a, b = f.read(), g.read()
    if a == b:
        return None
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"byte {index} differs ({len(a)} and {len(b)} bytes)"


def first_difference(baseline: str, other: str, notes: Optional[list[str]] = None) -> Optional[str]:
    """The first difference between two runs' folders, in `COMPARED` order: a file one holds
    and the other not, or the first differing field of a file; None when they agree. What
    differs without changing a result (a state class's module) is added to `notes`."""
    for name in COMPARED:
        ours, theirs = os.path.join(baseline, name), os.path.join(other, name)
        if not os.path.exists(ours) or not os.path.exists(theirs):
            if os.path.exists(ours) != os.path.exists(theirs):
                return f"{name}: in {'the baseline' if os.path.exists(ours) else 'the rerun'} only"
            continue
        if name == CHECKPOINT:
            found = first_difference_in_checkpoint(ours, theirs, [] if notes is None else notes)
        elif name.endswith(".csv"):
            found = first_difference_in_csv(ours, theirs)
        else:
            found = first_difference_in_bytes(ours, theirs)
        if found:
            return f"{name}: {found}"
    if not os.path.exists(os.path.join(baseline, CHECKPOINT)):
        return f"{CHECKPOINT}: missing in both (the run wrote no final checkpoint)"
    return None


def compare_folders(
    baseline_dir: str, other_dir: str, only: Optional[str] = None
) -> list[tuple[str, str]]:
    """(case, `ok` (with what moved) / `DIFFERS: ...` / `FAILED: ...`) for each case of the
    baseline's manifest (those whose name `only` matches): a case that failed in either, or
    is missing from the rerun, fails."""
    baseline = load_manifest(baseline_dir)
    other_path = os.path.join(other_dir, MANIFEST)
    other = load_manifest(other_dir) if os.path.exists(other_path) else {"cases": {}}
    rows = []
    for name, record in baseline["cases"].items():
        if only and not re.search(only, name):
            continue
        rerun = other["cases"].get(name)
        if record.get("error"):
            rows.append((name, f"FAILED: in the baseline: {record['error']}"))
        elif rerun is None or not os.path.isdir(os.path.join(other_dir, name)):
            rows.append((name, "FAILED: missing from the rerun"))
        elif rerun.get("error"):
            rows.append((name, f"FAILED: {rerun['error']}"))
        else:
            notes: list[str] = []
            found = first_difference(
                os.path.join(baseline_dir, name), os.path.join(other_dir, name), notes
            )
            ok = "ok" + (f" ({'; '.join(notes)})" if notes else "")
            rows.append((name, ok if found is None else f"DIFFERS: {found}"))
    if not rows:
        rows.append((only or "(all)", "FAILED: no case of the baseline matches"))
    return rows


def load_manifest(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot read {path}: {e}") from None


def write_manifest(folder: str, cases: dict[str, dict[str, Any]], seconds: float) -> None:
    manifest = {
        "machine": machine(),
        "code": code_version(),
        "python": sys.executable,
        "binary": TRAIN,
        "exempt_suffixes": list(EXEMPT_SUFFIXES),
        "seconds": round(seconds, 1),
        "cases": cases,
    }
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def print_table(rows: Sequence[tuple[str, str]]) -> int:
    """Prints one line per case and a total; the exit code (1 unless all are ok)."""
    width = max(len(name) for name, _ in rows)
    for name, verdict in rows:
        print(f"{name:<{width}}  {verdict}")
    bad = [name for name, verdict in rows if not verdict.startswith("ok")]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases ok" + (f"; {len(bad)} not" if bad else ""))
    return 1 if bad else 0


# -- the commands ------------------------------------------------------------------------------


def record(out_dir: str, only: Optional[str], jobs: int) -> int:
    cases = [c for c in matrix(offered_algorithms()) if not only or re.search(only, c.name)]
    if not cases:
        raise SystemExit(f"no case matches {only!r}")
    os.makedirs(out_dir, exist_ok=True)
    kept: dict[str, dict[str, Any]] = {}
    if os.path.exists(os.path.join(out_dir, MANIFEST)):  # re-record some cases, keep the rest
        earlier = load_manifest(out_dir)
        refuse_other_machine(earlier["machine"])
        kept = earlier["cases"]
    started = time.perf_counter()
    records = run_cases(cases, out_dir, jobs)
    seconds = time.perf_counter() - started
    write_manifest(out_dir, {**kept, **records}, seconds)
    failed = [name for name, r in records.items() if r["error"]]
    print(
        f"recorded {len(records)} cases in {seconds:.0f} s into {out_dir}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def compare(baseline_dir: str, out_dir: str, only: Optional[str], jobs: int) -> int:
    baseline = load_manifest(baseline_dir)
    refuse_other_machine(baseline["machine"])
    cases = [
        Case.from_json(name, data)
        for name, data in baseline["cases"].items()
        if not only or re.search(only, name)
    ]
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    records = run_cases(cases, out_dir, jobs)
    write_manifest(out_dir, records, time.perf_counter() - started)
    return print_table(compare_folders(baseline_dir, out_dir, only))


def diff(baseline_dir: str, other_dir: str, only: Optional[str]) -> int:
    refuse_other_machine(load_manifest(baseline_dir)["machine"])
    return print_table(compare_folders(baseline_dir, other_dir, only))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="run the matrix and record it")
    recording.add_argument("--out", required=True)
    comparing = commands.add_parser("compare", help="rerun a baseline's cases and compare")
    comparing.add_argument("--baseline", required=True)
    comparing.add_argument("--out", required=True)
    for sub in (recording, comparing):
        sub.add_argument("--jobs", type=int, default=1, help="one-worker cases run at once")
    diffing = commands.add_parser("diff", help="compare two recorded folders, no rerun")
    diffing.add_argument("baseline")
    diffing.add_argument("other")
    for sub in (recording, comparing, diffing):
        sub.add_argument("--only", help="a regular expression the case names must match")
    for sub in (recording, comparing):
        sub.add_argument("--root", help="the checkout whose train.py runs (default: this one)")
    args = parser.parse_args(argv)
    if args.command != "diff" and args.root:
        global ROOT  # noqa: PLW0603 - every run and the code's version read it
        ROOT = os.path.abspath(args.root)
    if args.command == "record":
        return record(args.out, args.only, args.jobs)
    if args.command == "compare":
        return compare(args.baseline, args.out, args.only, args.jobs)
    return diff(args.baseline, args.other, args.only)


if __name__ == "__main__":
    sys.exit(main())
