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
import json
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import app, flags

from tff_clustered.cli import exits, logs
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.data import leaf_cache
from tff_clustered.data.federated_data import DataError
from tff_clustered.data.fingerprint import SQLITE_MAGIC
from tff_clustered.data.image_formats import TFDS_NAMES, tfds_root
from tff_clustered.data.leaf import leaf_split_files
from tff_clustered.data.medmnist import pathmnist_path
from tff_clustered.data.mnist import FASHION_MNIST, MNIST
from tff_clustered.data.mnist_writers import WRITERS_FILE
from tff_clustered.data.registry import TFF_DATABASES
from tff_clustered.data.sent140 import read_glove
from tff_clustered.data.sql_clients import SqlClients
from tff_clustered.data.stackoverflow import STACKOVERFLOW_FILE
from tff_clustered.data.tff_sql import tff_sql_path
from tff_clustered.data.vector_records import vector_records
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


def leaf_layout(folder: str) -> bool:
    """Whether `folder` has LEAF's train/ and test/ *.json, every one a regular file (else the
    loader's DataError naming it: a folder, a named pipe, a symlink loop)."""
    splits = [os.path.join(folder, split) for split in ("train", "test")]
    if not all(glob.glob(os.path.join(split, "*.json")) for split in splits):
        return False
    return bool(leaf_split_files(folder))


def database(file: str) -> Callable[[str], bool]:
    """Whether a folder holds the SQLite database `file` (`sqlite_file`)."""
    return lambda folder: sqlite_file(folder, file)


DATASETS: dict[str, Callable[[str], bool]] = {
    "mnist / mnist_partitioned / fashion_mnist (IDX or npz)": mnist_files,
    "mnist_writers (MNIST files and writers.npz)": lambda d: (
        mnist_files(d) and os.path.isfile(os.path.join(d, WRITERS_FILE))
    ),
    "leaf / femnist / sent140 (train/ and test/ JSON)": leaf_layout,
    "cifar10": lambda d: os.path.isdir(os.path.join(d, "cifar-10-batches-py")),
    "cifar100": lambda d: os.path.isdir(os.path.join(d, "cifar-100-python")),
    "svhn": lambda d: (
        os.path.isfile(os.path.join(d, "train_32x32.mat"))
        and os.path.isfile(os.path.join(d, "test_32x32.mat"))
    ),
    "pathmnist": lambda d: os.path.isfile(pathmnist_path(d)),
    **{
        f"{name} ({file})": database(file)
        for name, file in {**TFF_DATABASES, "tff_stackoverflow": STACKOVERFLOW_FILE}.items()
    },
    "tff_sql (the folder's one .sqlite file)": lambda d: (
        len(glob.glob(os.path.join(d, "*.sqlite"))) == 1 and bool(sqlite_file(tff_sql_path(d)))
    ),
}


def sqlite_file(*path: str) -> bool:
    """Whether the file `path` (joined) is a SQLite database (its header) of TFF's
    SqlClientData format (`SqlClients.check_format`, as a run checks it); False when it is
    absent, DataError when it is another file."""
    file = os.path.join(*path)
    if not os.path.isfile(file):
        return False
    with open(file, "rb") as f:
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise DataError(f"{file} is not a SQLite database (its first bytes); fetch it again")
    reader = SqlClients(file, vector_records, {})
    try:
        reader.check_format()
    except sqlite3.Error as e:
        raise DataError(f"{file} cannot be read as SQLite ({e}); fetch it again") from None
    finally:
        reader.connection().close()
    return True


def check_data(report: Report) -> None:
    print("data")
    report.ok("embedded", "digits, digits_* and synthetic need no files")
    check_data_dir(report, FLAGS.data_dir)
    check_glove(report, FLAGS.glove_path)
    check_tfds(report, FLAGS.tfds_dir)
    check_leaf_cache(report)


