"""Where a run's wall time goes: seconds per phase, for summary.json's `phases` and the log.

A run's time is split into phases that do not overlap (`PHASES`: importing, checking the
input, starting the runtime, loading the data, building the experiment, the algorithm's cold
start, the rounds, evaluation, checkpoints, writing outputs), so that they add up to the wall
time from the timer's start; what no phase covers is `unaccounted`. `PARTS` are figures
inside the phases, not added again: the rounds' training and server work (metrics.csv's
columns summed) and the time spent building rounds (tracing their TF functions and TFF's
computations), counted in whichever phase first needed each round.

Light: the standard library only, so that `binaries/train.py` can start a timer before it
imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any, Optional, TypeVar

PHASES = (
    "imports",
    "validation",
    "runtime",
    "loading",
    "building",
    "cold_start",
    "rounds",
    "evaluation",
    "checkpoints",
    "outputs",
)
PARTS = ("training", "server", "tracing")
# The phase a part is inside, when it is one phase's (tracing is wherever a round was needed).
PART_OF = {"training": "rounds", "server": "rounds"}

Item = TypeVar("Item")
_DONE: Any = object()  # what `PhaseTimer.timed` gets from an exhausted iterator


class Stopwatch:
    """Seconds between entering and leaving a `with` block (`time.perf_counter`)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.started


class PhaseTimer:
    """Seconds per phase of one run, from `started` (a `time.perf_counter` reading; default:
    now). Phases may not nest (each second is counted once); parts may sit inside phases."""

    def __init__(self, started: Optional[float] = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.seconds: dict[str, float] = {}
        self._open: Optional[str] = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Stopwatch]:
        """Times the block as phase `name` (added to what it already has)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; the phases are {', '.join(PHASES)}")
        if self._open is not None:
            raise RuntimeError(f"phase {name!r} started inside phase {self._open!r}")
        self._open = name
        try:
            with Stopwatch() as watch:
                yield watch
        finally:
            self._open = None
            self.add(name, watch.seconds)

    def timed(self, name: str, items: Iterable[Item]) -> Iterator[tuple[Item, Stopwatch]]:
        """`items` with the time of producing each (a generator's work) timed as phase `name`;
        each comes with its stopwatch. The consumer's work between items is not counted."""
        iterator = iter(items)
        while True:
            with self.phase(name) as watch:
                item = next(iterator, _DONE)
            if item is _DONE:
                return
            yield item, watch

    def add(self, name: str, seconds: float) -> None:
        """Adds `seconds` to phase or part `name` (a part: measured inside a phase)."""
        if name not in PHASES and name not in PARTS:
            raise ValueError(f"unknown phase or part {name!r}")
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def move(self, source: str, target: str, seconds: float) -> None:
        """Counts `seconds` timed as `source` as `target` instead (a part of `source`'s time
        measured separately, e.g. a round's evaluation); the sum is unchanged."""
        self.add(source, -seconds)
        self.add(target, seconds)

    def report(self) -> dict[str, Any]:
        """The phases (each of `PHASES` timed, in their order), `unaccounted`, `wall` (now
        minus `started`) and the `parts`: the phases and `unaccounted` add up to `wall`."""
        wall = time.perf_counter() - self.started
        phases = {name: self.seconds[name] for name in PHASES if name in self.seconds}
        parts = {name: self.seconds[name] for name in PARTS if name in self.seconds}
        return dict(phases, unaccounted=wall - sum(phases.values()), wall=wall, parts=parts)


def phases_line(report: dict[str, Any]) -> str:
    """The report as one log line: "time: loading 0.3 s, ..., rounds 9.1 s (training 7.0,
    server 1.2), ...; wall 12.0 s", parts in brackets after the phase they belong to."""
    parts = report["parts"]
    items = []
    for name in PHASES:
        if name not in report:
            continue
        item = f"{name.replace('_', ' ')} {report[name]:.1f} s"
        inside = [p for p in PARTS if p in parts and PART_OF.get(p) == name]
        if inside:
            item += f" ({', '.join(f'{p} {parts[p]:.1f}' for p in inside)})"
        items.append(item)
    items.append(f"unaccounted {report['unaccounted']:.1f} s")
    line = f"time: {', '.join(items)}; wall {report['wall']:.1f} s"
    if "tracing" in parts:
        line += (
            f", of which tracing {parts['tracing']:.1f} s (building rounds, in the phases above)"
        )
    return line
