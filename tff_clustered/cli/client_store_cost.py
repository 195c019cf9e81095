"""The cost of the clients' own models in a large population, memory store against disk.

The cost of the clients' own models in a large population, memory store against disk store:
the process's resident memory (anonymous: the heap; file: the store's mapped pages, which the
kernel may drop once written) after some clients trained, and the time and size of one
checkpoint. The models are the MLP 32-16-10's (698 values).

    python binaries/client_store_cost.py [--clients=100000] [--trained 2000 100000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tff_clustered.cli import (
    exits,  # light: quiets TensorFlow before its import
)
from tff_clustered.cli.launch import REPOSITORY
from tff_clustered.loop.client_store import (
    ClientStore,
    DiskClientStore,
    MemoryClientStore,
)
from tff_clustered.loop.state import RunState
from tff_clustered.run_folder import CLIENT_STORE_NAME, RunFolder
from tff_clustered.runs import checkpoint

# The MLP 32-16-10's variables: kernel and bias of each layer.
# Each case runs again in a process of its own (this binary, with --store).
BINARY = os.path.join(REPOSITORY, "binaries", "client_store_cost.py")
SHAPES = ((32, 16), (16,), (16, 10), (10,))


def resident_mb() -> dict[str, float]:
    """The process's resident memory in MB: anonymous (heap) and file-backed (mapped files)."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) / 1024
    return found


def fill(store: ClientStore, client_ids: list[str], rng: np.random.Generator) -> None:
    """Writes a random model for each of `client_ids`, as a round's stored outputs are written."""
    for client_id in client_ids:
        store.update(
            client_id,
            range(len(SHAPES)),
            [rng.normal(size=s).astype(np.float32) for s in SHAPES],
        )


def measured(store: ClientStore, client_ids: list[str], trained: int, folder: str) -> str:
    """`trained` clients' models written to `store`, then one checkpoint: the memory grown by
    the writes and left after the checkpoint, the checkpoint's seconds and size, as one line."""
    rng = np.random.default_rng(0)
    before = resident_mb()
    fill(store, list(rng.choice(client_ids, trained, replace=False)), rng)
    written = resident_mb()
    path = RunFolder(folder).checkpoint
    started = time.perf_counter()
    checkpoint.save(path, RunState(client_models=store.record()), {"benchmark": "client_store"})
    seconds = time.perf_counter() - started
    saved = resident_mb()
    grown = {k: f"{written[k] - before[k]:+.1f}/{saved[k] - before[k]:+.1f}" for k in before}
    return (
        f"{type(store).__name__}, {trained:,} of {len(client_ids):,} clients trained: "
        f"{grown['RssAnon']} MB anonymous, {grown['RssFile']} MB file-backed (written/after "
        f"the checkpoint); checkpoint {seconds:.3f} s, {os.path.getsize(path) / 1e6:.2f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--trained", type=int, nargs="+", default=[2_000, 100_000])
    parser.add_argument("--folder", default=None, help="where the store's file and checkpoints go")
    parser.add_argument("--store", choices=("memory", "disk"), help="one case (in this process)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="client-store-cost-")
    if args.store is None:  # each case in a fresh process, so that none reuses another's heap
        for store in ("disk", "memory"):
            for trained in args.trained:
                own = os.path.join(folder, f"{store}-{trained}")
                case = ["--store", store, "--trained", str(trained), "--folder", own]
                command = [sys.executable, BINARY, "--clients", str(args.clients), *case]
                subprocess.run(command, check=True)
        return
    os.makedirs(folder, exist_ok=True)
    client_ids = [f"client{i:07d}" for i in range(args.clients)]
    initial = tuple(np.zeros(s, np.float32) for s in SHAPES)
    if args.store == "disk":
        store: ClientStore = DiskClientStore(initial, client_ids, folder)
    else:
        store = MemoryClientStore(initial)
    print(measured(store, client_ids, args.trained[0], folder), flush=True)
    if args.store == "disk":
        path = os.path.join(folder, CLIENT_STORE_NAME)
        print(
            f"  its file: {os.path.getsize(path) / 1e6:.0f} MB apparent, "
            f"{os.stat(path).st_blocks * 512 / 1e6:.1f} MB on disk",
            flush=True,
        )


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    with exits.one_line_on_signals("client_store_cost.py: ", ""):
        main()
