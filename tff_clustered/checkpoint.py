"""Atomic checkpoints of a run's `RunState`.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one (`os.replace` is atomic on POSIX), so a crash leaves either the previous or the
new checkpoint, never a torn one. It records the run's settings; resuming with other settings
is refused. The format is a pickle of NumPy values: load only checkpoints you wrote.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Optional

from tff_clustered.orchestration import RunState

FORMAT_VERSION = 2  # 2: cluster models, client store and algorithm state of the composable core
CHECKPOINT_NAME = "checkpoint.pkl"


class CheckpointError(RuntimeError):
    pass


def atomic_write_bytes(path: str, payload: bytes) -> None:
    """Writes `payload` to `path` so that readers see the old or the new file, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
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


def save(path: str, state: RunState, settings: dict[str, Any]) -> None:
    blob = {"format": FORMAT_VERSION, "settings": settings, "state": state}
    atomic_write_bytes(path, pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))


def load(path: str, settings: dict[str, Any]) -> Optional[RunState]:
    """The saved state, or None when there is no checkpoint. Refuses other settings."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            blob = pickle.load(f)  # noqa: S301 - our own checkpoint format
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({e}); delete it to start over"
        ) from e
    if not isinstance(blob, dict) or blob.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is not a tff-clustered checkpoint of format {FORMAT_VERSION}"
        )
    saved = blob["settings"]
    differing = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if differing:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {settings.get(k)!r}" for k in differing)
        raise CheckpointError(
            f"checkpoint {path} belongs to a run with other settings ({details}); resume with "
            "the same flags, or choose a new --output_dir"
        )
    return blob["state"]
