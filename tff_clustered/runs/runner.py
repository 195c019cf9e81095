"""One complete run with its outputs and checkpoints; what `binaries/train.py` calls."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional, Union

import numpy as np

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import Algorithm
from tff_clustered.data import load_dataset
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.data.fingerprint import SourceFingerprint
from tff_clustered.data.registry import source_fingerprint
from tff_clustered.loop import accounting
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment, RoundMetric
from tff_clustered.loop.phases import PhaseTimer, phases_line
from tff_clustered.loop.state import RunState
from tff_clustered.models.keras_models import ModelSpec
from tff_clustered.models.memory import refuse_too_large
from tff_clustered.report import figures, reporting
from tff_clustered.run_folder import RunFolder
from tff_clustered.runs import checkpoint
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runtime import signals

# Copies of the model a round holds beside the cluster models: a client's model, its gradient
# and its update, and the per-cluster sums.
WORKING_COPIES = 4


def build_experiment(
    data: FederatedData,
    model: ModelSpec,
    algorithm: Algorithm,
    training: TrainingConfig,
    execution: RunExecution,
    round_metrics: Sequence[RoundMetric] = (),
) -> Experiment:
    """The `Experiment` of a run, for the binaries and the Python API alike, timed as the
    `building` phase: refused first when the model and its working copies would not fit in
    memory. `execution`: how its rounds run and where its clients' models live (not what they
    compute); its timer also gets the experiment's cold start and tracing."""
    with execution.timer.phase("building"):
        refuse_too_large(model, getattr(algorithm, "num_clusters", 1) + WORKING_COPIES)
        return Experiment(
            data,
            model,
            algorithm,
            training,
            round_metrics=round_metrics,
            execution=execution,
        )


def spec_experiment(
    spec: RunSpec,
    execution: Optional[RunExecution] = None,
    round_metrics: Sequence[RoundMetric] = (),
) -> Experiment:
    """The `Experiment` of `spec` (`build_experiment`), its data loaded (timed as `loading`)
    and its model and algorithm made (`building`). `execution` (default: one local TFF
    worker, a timer of its own, the client store chosen by the population's size)."""
    execution = RunExecution() if execution is None else execution
    with execution.timer.phase("loading"):
        data = load_dataset(spec.data, seed=spec.training.seed)
    with execution.timer.phase("building"):
        model = spec.model_choice.spec_for(data)
        algorithm = make_algorithm(spec.algorithm, spec.algorithm_options)
    return build_experiment(data, model, algorithm, spec.training, execution, round_metrics)


class Resumed(NamedTuple):
    """A run folder's checkpoint as a resume reads it before anything starts (`resumed`)."""

    state: Optional[RunState]  # None: the folder holds no checkpoint
    # The files the run's data is read from, as they are now (None: no checkpoint to check
    # them against; the run fingerprints them once it has loaded its data).
    data_source: Optional[SourceFingerprint]
    spec: RunSpec  # the run resumed: `checkpointed_spec`


def resumed(spec: RunSpec, output_dir: str, log: Callable[[str], None] = print) -> Resumed:
    """The checkpoint in `output_dir`, read and checked against the settings and data files of
    `spec` as it resumes it (`checkpointed_spec`; `checkpoint.load`, which refuses it with a
    `CheckpointError`): before a TFF worker starts and writes its log in the folder, which a
    refused resume leaves as it found it."""
    spec = checkpointed_spec(spec, output_dir, log)
    source = source_fingerprint(spec.data) if checkpoint.exists(output_dir) else None
    state = checkpoint.load(RunFolder(output_dir).checkpoint, spec.settings(), source, log)
    return Resumed(state, source, spec)


def checkpointed_spec(spec: RunSpec, output_dir: str, log: Callable[[str], None]) -> RunSpec:
    """`spec` with the algorithm options its checkpoint in `output_dir` ran with where their
    default changed since (`checkpoint.options_as_checkpointed`)."""
    path = RunFolder(output_dir).checkpoint
    options = checkpoint.options_as_checkpointed(path, spec.algorithm_options, log)
    if options is spec.algorithm_options:
        return spec
    return dataclasses.replace(spec, algorithm_options=options)


