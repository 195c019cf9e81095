"""Seconds to load a LEAF data folder: Python's json, orjson, and the arrays kept in the cache.

    python scripts/leaf_read_timing.py /path/to/leaf/data [--cycles 3]

Each cycle loads the folder's train/ and test/ (`data.leaf.load_leaf`) three ways, in turn, in
this process: parsed by Python's `json` (as before orjson), parsed by orjson, and read from the
arrays `data/leaf_cache.py` keeps (written once, in a temporary cache folder, before the
cycles). It prints each cycle's seconds and ratios, and checks that the three give the same
arrays bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from tff_clustered.data import leaf


def standard_json(path: str) -> object:
    """The file parsed by Python's own json module (the reader before orjson)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def timed_load(folder: str, cache: str) -> tuple[float, object]:
    """Seconds to load `folder` with the LEAF cache at `cache` ("off": none), and the data."""
    os.environ["TFF_CLUSTERED_CACHE"] = cache
    began = time.perf_counter()
    data = leaf.load_leaf(os.path.join(folder, "train"), os.path.join(folder, "test"))
    return time.perf_counter() - began, data


def same_arrays(a: object, b: object) -> bool:
    return a.client_ids == b.client_ids and all(
        a.arrays(split, c)[k].tobytes() == b.arrays(split, c)[k].tobytes()
        for split in ("train", "test")
        for c in a.client_ids
        for k in ("x", "y")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    orjson_parse = leaf.parsed_json
    with tempfile.TemporaryDirectory() as cache:
        timed_load(args.folder, cache)  # keeps the arrays
        for cycle in range(args.cycles):
            leaf.parsed_json = standard_json
            stdlib, a = timed_load(args.folder, "off")
            leaf.parsed_json = orjson_parse
            fast, b = timed_load(args.folder, "off")
            kept, c = timed_load(args.folder, cache)
            print(
                f"cycle {cycle + 1}: json {stdlib:.2f} s, orjson {fast:.2f} s "
                f"({stdlib / fast:.2f}x), kept arrays {kept:.2f} s ({stdlib / kept:.1f}x); "
                "same arrays "
                f"{same_arrays(a, b) and same_arrays(a, c)}; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
