"""Bad input refused before any work, each with one line naming the problem and the fix: more
clusters than clients, a model too large for memory, an output folder that cannot be used."""

from __future__ import annotations

import errno
import os
import uuid

import numpy as np
import pytest
from conftest import run_binary, worker_pids_with_tag

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import RunInfo
from tff_clustered.cli import run_flags
from tff_clustered.models import model_spec
from tff_clustered.models.memory import declared_parameter_count, refuse_too_large


def test_ifca_refuses_more_clusters_than_clients() -> None:
    run = RunInfo(
        client_ids=("a", "b", "c"),
        train_sizes={"a": 5, "b": 5, "c": 5},
        seed=0,
        clients_per_round=3,
        layer_sizes=(2,),
        tensor_sizes=(6, 3),
        num_trainable_values=9,
        initial_model=np.zeros(9, np.float32),
    )

    class NoQueries:  # the refusal comes before any query
        pass

    with pytest.raises(ValueError, match="num_clusters=4 exceeds the 3 clients; lower"):
        make_algorithm("ifca", num_clusters=4).init(run, NoQueries())


def test_a_model_too_large_for_memory_is_refused_with_its_size() -> None:
    huge = model_spec("mlp", (64,), 10, hidden_units=2_000_000_000)
    assert declared_parameter_count(huge) == 64 * 2_000_000_000 + 2_000_000_000 * 11 + 10
    with pytest.raises(ValueError, match=r"has 150,000,000,010 parameters \(600 GB as float32\)"):
        refuse_too_large(huge, models_held=5)
    small = model_spec("mlp", (64,), 10, hidden_units=8)
    refuse_too_large(small, models_held=5)
    with pytest.raises(ValueError, match="about 1000 copies.*lower --hidden_units"):
        refuse_too_large(small, models_held=1000, available=4 * 600 * 999)


def test_a_failed_write_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        with run_flags.reported_errors(
            lambda: "the last checkpoint is kept, continue with --resume"
        ):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/x/metrics.csv")
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: /runs/x/metrics.csv: No space left on device; free space")
    assert "continue with --resume" in err
    with pytest.raises(FileNotFoundError):  # not the user's folder: a bug, shown as one
        with run_flags.reported_errors(lambda: "..."):
            raise FileNotFoundError(errno.ENOENT, "gone", "/somewhere")


