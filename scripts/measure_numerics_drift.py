"""Does a committed table's cell move with TensorFlow's numerics settings on this machine?

Runs the same `binaries/compare.py` cells (default: `results/fedtsdp-digits`'s iid FedAvg and
FedRep, seeds 0 and 1, the `tsdp_cnn` CNN) once per setting, one run at a time, each in a fresh
process: oneDNN on (TensorFlow's default on x86) or off (`TF_ENABLE_ONEDNN_OPTS=0`), TF's own
thread counts or 1 or 2 intra-/inter-op threads (`TF_NUM_INTRAOP_THREADS`,
`TF_NUM_INTEROP_THREADS`), or one CPU (`taskset -c 0`); the first two settings twice, to show
run-to-run determinism. Prints, per setting, each cell's final/max accuracy and in
parentheses the largest absolute difference of its final model weights (every array of its
`checkpoint.npz`: the shared model and the clients' own) from the first setting's
(docs/reproducibility.md, "On another machine"). About 75 s a setting on 2 cores.

  .venv/bin/python scripts/measure_numerics_drift.py --output_dir=/tmp/numerics_drift
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLS = [
    "--flagfile=configs/fedtsdp_digits.flags",
    "--algorithms=fedavg,fedrep",
    "--settings=iid",
    "--seeds=0,1",
]
# (name, environment added, command prefix)
SETTINGS: list[tuple[str, dict[str, str], list[str]]] = [
    ("onednn-on", {}, []),
    ("onednn-on again", {}, []),
    ("onednn-on 1 thread", {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}, []),
    ("onednn-on 2 threads", {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "2"}, []),
    ("onednn-on taskset -c 0", {}, ["taskset", "-c", "0"]),
    ("onednn-off", {"TF_ENABLE_ONEDNN_OPTS": "0"}, []),
    ("onednn-off again", {"TF_ENABLE_ONEDNN_OPTS": "0"}, []),
    (
        "onednn-off 1 thread",
        {
            "TF_ENABLE_ONEDNN_OPTS": "0",
            "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "1",
        },
        [],
    ),
    (
        "onednn-off 2 threads",
        {
            "TF_ENABLE_ONEDNN_OPTS": "0",
            "TF_NUM_INTRAOP_THREADS": "2",
            "TF_NUM_INTEROP_THREADS": "2",
        },
        [],
    ),
    ("onednn-off taskset -c 0", {"TF_ENABLE_ONEDNN_OPTS": "0"}, ["taskset", "-c", "0"]),
]


def weights(run_dir: str) -> dict[str, dict[str, np.ndarray]]:
    """Every run's final checkpoint arrays, by the run's folder relative to `run_dir`."""
    found = {}
    for path in sorted(
        glob.glob(os.path.join(run_dir, "s*", "**", "checkpoint.npz"), recursive=True)
    ):
        with np.load(path, allow_pickle=False) as arrays:
            found[os.path.relpath(os.path.dirname(path), run_dir)] = {
                k: arrays[k] for k in arrays.files if k != "meta.json"
            }
    return found


def largest_differences(
    a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]
) -> dict[str, float]:
    """Per run folder (`s1/iid/fedavg`), the largest absolute difference between its arrays
    in `a` and in `b`."""
    return {
        run: max(float(np.max(np.abs(a[run][k].astype(np.float64) - b[run][k]))) for k in a[run])
        for run in a
    }


def report_line(name: str, run_dir: str, first: dict[str, dict[str, np.ndarray]]) -> str:
    """One setting's runs: each cell's final/max accuracy and its weights' largest
    difference from the same cell of the first setting's run."""
    with open(os.path.join(run_dir, "comparison.csv")) as f:
        accuracies = {
            f"s{r['seed']}/{r['setting']}/{r['algorithm']}": (
                f"{float(r['final_accuracy']):.6f}/{float(r['max_accuracy']):.6f}"
            )
            for r in csv.DictReader(f)
        }
    differences = largest_differences(weights(run_dir), first)
    cells = [f"{run} {accuracies[run]} ({differences[run]:.2g})" for run in sorted(accuracies)]
    return f"{name:24} {'  '.join(cells)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--only", nargs="*", help="names of the settings to run (default all)")
    given = parser.parse_args()
    first: dict[str, dict[str, np.ndarray]] = {}
    for name, environment, prefix in SETTINGS:
        if given.only and name not in given.only:
            continue
        run_dir = os.path.join(given.output_dir, name.replace(" ", "_"))
        command = [
            *prefix,
            sys.executable,
            "binaries/compare.py",
            *CELLS,
            f"--output_dir={run_dir}",
        ]
        done = subprocess.run(
            command, cwd=ROOT, env={**os.environ, **environment}, capture_output=True, text=True
        )
        if done.returncode:
            print(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
            return 1
        first = first or weights(run_dir)
        print(report_line(name, run_dir, first), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
