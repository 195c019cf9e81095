"""Seconds to load a LEAF data folder: Python's json, orjson, simdjson, and the kept arrays.

    python scripts/leaf_read_timing.py /path/to/leaf/data [--cycles 3]
    python scripts/leaf_read_timing.py --users 100000 [--cycles 1]

Each cycle loads the folder's train/ and test/ (`data.leaf.load_leaf`) four ways, in turn, in
this process: parsed by Python's `json` (as before orjson), by orjson (the reference reader,
`leaf.parsed_json`), by simdjson straight into arrays (`data/leaf_numeric_json.py`, a first
read today; a folder that is not numeric features is read by the reference reader there too),
and read from the arrays `data/leaf_cache.py` keeps (written once, in a temporary cache folder,
before the cycles). It prints each cycle's seconds and ratios to Python's `json`, and checks
that the four give the same arrays bit for bit. `--users N` times a folder written first, in a
temporary folder, instead: N users of `EXAMPLES` examples of `FEATURES` features in train/ and
one example each in test/, one file per split (how the read grows with a file's users).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from tff_clustered.data import leaf, leaf_numeric_json

EXAMPLES, FEATURES = 5, 10  # each generated user's training examples, and their length


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


def write_users(folder: str, users: int) -> str:
    """A LEAF data/ folder of `users` users in `folder` (see the module docstring)."""
    rng = np.random.default_rng(0)
    names = [f"f_{i:06d}" for i in range(users)]
    for split, size in (("train", EXAMPLES), ("test", 1)):
        user_data = {
            name: {
                "x": np.round(rng.random((size, FEATURES)), 6).tolist(),
                "y": rng.integers(0, 10, size).tolist(),
            }
            for name in names
        }
        os.makedirs(os.path.join(folder, split))
        with open(os.path.join(folder, split, "data.json"), "w") as f:
            json.dump({"users": names, "num_samples": [size] * users, "user_data": user_data}, f)
    return folder


def same_arrays(a: object, b: object) -> bool:
    return a.client_ids == b.client_ids and all(
        a.arrays(split, c)[k].tobytes() == b.arrays(split, c)[k].tobytes()
        for split in ("train", "test")
        for c in a.client_ids
        for k in ("x", "y")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?")
    parser.add_argument("--users", type=int, help="time a written folder of this many users")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    if (args.folder is None) == (args.users is None):
        parser.error("give a LEAF data folder or --users, not both")
    orjson_parse, numeric_read = leaf.parsed_json, leaf.numeric_leaf_json
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as written:
        if args.users is not None:
            args.folder = write_users(os.path.join(written, "data"), args.users)
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
