"""Where a training round's time goes on TFF's runtime: wall, this process's CPU, the worker's.

Runs `binaries/train.py` with the flags given after `--`, times each call of a round's `next`
(`TrainingCalls.train`: building the inputs, TFF's sending and its results, the worker's
training) and prints per round its wall seconds, this process's CPU seconds (all its threads:
TFF's event loop serializes there) and the CPU seconds of its TFF worker (the `worker_binary`
child: the training and TFF's executor). With `--functions` (needs `pip install yappi`), it
also prints the functions this process spent its CPU in over the rounds after the first (which
builds the round), heaviest first: the split docs/performance.md quotes.

    python scripts/tff_round_profile.py [--functions] -- --execution=tff --dataset=... ...
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_cpu() -> float:
    """CPU seconds of this process's TFF worker (`worker_binary`) so far."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if "worker_binary" in " ".join(child.cmdline()):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def profiled_train(functions: bool) -> list[tuple[float, float, float]]:
    """Wraps `TrainingCalls.train` to time each call; returns the list it fills."""
    from tff_clustered.loop import training_call

    rows: list[tuple[float, float, float]] = []
    original = training_call.TrainingCalls.train

    def timed(self: Any, request: Any, store: Any = None) -> Any:
        worker, ours, wall = worker_cpu(), time.process_time(), time.perf_counter()
        if functions and rows:
            import yappi

            yappi.start()
        try:
            return original(self, request, store)
        finally:
            if functions and rows:
                yappi.stop()
            rows.append(
                (time.perf_counter() - wall, time.process_time() - ours, worker_cpu() - worker)
            )

    training_call.TrainingCalls.train = timed
    return rows


def main() -> None:
    """The run of the flags after `--`, its rounds timed (see the module docstring)."""
    functions = "--functions" in sys.argv[: sys.argv.index("--")]
    sys.argv = ["train.py", *sys.argv[sys.argv.index("--") + 1 :]]
    if functions:
        import yappi

        yappi.set_clock_type("cpu")
    rows = profiled_train(functions)
    from tff_clustered.cli import launch

    try:
        launch.train()
    except SystemExit as exit_code:  # absl's exit at the end of a run: print the figures
        if exit_code.code:
            raise
    for wall, ours, worker in rows:
        print(
            f"round: wall {wall:.3f} s, this process's CPU {ours:.3f} s, worker CPU {worker:.3f} s"
        )
    for i, name in enumerate(("wall", "this process's CPU", "worker CPU")):
        values = [row[i] for row in rows[1:]]
        print(
            f"{name}: median {statistics.median(values):.3f} s, {min(values):.3f}-{max(values):.3f}"
        )
    if functions:
        import yappi

        stats = yappi.get_func_stats()
        stats.sort("ttot")
        for stat in list(stats)[:40]:
            where = stat.module.split("site-packages/")[-1]
            print(
                f"{stat.ttot:8.3f} {stat.tsub:8.3f} {stat.ncall:7d}  "
                f"{where}:{stat.lineno} {stat.name}"
            )


if __name__ == "__main__":
    main()
