"""Checkpoints: an exact round trip of every kind of run state, and a format that never runs
code (pickles, foreign classes, damaged files and other versions are refused clearly)."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import pickle
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tff_clustered import atomic_files
from tff_clustered.algorithms.fedgroup import GroupState
from tff_clustered.algorithms.fedtsdp import TSDPState
from tff_clustered.loop.client_store import MemoryClientStore, StoreIndex
from tff_clustered.loop.state import RunState
from tff_clustered.run_folder import CHECKPOINT_NAME
from tff_clustered.runs import checkpoint
from tff_clustered.runs.checkpoint import CheckpointError
from tff_clustered.runs.state_encoding import encode_tree

SETTINGS = {"algorithm": "fedgroup", "rounds": 3, "shape": (2, 3), "lr": 0.1}


def state(algorithm_state: object) -> RunState:
    rng = np.random.default_rng(0)
    return RunState(
        round_num=2,
        cluster_models=rng.normal(size=(3, 7)).astype(np.float32),
        assignment={"a": 0, "b": -1, "c": 2},
        shared=(0, 1),
        anchor=None,
        algorithm_state=algorithm_state,
        client_models={"a": (np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32))},
        history=[{"round": 0, "accuracy": float("nan")}, {"round": 1, "accuracy": 0.25}],
    )


def assert_same(a: object, b: object) -> None:
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            assert_same(getattr(a, name), getattr(b, name))
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize(
    "algorithm_state",
    [
        None,
        GroupState(np.eye(2, 5), frozenset({"x", "y"})),
        TSDPState(np.full(4, 0.25), triggers=3),
        {"clusters": [[0, 1], [2]], 3: (1.5, True)},
    ],
)
def test_round_trip_is_exact(tmp_path: Path, algorithm_state: object) -> None:
    path = str(tmp_path / CHECKPOINT_NAME)
    saved = state(algorithm_state)
    checkpoint.save(path, saved, SETTINGS)
    assert_same(checkpoint.load(path, SETTINGS), saved)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_a_pickle_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (open, (str(marker), "w"))

    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(pickle.dumps({"format": checkpoint.FORMAT_VERSION, "state": Payload()}))
    with pytest.raises(CheckpointError, match="not a tff-clustered checkpoint"):
        checkpoint.load(str(path), SETTINGS)
    assert not marker.exists()
    # an old-format pickle next to no new checkpoint is refused by name, never read
    path.unlink()
    (tmp_path / "checkpoint.pkl").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match="pickle checkpoint of an older version"):
        checkpoint.load(str(path), SETTINGS)
    assert not marker.exists() and checkpoint.exists(str(tmp_path))


def rewrite_meta(path: Path, edit: object) -> None:
    with np.load(path, allow_pickle=False) as data:
        entries = {n: data[n] for n in data.files}
    meta = json.loads(entries.pop(checkpoint.META_ENTRY).tobytes().decode())
    edit(meta)
    buffer = io.BytesIO()
    encoded = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(buffer, **entries, **{checkpoint.META_ENTRY: encoded})
    path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(format=2), "format 2, this version reads format 3"),
        (lambda m: m["state"].update(dataclass="os:system"), "not a tff-clustered state class"),
        (
            lambda m: m["state"].update(dataclass="tff_clustered.runs.checkpoint:CheckpointError"),
            "not a state class",
        ),
        (lambda m: m["state"]["fields"].update(extra=1), "does not match this version"),
        (lambda m: m["state"]["fields"].update(round_num={"ndarray": "a999"}), "missing"),
        (lambda m: m.update(state=[1, 2]), "unexpected structure"),
    ],
)
def test_foreign_or_damaged_contents_are_refused(
    tmp_path: Path, edit: object, message: str
) -> None:
    path = tmp_path / CHECKPOINT_NAME
    checkpoint.save(str(path), state(None), SETTINGS)
    rewrite_meta(path, edit)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(str(path), SETTINGS)


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda s: s.cluster_models.__setitem__((1, 3), np.nan), "a cluster model"),
        (lambda s: setattr(s, "anchor", np.array([0.5, np.inf], np.float32)), "the anchor model"),
        (lambda s: s.client_models["a"][1].__setitem__(2, -np.inf), "a client's own model"),
    ],
)
def test_a_checkpoint_with_a_non_finite_weight_is_refused_as_damaged(
    tmp_path: Path, damage: object, named: str
) -> None:
    """No run checkpoints a non-finite model (it stops first): the file was damaged, and
    resumed, its first round blamed the learning rate."""
    path = str(tmp_path / CHECKPOINT_NAME)
    damaged = state(None)
    damage(damaged)
    checkpoint.save(path, damaged, SETTINGS)
    with pytest.raises(CheckpointError, match=f"^checkpoint {path} is damaged: {named} in it"):
        checkpoint.load(path, SETTINGS)


def test_truncated_or_foreign_files_and_other_settings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    checkpoint.save(str(path), state(None), SETTINGS)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match="cannot be read"):
        checkpoint.load(str(path), SETTINGS)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("x.npy", b"junk")
    path.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError, match="not a tff-clustered checkpoint"):
        checkpoint.load(str(path), SETTINGS)
    checkpoint.save(str(path), state(None), SETTINGS)
    with pytest.raises(CheckpointError, match="rounds: checkpoint 3, now 4"):
        checkpoint.load(str(path), {**SETTINGS, "rounds": 4})
    assert checkpoint.load(str(tmp_path / "none.npz"), SETTINGS) is None


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_take_the_users_umask(
    tmp_path: object, umask: int, mode: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A colleague or a TensorBoard server on a shared filesystem reads what the user's umask
    lets them read, as for any file the user writes (a bare temporary file would be 0600). The
    umask is read once, at import (reading it means setting it: per write, it could race with
    another thread creating a file)."""
    previous = os.umask(umask)
    try:
        assert atomic_files._read_umask() == umask
    finally:
        os.umask(previous)
    monkeypatch.setattr(atomic_files, "_UMASK", umask)
    path = os.path.join(str(tmp_path), "metrics.csv")
    atomic_files.atomic_write_bytes(path, b"round\n")
    atomic_files.atomic_write_bytes(path, b"round\n1\n")  # replacing keeps it
    assert stat.S_IMODE(os.stat(path).st_mode) == mode


