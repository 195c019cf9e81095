"""Owns the TFF execution context and the lifetime of TFF's C++ `worker_binary`.

TFF 0.87 runs every computation in a separate C++ process, its local `worker_binary`. TFF
starts that process from its default execution context and stops it only in the `__del__` of
the object that manages it (its service manager), and Python does not run that `__del__` at
interpreter exit: after `sys.exit`, an uncaught exception or a signal, the worker is left
running, and a SIGKILLed parent always leaves it behind. This module starts that worker itself,
so that it can guarantee it stops:

* on normal exit, on an exception, on Ctrl-C, SIGTERM and SIGHUP (`stop()` via `atexit`/signal
  handler);
* even when the parent is SIGKILLed: the worker is started with `PR_SET_PDEATHSIG`, so the
  kernel kills it when its parent dies;
* at once when the run was started in the background: the worker starts with SIGINT and
  SIGTERM at their default action, even when its parent ignores them (`prepare_worker_child`).

`start()` does not wait for the local worker to answer (it takes about a second to start): the
run loads its data and builds its rounds meanwhile, and the first call to the worker waits
until it answers (`worker_connection.FailFastStub`), raising the same error as before if it
exited at start-up.

The worker's output goes to a log file, never to the parent's stdout, so a shell pipeline such
as `train.py | tee log` cannot hang on it.

With `execution="in_process"` nothing is started: rounds run in this process
(`federated/in_process.py`). Otherwise, contexts:
* `local` (default): one worker on localhost, talked to over gRPC (TFF's own C++ runtime).
* `remote`: workers already running elsewhere (`--workers=host1:port1,host2:port2,...`, each
  started with `binaries/worker.py`), reached with the same `RemoteExecutor` stack. With
  several, each round's clients are split over them (`federated/sharded.py`); computations
  that are not split run on the first.

A worker that stops answering fails the call with `WorkerLostError` naming it
(`worker_connection.py`). `stop()` also gives TFF back the default execution context it found.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import importlib.util
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Optional

from tff_clustered.runtime.signals import (
    Terminated,
    keep_swallowed_signals_quiet,
    raise_terminated,
)
from tff_clustered.runtime.worker_connection import (
    WorkerConnection,
    WorkerLostError,
    wait_until_ready,
)

__all__ = ["WorkerLostError"]  # raised by a run's calls; importers catch it from here

_PR_SET_PDEATHSIG = 1
WORKER_TAG_ENV = "TFF_CLUSTERED_RUN_TAG"
# The started runtime's workers, `(address, execution context)` in `--workers` order.
_ACTIVE_WORKERS: tuple[tuple[str, object], ...] = ()
# How the started runtime's rounds get each client's training examples (`RuntimeConfig`).
CLIENT_DATA = ("auto", "sent", "read_on_worker")
_ACTIVE_CLIENT_DATA = "sent"


def client_data() -> str:
    """The started runtime's `client_data` ("sent" when none is started)."""
    return _ACTIVE_CLIENT_DATA


def worker_contexts() -> tuple[tuple[str, object], ...]:
    """`(address, context)` of each worker of the started runtime; empty when none is started
    (or rounds run in process). Computations invoked under a context run on its worker."""
    return _ACTIVE_WORKERS


def workers_here() -> bool:
    """Whether every worker of the started runtime runs on this machine (a loopback address:
    the local worker, or `--workers` on localhost), so that it reads this machine's files."""
    hosts = [address.rsplit(":", 1)[0].strip("[]") for address, _ in _ACTIVE_WORKERS]
    return bool(hosts) and all(h in ("localhost", "::1") or h.startswith("127.") for h in hosts)


def worker_binary_path() -> str:
    """Path of the C++ worker shipped in the tensorflow-federated wheel (found without importing
    TensorFlow: `worker_service` must stay single-threaded until it has its namespace)."""
    spec = importlib.util.find_spec("tensorflow_federated")
    if spec is None or spec.origin is None:
        raise RuntimeError("tensorflow_federated is not installed: run `make test` once.")
    path = os.path.join(os.path.dirname(spec.origin), "data", "worker_binary")
    if not os.path.isfile(path):
        raise RuntimeError(
            f"TFF's worker binary is missing at {path}. Reinstall the environment: "
            "`make clean-env` then `make test`."
        )
    return path


