"""How a run executes, as one record built once: runtime, timer and client store.

Built from the flags or the Python API's arguments: the runtime (execution, device, workers),
the timer of the run's phases, and where the clients' own models live. None of it changes what
the run computes."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.loop.client_store import checked_store_choice
from tff_clustered.loop.phases import PhaseTimer
from tff_clustered.runtime.context import RuntimeConfig


@dataclasses.dataclass(frozen=True)
class RunExecution:
    """`runtime`: where rounds run (TFF's runtime and its `workers`, or in process on a
    `device`), entered with `tff_runtime(execution.runtime)`; `timer`: the run's phases
    (default: a timer started when the record is made); `client_store`: "memory", "disk" or
    "auto" (`client_store.store_kind`), the disk store's file in `store_folder` (a run's
    folder; None: a temporary folder)."""

    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    timer: PhaseTimer = dataclasses.field(default_factory=PhaseTimer)
    client_store: str = "auto"
    store_folder: Optional[str] = None

    def __post_init__(self) -> None:
        checked_store_choice(self.client_store)

    @classmethod
    def of(cls, execution: str = "tff", device: Optional[str] = None) -> RunExecution:
        """On one local worker (`execution` "tff") or in process (on `device` when named)."""
        return cls(RuntimeConfig(execution=execution, device=device))

    def timed_anew(self) -> RunExecution:
        """This execution with a timer started now: the next run on the same runtime."""
        return dataclasses.replace(self, timer=PhaseTimer())

    def in_folder(self, folder: str) -> RunExecution:
        """This execution with the disk client store's file in `folder` (the run's folder)."""
        return dataclasses.replace(self, store_folder=folder)
