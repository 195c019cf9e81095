"""TensorFlow's logs quieted by default, and this project's warnings shown.

Quiet TensorFlow by default. Importing TensorFlow (and TFF) prints dozens of C++ log lines
(CUDA factory registration, oneDNN, TensorRT, CPU features, grappler sessions) and Python
warnings (AutoGraph) that say nothing about a run. Binaries call `quiet_tensorflow` before
TensorFlow is imported; `--tf_logs` (or an explicit TF_CPP_MIN_LOG_LEVEL) shows them again.
This project's own warnings (its `logging` loggers, e.g. a SQLite file without an index)
always reach the user, as `warning: ...` lines on stderr (`show_package_warnings`).

This module imports nothing heavy, so it can run first.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from absl import logging as absl_logging

FLAG = "tf_logs"
FLAG_HELP = "Show TensorFlow's own log lines (C++ and Python), hidden by default."


def wants_tf_logs(argv: Sequence[str]) -> bool:
    """Whether the command line asks for TensorFlow's logs (read before absl parses it)."""
    on = {f"--{FLAG}", f"--{FLAG}=true", f"--{FLAG}=True", f"--{FLAG}=1"}
    shown = False
    for arg in argv[1:]:
        if arg in on:
            shown = True
        elif arg in (f"--no{FLAG}", f"--{FLAG}=false", f"--{FLAG}=False", f"--{FLAG}=0"):
            shown = False
    return shown


def quiet_tensorflow(argv: Sequence[str]) -> None:
    """Before TensorFlow is imported: hide its C++ logs below FATAL and AutoGraph's notes,
    unless asked for (`--tf_logs`) or the user set TF_CPP_MIN_LOG_LEVEL themselves. After the
    import, `quiet_python_logs` hides the Python-side warnings too."""
    if wants_tf_logs(argv):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("AUTOGRAPH_VERBOSITY", "0")


def quiet_python_logs(argv: Sequence[str]) -> None:
    """TensorFlow's Python logger (AutoGraph's "could not transform" notes) to errors only;
    this project's warnings shown (`show_package_warnings`)."""
    show_package_warnings()
    if wants_tf_logs(argv):
        return
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    absl_logging.set_verbosity(absl_logging.ERROR)


PACKAGE = "tff_clustered"


class WarningLines(logging.Handler):
    """A record as one `warning: message` line on the stderr of the moment (a binary run
    inside a test writes to the stream the test captures)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", file=sys.stderr)


def show_package_warnings() -> None:
    """This project's loggers (`tff_clustered.*`) print their warnings and errors as
    `WarningLines`, whatever absl does to the root logger (`set_verbosity(ERROR)` above hides
    every warning that reaches it)."""
    logger = logging.getLogger(PACKAGE)
    if not any(isinstance(h, WarningLines) for h in logger.handlers):
        logger.addHandler(WarningLines(logging.WARNING))
    logger.setLevel(logging.WARNING)
    logger.propagate = False
