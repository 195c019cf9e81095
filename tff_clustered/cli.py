"""What every binary does around its work: absl's parser, with bad input as exit code 2; and
Ctrl-C / SIGTERM / SIGHUP (a closed terminal or SSH session) as one line and exit code
130 / 143 / 129 at any moment, start-up included. Light (absl only), so a binary can use it
before TensorFlow is imported."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from absl import flags

FLAGS = flags.FLAGS


def parse_flags(argv: list[str]) -> list[str]:
    """`app.run`'s flags parser: a value absl itself rejects (not a number, out of its bounds,
    not among an enum's choices, an unknown flag) exits 2 like every other bad input, with
    absl's message naming the flag (absl's own parser exits 1), and so does a non-finite
    number (absl reads `nan` and `inf` as floats); asking for help exits 0."""
    try:
        rest = FLAGS(argv)
    except SystemExit as e:  # absl's --help/--helpfull/--helpshort print the help and exit 1
        asked = {"--help", "--helpfull", "--helpshort", "-h", "-?"} & set(argv[1:])
        raise SystemExit(0 if asked and e.code == 1 else e.code) from None
    except flags.Error as e:
        print(f"error: {e}\nPass --helpshort or --helpfull to see the flags.", file=sys.stderr)
        raise SystemExit(2) from None
    for name in FLAGS:
        value = FLAGS[name].value
        if FLAGS[name].present and isinstance(value, float) and not math.isfinite(value):
            print(f"error: --{name}={value}: give a finite number", file=sys.stderr)
            raise SystemExit(2)
    return rest


def usage_error(message: str) -> SystemExit:
    """`error: message` on stderr; raise the returned exit (code 2)."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)


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


def run_main(binary: str, main: Callable[[list[str]], Any]) -> None:
    """`app.run(main)` for a binary that keeps no checkpoint (doctor, benchmark, gpu_check,
    model_matrix): flags parsed by `parse_flags`; Ctrl-C and SIGTERM, once `main` runs, stop
    it between two steps (its TFF worker stopped on the way out) with one line and 130 / 143,
    never a traceback. Call `stop_at_once_on_signals(binary)` in its first lines too."""
    from absl import app

    def guarded(argv: list[str]) -> Any:
        with one_line_on_signals(f"{binary}: ", ""):
            return main(argv)

    app.run(guarded, flags_parser=parse_flags)


@contextlib.contextmanager
def one_line_on_signals(before: str, after: str) -> Iterator[None]:
    """While the block runs (the work, after start-up): Ctrl-C, SIGTERM and SIGHUP stop it
    between two steps with the one line `{before}interrupted{after}` (or `terminated`,
    `hung up`) and exit code 130 / 143 / 129."""
    stop_cleanly_on_signals()
    try:
        yield
        # A signal whose exception was swallowed (raised inside a garbage-collection callback
        # or a `__del__`, where Python ignores exceptions) still ends the work with its line.
        reraise_received_signal()
    except KeyboardInterrupt:
        exit_at_once(f"{before}interrupted{after}", 130)
    except Terminated as e:
        exit_at_once(f"{before}{e.word}{after}", 128 + e.signum)


def exit_at_once(line: str, code: int) -> NoReturn:
    """`line` on stderr and exit `code`, skipping the interpreter's shutdown. Called outermost,
    once the block has unwound (its TFF worker stopped, its files closed): at shutdown a
    TensorFlow or gRPC thread that wakes into the finalizing interpreter can abort the whole
    process ("terminate called ... FATAL: exception not rethrown", exit 134), as a SIGTERM
    to model_matrix.py did once in 7 tries."""
    print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_cleanly_on_signals() -> None:
    """Once the work starts (inside `run_flags.reported_errors`): Ctrl-C raises
    `KeyboardInterrupt`, SIGTERM and SIGHUP `Terminated`, so that the run stops between two
    steps, its worker is stopped and its last checkpoint is kept."""
    _RECEIVED.clear()
    for signum in STOPPING_SIGNALS:
        if signum not in _IGNORED:
            handler = raise_interrupted if signum == signal.SIGINT else raise_terminated
            signal.signal(signum, handler)