_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here: no dlopen in a forked child
_LIBC.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
_LIBC.signal.restype = ctypes.c_void_p
_SIG_DFL = None  # a null handler: the signal's default action
# The signals that stop a worker (`stop_process`) or its parent (`signals.STOPPING_SIGNALS`).
_WORKER_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def prepare_worker_child() -> None:
    """preexec_fn of a worker, in the child between fork and exec (calls into libc only):

    * the kernel SIGKILLs the worker when its parent process dies;
    * SIGINT, SIGTERM and SIGHUP take their default action (end the worker) and are not
      blocked: a signal ignored in the parent stays ignored across exec, and a run started in
      the background (`nohup ... &`, a shell's `&` without job control) ignores SIGINT, which
      `stop_process` sends (its worker then ran until killed 10 s later)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for signum in _WORKER_STOPPING_SIGNALS:
        _LIBC.signal(signum, _SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WORKER_STOPPING_SIGNALS)


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGINT, then SIGKILL if `process` has not exited within `timeout_s`. A stopped process
    (SIGSTOP: the silent worker `WorkerLostError` names) is continued so that it sees the
    SIGINT at once."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How computations run. `execution`: "tff" (TFF's runtime: `workers`, empty for one
    local worker started here) or "in_process" (TensorFlow in this process, on `device` when
    named, else its choice: a GPU if it sees one; no worker is started). `client_data`: how a
    TFF round gets each client's training examples when the data is a file of TFF's SQL format
    (`--dataset=tff_sql`): "sent" as arrays by this process, "read_on_worker" by the worker from
    the file (which it must be able to open at the same path), "auto" the faster of the two
    for the setting (`federated/executions.reads_on_worker`); other data is always sent."""

    execution: str = "tff"
    device: Optional[str] = None
    workers: tuple[str, ...] = ()
    client_data: str = "auto"
    max_concurrent_computation_calls: int = -1
    log_dir: Optional[str] = None
    # glibc malloc arenas of the local worker (MALLOC_ARENA_MAX); 0 leaves glibc's default
    # (8 per core). The worker's many threads each keep freed memory in their own arena, which
    # shows as resident memory growing round after round (docs/performance.md, memory figures).
    worker_malloc_arenas: int = 4
    # How long to wait for each of `workers` to answer at start.
    connect_timeout_s: float = 30.0
    # While a call to a worker is under way, the worker is probed every `probe_every_s` and must
    # answer within `worker_timeout_s`, or the call fails with `WorkerLostError`.
    worker_timeout_s: float = 30.0
    probe_every_s: float = 10.0

    def __post_init__(self) -> None:
        if self.execution not in ("tff", "in_process"):
            raise ValueError(f"execution must be tff or in_process, got {self.execution!r}")
        if self.client_data not in CLIENT_DATA:
            raise ValueError(f"client_data must be one of {CLIENT_DATA}, got {self.client_data!r}")
        if self.execution == "in_process" and self.client_data == "read_on_worker":
            raise ValueError(
                "--client_data=read_on_worker has TFF's workers read the data; "
                "--execution=in_process has none. Drop one of the two."
            )
        if self.execution == "in_process" and self.workers:
            raise ValueError(
                "--workers are TFF workers; --execution=in_process runs rounds in this process. "
                "Drop one of the two."
            )
        if self.device and self.execution != "in_process":
            raise ValueError(
                f"--device={self.device} places the in-process round; TFF's worker runs on its "
                "own CPU. Add --execution=in_process or drop --device."
            )
        for name, seconds in (
            ("--worker_timeout", self.worker_timeout_s),
            ("probe_every_s", self.probe_every_s),
        ):
            if not 0 < seconds < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds}")
        if self.worker_malloc_arenas < 0:
            raise ValueError("worker_malloc_arenas must be >= 0 (0: glibc's default)")
        for address in self.workers:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"worker address {address!r} is not HOST:PORT; start workers with "
                    "`worker_binary --port=PORT` and pass --workers=host1:port,host2:port."
                )
            if not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"worker address {address!r}: port {port} is not a TCP port (1-65535); "
                    "give the --port its worker was started with."
                )