def test_an_output_folder_that_cannot_be_used_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    for folder in (a_file, a_file / "run"):
        with pytest.raises(CheckpointError, match="is a file, or inside one, not a folder"):
            with checkpoint.hold_run_folder(str(folder)):
                pass
    assert a_file.read_text() == "not a folder"

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "run"))

    monkeypatch.setattr(checkpoint.os, "makedirs", full)
    with pytest.raises(CheckpointError, match="has no space left.*choose another --output_dir"):
        with checkpoint.hold_run_folder(str(tmp_path / "run")):
            pass


def test_a_run_folder_is_held_by_one_run_and_a_killed_holder_never_blocks(
    tmp_path: object,
) -> None:
    """A second run on a held folder is refused at once, naming the holder; the lock goes with
    its process, however it ends (SIGKILL here), so `--resume` is never blocked by a stale
    lock."""
    folder = str(tmp_path / "run")
    with checkpoint.hold_run_folder(folder):
        with pytest.raises(CheckpointError, match=rf"in use by another run \(pid {os.getpid()}\)"):
            with checkpoint.hold_run_folder(folder):
                pass
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from tff_clustered.runs import checkpoint\n"
            f"with checkpoint.hold_run_folder({folder!r}):\n"
            "    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=rf"pid {holder.pid}\).*--output_dir"):
            with checkpoint.hold_run_folder(folder):
                pass
    finally:
        holder.kill()
        holder.wait()
    with checkpoint.hold_run_folder(folder):  # the killed holder left no lock
        pass


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


# What a crafted checkpoint may put in place of a part of the state: any JSON value, one of
# the format's own markers around one, a list as a dict key, or nesting deeper than Python's
# recursion limit.
def _nested(depth: int) -> list:
    tree: list = []
    for _ in range(depth):
        tree = [tree]
    return tree


CRAFTED = (
    JSON_VALUES
    | st.builds(
        lambda kind, v: {kind: v}, st.sampled_from(["list", "dict", "ndarray"]), JSON_VALUES
    )
    | st.builds(lambda k, v: {"dict": [[k, v]]}, st.just({"list": [1]}), JSON_VALUES)
    | st.integers(2, 400).map(_nested)
)


