"""A TFF worker for other machines' runs (`binaries/worker.py`), reachable only where we say.

TFF's `worker_binary` runs any computation it is sent, has no authentication, and always
listens on every interface (`[::]:PORT`, no flag to change it). So this service does not let
it: it binds the public socket itself, on `--listen` (loopback unless told otherwise), then
moves into a private network namespace of its own (an unprivileged user + network namespace:
only a loopback device, invisible from outside) and starts `worker_binary` there. Connections
accepted on the public socket are relayed byte for byte to the worker inside. Nothing but the
public socket can reach the worker, and the worker dies with the service (PDEATHSIG).

The namespace must be entered before any thread exists (the kernel refuses `unshare` of a
user namespace in a multi-threaded process), so this module imports neither TensorFlow nor
gRPC (`runtime` imports neither at module level).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Optional

from tff_clustered.runtime.context import prepare_worker_child, stop_process, worker_binary_path

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
INNER_PORT = 10000  # the worker's port inside the private namespace (nothing else is there)
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class WorkerServiceError(RuntimeError):
    """The service cannot start as asked; the message says what to change."""


def bind_public_socket(listen: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise WorkerServiceError(
                f"port {port} on {listen} is in use: pick another --port."
            ) from None
        raise WorkerServiceError(
            f"cannot listen on {listen}:{port} ({e.strerror}): --listen must be an address of "
            "this machine (127.0.0.1, a private-network address, or 0.0.0.0 for every one)."
        ) from None
    sock.listen(64)
    return sock


def enter_private_network() -> None:
    """Moves this (single-threaded) process into a new network namespace whose only device is
    an up loopback; sockets opened before keep their own namespace."""
    if threading.active_count() > 1:
        raise WorkerServiceError("internal: the namespace must be entered before any thread")
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        reason = os.strerror(ctypes.get_errno())
        raise WorkerServiceError(
            f"this machine refuses a private network namespace ({reason}), so TFF's worker "
            "cannot be kept off other interfaces. Enable unprivileged user namespaces (e.g. "
            "`sysctl kernel.unprivileged_userns_clone=1`), or pass --unconfined to run TFF's "
            "worker as it is, listening on every interface: then firewall the port."
        )
    if flags & CLONE_NEWUSER:  # keep our own uid/gid inside
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        current = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", current | _IFF_UP))


def start_worker(port: int, max_concurrent_calls: int, log_path: str) -> subprocess.Popen:
    try:
        binary = worker_binary_path()
    except RuntimeError as e:  # TFF's worker binary missing
        raise WorkerServiceError(str(e)) from e
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--port={port}",
                f"--max_concurrent_computation_calls={max_concurrent_calls}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=prepare_worker_child,
        )
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise WorkerServiceError(
                f"TFF's worker exited with code {process.returncode} at start; see {log_path}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise WorkerServiceError(
                    f"TFF's worker did not listen in 60 s; see {log_path}"
                ) from None
            time.sleep(0.05)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 20):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (sink, source):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay(public: socket.socket, inner_port: int) -> None:
    """Accepts on `public` for ever, relaying each connection to the worker inside."""
    while True:
        client, _ = public.accept()
        try:
            inner = socket.create_connection(("127.0.0.1", inner_port))
        except OSError:
            client.close()
            continue
        for s in (client, inner):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(client, inner), daemon=True).start()
        threading.Thread(target=_pump, args=(inner, client), daemon=True).start()


def serve(
    port: int,
    listen: str = "127.0.0.1",
    unconfined: bool = False,
    max_concurrent_calls: int = -1,
    log_path: Optional[str] = None,
) -> int:
    """Runs the worker until SIGINT/SIGTERM (exit 0) or until it dies (exit 1)."""
    log_path = log_path or os.path.join("/tmp", f"tff_worker_service_{port}.log")
    if unconfined:
        process = start_worker(port, max_concurrent_calls, log_path)
        print(
            f"TFF worker listening on EVERY interface, port {port} (--unconfined). Anyone who "
            "can reach this port can run any code on this machine: firewall it.",
            flush=True,
        )
    else:
        public = bind_public_socket(listen, port)
        enter_private_network()
        process = start_worker(INNER_PORT, max_concurrent_calls, log_path)
        where = "loopback only" if listen in LOOPBACK else "NOT loopback"
        print(f"TFF worker listening on {listen}:{port} ({where}).", flush=True)
        if listen not in LOOPBACK:
            print(
                "Anyone who can reach this address can run any code on this machine: expose it "
                "on a private network only, or keep the default and use an SSH tunnel.",
                flush=True,
            )
        threading.Thread(target=relay, args=(public, INNER_PORT), daemon=True).start()

    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stopping.is_set() and process.poll() is None:
        stopping.wait(0.5)
    if process.poll() is not None:
        print(
            f"TFF's worker exited with code {process.returncode}; see {log_path}", file=sys.stderr
        )
        return 1
    stop_process(process)
    return 0
