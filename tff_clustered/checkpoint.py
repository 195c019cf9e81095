"""Atomic checkpoints of a run's `RunState`, in a format that cannot execute code.

A checkpoint is one `.npz` file (NumPy's zip of arrays, read with `allow_pickle=False`): every
array of the state is an entry, and one entry holds the rest as JSON text (format version,
the run's settings, and the state's structure, whose arrays are referenced by entry name).
Dataclasses are recorded by name and rebuilt only when they are dataclasses of this package;
nothing else in a checkpoint names code. Older pickle checkpoints (`checkpoint.pkl`) are
refused, never loaded.

It is written to a temporary file in the same folder, flushed to disk, then renamed over the
old one (`os.replace` is atomic on POSIX), so a crash leaves either the previous or the new
checkpoint, never a torn one. Resuming with other settings is refused.

A run holds an exclusive lock on its output folder (`hold_run_folder`: `flock` on `.lock`)
for its lifetime, so a second run on the same folder is refused at once instead of both
appending to its files. The kernel drops the lock when the process ends, however it ends, so
a killed run never leaves a lock that blocks `--resume`. A run killed mid-write can leave a
temporary file; the next run to hold the folder deletes it (`remove_orphan_temp_files`).

A checkpoint also records the files the run's data was read from (`data_source`: each file's
path and a digest of its bytes, `tff_clustered.data.fingerprint`); resuming on other data is
refused, naming the first file that changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import importlib
import io
import json
import os
import re
import tempfile
import types
import typing
import zipfile
from collections.abc import Callable, Iterator
from typing import Any, Optional

import numpy as np

from tff_clustered.data.fingerprint import SourceFingerprint
from tff_clustered.loop.state import RunState

FORMAT_VERSION = 3  # 3: npz + JSON (2: pickle of the composable core's state)
CHECKPOINT_NAME = "checkpoint.npz"
LEGACY_NAMES = ("checkpoint.pkl",)
META_ENTRY = "meta.json"
DATA_SOURCE_ENTRY = "data_source"  # in the meta JSON; older checkpoints have none
LOCK_NAME = ".lock"
# `atomic_write_bytes`' temporary files: `tempfile.mkstemp(prefix=TEMP_PREFIX)` names them with
# 8 characters of [a-z0-9_]. A process killed between creating one and renaming it leaves it.
TEMP_PREFIX = ".tmp-"
ORPHAN_TEMP_FILE = re.compile(re.escape(TEMP_PREFIX) + r"[a-z0-9_]{8}")
PACKAGE = "tff_clustered."


class CheckpointError(RuntimeError):
    pass


@contextlib.contextmanager
def hold_run_folder(output_dir: str) -> Iterator[None]:
    """An exclusive lock on `output_dir` while the block runs; another process holding it:
    `CheckpointError` naming that process (its pid is written in the lock file), and one
    naming the problem when the folder cannot be made or written (a file, read-only, full)."""
    make_output_folder(output_dir)
    path = os.path.join(output_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, user_file_mode())
    except OSError as e:
        raise CheckpointError(output_folder_problem(output_dir, e)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise CheckpointError(
                f"{output_dir} is in use by another run (pid {holder}); wait for it to end "
                "(then --resume continues it) or choose another --output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        remove_orphan_temp_files(output_dir)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def remove_orphan_temp_files(folder: str) -> list[str]:
    """Deletes the temporary files killed runs left in `folder` (names matching
    `ORPHAN_TEMP_FILE` exactly, regular files only) and returns their names. Call it only while
    holding the folder (`hold_run_folder`): no other run can then be writing one."""
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if ORPHAN_TEMP_FILE.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(name)
    return removed


def refuse_held_run_folder(output_dir: str) -> None:
    """Makes `output_dir` and refuses it at once (`CheckpointError`) if another run holds it:
    before a TFF worker is started and writes its log there. The run then holds the folder
    itself with `hold_run_folder`."""
    with hold_run_folder(output_dir):
        pass


def make_output_folder(output_dir: str) -> None:
    """`os.makedirs`, with a folder that cannot be made (a file in the way, read-only, full)
    refused by a `CheckpointError` naming the problem and the fix."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise CheckpointError(output_folder_problem(output_dir, e)) from None


def output_folder_problem(output_dir: str, error: OSError) -> str:
    """One line for an output folder the run cannot make or write, with the fix."""
    if error.errno in (errno.EEXIST, errno.ENOTDIR):
        what = "is a file, or inside one, not a folder"
    elif error.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "has no space left (or the disk quota is used up)"
    elif error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        what = "cannot be written (read-only file system, or no permission)"
    else:
        what = f"cannot be used ({error.strerror})"
    where = error.filename or output_dir
    return f"--output_dir={output_dir}: {where} {what}; choose another --output_dir or fix it"


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import (before any thread starts): reading the umask means setting it, so
# reading it per write could race with another thread creating a file.
_UMASK = _read_umask()


