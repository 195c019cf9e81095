"""Runs every algorithm for one round with every model that fits its data, on tiny data.

  python binaries/model_matrix.py                       # all algorithms x models, in process
  python binaries/model_matrix.py --executions=tff,in_process --models=cnn,lenet
  make model-matrix

Image models (mclr, mlp, cnn, tsdp_cnn, lenet, resnet18 at width 4) train on the tiny MNIST
fixture (`testdata/mnist_idx_tiny`, 28x28, 4 clients); the lstm on the tiny Sent140 fixture
(3 writers); the char_lstm on the tiny TFF Shakespeare fixture (3 speaking parts). Each cell
is one round of every client (decentralized algorithms: 2 neighbours; FedAC: 2 clusters) from
a fresh experiment; it prints ok with the round's accuracy, `refused` with the reason when a
pair cannot work (refused before any training, as train.py would), or FAIL with the error.
Exit code 1 if any cell fails. A whole matrix takes tens of minutes on 2 cores (resnet18 is the
slowest), so the test suite runs only slices of it (tests/test_functional_models.py: every layer
kind and model path; tests/test_model_matrix.py: the pairs that failed once); run this after
changing a model, the functional interpreter or an algorithm's client work.
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
import time
import traceback

from absl import app, flags

from tff_clustered.algorithms import ALGORITHMS, make_options
from tff_clustered.algorithms.dfl import Decentralized
from tff_clustered.cli import exits, logs
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.data.spec import DataSpec
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.models import MODEL_NAMES
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runs.runner import spec_experiment
from tff_clustered.runtime.context import RuntimeConfig, tff_runtime

TESTDATA = os.path.join(REPOSITORY, "testdata")
FLAGS = flags.FLAGS
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
flags.DEFINE_list("algorithms", sorted(ALGORITHMS), "Algorithms to run (default: all).")
flags.DEFINE_list("models", list(MODEL_NAMES), "Models to run (default: all).")
flags.DEFINE_list("executions", ["in_process"], "Executions: in_process, tff or both.")
flags.DEFINE_list(
    "pairs",
    [],
    "ALGORITHM:MODEL cells to run instead of --algorithms x --models, e.g. uapdfl:cnn,fedac:mclr.",
)


def cell_spec(algorithm: str, model: str) -> RunSpec:
    """One round of `algorithm` with `model` on the tiny fixture its inputs fit."""
    options = {}
    if issubclass(ALGORITHMS[algorithm], Decentralized):
        options["num_neighbours"] = 2
    if algorithm == "fedac":
        options["num_clusters"] = 2
    clients = 4
    if model == "lstm":
        clients = 3  # the fixture's writers
        data = dict(
            dataset="sent140",
            data_dir=os.path.join(TESTDATA, "sent140_tiny"),
            glove_path=os.path.join(TESTDATA, "sent140_tiny", "glove_tiny.300d.txt"),
        )
    elif model == "char_lstm":
        clients = 3  # the fixture's parts with an example in both splits
        data = dict(
            dataset="tff_shakespeare", data_dir=os.path.join(TESTDATA, "tff_shakespeare_tiny")
        )
    else:
        data = dict(dataset="fashion_mnist", data_dir=os.path.join(TESTDATA, "mnist_idx_tiny"))
    return RunSpec(
        algorithm=algorithm,
        # the LEAF fixture has its own clients (a count is refused there)
        data=DataSpec(num_clients=None if model == "lstm" else clients, **data),
        model_choice=ModelChoice(model, hidden_units=8, cnn_dense_units=8, resnet_width=4),
        algorithm_options=make_options(algorithm, **options),
        training=TrainingConfig(
            rounds=1, clients_per_round=clients, local_epochs=1, learning_rate=0.01, seed=0
        ),
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.pairs:
        cells = [tuple(pair.partition(":")[::2]) for pair in FLAGS.pairs]
    else:
        cells = [(a, m) for m in FLAGS.models for a in FLAGS.algorithms]
    unknown = sorted({a for a, _ in cells if a not in ALGORITHMS})
    unknown += sorted({m for _, m in cells if m not in MODEL_NAMES})
    unknown += [e for e in FLAGS.executions if e not in ("tff", "in_process")]
    if unknown:
        print(f"error: unknown {', '.join(unknown)}; see --helpfull", file=sys.stderr)
        raise SystemExit(2)
    print(f"command: {shlex.join(['python', *sys.argv])}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}", flush=True)
    outcomes = []
    for execution in FLAGS.executions:
        with tff_runtime(RuntimeConfig(execution=execution)):
            for algorithm, model in cells:
                started = time.perf_counter()
                outcome, detail = run_cell(algorithm, model, execution)
                outcomes.append(outcome)
                seconds = time.perf_counter() - started
                print(
                    f"{execution:10s} {model:9s} {algorithm:18s} {seconds:6.1f}s  "
                    f"{outcome:8s} {detail}"
                )
                sys.stdout.flush()
    failed, refused = outcomes.count("FAIL"), outcomes.count("refused")
    print(f"{failed} cell(s) failed, {refused} refused with a reason (a pair that cannot work)")
    raise SystemExit(1 if failed else 0)


def run_cell(algorithm: str, model: str, execution: str) -> tuple[str, str]:
    """("ok", accuracy), ("refused", why: a pair that cannot work, refused before any
    training as train.py would) or ("FAIL", the error)."""
    try:
        experiment = spec_experiment(cell_spec(algorithm, model), RunExecution.of(execution))
        experiment.start()
    except ValueError as e:
        return "refused", str(e).splitlines()[0][:200]
    try:
        list(experiment.rounds())
    except Exception as e:  # noqa: BLE001 - every failure is a cell's result
        if FLAGS[logs.FLAG].value:
            traceback.print_exc()
        return "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return "ok", f"accuracy {experiment.state.history[-1]['accuracy']:.3f}"


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    exits.run_main("model_matrix.py", main)
