"""A run on TFF's runtime gives TFF's execution context back as it found it: plain TFF code works
before, between and after runs in one process, on success, on error and on Ctrl-C, and nothing
the run built (executors, finalizers) talks to its stopped worker afterwards."""

from __future__ import annotations

import uuid

import pytest
from conftest import run_binary, worker_pids_with_tag

# One user's notebook, as one process: plain TFF, a run on TFF's runtime, plain TFF again, a
# second run, an in-process run, plain TFF. Each run is one round (the case that printed
# `Exception ignored in: <finalize object>` at exit).
NOTEBOOK = """
import tempfile
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tff_clustered

rng = np.random.default_rng(0)
clients = {
    f"c{i}": (rng.normal(size=(20, 4)).astype("float32"), rng.integers(0, 3, 20))
    for i in range(4)
}

def model_fn():
    return tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3)])

@tff.tensorflow.computation(tf.int32)
def add_one(x):
    return x + 1

def plain_tff(step):
    print(step, "plain TFF:", add_one(41))

def run(step, execution):
    result = tff_clustered.run(
        "fedavg", train=clients, model_fn=model_fn, output_dir=tempfile.mkdtemp(),
        training=tff_clustered.TrainingConfig(rounds=1, clients_per_round=2),
        execution=execution, log=lambda line: None,
    )
    print(step, "run:", len(result.history), "rows")

plain_tff(1)
run(2, "tff")
plain_tff(3)
run(4, "tff")
run(5, "in_process")
plain_tff(6)
"""


def test_plain_tff_works_before_between_and_after_runs_in_one_process() -> None:
    tag = uuid.uuid4().hex
    done = run_binary(["-c", NOTEBOOK], {"TFF_CLUSTERED_RUN_TAG": tag})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for step in (1, 3, 6):
        assert f"{step} plain TFF: 42" in lines, done.stdout + done.stderr[-3000:]
    for step in (2, 4, 5):
        assert f"{step} run: 2 rows" in lines, done.stdout
    for leftover in ("Exception ignored", "Traceback", "WorkerLostError"):
        assert leftover not in done.stderr, done.stderr[-3000:]
    assert worker_pids_with_tag(tag) == []


@pytest.mark.parametrize("stopped_by", [RuntimeError, KeyboardInterrupt])
def test_a_runtime_stopped_by_an_error_or_ctrl_c_restores_tffs_context(
    stopped_by: type,
) -> None:
    from tff_clustered.runtime.context import _default_context, tff_runtime

    before = _default_context()
    with pytest.raises(stopped_by), tff_runtime() as runtime:
        assert _default_context() is not before
        assert runtime.worker_pid is not None
        raise stopped_by()
    assert _default_context() is before
    assert runtime.worker_pid is None


def test_a_computation_under_a_stopped_runtimes_context_names_it() -> None:
    """A context kept from a stopped runtime (a user who held on to it) sends nothing to the
    stopped worker: its call names the stopped runtime instead of a lost worker."""
    import tensorflow as tf
    import tensorflow_federated as tff

    from tff_clustered.runtime.context import tff_runtime, worker_contexts

    @tff.tensorflow.computation(tf.int32)
    def add_one(x: object) -> object:
        return x + 1

    stack = tff.framework.get_context_stack()
    with tff_runtime():
        kept = worker_contexts()[0][1]
        with stack.install(kept):
            assert add_one(1) == 2
    with pytest.raises(RuntimeError, match="was stopped"), stack.install(kept):
        add_one(1)
