"""Checks the environment a run needs and prints each problem with its fix.

  python binaries/doctor.py [--data_dir=DIR] [--glove_path=FILE] [--tfds_dir=DIR]
  make doctor ARGS="--data_dir=/data/cifar"

It prints the Python, TensorFlow, TFF and NumPy versions against the tested lock; starts TFF's
worker, runs a computation on it and checks that it stopped; says whether TensorFlow sees a GPU;
and says which datasets the given data folders can serve. Exit code 0 when nothing is wrong,
1 otherwise. The first thing to run when a setup goes wrong.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import app, flags

from tff_clustered.cli import exits, logs
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.data.medmnist import pathmnist_path
from tff_clustered.data.mnist import FASHION_MNIST, MNIST
from tff_clustered.data.mnist_writers import WRITERS_FILE
from tff_clustered.runtime.context import tff_runtime, worker_binary_path

FLAGS = flags.FLAGS
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
flags.DEFINE_string("data_dir", None, "A data folder to check (as given to train.py).")
flags.DEFINE_string("glove_path", None, "A GloVe file to check (Sent140).")
flags.DEFINE_string("tfds_dir", None, "A TensorFlow Datasets folder to check.")

LOCK = os.path.join(REPOSITORY, "requirements", "lock.txt")
REINSTALL = "rebuild the environment from the lock: `make clean-env && make test`"


@dataclasses.dataclass
class Report:
    problems: int = 0

    def ok(self, what: str, detail: str) -> None:
        print(f"  ok       {what}: {detail}")

    def note(self, what: str, detail: str) -> None:
        print(f"  note     {what}: {detail}")

    def problem(self, what: str, detail: str, fix: str) -> None:
        self.problems += 1
        print(f"  PROBLEM  {what}: {detail}\n           fix: {fix}")


def locked_versions() -> dict[str, str]:
    versions = {}
    with open(LOCK) as f:
        for line in f:
            name, sep, version = line.split(";")[0].strip().partition("==")
            if sep:
                versions[name.lower()] = version
    return versions


def check_versions(report: Report) -> None:
    print("versions")
    python = platform.python_version()
    if (3, 9) <= sys.version_info[:2] <= (3, 11):
        report.ok("Python", python)
    else:
        report.problem(
            "Python",
            f"{python} (TFF 0.87 needs 3.9-3.11)",
            "install Python 3.11, then " + REINSTALL,
        )
    locked = locked_versions()
    found = {
        "tensorflow": tf.__version__,
        "tensorflow-federated": tff.__version__,
        "numpy": np.__version__,
    }
    expected = {**locked, "tensorflow-federated": "0.87.0"}
    for name, version in found.items():
        want = expected.get(name)
        if want is None or version == want:
            report.ok(name, version)
        else:
            report.problem(name, f"{version}, the tested lock has {want}", REINSTALL)


def check_worker(report: Report) -> None:
    print("TFF worker")
    try:
        path = worker_binary_path()
    except RuntimeError as e:
        report.problem("worker_binary", str(e), REINSTALL)
        return
    report.ok("worker_binary", path)

    @tff.tensorflow.computation(tff.TensorType(np.int32))
    def add_one(x: tf.Tensor) -> tf.Tensor:
        return x + 1

    started = time.perf_counter()
    try:
        with tff_runtime() as runtime:
            pid = runtime.worker_pid
            answer = int(add_one(41))
            seconds = time.perf_counter() - started
    except Exception as e:  # noqa: BLE001 - any failure here is the report
        report.problem(
            "worker start",
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            "check the worker's log (tff_worker_*.log) and that localhost ports can be opened; "
            + REINSTALL,
        )
        return
    if answer != 42:
        report.problem("worker", f"computed {answer} for 41 + 1", REINSTALL)
        return
    report.ok("worker start", f"ran a computation in {seconds:.1f} s")
    if pid is not None and os.path.exists(f"/proc/{pid}") and not zombie(pid):
        report.problem("worker stop", f"pid {pid} still runs", f"kill it (`kill {pid}`)")
    else:
        report.ok("worker stop", "stopped with its context")


def zombie(pid: int) -> bool:
    """Whether `pid` has exited and only waits to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def check_gpu(report: Report) -> None:
    print("GPU")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        report.ok("TensorFlow GPUs", ", ".join(g.name for g in gpus))
    else:
        report.note(
            "TensorFlow GPUs",
            "none visible: local training runs on the CPU (the pip TFF worker is CPU-only in "
            "any case). For a GPU, install TensorFlow's CUDA build in .venv "
            "(`pip install tensorflow[and-cuda]==" + tf.__version__ + "`) on a machine with "
            "an NVIDIA driver",
        )