def _paths(tree: object, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON tree, as a path of keys and indices."""
    found = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found += _paths(value, (*prefix, i))
    return found


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_crafted_checkpoints_load_whole_or_are_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Any part of a checkpoint's structure replaced by a crafted value: the load gives a run
    state whose fields have their declared types, or the refusal message; never another
    exception."""
    path = tmp_path_factory.mktemp("crafted") / CHECKPOINT_NAME
    checkpoint.save(str(path), state(GroupState(np.eye(2, 5), frozenset({"x"}))), SETTINGS)
    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(saved[checkpoint.META_ENTRY].tobytes().decode())
    where = data.draw(st.sampled_from(_paths(meta["state"])[1:]))
    crafted = data.draw(CRAFTED)

    def replace(m: dict) -> None:
        parent = m["state"]
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = crafted

    rewrite_meta(path, replace)
    try:
        loaded = checkpoint.load(str(path), SETTINGS)
    except CheckpointError as e:
        assert "\n" not in str(e) and str(path) in str(e), str(e)
        return
    assert isinstance(loaded, RunState)
    assert isinstance(loaded.round_num, int) and isinstance(loaded.assignment, dict)


def test_a_checkpoint_nested_deeper_than_python_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    text = '{"format": 3, "settings": {"dict": []}, "state": ' + "[" * 100_000 + "]" * 100_000
    buffer = io.BytesIO()
    np.savez(buffer, **{checkpoint.META_ENTRY: np.frombuffer((text + "}").encode(), np.uint8)})
    path.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError, match="cannot be read.*delete it to start over"):
        checkpoint.load(str(path), SETTINGS)


def test_a_disk_store_index_round_trips_and_a_memory_store_keeps_its_format(
    tmp_path: Path,
) -> None:
    """The disk store's checkpoint holds its index, exactly; the memory store's holds the dict
    of models as before (the JSON tree of checkpoints made before the disk store existed)."""
    path = str(tmp_path / CHECKPOINT_NAME)
    index = StoreIndex(slots=np.array([0, -1, 1], np.int8), num_values=7)
    saved = RunState(round_num=1, cluster_models=np.zeros((1, 7), np.float32), client_models=index)
    checkpoint.save(path, saved, SETTINGS)
    assert_same(checkpoint.load(path, SETTINGS), saved)
    models = {"a": (np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32))}
    record = MemoryClientStore((np.zeros((2, 2)), np.zeros(3)), models).record()
    arrays: dict = {}
    assert encode_tree(RunState(client_models=record), arrays)["fields"]["client_models"] == {
        "dict": [["a", {"tuple": [{"ndarray": "a0"}, {"ndarray": "a1"}]}]]
    }


def test_client_models_of_another_kind_are_refused(tmp_path: Path) -> None:
    path = str(tmp_path / CHECKPOINT_NAME)
    checkpoint.save(path, RunState(client_models=[1, 2]), SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="client_models is a list"):
        checkpoint.load(path, SETTINGS)


def test_a_checkpoint_older_than_a_setting_resumes_at_the_value_its_run_had(
    tmp_path: Path,
) -> None:
    """`training.eval_clients` came after checkpoints that lack it: such a checkpoint resumes a
    run that scores every client (0), and is refused, naming the setting, for a sample."""
    path = str(tmp_path / CHECKPOINT_NAME)
    before = {"algorithm": "fedavg", "training": {"rounds": 3}}
    checkpoint.save(path, state(None), before)
    now = {"algorithm": "fedavg", "training": {"rounds": 3, "eval_clients": 0}}
    assert checkpoint.load(path, now) is not None
    with pytest.raises(CheckpointError, match="eval_clients: checkpoint \\(none\\), now 100"):
        checkpoint.load(path, {**now, "training": {"rounds": 3, "eval_clients": 100}})
    with pytest.raises(CheckpointError, match="rounds: checkpoint 3, now 4"):
        checkpoint.load(path, {**now, "training": {"rounds": 4, "eval_clients": 0}})


