"""A run's files but its pictures: its CSVs, TensorBoard events, summary and progress bar.

A run's files but its pictures (`report/figures.py`): the per-round CSV, the per-client
CSV, TensorBoard events, the JSON summary, and the terminal's progress bar."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import itertools
import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.atomic_files import atomic_write_bytes
from tff_clustered.run_folder import RunFolder


def write_metrics_csv(path: str, history: Sequence[dict[str, Any]]) -> None:
    """All rows, columns in first-seen order; a round without evaluation leaves cells empty."""
    columns: list[str] = []
    for row in history:
        columns += [k for k in row if k not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    atomic_write_bytes(path, buffer.getvalue().encode())


class ClientsCsv:
    """`clients.csv`: one row per evaluated client and round (round, client, the cluster it was
    scored with, whether it is assigned, training and test examples, then accuracy and loss per
    model kind), appended as rounds finish. A resumed run first drops the rows of rounds after
    its checkpoint (and any torn last line), so the file ends as an uninterrupted run's would."""

    def __init__(self, path: str, keep_through_round: Optional[int] = None) -> None:
        self.path = path
        self.columns: list[str] = []
        if keep_through_round is None or not os.path.exists(path):
            if os.path.exists(path):
                os.unlink(path)
            return
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            self.columns = list(reader.fieldnames or [])
            kept = [
                row
                for row in reader
                if all(row.get(c) not in (None, "") for c in self.columns)
                and int(row["round"]) <= keep_through_round
            ]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
        atomic_write_bytes(path, buffer.getvalue().encode())

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        buffer = io.StringIO()
        header = not self.columns
        self.columns = self.columns or list(rows[0])
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows({c: csv_cell(r[c]) for c in self.columns} for r in rows)
        with open(self.path, "a") as f:
            f.write(buffer.getvalue())
            f.flush()


def tensorboard_tag(column: str) -> str:
    """`cluster_size_3` -> `cluster_size/3`, so TensorBoard groups per-cluster series."""
    match = re.fullmatch(r"(cluster_size|cluster_accuracy|sampled_cluster)_(\d+)", column)
    return f"{match.group(1)}/{match.group(2)}" if match else column


class TensorBoardLog:
    """TensorBoard event files in the run's folder (`tensorboard --logdir runs/` shows every
    run side by side): every numeric column of each round's row as a scalar at step = round.
    Rows are held until the checkpoint that covers them is written (`flush`), so a resumed run
    neither repeats nor loses a point.

    TensorFlow's writer drops some write errors (on a full disk it leaves a truncated file and
    the run would end with exit 0), so after every flush the file is read back: each event
    written must be in it, else an `OSError` says so."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.earlier_files = set(RunFolder(output_dir).event_files())
        self.writer = tf.summary.create_file_writer(output_dir)
        self.pending: list[dict[str, Any]] = []
        self.events_written = 1  # the writer's own first event (the file's version)

    def add(self, row: dict[str, Any]) -> None:
        self.pending.append(row)

    def flush(self) -> None:
        with self.writer.as_default(), output_errors(self.output_dir):
            for row in self.pending:
                step = int(row["round"])
                for column, value in row.items():
                    if column == "round" or isinstance(value, bool):
                        continue
                    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(
                        value
                    ):
                        tf.summary.scalar(tensorboard_tag(column), float(value), step=step)
                        self.events_written += 1
            self.writer.flush()
        self.pending = []
        self.check_written()

    def add_images(self, pngs: Mapping[str, str], step: int) -> None:
        """PNG files (tag -> path) as TensorBoard images at `step`; absent files are skipped."""
        with self.writer.as_default(), output_errors(self.output_dir):
            for tag, path in pngs.items():
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        image = tf.image.decode_png(f.read(), channels=3)
                    tf.summary.image(tag, image[None], step=step)
                    self.events_written += 1
            self.writer.flush()
        self.check_written()

    def check_written(self) -> None:
        """Raises `OSError` unless this writer's file holds every event written so far."""
        ours = [f for f in RunFolder(self.output_dir).event_files() if f not in self.earlier_files]
        found = count_records(ours[0]) if len(ours) == 1 else 0
        if found != self.events_written:
            where = ours[0] if len(ours) == 1 else os.path.join(self.output_dir, "events.out.*")
            raise OSError(
                errno.EIO,
                f"TensorBoard events were not all written ({found} of {self.events_written} in "
                "the file; is the disk full?)",
                where,
            )

    def close(self) -> None:
        with output_errors(self.output_dir):
            self.writer.close()


