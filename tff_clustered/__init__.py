"""tff-clustered: clustered and personalized federated learning on TensorFlow Federated.

`tff_clustered.run(algorithm, train=..., model_fn=..., output_dir=...)` runs any algorithm on
your clients and Keras model (`tff_clustered.runs.api`); the algorithms are in
`tff_clustered.algorithms`, the federated core in `tff_clustered.federated`. Importing this
package is light: TensorFlow loads on first use of the API."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
from typing import Any

# gRPC core's fork handlers (enabled by default in grpcio) run at every fork of this process,
# including the one that starts TFF's worker while an earlier run's channel threads are alive.
# gRPC supports fork only before any gRPC work; in the suite an example that starts two runs
# died once with SIGSEGV right after "Other threads are currently calling into gRPC, skipping
# fork() handlers" (grpc/grpc#13998, #14055). The worker is fork-exec'd and needs no handler.
# Read when gRPC initialises, so set before TensorFlow Federated is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The Python API, imported on first use (`tff_clustered.run`): every binary imports this package
# before it quiets TensorFlow (`cli/launch.py`), so it must stay light.
_API = {
    "run": "tff_clustered.runs.api",
    "RunResult": "tff_clustered.runs.api",
    "federated_data": "tff_clustered.runs.api",
    "TrainingConfig": "tff_clustered.loop.config",
    "ServerOptimizer": "tff_clustered.federated.server_optimizers",
    "AggregatorConfig": "tff_clustered.loop.config",
    "ClusterDP": "tff_clustered.federated.cluster_dp",
    "ClusterMean": "tff_clustered.federated.cluster_aggregators",
    "ClusterRobust": "tff_clustered.federated.cluster_robust",
    "ClusterCompression": "tff_clustered.federated.cluster_encodings",
    "ClusterSecure": "tff_clustered.federated.cluster_encodings",
    "TffFactoryPerCluster": "tff_clustered.federated.tff_factory_aggregator",
    "ALGORITHMS": "tff_clustered.algorithms",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'tff_clustered' has no attribute {name!r}")


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