def test_a_uapdfl_checkpoint_older_than_its_alike_ratio_resumes_at_ratio_one(
    tmp_path: Path,
) -> None:
    """`--uapdfl_alike_ratio` came after UA-PDFL checkpoints that lack it: their runs used 1."""
    path = str(tmp_path / CHECKPOINT_NAME)
    before = {"algorithm": "uapdfl", "algorithm_options": {"uapdfl_mu": 0.01}}
    checkpoint.save(path, state(None), before)
    now = {**before, "algorithm_options": {"uapdfl_mu": 0.01, "uapdfl_alike_ratio": 1.0}}
    assert checkpoint.load(path, now) is not None
    other = {**before, "algorithm_options": {"uapdfl_mu": 0.01, "uapdfl_alike_ratio": 1.2}}
    with pytest.raises(CheckpointError, match="uapdfl_alike_ratio: checkpoint \\(none\\), now 1.2"):
        checkpoint.load(path, other)


def test_a_checkpoint_older_than_client_sampling_resumes_with_fixed_sampling(
    tmp_path: Path,
) -> None:
    """`training.client_sampling` came after checkpoints that lack it: their runs drew a fixed
    number of clients, so they resume with "fixed" and are refused, naming it, with "poisson"."""
    path = str(tmp_path / CHECKPOINT_NAME)
    checkpoint.save(path, state(None), {"algorithm": "fedavg", "training": {"rounds": 3}})
    now = {"algorithm": "fedavg", "training": {"rounds": 3, "client_sampling": "fixed"}}
    assert checkpoint.load(path, now) is not None
    poisson = {"algorithm": "fedavg", "training": {"rounds": 3, "client_sampling": "poisson"}}
    with pytest.raises(
        CheckpointError, match="client_sampling: checkpoint \\(none\\), now 'poisson'"
    ):
        checkpoint.load(path, poisson)


def test_a_population_s_assignment_is_kept_as_two_arrays_and_read_back_exactly(
    tmp_path: Path,
) -> None:
    """A run of many clients keeps their clusters as an array of ids and one of clusters (a
    JSON pair per client made a checkpoint of a million clients take seconds); small dicts keep
    the JSON form, and both read back equal, with Python ints."""
    path = str(tmp_path / CHECKPOINT_NAME)
    many = {f"client {i}": i % 5 - 1 for i in range(5000)}
    saved = dataclasses.replace(state(None), assignment=many)
    checkpoint.save(path, saved, SETTINGS)
    with np.load(path, allow_pickle=False) as stored:
        meta = stored["meta.json"].tobytes().decode()
    assert "str_int_text" in meta and "client 4999" not in meta
    loaded = checkpoint.load(path, SETTINGS)
    assert loaded.assignment == many
    assert list(loaded.assignment) == list(many)
    assert all(type(k) is int for k in list(loaded.assignment.values())[:10])


@pytest.mark.parametrize(
    "odd_key",
    ["line\nbreak", "", "é", "\ud800"],
    ids=["line break", "empty", "beyond ascii", "surrogate"],
)
def test_a_population_s_ids_of_any_text_read_back_exactly(tmp_path: Path, odd_key: str) -> None:
    """The ids are kept as their UTF-8 text end to end with each one's length: an id that holds
    a line break, is empty, beyond ASCII or a lone surrogate reads back as it was."""
    path = str(tmp_path / CHECKPOINT_NAME)
    many = {odd_key: 3, **{f"client {i}": i % 5 for i in range(2000)}}
    checkpoint.save(path, dataclasses.replace(state(None), assignment=many), SETTINGS)
    with np.load(path, allow_pickle=False) as stored:
        meta = stored["meta.json"].tobytes().decode()
    assert "str_int_text" in meta
    assert list(checkpoint.load(path, SETTINGS).assignment.items()) == list(many.items())


def test_a_checkpoint_keeping_ids_as_an_array_of_strings_still_resumes(tmp_path: Path) -> None:
    """A checkpoint made before the ids were kept as lines (an array of strings) reads back."""
    path = str(tmp_path / CHECKPOINT_NAME)
    many = {f"client {i}": i % 3 for i in range(2000)}
    checkpoint.save(path, dataclasses.replace(state(None), assignment=many), SETTINGS)
    with np.load(path, allow_pickle=False) as stored:
        entries = dict(stored)
    meta = json.loads(entries["meta.json"].tobytes())
    fields = meta["state"]["fields"]
    text, _, values = fields["assignment"].pop("str_int_text")
    fields["assignment"]["str_int_dict"] = [text, values]
    entries[text] = np.array(list(many), dtype=str)
    entries["meta.json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **entries)
    assert checkpoint.load(path, SETTINGS).assignment == many
