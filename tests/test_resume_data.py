"""`--resume` refuses data that changed since the checkpoint, for every loader, from a
fingerprint of the files the loader reads (not of the decoded examples); and a run folder's
orphan temporary files are removed by the next run that holds it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import TESTDATA, TRAIN_IN_ONE_PROCESS, run_binary

from tff_clustered import atomic_files
from tff_clustered.data import fingerprint
from tff_clustered.data.fingerprint import SourceFingerprint, file_digest, sampled_digest
from tff_clustered.data.population import PopulationSpec, write_population_sql
from tff_clustered.data.registry import data_files, load_dataset, source_fingerprint
from tff_clustered.data.spec import DATASET_NAMES
from tff_clustered.loop.state import RunState
from tff_clustered.run_folder import CHECKPOINT_NAME, LOCK_NAME
from tff_clustered.runs import checkpoint
from tff_clustered.runs.checkpoint import CheckpointError

LEAF_TRAIN_0 = "train/all_data_0_niid_0_keep_0_train_9.json"
LEAF_TEST = "test/all_data_niid_0_keep_0_test_9.json"


@pytest.fixture
def leaf_copy(tmp_path: Path) -> Path:
    """testdata/leaf_tiny copied, to be changed."""
    folder = tmp_path / "leaf"
    shutil.copytree(os.path.join(TESTDATA, "leaf_tiny"), folder)
    return folder


def edit_leaf(path: Path, edit: object) -> None:
    """Rewrites a LEAF JSON file with `edit(blob)` applied."""
    blob = json.loads(path.read_text())
    edit(blob)
    path.write_text(json.dumps(blob))


def remove_first_user(blob: dict) -> None:
    """Removes user f_0000 (the first of the files that hold it: train 0 and test)."""
    assert blob["users"][0] == "f_0000"
    blob["users"].pop(0)
    blob["num_samples"].pop(0)
    del blob["user_data"]["f_0000"]


def shift_labels(blob: dict) -> None:
    for examples in blob["user_data"].values():
        examples["y"] = [(y + 1) % 4 for y in examples["y"]]


# -- the fingerprint ---------------------------------------------------------------------------


def test_unchanged_leaf_files_give_the_same_fingerprint(leaf_copy: Path) -> None:
    before = source_fingerprint("leaf", str(leaf_copy))
    assert set(before.files) == {
        LEAF_TRAIN_0,
        "train/all_data_1_niid_0_keep_0_train_9.json",
        LEAF_TEST,
    }
    assert before.root == str(leaf_copy)
    assert source_fingerprint("leaf", str(leaf_copy)).change_since(before) is None


@pytest.mark.parametrize("edit", [remove_first_user, shift_labels])
def test_a_removed_user_or_shifted_labels_name_the_changed_file(
    leaf_copy: Path, edit: object
) -> None:
    before = source_fingerprint("leaf", str(leaf_copy))
    edit_leaf(leaf_copy / LEAF_TRAIN_0, edit)
    assert source_fingerprint("leaf", str(leaf_copy)).change_since(before) == (
        f"{LEAF_TRAIN_0} differs"
    )


def test_a_new_or_removed_file_is_named(leaf_copy: Path) -> None:
    before = source_fingerprint("leaf", str(leaf_copy))
    shutil.copy(leaf_copy / LEAF_TRAIN_0, leaf_copy / "train" / "zz_extra.json")
    assert source_fingerprint("leaf", str(leaf_copy)).change_since(before) == (
        "train/zz_extra.json is new"
    )
    os.remove(leaf_copy / "train" / "zz_extra.json")
    os.remove(leaf_copy / LEAF_TRAIN_0)
    assert source_fingerprint("leaf", str(leaf_copy)).change_since(before) == (
        f"{LEAF_TRAIN_0} is gone"
    )


def test_generated_datasets_have_no_files_and_every_dataset_has_a_hook() -> None:
    generated = {"digits", "digits_dirichlet", "digits_iid", "digits_pathological", "synthetic"}
    for name in generated:
        assert data_files(name) == []
    for name in set(DATASET_NAMES) - generated:  # each file-based loader is known to the hook
        try:
            data_files(name, data_dir=None)
        except ValueError as e:
            assert "unknown dataset" not in str(e), name


def test_a_file_above_the_limit_is_hashed_by_sampled_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule for large files: size, mtime and SHA-256 of evenly spaced blocks (the first and
    the last included); a change inside a sampled block, at the end, or of the size shows."""
    monkeypatch.setattr(fingerprint, "FULL_HASH_LIMIT", 1000)
    monkeypatch.setattr(fingerprint, "SAMPLED_BLOCKS", 4)
    monkeypatch.setattr(fingerprint, "SAMPLE_BLOCK", 10)
    path = tmp_path / "population.sqlite"
    payload = bytearray(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    path.write_bytes(bytes(payload))
    os.utime(path, ns=(1, 1))
    original = file_digest(str(path))
    assert original.startswith("4000:1:sampled-")
    for offset in (0, 1996, 3999):  # blocks at 0, 1330, 2660, 3990 (+10): first, middle, last
        changed = bytearray(payload)
        changed[offset if offset != 1996 else 1335] ^= 0xFF
        path.write_bytes(bytes(changed))
        os.utime(path, ns=(1, 1))
        assert file_digest(str(path)) != original, offset
    path.write_bytes(bytes(payload) + b"x")
    os.utime(path, ns=(1, 1))
    assert file_digest(str(path)) != original
    path.write_bytes(bytes(payload))
    os.utime(path, ns=(1, 1))
    assert file_digest(str(path)) == original
    monkeypatch.setattr(fingerprint, "FULL_HASH_LIMIT", 4000)  # at the limit: whole
    assert file_digest(str(path)).startswith("4000:") and "sampled" not in file_digest(str(path))
    assert file_digest(str(tmp_path / "none")) == fingerprint.ABSENT


# -- SQLite databases in every journal mode -------------------------------------------------------

JOURNAL_MODES = ("DELETE", "TRUNCATE", "PERSIST", "MEMORY", "WAL", "OFF")
# A modification time well before any change a test makes: the database was written before the
# run (a change within the same clock tick as its writing would keep the time).
WRITTEN_EARLIER_NS = 10**18


@pytest.fixture(scope="module")
def population_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small population of TFF's SQL format (DELETE mode, the default)."""
    spec = PopulationSpec(num_clients=60, train_examples=4, test_examples=3, num_features=8)
    path = str(tmp_path_factory.mktemp("population") / "population.sqlite")
    write_population_sql(spec, path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=DELETE")
    return path


def database_in_mode(source: str, folder: Path, mode: str) -> str:
    """A copy of `source` switched to journal mode `mode`, written "earlier"."""
    copy = str(folder / "population.sqlite")
    shutil.copy(source, copy)
    with contextlib.closing(sqlite3.connect(copy)) as db:
        assert db.execute(f"PRAGMA journal_mode={mode}").fetchone()[0] == mode.lower()
    os.utime(copy, ns=(WRITTEN_EARLIER_NS, WRITTEN_EARLIER_NS))
    return copy


def relabel_a_test_example(db: sqlite3.Connection) -> None:
    """Commits a new label for the middle test example (a row far from the file's ends)."""
    (middle,) = db.execute(
        "SELECT rowid FROM examples WHERE split_name = 'test' ORDER BY rowid LIMIT 1 OFFSET 90"
    ).fetchone()
    (blob,) = db.execute(
        "SELECT serialized_example_proto FROM examples WHERE rowid = ?", (middle,)
    ).fetchone()
    example = tf.train.Example.FromString(blob)
    labels = example.features.feature["y"].int64_list.value
    labels[0] = (labels[0] + 1) % 10
    db.execute(
        "UPDATE examples SET serialized_example_proto = ? WHERE rowid = ?",
        (example.SerializeToString(), middle),
    )
    db.commit()


@pytest.fixture
def header_only_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sampled_digest` reads only the first and the last page: the changed row's page is not
    sampled, so only what SQLite changes on every write can show the change."""
    monkeypatch.setattr(fingerprint, "EDGE_BYTES", 4096)
    monkeypatch.setattr(fingerprint, "PAGE_SAMPLES", 2)
    monkeypatch.setattr(fingerprint, "PAGE_SAMPLE", 4096)


@pytest.mark.parametrize("mode", JOURNAL_MODES)
@pytest.mark.parametrize("digest", [sampled_digest, file_digest])
@pytest.mark.usefixtures("header_only_samples")
def test_a_changed_label_changes_the_fingerprint_in_every_journal_mode(
    population_db: str, tmp_path: Path, mode: str, digest: Callable[[str], str]
) -> None:
    """The probe: a database in WAL mode, a test label changed by UPDATE and checkpointed into
    the file (`wal_checkpoint(TRUNCATE)`), the fingerprint unchanged; and in every other
    journal mode SQLite has."""
    path = database_in_mode(population_db, tmp_path, mode)
    before = digest(path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        relabel_a_test_example(db)
        if mode == "WAL":
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert digest(path) != before


@pytest.mark.parametrize("digest", [sampled_digest, file_digest])
@pytest.mark.usefixtures("header_only_samples")
def test_a_change_still_in_the_wal_file_changes_the_fingerprint(
    population_db: str, tmp_path: Path, digest: Callable[[str], str]
) -> None:
    """WAL mode, the change committed but not checkpointed (its writer still open): the
    database file is as it was, SQLite reads the change from the -wal file."""
    path = database_in_mode(population_db, tmp_path, "WAL")
    before = digest(path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        relabel_a_test_example(db)
        assert os.path.getsize(path + "-wal") > 0
        pending = digest(path)
    assert pending != before
    assert not os.path.exists(path + "-wal")  # the last connection checkpointed it
    assert digest(path) != before


@pytest.mark.parametrize("mode", JOURNAL_MODES)
def test_reading_a_database_keeps_its_fingerprint(
    population_db: str, tmp_path: Path, mode: str
) -> None:
    """A run reads its data read-only (in WAL mode that leaves an empty -wal file): the
    fingerprint a resume computes is the one its checkpoint holds."""
    path = database_in_mode(population_db, tmp_path, mode)
    before = source_fingerprint("tff_sql", data_dir=path)
    data = load_dataset("tff_sql", data_dir=path, num_classes=10)
    data.arrays("test", data.client_ids[-1])
    assert source_fingerprint("tff_sql", data_dir=path).change_since(before) is None


# Each file-based loader on its fixture: load_dataset's keyword arguments.
FIXTURE_LOADS = {
    "leaf": {"data_dir": "leaf_tiny"},
    "sent140": {"data_dir": "sent140_tiny", "glove_path": "sent140_tiny/glove_tiny.300d.txt"},
    "mnist": {"data_dir": "mnist_idx_tiny", "num_clients": 20},
    "fashion_mnist": {"data_dir": "mnist_idx_tiny", "partition": "iid", "num_clients": 4},
    "cifar10": {"data_dir": "cifar10_tiny", "partition": "iid", "num_clients": 4},
    "cifar100": {"data_dir": "cifar100_tiny", "partition": "iid", "num_clients": 4},
    "svhn": {"data_dir": "svhn_tiny", "partition": "iid", "num_clients": 4},
    "pathmnist": {"data_dir": "pathmnist_tiny", "partition": "iid", "num_clients": 4},
    "tff_emnist": {"data_dir": "tff_emnist_tiny"},
    "tff_cifar100": {"data_dir": "tff_cifar100_tiny"},
    "tff_shakespeare": {"data_dir": "tff_shakespeare_tiny"},
}
_opened: list[str] = []
_tracing: list[bool] = [False]


def _record_open(event: str, args: tuple) -> None:
    if _tracing[0] and event in ("open", "sqlite3.connect") and args:
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.fsdecode(path)
            if event == "sqlite3.connect" and path.startswith("file:"):  # a URI: file:PATH?mode=ro
                path = path[len("file:") :].split("?", 1)[0]
            _opened.append(os.path.realpath(path))


@pytest.fixture(scope="module")
def opened_files() -> Iterator[object]:
    """`trace(fn)`: the files `fn()` opens (Python's audit events; audit hooks cannot be
    removed, so this one records only while tracing)."""
    sys.addaudithook(_record_open)

    def trace(fn: object) -> set[str]:
        _opened.clear()
        _tracing[0] = True
        try:
            fn()
        finally:
            _tracing[0] = False
        return set(_opened)

    yield trace


@pytest.mark.parametrize("name", sorted(FIXTURE_LOADS))
def test_the_fingerprint_covers_every_file_the_loader_reads(
    name: str, opened_files: object
) -> None:
    kwargs = {
        k: os.path.join(TESTDATA, v) if k in ("data_dir", "glove_path") else v
        for k, v in FIXTURE_LOADS[name].items()
    }
    testdata = os.path.realpath(TESTDATA)
    read = {
        p
        for p in opened_files(lambda: load_dataset(name, **kwargs))
        if p.startswith(testdata + os.sep) and os.path.isfile(p)
    }
    listed = {
        os.path.realpath(p)
        for p in data_files(name, kwargs["data_dir"], kwargs.get("glove_path"), None)
    }
    assert read, "the loader opened no file: the trace does not work"
    assert read <= listed, sorted(read - listed)
    fingerprinted = source_fingerprint(name, kwargs["data_dir"], kwargs.get("glove_path"))
    assert fingerprint.ABSENT not in fingerprinted.files.values()


def test_tfds_and_mnist_writers_list_their_files(tmp_path: Path) -> None:
    tfds = os.path.join(TESTDATA, "tfds_tiny")
    listed = data_files("cifar10", tfds_dir=tfds)
    assert os.path.join(tfds, "cifar10", "3.0.2", "dataset_info.json") in listed
    assert source_fingerprint("cifar10", tfds_dir=tfds).root == tfds
    mnist = os.path.join(TESTDATA, "mnist_idx_tiny")
    writers = data_files("mnist_writers", mnist)
    assert writers == [*data_files("mnist", mnist), os.path.join(mnist, "writers.npz")]


# -- the checkpoint ----------------------------------------------------------------------------

SETTINGS = {"dataset": "leaf", "rounds": 3}


def small_state() -> RunState:
    return RunState(
        round_num=2,
        cluster_models=np.zeros((1, 3), np.float32),
        assignment={"a": 0},
        shared=(0,),
        anchor=None,
        algorithm_state=None,
        client_models={},
        history=[{"round": 0, "accuracy": 0.5}],
    )


def test_a_checkpoint_refuses_changed_data_and_resumes_the_same(leaf_copy: Path) -> None:
    path = str(leaf_copy.parent / CHECKPOINT_NAME)
    source = source_fingerprint("leaf", str(leaf_copy))
    checkpoint.save(path, small_state(), SETTINGS, source)
    warnings: list[str] = []
    assert checkpoint.load(path, SETTINGS, source, warnings.append).round_num == 2
    assert warnings == []
    edit_leaf(leaf_copy / LEAF_TRAIN_0, shift_labels)
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(path, SETTINGS, source_fingerprint("leaf", str(leaf_copy)))
    message = str(refused.value)
    assert f"the data under {leaf_copy} changed since the checkpoint" in message
    assert f"{LEAF_TRAIN_0} differs" in message and "new --output_dir" in message
    assert "\n" not in message


@pytest.mark.usefixtures("header_only_samples")
def test_a_checkpoint_refuses_a_wal_mode_database_changed_since(
    population_db: str, tmp_path: Path
) -> None:
    """The probe's resume: a run on a WAL-mode database checkpointed, a test label changed by
    UPDATE and checkpointed into the file (on a page the sample does not read, as in a large
    population): the resume is refused, naming the file."""
    path = database_in_mode(population_db, tmp_path, "WAL")
    saved = str(tmp_path / CHECKPOINT_NAME)
    checkpoint.save(saved, small_state(), SETTINGS, source_fingerprint("tff_sql", data_dir=path))
    load_dataset("tff_sql", data_dir=path, num_classes=10).arrays("test", "c0000001")
    assert checkpoint.load(saved, SETTINGS, source_fingerprint("tff_sql", data_dir=path))
    with contextlib.closing(sqlite3.connect(path)) as db:
        relabel_a_test_example(db)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with pytest.raises(CheckpointError, match="population.sqlite differs; restore the data"):
        checkpoint.load(saved, SETTINGS, source_fingerprint("tff_sql", data_dir=path))


def test_a_checkpoint_without_a_data_fingerprint_resumes_with_a_warning(leaf_copy: Path) -> None:
    """Checkpoints written before they recorded their data: accepted, with a warning."""
    path = str(leaf_copy.parent / CHECKPOINT_NAME)
    checkpoint.save(path, small_state(), SETTINGS)  # as older versions wrote it
    warnings: list[str] = []
    source = source_fingerprint("leaf", str(leaf_copy))
    assert checkpoint.load(path, SETTINGS, source, warnings.append) is not None
    assert len(warnings) == 1 and "predates data fingerprints" in warnings[0]
    checkpoint.save(path, small_state(), {"dataset": "digits"}, SourceFingerprint())
    assert checkpoint.load(path, {"dataset": "digits"}, SourceFingerprint(), warnings.append)
    assert len(warnings) == 1  # generated data: its settings are its fingerprint


def test_a_damaged_data_record_is_refused(leaf_copy: Path) -> None:
    source = source_fingerprint("leaf", str(leaf_copy))
    for damaged in ({"root": 1}, {"root": "x", "files": {"a": 2}}, "text"):
        with pytest.raises(CheckpointError, match="data_source is damaged; start over"):
            checkpoint.refuse_changed_data("ckpt", damaged, source, print)


# -- orphan temporary files --------------------------------------------------------------------


def test_holding_a_run_folder_removes_only_our_orphan_temp_files(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    fd, made = tempfile.mkstemp(prefix=atomic_files.TEMP_PREFIX, dir=folder)  # an older write's
    os.close(fd)
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # a write of a process that ended, and one of a running process (this one's), which is kept
    orphans = {os.path.basename(made), ".tmp-abcd_123", f".tmp-{ended}-abcd_123"}
    kept = {".tmp-abc", ".tmp-abcd1234.json", "x.tmp-abcd1234", "metrics.csv", ".tmp-ABCD1234"}
    kept.add(f".tmp-{os.getpid()}-abcd1234")
    for name in orphans | kept:
        (folder / name).write_bytes(b"1" * 1700)
    (folder / ".tmp-dir12345").mkdir()  # a folder of that name is not ours
    with checkpoint.hold_run_folder(str(folder)):
        assert set(os.listdir(folder)) == kept | {".tmp-dir12345", LOCK_NAME}


# -- train.py end to end ----------------------------------------------------------------------


# train.py's main run twice in one process (importing TensorFlow once), as `app.run` would,
# with user f_0000 removed from the given LEAF files in between; each run's exit code and
# stderr as a JSON line (conftest's TRAIN_IN_ONE_PROCESS).
RUN_REMOVE_USER_RESUME = (
    TRAIN_IN_ONE_PROCESS
    + """
command, edited = ARGUMENT
run_train(command)
for path in edited:
    with open(path) as f:
        blob = json.load(f)
    at = blob["users"].index("f_0000")
    del blob["users"][at], blob["num_samples"][at], blob["user_data"]["f_0000"]
    with open(path, "w") as f:
        json.dump(blob, f)
run_train([*command, "--resume"])
"""
)


def test_train_resume_refuses_a_removed_user(tmp_path: Path) -> None:
    """The probe: a LEAF run checkpointed, user f_0000 removed from the files, the same
    command with --resume: refused with exit 2 and one line naming the first changed file;
    the checkpoint is kept as it was. The checkpoint holds the fingerprint a resume computes
    again on unchanged data; the orphan temporary file of a kill is gone once a run starts."""
    data = tmp_path / "leaf"
    shutil.copytree(os.path.join(TESTDATA, "leaf_tiny"), data)
    unchanged = source_fingerprint("leaf", str(data)).to_json()
    out = tmp_path / "run"
    out.mkdir()
    (out / ".tmp-k1lled_7").write_bytes(b"1" * 1700)  # left by a kill mid-write
    command = [
        "--dataset=leaf",
        f"--data_dir={data}",
        "--num_classes=4",
        "--model=mclr",
        "--algorithm=fedavg",
        "--rounds=1",
        "--clients_per_round=2",
        "--local_epochs=1",
        "--execution=in_process",
        f"--output_dir={out}",
    ]
    edited = [str(data / LEAF_TRAIN_0), str(data / LEAF_TEST)]
    done = run_binary(["-c", RUN_REMOVE_USER_RESUME, json.dumps([command, edited])])
    assert done.returncode == 0, done.stderr[-3000:]
    (first, _), (code, stderr) = [
        json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")
    ]
    assert first == 0 and not (out / ".tmp-k1lled_7").exists()
    assert code == 2, stderr[-2000:]
    assert f"the data under {data} changed since the checkpoint" in stderr
    assert f"{LEAF_TEST} differs" in stderr and "new --output_dir" in stderr
    assert "Traceback" not in stderr
    saved = np.load(out / CHECKPOINT_NAME)[checkpoint.META_ENTRY].tobytes()
    assert json.loads(saved)[checkpoint.DATA_SOURCE_ENTRY] == unchanged
