"""Times CFL's per-cluster split statistics against the update norms alone.

Times CFL's per-cluster split statistics (`cfl.split_statistics`: norms, pairwise update
cosines, optimal bipartition, gap, spread), computed for every sampled cluster in every round,
against the update norms alone, on random float32 updates of a given size (default: FEMNIST's
MCLR, 784 * 62 + 62 values). Best of 7 calls each.

    .venv/bin/python scripts/time_cfl_statistics.py [--members=20,105,200] [--values=48670]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.cfl import split_statistics


def best_seconds(function: Callable[[np.ndarray], object], updates: np.ndarray) -> float:
    return min(timeit.repeat(lambda: function(updates), number=1, repeat=7))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", default="20,105,200", help="cluster sizes, comma-separated")
    parser.add_argument("--values", type=int, default=784 * 62 + 62, help="values per update")
    args = parser.parse_args()
    try:
        sizes = [int(m) for m in args.members.split(",")]
    except ValueError:
        sys.exit(f"--members must be comma-separated integers, got {args.members!r}")
    if min(sizes) < 1 or args.values < 1:
        sys.exit("--members and --values must be >= 1")
    rng = np.random.default_rng(0)
    for size in sizes:
        updates = rng.normal(size=(size, args.values)).astype(np.float32)
        norms = best_seconds(clustering.update_norms, updates)
        stats = best_seconds(split_statistics, updates)
        print(
            f"{size} members: norms alone {norms * 1e3:.0f} ms, all statistics "
            f"{stats * 1e3:.0f} ms, the bipartition's extra {(stats - norms) * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