def user_file_mode() -> int:
    """The mode `open()` would give a new file: 0666 less the process's umask."""
    return 0o666 & ~_UMASK


def atomic_write_bytes(path: str, payload: bytes) -> None:
    """Writes `payload` to `path` so that readers see the old or the new file, never a mix. The
    file takes the user's umask like any file they write (a temporary file would be 0600)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        os.fchmod(fd, user_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# -- a JSON tree with arrays by reference ------------------------------------------------------


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON-able form of `value`; arrays go to `arrays` and are referenced by name."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)  # NaN and infinity: JSON's common extension, read back as such
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("object arrays cannot be checkpointed")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"ndarray": name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: _encode(getattr(value, f.name), arrays) for f in dataclasses.fields(cls)}
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}[type(value)]
        items = sorted(value, key=repr) if kind in ("set", "frozenset") else value
        return {kind: [_encode(v, arrays) for v in items]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    raise TypeError(f"a checkpoint cannot hold a {type(value).__name__}")


def _dataclass(name: str) -> type:
    """A dataclass of this package by `module:qualname`; anything else is refused."""
    if not isinstance(name, str):
        raise CheckpointError(f"a state class name is a {type(name).__name__}, not a name")
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith(PACKAGE) or not qualname:
        raise CheckpointError(f"it names {name!r}, which is not a tff-clustered state class")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise CheckpointError(f"it names an unknown state class {name!r}") from e
    if not (isinstance(found, type) and dataclasses.is_dataclass(found)):
        raise CheckpointError(f"it names {name!r}, which is not a state class")
    return found


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _decode(tree: Any, arrays: Any) -> Any:
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, dict) and len(tree) == 1:
        ((kind, body),) = tree.items()
        if kind == "ndarray":
            if not isinstance(body, str) or body not in arrays:
                raise CheckpointError(f"array {body!r} is missing")
            return arrays[body]
        if kind in ("list", "tuple", "set", "frozenset") and isinstance(body, list):
            items = [_decode(v, arrays) for v in body]
            if kind in ("set", "frozenset") and not all(_hashable(v) for v in items):
                raise CheckpointError(f"a {kind} holds an unhashable item")
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
        if kind == "dict" and isinstance(body, list):
            if not all(isinstance(pair, list) and len(pair) == 2 for pair in body):
                raise CheckpointError("a dict entry is not a (key, value) pair")
            decoded = [(_decode(k, arrays), _decode(v, arrays)) for k, v in body]
            if not all(_hashable(k) for k, _ in decoded):
                raise CheckpointError("a dict key is not hashable")
            return dict(decoded)
    if isinstance(tree, dict) and set(tree) == {"dataclass", "fields"}:
        cls = _dataclass(tree["dataclass"])
        if not isinstance(tree["fields"], dict):
            raise CheckpointError(f"its {cls.__name__} has no fields")
        fields = {k: _decode(v, arrays) for k, v in tree["fields"].items()}
        _check_field_types(cls, fields)
        try:
            return cls(**fields)
        except TypeError as e:
            raise CheckpointError(f"its {cls.__name__} does not match this version: {e}") from e
    raise CheckpointError(f"unexpected structure {str(tree)[:80]!r}")


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type at its top level (containers' items are not
    checked; hints this cannot read, e.g. a Literal or a TypeVar, pass)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    hint = origin or hint
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating))
    if hint is int:
        return isinstance(value, (int, np.integer))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_field_types(cls: type, fields: dict[str, Any]) -> None:
    """Refuses a field whose value is not of its annotated type (a crafted checkpoint would
    otherwise fail later, far from its cause)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - annotations this cannot resolve are not checked
        return
    for name, value in fields.items():
        if name in hints and not _matches(value, hints[name]):
            raise CheckpointError(
                f"its {cls.__name__}.{name} is a {type(value).__name__}, not {hints[name]}"
            )


# -- save and load -----------------------------------------------------------------------------