def run(
    spec: RunSpec,
    output_dir: str,
    execution: Optional[RunExecution] = None,
    checkpoint_every: int = 5,
    resume: Union[bool, Resumed] = False,
    log: Callable[[str], None] = print,
    round_metrics: Sequence[RoundMetric] = (),
    overwrite: bool = False,
) -> dict[str, Any]:
    """Runs (or resumes) `spec`, writing metrics.csv, clients.csv, TensorBoard events,
    summary.json, curves.png, checkpoints. `execution`: how rounds run and where the clients'
    models live (default: one local TFF worker, a timer started now; a disk store's file goes
    in `output_dir`); a run may resume under another execution or store. `resume`: True, or
    the checkpoint as `resumed` read it already (either resumes the spec its checkpoint ran:
    `checkpointed_spec`). `overwrite`: see `run_experiment`.

    Returns the summary, with the per-round rows under `history`."""
    execution = (RunExecution() if execution is None else execution).in_folder(output_dir)
    read = resume if isinstance(resume, Resumed) else None
    if read is not None:
        spec = read.spec
    elif resume:
        spec = checkpointed_spec(spec, output_dir, log)

    def data_source() -> SourceFingerprint:
        if read is not None and read.data_source is not None:
            return read.data_source
        return source_fingerprint(spec.data)

    summary, _ = run_experiment(
        lambda: spec_experiment(spec, execution, round_metrics),
        spec.settings(),
        output_dir,
        execution.timer,
        checkpoint_every,
        read is not None or resume is True,
        log,
        data_source=data_source,
        read_checkpoint=None if read is None else (lambda: read.state),
        overwrite=overwrite,
    )
    return summary


def run_experiment(
    build: Callable[[], Experiment],
    settings: dict[str, Any],
    output_dir: str,
    timer: PhaseTimer,
    checkpoint_every: int = 5,
    resume: bool = False,
    log: Callable[[str], None] = print,
    data_source: Callable[[], SourceFingerprint] = SourceFingerprint,
    read_checkpoint: Optional[Callable[[], Optional[RunState]]] = None,
    overwrite: bool = False,
) -> tuple[dict[str, Any], Experiment]:
    """Runs (or resumes) the experiment `build()` makes, with `run`'s outputs and checkpoints,
    holding `output_dir`. `settings` define its results: a checkpoint made under other settings
    is refused. `data_source` fingerprints the files its data is read from (default: no
    files, data the settings define): a checkpoint made on other data is refused too. Returns
    the summary (with `history`) and the finished experiment.

    `timer` (the run's execution's: `RunExecution.timer`) times this session's phases, written
    to summary.json as `phases` and logged as one line at the end; `build` times its loading
    and building with it, and its `Experiment` the cold start and tracing. On a resume the
    phases are this session's: the rounds done before it are not counted again.

    `read_checkpoint` (on a resume): the checkpoint in `output_dir` as the caller has read it
    with `checkpoint.load` for these settings and this data (default: read it here).

    A folder holding a run's outputs (`RunFolder.run_outputs`) is never written over unless
    `resume` (continue it) or `overwrite` (delete its outputs, then start a new run) says so
    (`checkpoint.refuse_overwriting`)."""
    if checkpoint_every < 0:
        raise ValueError("checkpoint_every must be >= 0 (0 = only at the end)")
    with checkpoint.hold_run_folder(output_dir):
        return _run_in_folder(
            build,
            settings,
            output_dir,
            checkpoint_every,
            resume,
            log,
            data_source,
            timer,
            read_checkpoint,
            overwrite,
        )


def _run_in_folder(
    build: Callable[[], Experiment],
    settings: dict[str, Any],
    output_dir: str,
    checkpoint_every: int,
    resume: bool,
    log: Callable[[str], None],
    data_source: Callable[[], SourceFingerprint],
    timer: PhaseTimer,
    read_checkpoint: Optional[Callable[[], Optional[RunState]]],
    overwrite: bool,
) -> tuple[dict[str, Any], Experiment]:
    """`run_experiment`, once the output folder is held."""
    folder = RunFolder(output_dir)
    checkpoint.refuse_overwriting(output_dir, resume, overwrite)
    if overwrite:
        folder.remove_run()
    experiment, saved, source = _started(
        build, settings, folder, resume, log, data_source, timer, read_checkpoint
    )
    rounds = experiment.config.rounds
    if saved is not None:
        _say_lost_client_rows(experiment.state.history, folder, log)
    with timer.phase("outputs"):
        clients_csv = reporting.ClientsCsv(
            folder.clients_csv,
            keep_through_round=experiment.state.round_num if saved is not None else None,
        )
        tensorboard = reporting.TensorBoardLog(output_dir)
        progress = reporting.Progress(rounds, initial=experiment.state.round_num)
    try:
        checkpointed = saved.round_num if saved is not None else None
        for row in _rounds_written(experiment, folder, timer, clients_csv, tensorboard, progress):
            done = row["round"]
            last = done == rounds or experiment.stopped_at_target  # at --target_epsilon
            if done and ((checkpoint_every and done % checkpoint_every == 0) or last):
                with timer.phase("checkpoints") as saving:
                    checkpoint.save(folder.checkpoint, experiment.snapshot(), settings, source)
                    tensorboard.flush()
                row["checkpoint_seconds"] = saving.seconds
                checkpointed = done
        if checkpointed != experiment.state.round_num:
            # Stopped before the round that writes one (--target_epsilon before round 1): the
            # folder still holds a checkpoint of where it ended, which --resume continues.
            with timer.phase("checkpoints"):
                checkpoint.save(folder.checkpoint, experiment.snapshot(), settings, source)
                tensorboard.flush()
        if experiment.stopped_at_target:
            log(
                f"stopped after round {experiment.state.round_num}/{rounds}: the next round would "
                f"take a client's epsilon past --target_epsilon={experiment.account.target_epsilon}"
            )
        summary = _summary_written(experiment, settings, folder, tensorboard, timer, log)
    finally:
        progress.close()
        tensorboard.close()
    return dict(summary, history=experiment.state.history), experiment