def mnist_files(folder: str) -> bool:
    """MNIST's (or Fashion-MNIST's: the same names) IDX files, or a Keras-style .npz of either."""
    names = (*MNIST.npz_names, *FASHION_MNIST.npz_names)
    return bool(glob.glob(os.path.join(folder, "train-images-idx3-ubyte*"))) or any(
        os.path.isfile(os.path.join(folder, name)) for name in names
    )


DATASETS: dict[str, Callable[[str], bool]] = {
    "mnist / mnist_partitioned / fashion_mnist (IDX or npz)": mnist_files,
    "mnist_writers (MNIST files and writers.npz)": lambda d: (
        mnist_files(d) and os.path.isfile(os.path.join(d, WRITERS_FILE))
    ),
    "leaf / femnist / sent140 (train/ and test/ JSON)": lambda d: bool(
        glob.glob(os.path.join(d, "train", "*.json"))
        and glob.glob(os.path.join(d, "test", "*.json"))
    ),
    "cifar10": lambda d: os.path.isdir(os.path.join(d, "cifar-10-batches-py")),
    "cifar100": lambda d: os.path.isdir(os.path.join(d, "cifar-100-python")),
    "svhn": lambda d: (
        os.path.isfile(os.path.join(d, "train_32x32.mat"))
        and os.path.isfile(os.path.join(d, "test_32x32.mat"))
    ),
    "pathmnist": lambda d: os.path.isfile(pathmnist_path(d)),
}


def check_data(report: Report) -> None:
    print("data")
    report.ok("embedded", "digits, digits_* and synthetic need no files")
    if FLAGS.data_dir:
        folder = os.path.abspath(FLAGS.data_dir)
        if not os.path.isdir(folder):
            report.problem(
                "--data_dir", f"{folder} is not a folder", "point --data_dir at an existing folder"
            )
        else:
            served = [name for name, present in DATASETS.items() if present(folder)]
            if served:
                report.ok("--data_dir", f"{folder} can serve: {'; '.join(served)}")
            else:
                report.problem(
                    "--data_dir",
                    f"{folder} holds none of the known layouts",
                    "see docs/data.md ('Pointing it at real data') for the files each "
                    "dataset needs",
                )
    else:
        report.note("--data_dir", "not given (pass the folder you give train.py to check it)")
    for flag, check, fix in (
        ("glove_path", os.path.isfile, "point --glove_path at glove.6B.300d.txt"),
        (
            "tfds_dir",
            os.path.isdir,
            "point --tfds_dir at a TFDS data folder (~/tensorflow_datasets)",
        ),
    ):
        value = getattr(FLAGS, flag)
        if value and not check(value):
            report.problem(f"--{flag}", f"{value} does not exist", fix)
        elif value:
            report.ok(f"--{flag}", os.path.abspath(value))


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    report = Report()
    for check in (check_versions, check_worker, check_gpu, check_data):
        check(report)
    if report.problems:
        print(f"{report.problems} problem(s); each has its fix above")
        return 1
    print("everything a run needs is in place")
    return 0


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    exits.run_main("doctor.py", main)
