"""Arrays kept where the computations run, sent once and passed by reference afterwards.

A TFF computation's arguments are serialized and sent to the worker on every call, and for
pooled test examples that costs an order of magnitude more than scoring them (TFF's value
serialization and the gRPC transfer). `WorkerArrays` puts the arrays
on the worker once, as values of the executor the TFF context uses for unplaced computations,
and hands out references to them; TFF's context passes an argument that is already an
executor value through untouched. When that executor changes (TFF's context drops it after an
error, or its cache evicts it), the arrays are sent again. Without a TFF context that owns an
executor factory (in process, or TFF's test contexts) the arrays themselves are handed out."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any

import numpy as np

from tff_clustered.frameworks import tff


def unplaced_executor() -> Any:
    """The executor the current TFF context runs unplaced computations on (its cardinalities
    are empty), or None when the context has no executor factory."""
    factory = getattr(tff.framework.get_context_stack().current, "executor_factory", None)
    return None if factory is None else factory.create_executor({})


def run_coroutine(coroutine: Coroutine) -> Any:
    """`coroutine`'s result, also when the caller already runs an event loop (a notebook's
    cell): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


class WorkerArrays:
    """`arrays` sent to the worker once (`values()`), each as a tensor of `types[i]`: the TFF
    type the computations that take it declare for that parameter."""

    def __init__(self, arrays: tuple[np.ndarray, ...], types: tuple[tff.Type, ...]) -> None:
        if len(arrays) != len(types):
            raise ValueError(f"{len(arrays)} arrays for {len(types)} types")
        self.arrays, self.types = arrays, types
        self._executor: Any = None
        self._values: tuple = ()
        self.sends = 0  # how many times the arrays went to a worker

    def values(self) -> tuple:
        """References to the arrays on the worker the current context runs on (sent there
        first if they are not), or the arrays themselves without such a worker."""
        executor = unplaced_executor()
        if executor is None:
            return self.arrays
        if executor is not self._executor:
            self._values = ()  # the old references go with their executor
            self._values = tuple(
                run_coroutine(executor.create_value(array, tff_type))
                for array, tff_type in zip(self.arrays, self.types)
            )
            self._executor = executor
            self.sends += 1
        return self._values