def count_records(path: str) -> int:
    """Whole TFRecords in `path` (length, its CRC, data, the data's CRC), counted up to the
    first record the file does not hold entirely."""
    with open(path, "rb") as f:
        data = f.read()
    count, offset = 0, 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 12 + length + 4
        if offset > len(data):
            break
        count += 1
    return count


@contextlib.contextmanager
def output_errors(output_dir: str) -> Iterator[None]:
    """TensorFlow's file errors as the `OSError` a failed write of ours raises, with its errno
    read from the message (so a full disk or a read-only folder is reported as such)."""
    try:
        yield
    except tf.errors.OpError as e:
        reasons = {
            "No space left": errno.ENOSPC,
            "Read-only file system": errno.EROFS,
            "Permission denied": errno.EACCES,
            "quota exceeded": errno.EDQUOT,
        }
        code = next((c for text, c in reasons.items() if text in e.message), errno.EIO)
        raise OSError(code, os.strerror(code), output_dir) from e


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: floats to 6 significant digits, anything else as it is."""
    return f"{value:.6g}" if isinstance(value, float) else value


# summary.json's `results[ACCURACY_UNDEFINED]`: why its `final_accuracy` is NaN (absent when
# it is a number).
ACCURACY_UNDEFINED = "accuracy_undefined_reason"
NO_ROUND_TRAINED = "no round was trained (the run stopped before round 1), so no model to score"
NO_ASSIGNED_CLIENT = (
    "no evaluated client had a cluster assignment in any evaluated round: the paper's figure "
    "scores assigned clients only, the algorithm assigns a client once it is sampled (IFCA: "
    "the cluster it picked in its last round), and none of the evaluated clients (the "
    "--eval_clients sample) has been sampled yet; all_clients_KIND scores every evaluated "
    "client with the cluster its algorithm's rule gives it"
)


def summarize(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Final and best test accuracy (FedGroup's Table III reports the max over rounds) of the
    paper's figure (`accuracy`: assigned clients), and the same for each model kind over all
    clients (`accuracy_KIND`), each with the round of its best; validation accuracies, said
    under `split`, when the rows scored validation examples (`--split=validation`).

    `final_accuracy` (and the paper's figure's other finals and bests) is always there: NaN,
    with the reason under `ACCURACY_UNDEFINED`, when no trained round scored an assigned client
    (`NO_ROUND_TRAINED`: the run trained no round, so round 0's scores of the untrained model
    are no result; `NO_ASSIGNED_CLIENT`). A model kind is reported once a trained round scored
    it."""
    results: dict[str, Any] = dict(paper_figure(history))
    splits = {r["split"] for r in history if r.get("split")}
    if splits:  # `--split=validation`: the figures are validation accuracies, not test ones
        results["split"] = ",".join(sorted(splits))
    kinds = [
        k[len("accuracy_") :] for k in (history[-1] if history else {}) if k.startswith("accuracy_")
    ]
    for kind in kinds:
        column = f"accuracy_{kind}"
        scored = [r for r in history if not math.isnan(r.get(column, math.nan))]
        if any(r["round"] > 0 for r in scored):
            best = max(scored, key=lambda r: r[column])
            results[f"all_clients_{kind}"] = dict(
                final_accuracy=scored[-1][column],
                final_client_accuracy_mean=scored[-1][f"client_accuracy_mean_{kind}"],
                max_accuracy=best[column],
                max_accuracy_round=best["round"],
            )
    # Seconds summed over rounds: training (the clients' local work in the federated round),
    # the algorithm's server-side work, evaluation, checkpoints, and whole rounds (training,
    # server work and evaluation). A history whose rows have no `train_seconds` has only whole
    # rounds: its training total is theirs.
    for part in ("train", "server", "eval", "checkpoint", "round"):
        results[f"total_{part}_seconds"] = sum(r.get(f"{part}_seconds", 0.0) for r in history)
    if not any("train_seconds" in r for r in history):
        results["total_train_seconds"] = results["total_round_seconds"]
    return results


