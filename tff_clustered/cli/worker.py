"""Starts a TFF worker that runs another machine's rounds (`train.py --workers=...`).

  python binaries/worker.py --port=8000                  # loopback only: reach it via SSH
  python binaries/worker.py --port=8000 --listen=10.0.0.5  # a private-network address

TFF's worker runs whatever computation it is sent and has no authentication: anyone who can
reach its port can run code on this machine. So it listens on loopback (127.0.0.1) unless
--listen names another interface, and it says where it listens when it starts. From the
machine that trains, reach a loopback worker through an SSH tunnel:

  ssh -N -L 8000:127.0.0.1:8000 user@worker-host &
  python binaries/train.py --workers=localhost:8000,...

Stops on Ctrl-C or SIGTERM, and stops TFF's worker with it.
"""

from __future__ import annotations

import sys

from absl import app, flags

# No TensorFlow here: the private network namespace must be entered while single-threaded.
from tff_clustered.cli import exits
from tff_clustered.runtime import worker_service

FLAGS = flags.FLAGS
flags.DEFINE_integer("port", None, "Port to listen on.", lower_bound=1, upper_bound=65535)
flags.DEFINE_string(
    "listen",
    "127.0.0.1",
    "Address to listen on: 127.0.0.1 (default, this machine only), a private-network address, "
    "or 0.0.0.0 (every interface). Anyone reaching it can run code here.",
)
flags.DEFINE_bool(
    "unconfined",
    False,
    "Run TFF's worker as it is, listening on every interface (for machines that refuse "
    "private network namespaces; firewall the port).",
)
flags.DEFINE_integer(
    "max_concurrent_computation_calls", -1, "TFF worker's limit on concurrent calls (-1: none)."
)
flags.DEFINE_string("log_file", None, "TFF worker's log (default /tmp/tff_worker_service_PORT.log)")
flags.mark_flag_as_required("port")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        return worker_service.serve(
            FLAGS.port,
            FLAGS.listen,
            FLAGS.unconfined,
            FLAGS.max_concurrent_computation_calls,
            FLAGS.log_file,
        )
    except worker_service.WorkerServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def work() -> None:
    """The binary's work (`launch.worker`: no TensorFlow, signals handled by the service)."""
    app.run(main, flags_parser=exits.parse_flags)
