"""`clustering`: server-side clustering time against the number of clients clustered.

`clustering`: server-side EDC time as the number of clustered clients grows
(`--cluster_sizes`) at FEMNIST-MLP size d = 415,258 (`--cluster_dim`), the updates streamed from
a disk memmap (10,000 are 16.6 GB), with the planted groups' adjusted Rand index; MADC beside it
up to `--madc_max_clients` clients (EDC must stay linear in the number of clients). It runs
after TFF's worker has stopped (it needs no runtime)."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
from absl import flags
from sklearn.metrics import adjusted_rand_score

from tff_clustered import clustering
from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup

flags.DEFINE_list("cluster_sizes", ["2000", "5000", "10000"], "Clients clustered (clustering).")
flags.DEFINE_integer("madc_max_clients", 2000, "Largest P MADC is timed at (O(P^3)).")
flags.DEFINE_string("scratch_dir", None, "Where clustering's update memmaps go (default: /tmp).")
flags.DEFINE_integer("cluster_dim", 415_258, "Update length d (clustering): FEMNIST MLP.")


def planted_updates_on_disk(
    path: str, size: int, dim: int, groups: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`size` float32 updates of length `dim` in a .npy memmap at `path`: update i is
    scale_i * (center of its group + unit noise), groups drawn at random; written in blocks,
    so 10,000 x 415,258 (16.6 GB) never has to fit in memory. Returns (memmap, groups)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, groups, size)
    centers = rng.standard_normal((groups, dim), dtype=np.float32)
    updates = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(size, dim))
    for start in range(0, size, clustering.BLOCK_ROWS):
        rows = labels[start : start + clustering.BLOCK_ROWS]
        block = rng.standard_normal((len(rows), dim), dtype=np.float32)
        block += centers[rows]
        block *= rng.uniform(0.2, 5.0, (len(rows), 1)).astype(np.float32)
        updates[start : start + len(rows)] = block
    updates.flush()
    return updates, labels


def clustering_scaling(setup: Setup) -> dict:
    """EDC (and MADC, up to --madc_max_clients) seconds on P planted updates of length d
    (float32, streamed from a disk memmap), P growing; and how well EDC recovers the groups.
    The workload in `setup` is not used: the updates are planted."""
    del setup
    out: dict[str, dict] = {}
    for size in (int(s) for s in FLAGS.cluster_sizes):
        with tempfile.TemporaryDirectory(dir=FLAGS.scratch_dir) as scratch:
            start = time.perf_counter()
            updates, planted = planted_updates_on_disk(
                os.path.join(scratch, "updates.npy"), size, FLAGS.cluster_dim, FLAGS.groups, size
            )
            written = time.perf_counter() - start
            start = time.perf_counter()
            labels = clustering.cluster_edc(updates, FLAGS.groups, seed=0)
            edc = time.perf_counter() - start
            row = {
                "edc_s": round(edc, 3),
                "edc_adjusted_rand": round(adjusted_rand_score(planted, labels), 4),
                "gigabytes": round(updates.nbytes / 1e9, 2),
                "write_s": round(written, 1),
            }
            if size <= FLAGS.madc_max_clients:
                start = time.perf_counter()
                clustering.cluster_madc(np.asarray(updates), FLAGS.groups)
                madc = time.perf_counter() - start
                row.update(madc_s=round(madc, 3), madc_over_edc=round(madc / edc, 2))
            del updates
        out[str(size)] = row
        madc_text = f", MADC {row['madc_s']:.2f} s" if "madc_s" in row else ""
        print(
            f"clustering P={size} d={FLAGS.cluster_dim} ({row['gigabytes']} GB on disk): EDC "
            f"{edc:.2f} s (adjusted Rand {row['edc_adjusted_rand']}){madc_text}",
            flush=True,
        )
    sizes = sorted(out, key=int)
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        growth = out[last]["edc_s"] / out[first]["edc_s"]
        out["edc_time_growth_vs_clients_growth"] = round(growth / (int(last) / int(first)), 3)
    return out


BENCHMARK = Benchmark(clustering_scaling, in_tff_runtime=False)
