"""How this process reaches one TFF worker, and notices when it stops answering.

How this process reaches one TFF worker: TFF's own remote-executor stack over a gRPC stub
that names a worker which stops answering, instead of waiting for it or retrying for ever.

The call fails with `WorkerLostError` naming the worker's address, the run stops after its last
checkpoint, and the same command resumes it once the worker is back. A worker stops answering
in two ways:
* its connection breaks (the process or machine died): TFF would retry UNAVAILABLE without end;
* it goes silent (a stopped process, a stalled machine): the connection stays open and a call
  without a deadline waits for ever. Any fixed deadline would either cut a long round on a live
  worker or wait far too long, so a call is instead awaited in slices of
  min(`probe_every_s`, `worker_timeout_s`), and after each slice the worker must answer a
  liveness probe (an empty `Dispose`, on a connection of its own) within `worker_timeout_s`
  (`--worker_timeout`). A busy worker answers at once, whatever the length of the round; a
  silent one is named within twice `worker_timeout_s`, never before it had all of it.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from typing import Callable, Optional

GRPC_OPTIONS = [
    ("grpc.max_message_length", 2_000_000_000),
    ("grpc.max_receive_message_length", 2_000_000_000),
    ("grpc.max_send_message_length", 2_000_000_000),
]


class WorkerLostError(RuntimeError):
    """A TFF worker stopped answering mid-run (its address is in the message)."""


def wait_until_ready(
    target: str, process: Optional[subprocess.Popen], timeout_s: float = 60.0
) -> None:
    """Waits until the worker at `target` answers; `process`: ours, when we started it."""
    import grpc
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

    stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
        grpc.insecure_channel(target, GRPC_OPTIONS)
    )
    deadline = time.monotonic() + timeout_s
    while not stub.is_ready:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"TFF worker exited with code {process.returncode} at start-up")
        if time.monotonic() > deadline:
            if process is not None:
                raise RuntimeError(f"TFF worker at {target} not ready after {timeout_s:.0f}s")
            port = target.rpartition(":")[2]
            raise WorkerLostError(
                f"TFF worker {target} is unreachable (no answer in {timeout_s:.0f}s). Start it "
                f"on that machine with `python binaries/worker.py --port={port}`, "
                "reach it through an SSH tunnel or a private network (see docs/runtime.md), and "
                "check the address in --workers."
            )
        time.sleep(0.05)


class FailFastStub:
    """TFF's gRPC stub to one worker, except that a worker that stops answering raises
    `WorkerLostError` naming it: when its connection breaks (instead of TFF's `RetryableError`,
    which its execution context retries for ever) and when it goes silent (a call is awaited in
    slices of at most `worker_timeout_s`, and between slices the worker must answer a liveness
    probe within `worker_timeout_s`: a silent worker is named within twice that, and never
    before it has had `worker_timeout_s` to answer). Once named, the worker stays lost: TFF's
    clean-ups after the error (disposing of the executor and its values) return at once and
    any other call raises the same error, instead of each waiting for its own probe."""

    def __init__(
        self,
        target: str,
        worker_timeout_s: float,
        probe_every_s: float,
        until_ready: Optional[Callable[[], None]] = None,
    ) -> None:
        import grpc
        import tensorflow_federated as tff
        from tensorflow_federated.proto.v0 import executor_pb2_grpc

        self._target = target
        # Waits until a worker that is still starting answers (`wait_until_ready`), before the
        # first call: the worker starts while the run loads its data. None: it answers now.
        self._until_ready = until_ready
        self._worker_timeout_s = worker_timeout_s
        self._slice_s = min(probe_every_s, worker_timeout_s)
        channel = grpc.insecure_channel(target, GRPC_OPTIONS)
        self._stub = tff.framework.RemoteExecutorGrpcStub(channel)  # for `is_ready`
        self._calls = executor_pb2_grpc.ExecutorGroupStub(channel)
        # The probe has a connection of its own, so a large upload cannot delay its answer.
        probe_channel = grpc.insecure_channel(
            target, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        )
        self._probes = executor_pb2_grpc.ExecutorGroupStub(probe_channel)
        self._channels = (channel, probe_channel)
        self._lost: Optional[WorkerLostError] = None
        self._in_flight: set[object] = set()  # futures of calls under way, cancelled if lost
        self._lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        """After this the stub sends nothing: TFF's late clean-ups (a value's finalizer
        disposing of it, an executor's `close`) return at once, and any other call names the
        stopped runtime."""
        self.closed = True
        for channel in self._channels:
            channel.close()

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "is_ready":
            return self._stub.is_ready
        if self.closed or self._lost is not None:
            if name in ("dispose", "dispose_executor"):  # nothing left there to clear
                return lambda request: None
            if self._lost is not None:
                raise self._lost
            raise RuntimeError(
                f"the TFF runtime that reached worker {self._target} was stopped; run TFF "
                "computations under a running one "
                "(`with tff_clustered.runtime.context.tff_runtime():`)"
            )
        self._wait_until_ready()
        # TFF's stub method `create_value` is the gRPC method `CreateValue`, and so on.
        rpc = getattr(self._calls, "".join(word.title() for word in name.split("_")))
        return lambda request: self._await(rpc.future(request))

    def _wait_until_ready(self) -> None:
        """Before the first call to a worker that was starting: wait until it answers."""
        with self._lock:
            until_ready, self._until_ready = self._until_ready, None
            if until_ready is not None:
                until_ready()

    def _await(self, future: object) -> object:
        import grpc
        from tensorflow_federated.python.core.impl.executors import executors_errors

        with self._lock:
            self._in_flight.add(future)
        try:
            while True:
                try:
                    return future.result(timeout=self._slice_s)
                except grpc.FutureTimeoutError:
                    if self._lost is None and not self._answers_probe():
                        self._lose(
                            f"no answer to a liveness probe in {self._worker_timeout_s:g}s: a "
                            f"stopped process or a stalled machine; {RESUME_ADVICE}"
                        )
                    if self._lost is not None:
                        raise self._lost from None
        except grpc.FutureCancelledError:
            if self._lost is not None:  # another call found the worker lost
                raise self._lost from None
            raise
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            if self._lost is None and code in executors_errors.get_grpc_retryable_error_codes():
                self._lose(f"{code}). {RESUME_ADVICE}")
            if self._lost is not None:
                raise self._lost from None
            raise
        finally:
            with self._lock:
                self._in_flight.discard(future)

    def _lose(self, why: str) -> None:
        """Names the worker lost and cancels every call still waiting for it."""
        with self._lock:
            if self._lost is None:
                self._lost = WorkerLostError(f"TFF worker {self._target} stopped answering ({why}")
            waiting = list(self._in_flight)
        for future in waiting:
            future.cancel()

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def _answers_probe(self) -> bool:
        """True if the worker answers an empty `Dispose` within `worker_timeout_s` (any answer:
        it is alive). A probe refused at once (UNAVAILABLE: the connection could not be made)
        is sent again until that time is up, so the worker always gets all of it."""
        import grpc
        from tensorflow_federated.proto.v0 import executor_pb2

        deadline = time.monotonic() + self._worker_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._probes.Dispose(executor_pb2.DisposeRequest(), timeout=left)
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code == grpc.StatusCode.UNAVAILABLE:
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                    continue
                return code != grpc.StatusCode.DEADLINE_EXCEEDED
            return True
        return False


RESUME_ADVICE = (
    "The run stopped; its finished rounds are in its last checkpoint. Restart the worker, then "
    "run the same command with --resume."
)


class WorkerConnection:
    """One worker as TFF reaches it: TFF's own remote-executor stack (the one its local C++
    context builds) over a `_FailFastStub`, and the execution context that runs on it."""

    def __init__(
        self,
        target: str,
        worker_timeout_s: float,
        probe_every_s: float,
        until_ready: Optional[Callable[[], None]] = None,
    ) -> None:
        import tensorflow_federated as tff
        from tensorflow_federated.python.core.backends.native import compiler
        from tensorflow_federated.python.core.environments.tensorflow_frontend import (
            tensorflow_computation,
        )
        from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks

        self.target = target
        self._stub = FailFastStub(target, worker_timeout_s, probe_every_s, until_ready)

        def stack_fn(cardinalities: dict) -> object:
            if cardinalities.get(tff.CLIENTS) is None:
                cardinalities[tff.CLIENTS] = 0
            executor = tff.framework.RemoteExecutor(self._stub)
            executor.set_cardinalities(cardinalities)
            return executor

        self._factory = python_executor_stacks.ResourceManagingExecutorFactory(
            executor_stack_fn=stack_fn
        )
        self.context = tff.framework.SyncExecutionContext(
            executor_fn=self._factory,
            compiler_fn=compiler.desugar_and_transform_to_native,
            transform_args=tensorflow_computation.transform_args,
            transform_result=tensorflow_computation.transform_result,
        )

    def close(self) -> None:
        """Disposes of this connection's executors on the worker (and with them every value
        it holds for us) while it still answers, then closes the stub for good."""
        executors = list(self._factory._executors.values())  # no public list in TFF 0.87
        self._factory._executors.clear()
        for executor in executors:
            with contextlib.suppress(Exception):  # a lost worker has nothing left to clear
                executor.close()
        self._stub.close()

    @property
    def lost(self) -> bool:
        """Whether its worker was found not answering (it is then killed, not asked to stop)."""
        return self._stub.lost
