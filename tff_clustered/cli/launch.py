"""Every binary's start, written once: signals, TensorFlow quieted, its module imported.

Its console entry point (`setup.cfg`), which `binaries/NAME.py` calls too, quiets TensorFlow
and stops at once on a signal before it imports the binary's module (`tff_clustered.cli.NAME`),
then runs that module's `work()`.

Light (the standard library and absl only): nothing here may import TensorFlow, which must be
quieted before it loads (`logs.quiet_tensorflow`; tests/test_binary_logs.py checks it)."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from types import ModuleType

from absl import flags

from tff_clustered.cli import exits, logs
from tff_clustered.runtime import signals

# When the binary's process began its imports: a run's phases count from here (`train.py`).
STARTED = time.perf_counter()
# The checkout the package runs from (scripts/bootstrap.sh installs it editable): the results,
# requirements, docs and testdata folders the binaries read and write.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def imported(binary: str, loads_tensorflow: bool = True) -> ModuleType:
    """The module of `binary` (`tff_clustered.cli.BINARY`), imported once the process stops at
    once on Ctrl-C / SIGTERM / SIGHUP (one line, nothing written yet) and TensorFlow's logs are
    quieted. `loads_tensorflow=False` (the worker, which must stay single-threaded and handles
    its own signals): imported as it is. absl's `--help` shows the module's docstring and its
    key flags, as when the module was the script run."""
    if loads_tensorflow:
        signals.stop_at_once_on_signals(f"{binary}.py")
        logs.quiet_tensorflow(sys.argv)
    module = importlib.import_module(f"tff_clustered.cli.{binary}")
    if loads_tensorflow:
        logs.quiet_python_logs(sys.argv)
    sys.modules["__main__"].__doc__ = module.__doc__
    for flag in flags.FLAGS.get_key_flags_for_module(module.__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    return module


def launch(binary: str, loads_tensorflow: bool = True) -> None:
    """Runs `binary`'s work (`work()` of its module, `imported`). A binary that loads
    TensorFlow ends as soon as its work has (`exits.end_now`), not seconds after its last
    line."""
    module = imported(binary, loads_tensorflow)
    if not loads_tensorflow:
        module.work()
        return
    try:
        module.work()
    except SystemExit as e:
        exits.end_now(e.code)
    exits.end_now(0)


# The console entry points (`setup.cfg`'s console_scripts), one per binary.
benchmark = functools.partial(launch, "benchmark")
check_results = functools.partial(launch, "check_results")
client_store_cost = functools.partial(launch, "client_store_cost")
compare = functools.partial(launch, "compare")
docs_tables = functools.partial(launch, "docs_tables")
doctor = functools.partial(launch, "doctor")
gpu_check = functools.partial(launch, "gpu_check")
model_matrix = functools.partial(launch, "model_matrix")
train = functools.partial(launch, "train")
worker = functools.partial(launch, "worker", loads_tensorflow=False)
