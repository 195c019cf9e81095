"""The PFLlib benchmark's parts that need neither PFLlib nor torch: its skip, its data in both
formats, and its table. Each runs in a process of its own: the benchmark's module defines the
benchmarks' flags (`--rounds` among them), which train.py's flags, imported by other tests of
the same pytest process, define too."""

from __future__ import annotations

import textwrap

from conftest import run_binary


def run_checks(body: str, tmp_path: object) -> None:
    """`body` (Python, asserting) run in a fresh process with `vs_pfllib` imported and `tmp`
    the test's folder; fails with its output unless it ends with `ok`."""
    script = (
        textwrap.dedent(
            """
        import json, os, pathlib, sys
        import numpy as np
        from tff_clustered.cli.benchmarks import vs_pfllib
        from tff_clustered.data.leaf import read_leaf_split
        tmp = pathlib.Path(sys.argv[1])
        """
        )
        + textwrap.dedent(body)
        + "\nprint('ok')\n"
    )
    done = run_binary(["-c", script, str(tmp_path)], timeout=300)
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stdout + done.stderr[-3000:]


def test_it_is_skipped_with_the_reason_without_a_checkout_or_torch(tmp_path: object) -> None:
    run_checks(
        """
        reason = vs_pfllib.skip_reason(None, None)
        assert reason and "--pfllib_dir" in reason and "PFLlib" in reason
        checkout = tmp / "PFLlib"
        (checkout / "system").mkdir(parents=True)
        (checkout / "system" / "main.py").write_text("")
        assert "--pfllib_python" in vs_pfllib.skip_reason(str(checkout), None)
        # This Python has no torch (the project's environment does not install it).
        no_torch = vs_pfllib.skip_reason(str(checkout), sys.executable)
        assert no_torch is None or "cannot import torch" in no_torch, no_torch
        """,
        tmp_path,
    )


def test_both_formats_hold_the_same_examples(tmp_path: object) -> None:
    run_checks(
        """
        clients = vs_pfllib.digits_clients(3, seed=0)
        vs_pfllib.write_leaf(str(tmp / "leaf"), clients)
        vs_pfllib.write_pfllib(str(tmp / "pfllib"), clients)
        ours = read_leaf_split(str(tmp / "leaf" / "train"))
        for k, (x, y, *_) in enumerate(clients):
            assert x.shape == (100, 28, 28) and len(set(y.tolist())) == 2
            with open(tmp / "pfllib" / "train" / f"{k}.npz", "rb") as f:
                theirs = np.load(f, allow_pickle=True)["data"].tolist()
            assert np.array_equal(theirs["x"][:, 0], x) and np.array_equal(theirs["y"], y)
            assert np.array_equal(ours[f"c{k:04d}"][0], x.reshape(100, 784))
            assert np.array_equal(ours[f"c{k:04d}"][1], y)
        """,
        tmp_path,
    )


def test_the_table_gives_ours_over_pfllib_per_cycle_as_a_range(tmp_path: object) -> None:
    run_checks(
        """
        def figures(seconds):
            return {"round": seconds, "startup": 2 * seconds, "whole": 10 * seconds}

        def cycle(tff):
            return {"c100_r20_e5": {"tff": figures(tff), "in_process": figures(0.5),
                                    "pfllib": figures(2.0)}}

        cycles = [cycle(1.0), cycle(1.5)]
        lines = vs_pfllib.table_lines(cycles)
        assert len(lines) == 2 + 3, lines  # the header and the one workload's three figures
        assert lines[2].startswith(
            "| 20 of 100 clients a round, 5 local epochs | 0.50-0.75 | 0.25 |"
        ), lines[2]
        assert "1.25 / 0.50 / 2.00" in lines[2]  # median seconds of each system
        json.dumps(cycles)  # the report is JSON
        assert os.path.isfile(vs_pfllib.DRIVER)
        """,
        tmp_path,
    )
