"""The PFLlib benchmark's parts that need neither PFLlib nor torch: its skip, its data in both
formats, and its table."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tff_clustered.cli.benchmarks import vs_pfllib
from tff_clustered.data.leaf import read_leaf_split


def test_it_is_skipped_with_the_reason_without_a_checkout_or_torch(tmp_path: object) -> None:
    reason = vs_pfllib.skip_reason(None, None)
    assert reason and "--pfllib_dir" in reason and "PFLlib" in reason
    checkout = tmp_path / "PFLlib"
    (checkout / "system").mkdir(parents=True)
    (checkout / "system" / "main.py").write_text("")
    assert "--pfllib_python" in vs_pfllib.skip_reason(str(checkout), None)
    # This test's Python has no torch (the project's environment does not install it).
    no_torch = vs_pfllib.skip_reason(str(checkout), sys.executable)
    assert no_torch is None or "cannot import torch" in no_torch


def test_both_formats_hold_the_same_examples(tmp_path: object) -> None:
    clients = vs_pfllib.digits_clients(3, seed=0)
    vs_pfllib.write_leaf(str(tmp_path / "leaf"), clients)
    vs_pfllib.write_pfllib(str(tmp_path / "pfllib"), clients)
    ours = read_leaf_split(str(tmp_path / "leaf" / "train"))
    for k, (x, y, *_) in enumerate(clients):
        assert x.shape == (100, 28, 28) and len(set(y.tolist())) == 2
        with open(tmp_path / "pfllib" / "train" / f"{k}.npz", "rb") as f:
            theirs = np.load(f, allow_pickle=True)["data"].tolist()
        assert np.array_equal(theirs["x"][:, 0], x) and np.array_equal(theirs["y"], y)
        assert np.array_equal(ours[f"c{k:04d}"][0], x.reshape(100, 784))
        assert np.array_equal(ours[f"c{k:04d}"][1], y)


def test_the_table_gives_ours_over_pfllib_per_cycle_as_a_range() -> None:
    def figures(seconds: float) -> dict:
        return {"round": seconds, "startup": 2 * seconds, "whole": 10 * seconds}

    cycles = [
        {"c100_r20_e5": {"tff": figures(1.0), "in_process": figures(0.5), "pfllib": figures(2.0)}},
        {"c100_r20_e5": {"tff": figures(1.5), "in_process": figures(0.5), "pfllib": figures(2.0)}},
    ]
    lines = vs_pfllib.table_lines(cycles)
    assert len(lines) == 2 + 3  # the header and the three figures of the one workload run
    assert lines[2].startswith("| 20 of 100 clients a round, 5 local epochs | 0.50-0.75 | 0.25 |")
    assert "1.25 / 0.50 / 2.00" in lines[2]  # median seconds of each system
    json.dumps(cycles)  # the report is JSON
    assert os.path.isfile(vs_pfllib.DRIVER)