def _started(
    build: Callable[[], Experiment],
    settings: dict[str, Any],
    folder: RunFolder,
    resume: bool,
    log: Callable[[str], None],
    data_source: Callable[[], SourceFingerprint],
    timer: PhaseTimer,
    read_checkpoint: Optional[Callable[[], Optional[RunState]]],
) -> tuple[Experiment, Optional[RunState], SourceFingerprint]:
    """The experiment `build()` makes, restored from the folder's checkpoint (returned too)
    or started (its labels picture written), and its data's fingerprint. A checkpoint is
    checked against the settings and the data's files before the data is loaded; a new run
    fingerprints its data once `build` has loaded (and so checked) it."""
    resuming = resume and checkpoint.exists(folder.path)
    source, saved = None, None
    if resuming:
        with timer.phase("validation"):
            source = data_source()
    if resume:
        with timer.phase("checkpoints"):
            if read_checkpoint is None:
                saved = checkpoint.load(folder.checkpoint, settings, source, log)
            else:
                saved = read_checkpoint()
    experiment = build()
    for option, (value, why) in experiment.algorithm.run_choices(experiment.run).items():
        log(f"{experiment.algorithm.name}: --{option}={value}: {why}")
    if source is None:
        with timer.phase("validation"):
            source = data_source()
    if saved is not None:
        with timer.phase("checkpoints"):
            experiment.restore(saved)
        log(f"resuming {folder.path} after round {saved.round_num}/{experiment.config.rounds}")
        warning = experiment.aggregator.resume_warning()  # what the checkpoint cannot repeat
        if warning:
            log(warning)
        return experiment, saved, source
    if resume:
        log(f"no checkpoint in {folder.path}; starting the run from round 0")
    experiment.start()
    with timer.phase("outputs"):
        shown = experiment.data.client_ids[: figures.MAX_CLIENTS_SHOWN]
        figures.write_labels_png(
            folder.labels_png,
            label_counts(experiment.data, shown),
            experiment.data.client_ids,
            f"labels per client: {experiment.data.name}",
        )
    return experiment, None, source


def _say_lost_client_rows(
    history: Sequence[dict[str, Any]], folder: RunFolder, log: Callable[[str], None]
) -> None:
    """A resumed run whose clients.csv is gone says which rounds' rows are lost (it goes on,
    writing the rows of the rounds it evaluates from now)."""
    evaluated = [r["round"] for r in history if "accuracy" in r]
    if evaluated and not os.path.exists(folder.clients_csv):
        log(
            f"{folder.clients_csv} is missing: its rows of the rounds evaluated before the "
            f"checkpoint ({evaluated[0]} to {evaluated[-1]}) are lost; the run goes on and "
            "writes the rows of the rounds it evaluates from now (restore the file from a copy "
            "first to keep them)"
        )


def _rounds_written(
    experiment: Experiment,
    folder: RunFolder,
    timer: PhaseTimer,
    clients_csv: reporting.ClientsCsv,
    tensorboard: reporting.TensorBoardLog,
    progress: reporting.Progress,
) -> Iterator[dict[str, Any]]:
    """The experiment's remaining rounds, each row once its files are written (metrics.csv,
    clients.csv on an evaluated round, TensorBoard, the progress bar) and its seconds counted
    (`count_round`); the caller may still set its `checkpoint_seconds`."""
    for row, step in timer.timed("rounds", experiment.rounds()):
        signals.reraise_received_signal()  # one swallowed where Python ignores exceptions
        count_round(timer, row, step.seconds)
        row["checkpoint_seconds"] = 0.0  # set by the caller on a round that writes a checkpoint
        with timer.phase("outputs"):
            reporting.write_metrics_csv(folder.metrics_csv, experiment.state.history)
            if "accuracy" in row:
                clients_csv.append(experiment.client_rows)
            tensorboard.add(row)
            progress.update(row)
        yield row


