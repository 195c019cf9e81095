"""Seconds to load a LEAF data folder: Python's json, orjson, simdjson, and the kept arrays.

    python scripts/leaf_read_timing.py /path/to/leaf/data [--cycles 3]

Each cycle loads the folder's train/ and test/ (`data.leaf.load_leaf`) four ways, in turn, in
this process: parsed by Python's `json` (as before orjson), by orjson (the reference reader,
`leaf.parsed_json`), by simdjson straight into arrays (`data/leaf_numeric_json.py`, a first
read today; a folder that is not numeric features is read by the reference reader there too),
and read from the arrays `data/leaf_cache.py` keeps (written once, in a temporary cache folder,
before the cycles). It prints each cycle's seconds and ratios to Python's `json`, and checks
that the four give the same arrays bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from tff_clustered.data import leaf, leaf_numeric_json


def standard_json(data: bytes) -> object:
    """The file's bytes parsed by Python's own json module (the reader before orjson)."""
    return json.loads(data.decode("utf-8"))


def refused(data: bytes) -> dict:
    """The numeric reader refusing every file, so that the reference reader reads it."""
    raise leaf_numeric_json.NotNumericRows("timing the reference reader")


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
    orjson_parse, numeric_read = leaf.parsed_json, leaf.numeric_leaf_json
    with tempfile.TemporaryDirectory() as cache:
        timed_load(args.folder, cache)  # keeps the arrays
        for cycle in range(args.cycles):
            leaf.parsed_json, leaf.numeric_leaf_json = standard_json, refused
            stdlib, a = timed_load(args.folder, "off")
            leaf.parsed_json = orjson_parse
            reference, b = timed_load(args.folder, "off")
            leaf.numeric_leaf_json = numeric_read
            numeric, c = timed_load(args.folder, "off")
            kept, d = timed_load(args.folder, cache)
            print(
                f"cycle {cycle + 1}: json {stdlib:.2f} s, orjson {reference:.2f} s "
                f"({stdlib / reference:.2f}x), simdjson {numeric:.2f} s "
                f"({stdlib / numeric:.2f}x), kept arrays {kept:.2f} s ({stdlib / kept:.1f}x); "
                f"same arrays {all(same_arrays(a, other) for other in (b, c, d))}; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
