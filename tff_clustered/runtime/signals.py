"""How a process stops on Ctrl-C, SIGTERM or SIGHUP, at any moment.

At once during start-up; between two steps once the work runs (`Terminated`,
`KeyboardInterrupt`). SIGHUP is a closed terminal or SSH session. The standard library only, so
a binary can use it before TensorFlow is imported."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

# Signals the process was started with ignored (`stop_at_once_on_signals`): never handled.
_IGNORED: set[int] = set()
# SIGINT / SIGTERM / SIGHUP received once the work started (`stop_cleanly_on_signals`).
_RECEIVED: list[int] = []
# The signals that end a run, each with the word its one line uses. SIGHUP, sent when the
# terminal or SSH session closes, stops the run as SIGTERM does (its checkpoint kept, its
# worker stopped) instead of killing the process without a word.
STOPPING_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
STOPPING_SIGNALS[signal.SIGHUP] = "hung up"


class Terminated(SystemExit):
    """SIGTERM or SIGHUP received once work has started: exit code 128 + the signal (143,
    129, as a shell reports a process ended by it). `run_flags.reported_errors` prints its one
    line."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.word = STOPPING_SIGNALS[signum]


def raise_terminated(signum: int = signal.SIGTERM, frame: object = None) -> None:
    _RECEIVED.append(signum)
    raise Terminated(signum)


def raise_interrupted(signum: int = signal.SIGINT, frame: object = None) -> None:
    _RECEIVED.append(signal.SIGINT)
    raise KeyboardInterrupt


def reraise_received_signal() -> None:
    """If SIGINT or SIGTERM arrived during the work, raise it again (`KeyboardInterrupt`,
    `Terminated`): an error that follows a signal is its consequence, e.g. the TFF worker,
    stopped by the signal's handler, no longer answering a call in flight (a gRPC call can
    absorb the handler's exception and fail with UNAVAILABLE instead). The user asked the run
    to stop; they get the signal's line and exit code, not a worker failure."""
    if _RECEIVED:
        raise KeyboardInterrupt if _RECEIVED[0] == signal.SIGINT else Terminated(_RECEIVED[0])


def keep_swallowed_signals_quiet() -> None:
    """A signal's handler runs wherever the main thread is, also inside a garbage-collection
    callback or a `__del__`, where Python ignores the handler's exception and prints it as
    "Exception ignored in ..." with a traceback (TensorFlow's `_xla_gc_callback`, issue 64).
    Such an exception is recorded (`_RECEIVED`) and raised again at the work's next step
    (`reraise_received_signal`): it is not printed. Other ignored exceptions are, as before."""
    global _HOOK_BEFORE_QUIET
    if sys.unraisablehook is not _quiet_about_signals:
        _HOOK_BEFORE_QUIET, sys.unraisablehook = sys.unraisablehook, _quiet_about_signals


def _quiet_about_signals(unraisable: Any) -> None:
    if _RECEIVED and isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        return
    _HOOK_BEFORE_QUIET(unraisable)


_HOOK_BEFORE_QUIET = sys.unraisablehook


def stop_at_once_on_signals(binary: str) -> None:
    """From a binary's first lines until its work starts (imports, flag parsing): Ctrl-C,
    SIGTERM or SIGHUP end the process at once with one line and 130 / 143 / 129. Nothing is
    written yet, and
    a `KeyboardInterrupt` raised in the middle of an import would print a traceback (or be
    swallowed by the imported code). A signal the process was started with ignored stays
    ignored, here and after."""

    def stop(signum: int, frame: object) -> None:
        name = STOPPING_SIGNALS[signum]
        os.write(2, f"{binary}: {name} during start-up; nothing was written\n".encode())
        os._exit(128 + signum)

    for signum in STOPPING_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            _IGNORED.add(signum)  # as a shell starts background jobs: left ignored
        else:
            signal.signal(signum, stop)


def stop_cleanly_on_signals() -> None:
    """Once the work starts (inside `run_flags.reported_errors`): Ctrl-C raises
    `KeyboardInterrupt`, SIGTERM and SIGHUP `Terminated`, so that the run stops between two
    steps, its worker is stopped and its last checkpoint is kept."""
    _RECEIVED.clear()
    keep_swallowed_signals_quiet()
    for signum in STOPPING_SIGNALS:
        if signum not in _IGNORED:
            handler = raise_interrupted if signum == signal.SIGINT else raise_terminated
            signal.signal(signum, handler)