def check_leaf_cache(report: Report) -> None:
    """Where LEAF splits are kept and their bound, as a run reads them (`leaf_cache`): a bound
    that is not a number of megabytes stops every LEAF run."""
    folder = leaf_cache.cache_folder()
    if folder is None:
        report.note("LEAF cache", "off (TFF_CLUSTERED_CACHE=off): every LEAF run parses its files")
        return
    try:
        bound = leaf_cache.limit_bytes()
    except ValueError as e:  # its message names the variable and the fix
        report.problem("LEAF cache", str(e), "docs/data.md says where LEAF splits are kept")
        return
    report.ok("LEAF cache", f"{folder}, at most {bound // 2**20:,} MB")


def check_data_dir(report: Report, data_dir: Optional[str]) -> None:
    """Which datasets `--data_dir` can serve, as train.py finds them: a folder's layouts
    (`DATASETS`), or a SQLite file for --dataset=tff_sql."""
    if not data_dir:
        report.note("--data_dir", "not given (pass the folder you give train.py to check it)")
        return
    folder = os.path.abspath(data_dir)
    try:
        if os.path.isfile(folder) and sqlite_file(folder):
            report.ok("--data_dir", f"{folder} can serve: tff_sql (a SQLite file)")
            return
        if not os.path.isdir(folder):
            report.problem(
                "--data_dir",
                f"{folder} is neither a folder nor a SQLite file"
                if os.path.exists(folder)
                else f"{folder} does not exist",
                "point --data_dir at an existing folder, or at a population's .sqlite file "
                "(--dataset=tff_sql)",
            )
            return
        served = [name for name, present in DATASETS.items() if present(folder)]
    except DataError as e:
        report.problem("--data_dir", str(e), "see docs/data.md ('Pointing it at real data')")
        return
    if served:
        report.ok("--data_dir", f"{folder} can serve: {'; '.join(served)}")
    else:
        report.problem(
            "--data_dir",
            f"{folder} holds none of the known layouts",
            "see docs/data.md ('Pointing it at real data') for the files each dataset needs",
        )


def check_glove(report: Report, path: Optional[str]) -> None:
    """Whether `--glove_path` is GloVe text: its first line a word and its vector
    (`sent140.read_glove`)."""
    if not path:
        return
    try:
        read_glove(path, set(), lines=1)
    except DataError as e:
        report.problem("--glove_path", str(e), "point --glove_path at glove.6B.300d.txt")
        return
    report.ok("--glove_path", os.path.abspath(path))


def check_tfds(report: Report, path: Optional[str]) -> None:
    """Which prepared TFDS datasets `--tfds_dir` holds: a `<name>/<version>/` folder with its
    `dataset_info.json` (readable JSON) and TFRecord files, as `tfds.builder` reads them."""
    if not path:
        return
    fix = "point --tfds_dir at a TFDS data folder (~/tensorflow_datasets) holding " + ", ".join(
        TFDS_NAMES.values()
    )
    if not os.path.isdir(path):
        report.problem("--tfds_dir", f"{path} is not a folder", fix)
        return
    found = []
    for name in TFDS_NAMES.values():
        for info in glob.glob(os.path.join(tfds_root(name, path), name, "*", "dataset_info.json")):
            version = os.path.dirname(info)
            try:
                with open(info) as f:
                    json.load(f)
            except (OSError, ValueError) as e:
                report.problem("--tfds_dir", f"{info} cannot be read ({e})", "prepare it again")
                return
            if not glob.glob(os.path.join(version, "*.tfrecord*")):
                report.problem(
                    "--tfds_dir", f"{version} holds no TFRecord files", "prepare it again"
                )
                return
            found.append(f"{name} {os.path.basename(version)}")
    if found:
        report.ok("--tfds_dir", f"{os.path.abspath(path)} can serve: {', '.join(found)}")
    else:
        report.problem("--tfds_dir", f"{path} holds no prepared TFDS dataset", fix)


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