class TffRuntime:
    """Starts and stops the execution context. Use as a context manager or call start/stop."""

    def __init__(self, config: RuntimeConfig = RuntimeConfig()) -> None:
        self.config = config
        self._process: Optional[subprocess.Popen] = None
        self._log_file = None
        self._previous_handlers: dict[int, object] = {}
        self._outer_workers: tuple[tuple[str, object], ...] = ()
        self._outer_client_data = "sent"
        # TFF's default context when this runtime started, put back when it stops.
        self._outer_default_context: object = None
        # Every worker connection this runtime made, closed when it stops.
        self._connections: list[WorkerConnection] = []
        # The stopping signal whose handler stopped the workers, if one did.
        self.stopped_by_signal: Optional[int] = None
        self.started = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> TffRuntime:
        if self.started:
            return self
        if self.config.execution == "in_process":  # nothing of TFF's runs
            self.started = True
            return self
        global _ACTIVE_WORKERS, _ACTIVE_CLIENT_DATA
        # (When no worker can be reached below, TFF's import-time context is dropped at exit by
        # the hook in `tff_clustered/__init__.py`, before its `__del__` could fail.)
        if self.config.workers:
            for address in self.config.workers:
                wait_until_ready(address, None, self.config.connect_timeout_s)
            targets = {address: None for address in self.config.workers}
        else:  # started first (it starts while TFF is imported and the data loads); its first
            # call waits until it answers
            target = self._start_local_worker()
            targets = {target: functools.partial(wait_until_ready, target, self._process)}
        import tensorflow_federated as tff

        self._connections = [
            WorkerConnection(
                target, self.config.worker_timeout_s, self.config.probe_every_s, until_ready
            )
            for target, until_ready in targets.items()
        ]
        contexts = tuple((c.target, c.context) for c in self._connections)
        self._outer_default_context = _default_context()
        tff.framework.set_default_context(contexts[0][1])
        self._outer_workers, _ACTIVE_WORKERS = _ACTIVE_WORKERS, contexts
        self._outer_client_data, _ACTIVE_CLIENT_DATA = _ACTIVE_CLIENT_DATA, self.config.client_data
        atexit.register(self.stop)
        self._install_signal_handlers()
        self.started = True
        return self

    def stop(self) -> None:
        """Puts back the execution context that was TFF's default before `start` (TFF's own,
        the user's, or an outer runtime's), closes this runtime's executors on their workers
        while they still answer, then stops the local worker (SIGINT, then SIGKILL) and
        restores signal handlers. Nothing this runtime built talks to a worker afterwards."""
        global _ACTIVE_WORKERS, _ACTIVE_CLIENT_DATA
        if self.started and self.config.execution == "tff":
            _ACTIVE_WORKERS, self._outer_workers = self._outer_workers, ()
            _ACTIVE_CLIENT_DATA = self._outer_client_data
            import tensorflow_federated as tff

            tff.framework.set_default_context(self._outer_default_context)
            self._outer_default_context = None
        self._stop_workers()
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        self.started = False

    def _stop_workers(self) -> None:
        """Closes this runtime's executors on their workers while they still answer, then
        stops the local worker (SIGINT, then SIGKILL). A computation run on this runtime's
        context afterwards fails, naming the stopped runtime."""
        connections, self._connections = self._connections, []
        lost = any(connection.lost for connection in connections)
        for connection in connections:
            connection.close()
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, timeout_s=0.0 if lost else 10.0)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> TffRuntime:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def worker_pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    # -- internals ---------------------------------------------------------------------------
    def _start_local_worker(self) -> str:
        import portpicker

        port = portpicker.pick_unused_port()
        log_dir = self.config.log_dir or tempfile.gettempdir()
        os.makedirs(log_dir, exist_ok=True)
        self._log_file = open(os.path.join(log_dir, f"tff_worker_{port}.log"), "wb")  # noqa: SIM115
        args = [
            worker_binary_path(),
            f"--port={port}",
            f"--max_concurrent_computation_calls={self.config.max_concurrent_computation_calls}",
        ]
        env = dict(os.environ)
        if self.config.worker_malloc_arenas:
            env["MALLOC_ARENA_MAX"] = str(self.config.worker_malloc_arenas)
        self._process = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=prepare_worker_child,
        )
        return f"localhost:{port}"

    def _install_signal_handlers(self) -> None:
        """SIGTERM and SIGHUP stop the worker first, then end the work (`Terminated`).

        The handler leaves this runtime's (stopped) context as TFF's default until the work
        unwinds through `stop`. Python ignores an exception raised inside a garbage-collection
        callback or a `__del__`, where a handler can run: the work then goes on, and its next
        computation must fail (`tff_runtime` raises the signal's `Terminated` for it) rather
        than run on TFF's own context, which starts a worker of its own that nothing stops (it
        outlived its run, parent PID 1)."""

        def on_stopping_signal(signum: int, frame: object) -> None:
            self.stopped_by_signal = signum
            self._stop_workers()
            raise_terminated(signum)

        keep_swallowed_signals_quiet()

        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_IGN:
                continue  # started ignored (nohup, a background job): stays ignored
            with contextlib.suppress(ValueError):  # not in the main thread: atexit covers us
                self._previous_handlers[signum] = signal.signal(signum, on_stopping_signal)


def _default_context() -> object:
    """The context at the bottom of TFF's context stack (the one `set_default_context`
    replaces), whatever contexts are installed above it."""
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

    return context_stack_impl.context_stack._stack[0]  # no public getter in TFF 0.87


@contextlib.contextmanager
def tff_runtime(config: RuntimeConfig = RuntimeConfig()) -> Iterator[TffRuntime]:
    """`with tff_runtime(): ...` runs the body on a fresh context and always stops its worker.
    An error of the body after a stopping signal stopped the workers is its consequence (the
    body went on after Python swallowed the signal's exception): the signal's `Terminated`
    is raised instead."""
    runtime = TffRuntime(config)
    try:
        yield runtime.start()
    except Exception:
        if runtime.stopped_by_signal is None:
            raise
        raise Terminated(runtime.stopped_by_signal) from None
    finally:
        runtime.stop()
