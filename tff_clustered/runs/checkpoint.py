"""Atomic checkpoints of a run's `RunState`, in a format that cannot execute code.

A checkpoint is one `.npz` file (NumPy's zip of arrays, read with `allow_pickle=False`): every
array of the state is an entry, and one entry holds the rest as JSON text (format version,
the run's settings, and the state's structure, whose arrays are referenced by entry name:
`tff_clustered.runs.state_encoding`). Pickle checkpoints of older versions (`checkpoint.pkl`) are
refused, never loaded.

It is written atomically (`tff_clustered.atomic_files`), so a crash leaves either the previous
or the new checkpoint, never a torn one. Resuming with other settings is refused. With the disk
client store (`tff_clustered.loop.client_store.DiskClientStore`) it holds the store's index, not the
clients' models: the rows it names are on disk before it is written and untouched after.

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
import json
import os
import zipfile
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

import numpy as np

from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.atomic_files import atomic_write, remove_orphan_temp_files, user_file_mode
from tff_clustered.data.fingerprint import SourceFingerprint
from tff_clustered.loop.config import AggregatorConfig
from tff_clustered.loop.state import RunState
from tff_clustered.run_folder import CHECKPOINT_NAME, SUMMARY_JSON, RunFolder
from tff_clustered.runs.state_encoding import StateDecodeError, decode_tree, encode_tree

FORMAT_VERSION = 3  # npz + JSON; format 2, a pickle, is refused
META_ENTRY = "meta.json"
DATA_SOURCE_ENTRY = "data_source"  # in the meta JSON; a checkpoint without it: a warning


class CheckpointError(RuntimeError):
    """A checkpoint or run folder this run refuses, with the reason and the fix."""


@contextlib.contextmanager
def hold_run_folder(output_dir: str) -> Iterator[None]:
    """An exclusive lock on `output_dir` while the block runs; another process holding it:
    `CheckpointError` naming that process (its pid is written in the lock file), and one
    naming the problem when the folder cannot be made or written (a file, read-only, full)."""
    make_output_folder(output_dir)
    path = RunFolder(output_dir).lock
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


def refuse_held_run_folder(output_dir: str, resume: bool = False, overwrite: bool = False) -> None:
    """Makes `output_dir` and refuses it at once (`CheckpointError`) if another run holds it or
    a run this one may not write over is in it (`refuse_overwriting`): before the data is
    loaded and a TFF worker is started and writes its log there. The run then holds the folder
    itself with `hold_run_folder` and checks again."""
    with hold_run_folder(output_dir):
        refuse_overwriting(output_dir, resume, overwrite)


def refuse_overwriting(output_dir: str, resume: bool, overwrite: bool) -> None:
    """Refuses a run that would write over the run in `output_dir` unasked: a `CheckpointError`
    when the folder holds a run's outputs (`RunFolder.run_outputs`: checkpoint, summary.json,
    metrics.csv, clients.csv, client store) and neither `resume` (continue it) nor `overwrite`
    (replace it) is given, or when `resume` is given for a finished run (its summary.json)
    without a checkpoint to continue from. A run that stopped before its first checkpoint and
    left no summary has nothing finished to keep: `resume` starts it over from round 0, which
    ends where it would have. `resume` and `overwrite` together: a ValueError."""
    if resume and overwrite:
        raise ValueError(
            "--resume continues the run in --output_dir and --overwrite replaces it: pass one"
        )
    held = RunFolder(output_dir).run_outputs()
    if overwrite or not held or (resume and exists(output_dir)):
        return
    if not resume:
        raise CheckpointError(
            f"{output_dir} already holds a run ({', '.join(held)}); pass --resume to continue "
            "it, --overwrite to replace it, or choose a new --output_dir"
        )
    if SUMMARY_JSON in held:
        raise CheckpointError(
            f"{output_dir} holds a finished run ({SUMMARY_JSON}) but no {CHECKPOINT_NAME} to "
            "resume from; pass --overwrite to replace it with a new run, or choose a new "
            "--output_dir"
        )


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
        "settings": encode_tree(settings, arrays),
        "state": encode_tree(state, arrays),
    }
    if data_source is not None:
        meta[DATA_SOURCE_ENTRY] = data_source.to_json()
    entries = {**arrays, META_ENTRY: np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    atomic_write(path, lambda f: np.savez(f, **entries))


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


def saved_settings(path: str) -> Optional[dict[str, Any]]:
    """The settings a checkpoint at `path` was made with; None when there is none or it cannot
    be read (`load` then says why)."""
    try:
        saved = decode_tree(_read(path)[0].get("settings"), {}) if os.path.exists(path) else None
    except (CheckpointError, StateDecodeError, RecursionError):
        return None
    return saved if isinstance(saved, dict) else None


def load(
    path: str,
    settings: dict[str, Any],
    data_source: Optional[SourceFingerprint] = None,
    warn: Callable[[str], None] = print,
) -> Optional[RunState]:
    """The saved state, or None when there is no checkpoint. Refuses other settings, other data
    than `data_source` (`refuse_changed_data`), pickles and anything that is not our format."""
    folder = RunFolder(os.path.dirname(os.path.abspath(path)))
    for legacy in folder.legacy_checkpoints:
        if os.path.exists(legacy) and not os.path.exists(path):
            raise CheckpointError(
                f"{legacy} is a pickle checkpoint of an older version; it "
                "is not loaded (a pickle can run any code): start over in a new --output_dir"
            )
    if not os.path.exists(path):
        return None
    meta, arrays = _read(path)
    try:
        saved = decode_tree(meta.get("settings"), arrays)
        state = decode_tree(meta.get("state"), arrays)
    except StateDecodeError as e:
        raise CheckpointError(f"checkpoint {path} is refused: {e}") from None
    except RecursionError:
        raise CheckpointError(f"checkpoint {path} is refused: it is nested too deeply") from None
    if not isinstance(state, RunState) or not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a run state")
    if not same_settings(saved, settings):
        raise CheckpointError(other_settings_message(path, saved, settings))
    refuse_changed_data(path, meta.get(DATA_SOURCE_ENTRY), data_source, warn)
    refuse_non_finite_models(path, state)
    return state


def refuse_non_finite_models(path: str, state: RunState) -> None:
    """`CheckpointError` naming checkpoint `path` damaged when a model it holds (a cluster
    model, the anchor, a client's own model in the memory store) has a NaN or infinite value:
    a run stops at a non-finite model before it checkpoints one (`loop/divergence.py`), so
    the file was changed since; resumed, its first round would blame the learning rate."""
    models = {
        "a cluster model": state.cluster_models,
        "the anchor model": state.anchor,
        "a client's own model": state.client_models,  # the disk store's index: no models
    }
    for what, held in models.items():
        if any(not np.isfinite(a).all() for a in _float_arrays(held)):
            raise CheckpointError(
                f"checkpoint {path} is damaged: {what} in it has NaN or infinite values, which "
                "no run checkpoints; restore the file from a copy, or start over with "
                "--overwrite or in a new --output_dir"
            )


def _float_arrays(value: Any) -> Iterator[np.ndarray]:
    """The float arrays in `value` and in the tuples, lists and dicts inside it."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        yield value
    elif isinstance(value, (tuple, list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _float_arrays(item)


# Settings added after checkpoints were made without them, with the value such a checkpoint's
# run had (flat keys, as `_flat_settings` writes them): its run resumes when the setting is
# left at that value.
ADDED_SETTINGS = {
    "training.eval_clients": 0,
    "training.client_sampling": "fixed",
    "training.eval_at_start": True,
    "algorithm_options.fesem_estep": "server",  # FeSEM's E-step, on the server before
    "algorithm_options.uapdfl_alike_ratio": 1.0,  # UA-PDFL's calibration: a constant before
    **{
        f"training.aggregator.{name}": value
        for name, value in AggregatorConfig().settings().items()
    },
}


COLD_START_RELEASE = "training.aggregator.cold_start_release"
# The model's layers (`models.description.architecture`), which a run of a given model records
# in its settings; a checkpoint made before it was recorded resumes on its other settings (and
# the number of its model's values, `api.refuse_another_model`).
MODEL_ARCHITECTURE = "model_architecture"


def predated_values(old: dict[str, Any]) -> dict[str, Any]:
    """The values a checkpoint's run had for the settings it predates (`ADDED_SETTINGS`), from
    its flat settings `old`: a private run of an algorithm whose start reads clients' updates,
    checkpointed before the private cold start existed, read them raw."""
    values = dict(ADDED_SETTINGS)
    algorithm = ALGORITHMS.get(str(old.get("algorithm")))
    if old.get("training.aggregator.name") == "dp" and algorithm and algorithm.releases.cold_start:
        values[COLD_START_RELEASE] = "raw"
    return values


# Algorithm options whose default changed: (the default a checkpoint made before the change
# holds, today's). FedGroup's --cold_start was eager until auto became its default (2026-11-29).
EARLIER_DEFAULTS = {"cold_start": ("eager", "auto")}
OptionsT = TypeVar("OptionsT")


def options_as_checkpointed(
    path: str, options: OptionsT, log: Callable[[str], None] = print
) -> OptionsT:
    """An algorithm's `options` for resuming the checkpoint at `path`: an option at today's
    default of `EARLIER_DEFAULTS` takes the earlier default when the checkpoint's run had it,
    which is what that run did (said through `log`); the others, and options without a
    checkpoint, as given. The settings are compared after (`load`)."""
    saved = saved_settings(path)
    ran = saved.get("algorithm_options") if saved is not None else None
    if not isinstance(ran, dict) or not dataclasses.is_dataclass(options):
        return options
    earlier = {
        name: before
        for name, (before, now) in EARLIER_DEFAULTS.items()
        if getattr(options, name, None) == now and ran.get(name) == before
    }
    for name, before in earlier.items():
        now = EARLIER_DEFAULTS[name][1]
        log(
            f"resuming {path} with --{name}={before}, which its run had (the default before "
            f"--{name}={now} was); start over (--overwrite) to run with --{name}={now}"
        )
    return dataclasses.replace(options, **earlier) if earlier else options


def same_settings(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a checkpoint's settings are the run's, a setting the checkpoint predates
    (`predated_settings`) counting as the value its run had."""
    old, new = _compared(saved, now)
    return old == new


def predated_settings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The flat settings of `new` that flat settings `old` (a checkpoint's, or a baseline's:
    `scripts/compare_run_outputs.py`) predate, each at the value the run that made `old` had:
    an `ADDED_SETTINGS` setting at its `predated_values` value (another value is a change of
    the run, not returned), and the model's layers when `old` has no record of them
    (`MODEL_ARCHITECTURE`: the run's other settings decide)."""
    values = predated_values(old)
    architecture = f"{MODEL_ARCHITECTURE}."
    recorded = any(k.startswith(architecture) for k in old)
    return {
        k: v
        for k, v in new.items()
        if k not in old
        and ((k in values and values[k] == v) or (k.startswith(architecture) and not recorded))
    }


def _compared(saved: dict[str, Any], now: dict[str, Any]) -> tuple[dict, dict]:
    """The flat settings of a checkpoint and of the run, to compare: the run's without those
    the checkpoint predates at the value its run had (`predated_settings`)."""
    old, new = _flat_settings(saved), _flat_settings(now)
    predated = predated_settings(old, new)
    return old, {k: v for k, v in new.items() if k not in predated}


def _layer(key: str) -> str:
    """The model layer a flat setting of `MODEL_ARCHITECTURE` belongs to, as a key of its own
    (`model_architecture.layer 1 Dense`); another setting itself."""
    return ".".join(key.split(".")[:2]) if key.startswith(f"{MODEL_ARCHITECTURE}.") else key


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
    old, new = _compared(saved, now)
    # a model layer one side lacks is named once, not by each of its settings
    layers = [{_layer(k) for k in side if _layer(k) != k} for side in (old, new)]
    differing = sorted(
        {
            _layer(k) if _layer(k) in layers[0] ^ layers[1] else k
            for k in old.keys() | new.keys()
            if old.get(k) != new.get(k)
        }
    )
    last = [k.rsplit(".", 1)[-1] for k in old.keys() | new.keys()]

    def name(key: str) -> str:
        short = key.rsplit(".", 1)[-1]
        unique = last.count(short) == 1 and not key.startswith(MODEL_ARCHITECTURE)
        return short if unique else key

    def shown(settings: dict[str, Any], key: str, side: int) -> str:
        if key in layers[side]:
            return "(this layer)"
        return repr(settings[key]) if key in settings else "(none)"

    details = "; ".join(
        f"{name(k)}: checkpoint {shown(old, k, 0)}, now {shown(new, k, 1)}" for k in differing
    )
    return (
        f"checkpoint {path} belongs to a run with other settings ({details}); resume with the "
        "checkpoint's values (the same flags as its run), start over with --overwrite, or "
        "choose another --output_dir"
    )


def refuse_changed_data(
    path: str,
    saved_json: Any,
    data_source: Optional[SourceFingerprint],
    warn: Callable[[str], None],
) -> None:
    """`CheckpointError` naming the first file that differs when the data read now
    (`data_source`) is not what checkpoint `path` recorded. A checkpoint without a
    `DATA_SOURCE_ENTRY` is accepted with a warning through `warn`: its settings still match,
    and the next checkpoint records the data."""
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
    run_folder = RunFolder(folder)
    return any(os.path.exists(p) for p in (run_folder.checkpoint, *run_folder.legacy_checkpoints))