def paper_figure(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`summarize`'s finals and bests of `accuracy` (the assigned evaluated clients), or NaN
    with the reason when no trained round has it."""
    evaluated = [r for r in history if not math.isnan(r.get("accuracy", math.nan))]
    if any(r["round"] > 0 for r in evaluated):
        best = max(evaluated, key=lambda r: r["accuracy"])
        last = evaluated[-1]
        return dict(
            final_round=last["round"],
            final_accuracy=last["accuracy"],
            final_loss=last["loss"],
            final_client_accuracy_mean=last["client_accuracy_mean"],
            max_accuracy=best["accuracy"],
            max_accuracy_round=best["round"],
        )
    trained = any(r["round"] > 0 for r in history)
    return {
        "final_round": None,
        "final_accuracy": math.nan,
        "final_loss": math.nan,
        "final_client_accuracy_mean": math.nan,
        "max_accuracy": math.nan,
        "max_accuracy_round": None,
        ACCURACY_UNDEFINED: NO_ASSIGNED_CLIENT if trained else NO_ROUND_TRAINED,
    }


def cluster_recovery(
    assignment: Mapping[str, int], planted: Optional[Mapping[str, int]]
) -> dict[str, Any]:
    """The clusters a run ended with (`cluster_sizes`, by cluster index, over the clients with
    an assignment) and, when the data has planted groups, how well they recover them: the
    adjusted Rand index of the assignment against the groups (1: the same partition up to
    renaming; about 0: no better than chance; one cluster for everyone scores 0)."""
    every = np.fromiter(assignment.values(), np.int64, len(assignment))
    clusters = every[every >= 0]
    sizes = np.bincount(clusters).tolist() if len(clusters) else []
    recovery: dict[str, Any] = {
        "cluster_sizes": sizes,
        "clusters_in_use": int(np.count_nonzero(sizes)),
    }
    if planted and len(clusters):
        from sklearn.metrics import adjusted_rand_score

        assigned = itertools.compress(assignment, every >= 0)
        groups = np.fromiter(map(int, map(planted.__getitem__, assigned)), np.int64, len(clusters))
        recovery.update(  # the pairs' order does not change the index
            planted_groups=len(np.unique(groups)),
            adjusted_rand_vs_planted=float(adjusted_rand_score(groups, clusters)),
        )
    return recovery


def write_summary_json(
    path: str,
    config: dict[str, Any],
    history: Sequence[dict[str, Any]],
    clusters: Optional[dict[str, Any]] = None,
    phases: Optional[dict[str, Any]] = None,
    privacy: Optional[dict[str, Any]] = None,
) -> dict:
    """`config`, and the results: `summarize(history)` and, if given, `cluster_recovery`'s
    figures under `clusters`; and, if given, where the run's time went
    (`phases.PhaseTimer.report`: seconds per phase, `unaccounted`, `wall`, `parts`) and a
    private run's account (`loop.accounting.PrivacyAccount.summary`)."""
    results = summarize(history)
    if clusters is not None:
        results["clusters"] = clusters
    summary = {"config": config, "results": results}
    if phases is not None:
        summary["phases"] = phases
    if privacy is not None:
        summary["privacy"] = privacy
    atomic_write_bytes(path, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    return summary


class Progress:
    """A progress bar with ETA on a terminal; silent when stderr is not a TTY."""

    def __init__(self, total: int, initial: int = 0, stream: Optional[Any] = None) -> None:
        self.stream = stream or sys.stderr
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="round", file=self.stream)

    def update(self, row: dict[str, Any]) -> None:
        if self.bar is None or row["round"] == 0:
            return
        if "accuracy" in row:
            self.bar.set_postfix(acc=f"{row['accuracy']:.3f}", loss=f"{row['loss']:.3f}")
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
