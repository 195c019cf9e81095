"""How a binary exits: bad input as exit code 2, a signal as one line and its code.

absl's parser exits 2 on bad input; the work runs so that Ctrl-C / SIGTERM / SIGHUP end it with
one line and exit code 130 / 143 / 129. Light (absl only), so a binary can use it before
TensorFlow is imported."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from absl import flags

from tff_clustered.runtime.signals import (
    Terminated,
    reraise_received_signal,
    stop_cleanly_on_signals,
)

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


def run_main(binary: str, main: Callable[[list[str]], Any]) -> None:
    """`app.run(main)` for a binary that keeps no checkpoint (doctor, benchmark, gpu_check,
    model_matrix): flags parsed by `parse_flags`; Ctrl-C and SIGTERM, once `main` runs, stop
    it between two steps (its TFF worker stopped on the way out) with one line and 130 / 143,
    never a traceback. Call `stop_at_once_on_signals(binary)` in its first lines too."""
    from absl import app

    def guarded(argv: list[str]) -> Any:
        with one_line_on_signals(f"{binary}: "):
            return main(argv)

    app.run(guarded, flags_parser=parse_flags)


@contextlib.contextmanager
def one_line_on_signals(before: str, after: Callable[[], str] = lambda: "") -> Iterator[None]:
    """While the block runs (the work, after start-up): Ctrl-C, SIGTERM and SIGHUP stop it
    between two steps with the one line `{before}interrupted{after()}` (or `terminated`,
    `hung up`; `after` asked then: what the stopped work left) and exit code 130 / 143 /
    129."""
    stop_cleanly_on_signals()
    try:
        yield
        # A signal whose exception was swallowed (raised inside a garbage-collection callback
        # or a `__del__`, where Python ignores exceptions) still ends the work with its line.
        reraise_received_signal()
    except KeyboardInterrupt:
        exit_at_once(f"{before}interrupted{after()}", 130)
    except Terminated as e:
        exit_at_once(f"{before}{e.word}{after()}", 128 + e.signum)


def exit_at_once(line: str, code: int) -> NoReturn:
    """`line` on stderr and exit `code`, skipping the interpreter's shutdown but not the
    `atexit` functions (temporary folders removed: the clients' files a TFF worker read,
    issue 64; logs flushed). Called outermost, once the block has unwound (its TFF worker
    stopped, its files closed): at shutdown a TensorFlow or gRPC thread that wakes into the
    finalizing interpreter can abort the whole process ("terminate called ... FATAL: exception
    not rethrown", exit 134), as a SIGTERM to model_matrix.py did once in 7 tries. Unlike
    `end_now`, no thread is waited for: a stopped run's threads may be inside a long call."""
    print(line, file=sys.stderr)
    end_now(code, wait_for_threads=False)


def end_now(code: Any, wait_for_threads: bool = True) -> NoReturn:
    """Ends the process as `sys.exit(code)` would, without the interpreter's teardown: Python's
    own first steps of an exit run (its threads' exit hooks and joins, unless not
    `wait_for_threads`, then the `atexit` functions: a TFF runtime's stop, temporary folders
    removed, logs flushed), the standard streams are flushed, and the process exits. The
    teardown skipped, of every module and of TensorFlow's native threads, took 2-3 s after a
    run's last line with nothing left to write (every file is closed and written atomically by
    then)."""
    if code is None:
        code = 0
    elif not isinstance(code, int):  # `sys.exit("message")`: the message, exit code 1
        print(code, file=sys.stderr)
        code = 1
    if wait_for_threads:  # CPython's: as at the start of an exit
        getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`), a closed file
            stream.flush()
    os._exit(code)