def save(
    path: str,
    state: RunState,
    settings: dict[str, Any],
    data_source: Optional[SourceFingerprint] = None,
) -> None:
    """Writes the checkpoint atomically; `data_source`: the files the run's data is read from
    (`load` refuses other data)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {
        "format": FORMAT_VERSION,
        "settings": _encode(settings, arrays),
        "state": _encode(state, arrays),
    }
    if data_source is not None:
        meta[DATA_SOURCE_ENTRY] = data_source.to_json()
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{META_ENTRY: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    atomic_write_bytes(path, buffer.getvalue())


def _read(path: str) -> tuple[dict, Any]:
    try:
        data = np.load(path, allow_pickle=False)
        if META_ENTRY not in data.files:
            raise CheckpointError(f"{path} is not a tff-clustered checkpoint (no {META_ENTRY})")
        meta = json.loads(data[META_ENTRY].tobytes().decode())
        arrays = {name: data[name] for name in data.files if name != META_ENTRY}
    except CheckpointError:
        raise
    except (
        OSError,
        ValueError,
        zipfile.BadZipFile,
        UnicodeDecodeError,
        EOFError,
        RecursionError,
    ) as e:
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({e}); it is not a tff-clustered checkpoint or is "
            "damaged: delete it to start over"
        ) from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"{path} is a checkpoint of format {found}, this version reads format "
            f"{FORMAT_VERSION}; start a new --output_dir"
        )
    return meta, arrays


def load(
    path: str,
    settings: dict[str, Any],
    data_source: Optional[SourceFingerprint] = None,
    warn: Callable[[str], None] = print,
) -> Optional[RunState]:
    """The saved state, or None when there is no checkpoint. Refuses other settings, other data
    than `data_source` (`refuse_changed_data`), pickles and anything that is not our format."""
    folder = os.path.dirname(os.path.abspath(path))
    for legacy in LEGACY_NAMES:
        if os.path.exists(os.path.join(folder, legacy)) and not os.path.exists(path):
            raise CheckpointError(
                f"{os.path.join(folder, legacy)} is a pickle checkpoint of an older version; it "
                "is not loaded (a pickle can run any code): start over in a new --output_dir"
            )
    if not os.path.exists(path):
        return None
    meta, arrays = _read(path)
    try:
        saved = _decode(meta.get("settings"), arrays)
        state = _decode(meta.get("state"), arrays)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {path} is refused: {e}") from None
    except RecursionError:
        raise CheckpointError(f"checkpoint {path} is refused: it is nested too deeply") from None
    if not isinstance(state, RunState) or not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a run state")
    if saved != settings:
        raise CheckpointError(other_settings_message(path, saved, settings))
    refuse_changed_data(path, meta.get(DATA_SOURCE_ENTRY), data_source, warn)
    return state


def _flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings (a run's training and algorithm options are dicts) as `a.b.c: value`."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def other_settings_message(path: str, saved: dict[str, Any], now: dict[str, Any]) -> str:
    """Why a checkpoint made under other settings is refused: only the settings that differ,
    each as `name: checkpoint X, now Y` (the name is its flag's where that is unambiguous, e.g.
    `rounds`, else its path, e.g. `training.server_optimizer.learning_rate`), and the fix."""
    old, new = _flat_settings(saved), _flat_settings(now)
    differing = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    last = [k.rsplit(".", 1)[-1] for k in old.keys() | new.keys()]

    def name(key: str) -> str:
        short = key.rsplit(".", 1)[-1]
        return short if last.count(short) == 1 else key

    def shown(settings: dict[str, Any], key: str) -> str:
        return repr(settings[key]) if key in settings else "(none)"

    details = "; ".join(
        f"{name(k)}: checkpoint {shown(old, k)}, now {shown(new, k)}" for k in differing
    )
    return (
        f"checkpoint {path} belongs to a run with other settings ({details}); resume with the "
        "checkpoint's values (the same flags as its run), or choose another --output_dir"
    )


def refuse_changed_data(
    path: str,
    saved_json: Any,
    data_source: Optional[SourceFingerprint],
    warn: Callable[[str], None],
) -> None:
    """`CheckpointError` naming the first file that differs when the data read now
    (`data_source`) is not what checkpoint `path` recorded. A checkpoint written before
    checkpoints recorded their data (no entry) is accepted with a warning through `warn`:
    its settings still match, and the next checkpoint records the data."""
    if data_source is None or not data_source.files:
        return  # no files: data generated from the settings, which matched
    if saved_json is None:
        warn(
            f"warning: checkpoint {path} predates data fingerprints, so it cannot tell whether "
            f"the data under {data_source.root} changed since; resuming (the next checkpoint "
            "records it)"
        )
        return
    saved = SourceFingerprint.from_json(saved_json)
    if saved is None:
        raise CheckpointError(
            f"checkpoint {path} is refused: its {DATA_SOURCE_ENTRY} is damaged; start over in "
            "a new --output_dir"
        )
    change = data_source.change_since(saved)
    if change is not None:
        raise CheckpointError(
            f"the data under {data_source.root} changed since the checkpoint {path}: {change}; "
            "restore the data as it was, or start over in a new --output_dir"
        )


def exists(folder: str) -> bool:
    """Whether `folder` holds a checkpoint (of this or an older format)."""
    return any(os.path.exists(os.path.join(folder, n)) for n in (CHECKPOINT_NAME, *LEGACY_NAMES))