def test_an_output_folder_inside_a_file_exits_2_with_one_line(tmp_path: object) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    done = run_binary(
        ["binaries/train.py", "--rounds=1", f"--output_dir={a_file / 'run'}"],
        {"TFF_CLUSTERED_RUN_TAG": "bad-output-folder"},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is a file, or inside one, not a folder; choose another --output_dir" in done.stderr
    assert "Traceback" not in done.stderr
    assert a_file.read_text() == "kept"


def test_tensorboard_events_that_did_not_reach_the_disk_are_an_error(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorFlow's writer drops some write errors: on a full disk it left a truncated events
    file and the run ended with exit 0. The file is read back after each flush."""
    import tensorflow as tf

    from tff_clustered.report import reporting
    from tff_clustered.run_folder import RunFolder

    folder = str(tmp_path / "run")
    os.makedirs(folder)
    log = reporting.TensorBoardLog(folder)
    log.add({"round": 1, "accuracy": 0.5, "loss": 1.0, "converged": True})
    log.flush()  # the file's version event and two scalars
    (events,) = RunFolder(folder).event_files()
    assert reporting.count_records(events) == 3
    with open(events, "r+b") as f:  # what a full disk left: the last record cut short
        f.truncate(os.path.getsize(events) - 5)
    with pytest.raises(OSError, match="TensorBoard events were not all written.*2 of 3") as e:
        log.check_written()
    assert e.value.errno in run_flags.OUTPUT_ERRNOS and e.value.filename == events

    def full_disk(*args: object, **kwargs: object) -> None:
        raise tf.errors.ResourceExhaustedError(None, None, f"{events}; No space left on device")

    monkeypatch.setattr(tf.summary, "scalar", full_disk)
    log.add({"round": 2, "accuracy": 0.6})
    with pytest.raises(OSError) as e:
        log.flush()
    assert e.value.errno == errno.ENOSPC and e.value.filename == folder


@pytest.mark.parametrize("signum, code, word", [(2, 130, "interrupted"), (15, 143, "terminated")])
def test_binaries_without_checkpoints_stop_on_a_signal_with_one_line(
    signum: int, code: int, word: str
) -> None:
    """doctor, benchmark, gpu_check and model_matrix run their work through `exits.run_main`."""
    script = (
        "import os, time\n"
        "from tff_clustered.cli import exits\n"
        "from tff_clustered.runtime import signals\n"
        "signals.stop_at_once_on_signals('probe.py')\n"
        "def main(argv):\n"
        f"    os.kill(os.getpid(), {signum})\n"
        "    time.sleep(30)\n"
        "    print('swallowed')\n"
        "exits.run_main('probe.py', main)\n"
    )
    done = run_binary(["-c", script])
    assert done.returncode == code, done.stderr
    assert done.stderr.strip() == f"probe.py: {word}" and "swallowed" not in done.stdout


def test_the_flagfiles_named_in_a_refusal_are_read_as_absl_reads_them() -> None:
    """A refused option names the flagfile that may have set it, given either way."""
    given = ["--flagfile=a.flags", "--rounds=2", "--flagfile", "b.flags", "-flagfile=c.flags"]
    assert run_flags.flagfiles_given(given) == ["a.flags", "b.flags", "c.flags"]
    assert run_flags.flagfiles_given(["--flagfile"]) == []


# An error raised after a signal's exception was absorbed: the worker lost, or TensorFlow's
# eager context left half made by the handler's exception (seen once in CI after a Ctrl-C:
# exit 1 with "Was eager Context initialized?").
ERROR_AFTER_A_SIGNAL = """
import os, signal, sys, time
from tff_clustered.cli import exits, run_flags
from tff_clustered.runtime import signals
from tff_clustered.runtime.context import WorkerLostError

ERRORS = {
    "worker": WorkerLostError("TFF worker localhost:1 stopped answering (StatusCode.UNAVAILABLE)."),
    "eager": TypeError("Expected `context` argument in EagerTensor constructor to have"),
    "value": ValueError("a value error that follows the signal"),
}
kind, signame = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
with run_flags.reported_errors(lambda: "the last checkpoint is kept, continue with --resume"):
    if signame is not None:
        try:
            os.kill(os.getpid(), getattr(signal, signame))
            time.sleep(5)
        except (KeyboardInterrupt, signals.Terminated):
            pass  # absorbed, as a gRPC call in flight can absorb a handler's exception
    raise ERRORS[kind]
"""


@pytest.mark.parametrize("kind", ["worker", "eager", "value"])
@pytest.mark.parametrize(
    "signame, code, said", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")]
)
def test_an_error_after_a_signal_reports_the_signal(
    kind: str, signame: str, code: int, said: str
) -> None:
    """The runtime's SIGTERM handler stops the worker; a call in flight then fails with
    UNAVAILABLE (seen once in CI: exit 3 and "restart the worker" after a SIGTERM), or the
    handler's exception leaves TensorFlow half initialized. The user stopped the run: the
    signal's line and exit code, not the error that followed."""
    stopped = run_binary(["-c", ERROR_AFTER_A_SIGNAL, kind, signame])
    assert stopped.returncode == code, stopped.stderr[-2000:]
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"{said}; the last checkpoint is kept, continue with --resume"
    )
    assert "error:" not in stopped.stderr and "Traceback" not in stopped.stderr


def test_an_error_without_a_signal_is_reported_as_itself() -> None:
    lost = run_binary(["-c", ERROR_AFTER_A_SIGNAL, "worker"])
    assert lost.returncode == 3 and "error: TFF worker localhost:1 stopped answering" in lost.stderr
    bug = run_binary(["-c", ERROR_AFTER_A_SIGNAL, "eager"])
    assert bug.returncode == 1 and "TypeError: Expected `context`" in bug.stderr


# A SIGHUP whose exception Python swallows (raised inside a garbage-collection callback) while
# a TFF runtime runs, and the work going on to a computation.
SIGNAL_SWALLOWED_IN_A_RUNTIME = """
import gc, os, signal
from tff_clustered.cli import exits
from tff_clustered.runtime import signals
signals.stop_at_once_on_signals("probe.py")
import tensorflow as tf
from tff_clustered.frameworks import tff
from tff_clustered.runtime.context import tff_runtime

def main(argv):
    one = tff.tensorflow.computation(lambda: tf.constant(1))
    with tff_runtime():
        one()
        def collected(phase, info):
            if phase == "start":
                gc.callbacks.remove(collected)
                os.kill(os.getpid(), signal.SIGHUP)
        gc.callbacks.append(collected)
        gc.collect()
        one()
    print("finished")
exits.run_main("probe.py", main)
"""


def test_a_signal_swallowed_where_python_ignores_exceptions_still_stops_with_its_line() -> None:
    """A signal's exception raised inside a garbage-collection callback is ignored by Python
    ("Exception ignored in ..."): the work must still end with the signal's line and code,
    not exit 0 as if nothing had arrived, print no traceback, and the computation after it
    must not start a worker of TFF's own that nothing stops (issue 64: one outlived its run)."""
    tag = uuid.uuid4().hex
    done = run_binary(
        ["-c", SIGNAL_SWALLOWED_IN_A_RUNTIME], {"TFF_CLUSTERED_RUN_TAG": tag}, timeout=120
    )
    assert done.returncode == 129, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "probe.py: hung up", done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr
    assert "finished" not in done.stdout
    assert worker_pids_with_tag(tag) == [], "a TFF worker outlived its run"
