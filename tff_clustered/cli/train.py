"""Trains one federated algorithm and writes metrics.csv, summary.json, curves.png.

  python binaries/train.py --algorithm=fedper --dataset=digits --rounds=50

With no flags it runs FedPer on the embedded digits data (40 clients in 4 label-permutation
groups). `make run` runs `configs/default_run.flags`: FedGroup on the same data, then FedAvg
on the same clients (`--baseline`), and prints the clusters found against the planted groups.
The dataset, model, training and algorithm flags are in `tff_clustered/cli/run_flags.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Union

from absl import app, flags

# TensorFlow is imported (through these) before absl parses flags: imported inside `main`,
# Keras' Flatten layer fails to build (seen with TF 2.14 / absl 1.4).
from tff_clustered import options as options_lib
from tff_clustered.algorithms import ALGORITHMS, algorithm_class
from tff_clustered.cli import exits, run_flags
from tff_clustered.cli.launch import STARTED
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.phases import PhaseTimer
from tff_clustered.report.reporting import ACCURACY_UNDEFINED
from tff_clustered.run_folder import (
    CHECKPOINT_NAME,
    CLIENT_STORE_NAME,
    CLIENTS_CSV,
    METRICS_CSV,
    SUMMARY_JSON,
    RunFolder,
)
from tff_clustered.runs import checkpoint, runner
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runtime.context import tff_runtime

# The first run's timer, from the process's start (`launch.STARTED`); a baseline's starts when
# it does.
TIMER = PhaseTimer(started=STARTED)
TIMER.add("imports", time.perf_counter() - STARTED)

FLAGS = flags.FLAGS
# The files the last line names when the run folder holds them, in this order.
OUTPUTS_LISTED = (METRICS_CSV, CLIENTS_CSV, SUMMARY_JSON, CHECKPOINT_NAME, CLIENT_STORE_NAME)
flags.DEFINE_enum("algorithm", "fedper", list(ALGORITHMS), "Federated algorithm.")
flags.DEFINE_string("output_dir", None, "Where outputs go (default runs/DATASET-ALGORITHM-sSEED).")
flags.DEFINE_bool("resume", False, "Continue the run in --output_dir from its checkpoint.")
flags.DEFINE_bool(
    "overwrite",
    False,
    "Delete the run in --output_dir (its checkpoint, summary, CSVs, client store, pictures and "
    "TensorBoard events) and start a new one there; without it (or --resume) a folder holding "
    "a run is refused.",
)
flags.DEFINE_enum(
    "baseline",
    "",
    ["", *ALGORITHMS],
    "Then run this algorithm too (e.g. fedavg) on the same data, clients, seed and training "
    "flags, in OUTPUT_DIR/baseline-NAME, and print the difference (empty: none).",
)


def stopped_run_note(folder: list[str]) -> str:
    """What a stopped (or failed) run leaves for the next command: its last checkpoint, or
    none yet (a run stopped before its first checkpoint starts over)."""
    if folder and os.path.exists(RunFolder(folder[0]).checkpoint):
        return "the last checkpoint is kept, continue with --resume"
    return "no checkpoint was written yet; run the command again to start over"


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    baseline = FLAGS.baseline if FLAGS.baseline != FLAGS.algorithm else ""
    folder: list[str] = []  # the run's, once known
    with run_flags.reported_errors(lambda: stopped_run_note(folder)):
        with TIMER.phase("validation"):
            run_flags.refuse_other_algorithms_flags([FLAGS.algorithm, *filter(None, [baseline])])
            spec = run_flags.run_spec_from_flags(FLAGS.algorithm)
            output_dir = FLAGS.output_dir or os.path.join(
                "runs", f"{spec.data.dataset}-{spec.algorithm}-s{spec.training.seed}"
            )
            # Before a worker writes its log there, and before any data is loaded.
            checkpoint.refuse_held_run_folder(output_dir, FLAGS.resume, FLAGS.overwrite)
            folder.append(output_dir)
            resume = runner.resumed(spec, output_dir) if FLAGS.resume else False
            execution = run_flags.execution_from_flags(output_dir, TIMER)
        with contextlib.ExitStack() as running:
            with TIMER.phase("runtime"):
                running.enter_context(tff_runtime(execution.runtime))
            summary = run(spec, output_dir, execution, resume)
            print_results(spec, summary["results"])
            if baseline:
                baseline_spec = dataclasses.replace(
                    spec,
                    algorithm=baseline,
                    algorithm_options=options_lib.from_flags(algorithm_class(baseline).Options),
                )
                baseline_dir = RunFolder(output_dir).baseline(baseline).path
                print(f"{baseline} on the same clients, seed and training flags:")
                baseline_summary = run(
                    baseline_spec, baseline_dir, execution.timed_anew(), FLAGS.resume
                )
    if baseline:
        print_results(baseline_spec, baseline_summary["results"])
        ours, theirs = summary["results"], baseline_summary["results"]
        print(
            f"{spec.algorithm} - {baseline}: final accuracy "
            f"{ours['final_accuracy'] - theirs['final_accuracy']:+.4f}, max "
            f"{ours['max_accuracy'] - theirs['max_accuracy']:+.4f} ({baseline}'s outputs in "
            f"{baseline_dir})"
        )
    print(outputs_line(RunFolder(output_dir)))
    return 0


def outputs_line(folder: RunFolder) -> str:
    """The last line: the run's files that the folder holds (a file the run did not write,
    such as clients.csv without an evaluation, is not named)."""
    files = [name for name in OUTPUTS_LISTED if os.path.exists(folder.file(name))]
    if folder.event_files():
        files.append("TensorBoard events")
    pictures = folder.pictures_written()
    shown = ", ".join(files) if files else "no files"
    return f"outputs in {folder.path}: {shown}" + (
        f"; pictures {', '.join(pictures)}" if pictures else ""
    )


def run(
    spec: RunSpec,
    output_dir: str,
    execution: RunExecution,
    resume: Union[bool, runner.Resumed],
) -> dict[str, Any]:
    """`spec` run in `output_dir`; `resume`: --resume, or the checkpoint as read already."""
    return runner.run(
        spec,
        output_dir,
        execution,
        checkpoint_every=FLAGS.checkpoint_every,
        resume=resume,
        overwrite=FLAGS.overwrite,
    )


def print_results(spec: RunSpec, results: dict[str, Any]) -> None:
    """The run's accuracy, each model kind's on the scored clients, and its clusters: sizes and,
    on data with planted groups, the adjusted Rand index against them."""
    run = f"{spec.algorithm} on {spec.data.dataset}/{spec.model_choice.model}" + (
        " (validation split: not test figures)" if spec.data.split == "validation" else ""
    )
    if ACCURACY_UNDEFINED in results:
        print(f"{run}: no final accuracy: {results[ACCURACY_UNDEFINED]}")
    else:
        print(
            f"{run}: final accuracy {results['final_accuracy']:.4f}, max "
            f"{results['max_accuracy']:.4f} (round {results['max_accuracy_round']}), mean "
            f"per-client accuracy {results['final_client_accuracy_mean']:.4f}; "
            f"{results['total_train_seconds']:.1f}s of training (assigned clients, the "
            "paper's figure)"
        )
    sample = spec.training.eval_clients
    scored = f"{sample:,} sampled clients (--eval_clients)" if sample else "all clients"
    for key, kind in results.items():
        if key.startswith("all_clients_"):
            print(
                f"  {key[len('all_clients_') :]} model on {scored}: final "
                f"{kind['final_accuracy']:.4f}, max {kind['max_accuracy']:.4f} (round "
                f"{kind['max_accuracy_round']}), mean per-client "
                f"{kind['final_client_accuracy_mean']:.4f}"
            )
    clusters = results.get("clusters", {})
    sizes = clusters.get("cluster_sizes", [])
    if len(sizes) > 1:
        line = (
            f"  clusters at the end: {clusters['clusters_in_use']} in use, sizes "
            f"{', '.join(map(str, sizes))}"
        )
        if "adjusted_rand_vs_planted" in clusters:
            line += (
                f"; against the data's {clusters['planted_groups']} planted groups, adjusted "
                f"Rand {clusters['adjusted_rand_vs_planted']:.3f} (1: recovered exactly)"
            )
        print(line)


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    app.run(main, flags_parser=exits.parse_flags)