def _summary_written(
    experiment: Experiment,
    settings: dict[str, Any],
    folder: RunFolder,
    tensorboard: reporting.TensorBoardLog,
    timer: PhaseTimer,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """A finished run's outputs (`write_outputs`), then summary.json with the session's
    phases, which are logged as one line. Returns the summary."""
    with timer.phase("outputs"):
        config, clusters = write_outputs(experiment, settings, folder.path, tensorboard)
    phases = timer.report()
    summary = reporting.write_summary_json(
        folder.summary_json,
        config,
        experiment.state.history,
        clusters,
        phases,
        accounting.privacy_summary(
            experiment.account,
            experiment.state,
            experiment.stopped_at_target,
            experiment.algorithm.releases,
        ),
    )
    log(phases_line(phases))
    if "privacy" in summary:
        log(accounting.privacy_line(summary["privacy"]))
    return summary


def count_round(timer: PhaseTimer, row: dict[str, Any], step_seconds: float) -> None:
    """Splits a step of the rounds (`step_seconds`, timed as `rounds`) by its row's own
    seconds: its evaluation goes to `evaluation` (all of round 0's step: a fresh run's first
    evaluation), its training and server work are the `rounds` phase's parts."""
    if row["round"] == 0:
        timer.move("rounds", "evaluation", step_seconds)
        return
    timer.move("rounds", "evaluation", row["eval_seconds"])
    timer.add("training", row["train_seconds"])
    timer.add("server", row["server_seconds"])


def write_outputs(
    experiment: Experiment,
    settings: dict[str, Any],
    output_dir: str,
    tensorboard: reporting.TensorBoardLog,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The outputs of a finished run but summary.json, which is written last with the time
    these took: metrics.csv, the pictures, TensorBoard's images. Returns summary.json's
    config and cluster figures."""
    history = experiment.state.history
    folder = RunFolder(output_dir)
    reporting.write_metrics_csv(folder.metrics_csv, history)
    config = dict(
        settings,
        algorithm_details=experiment.algorithm.describe(),
        algorithm_choices={
            option: value
            for option, (value, _) in experiment.algorithm.run_choices(experiment.run).items()
        },
        num_clients=experiment.data.num_clients,
        # How clients weigh in their cluster's mean: the algorithm's, or uniform under a
        # private aggregator (its sensitivity bound needs every client to count once).
        client_weighting=experiment.client_weighting,
    )
    clusters = reporting.cluster_recovery(
        experiment.state.assignment, experiment.data.true_clusters
    )
    title = f"{experiment.algorithm.name} on {experiment.data.name} ({experiment.model.name})"
    figures.write_curves_png(folder.curves_png, history, title)
    figures.write_membership_png(
        folder.membership_png,
        folder.clients_csv,
        f"cluster membership: {title}",
        experiment.data.true_clusters,
    )
    figures.write_cluster_accuracy_png(
        folder.cluster_accuracy_png,
        history,
        f"accuracy per cluster: {title}",
    )
    figures.write_hopkins_png(folder.hopkins_png, history, f"re-clustering: {title}")
    if experiment.state.similarity is not None:
        figures.write_similarity_png(
            folder.similarity_png, experiment.state.similarity, f"clustering similarity: {title}"
        )
    tensorboard.add_images(
        {
            "membership": folder.membership_png,
            "similarity": folder.similarity_png,
            "labels": folder.labels_png,
        },
        step=experiment.state.round_num,
    )
    return config, clusters


def label_counts(data: FederatedData, client_ids: Sequence[str]) -> np.ndarray:
    """Training examples per class at each of `client_ids`, (clients, classes): only those
    clients' examples are read (`FederatedData.arrays_of`, lazily for a lazy source)."""
    counts = np.zeros((len(client_ids), data.num_classes), np.int64)
    for i, arrays in enumerate(data.arrays_of("train", client_ids)):
        labels = np.asarray(arrays["y"]).astype(np.int64).ravel()
        counts[i] = np.bincount(labels, minlength=data.num_classes)[: data.num_classes]
    return counts
