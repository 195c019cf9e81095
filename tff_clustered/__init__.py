"""tff-clustered: clustered and personalized federated learning on TensorFlow Federated.

See README.md; the algorithms are in `tff_clustered.algorithms`, the federated core in
`tff_clustered.federated`."""

from __future__ import annotations

import atexit
import contextlib
import sys


def _drop_tff_default_context() -> None:
    """Importing TensorFlow Federated installs a default context whose (never started)
    service manager has a `__del__` that fails at interpreter teardown, once `subprocess` is
    gone, printing a traceback after `--help`, a flag error or an in-process run. At exit,
    before teardown, drop that context so the `__del__` runs while it still can (a started
    runtime has stopped its worker by then: its handler is registered later, so runs first)."""
    if "tensorflow_federated" not in sys.modules:
        return
    with contextlib.suppress(Exception):
        from tensorflow_federated.python.core.impl.context_stack import set_default_context

        set_default_context.set_no_default_context()


atexit.register(_drop_tff_default_context)
