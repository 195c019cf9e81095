"""The PFLlib benchmark's parts that need neither PFLlib nor torch: its skip, its data in both
formats, and its table. They run in a process of their own (one for the three): the benchmark's
module defines the benchmarks' flags (`--rounds` among them), which train.py's flags, imported
by other tests of the same pytest process, define too."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import run_binary

# Each test's checks (Python, asserting) by the test's name, run with `vs_pfllib` imported and
# `tmp` a folder of the check's own.
CHECKS: dict[str, str] = {}

# Runs each check of the JSON sys.argv[1] ({name: body}) with the names above imported and
# `tmp` its own folder under sys.argv[2]: one JSON line {name: "ok" or its traceback}.
EACH_CHECK = """
import json, os, pathlib, sys, traceback
import numpy as np
from tff_clustered.cli.benchmarks import vs_pfllib
from tff_clustered.data.leaf import read_leaf_split
outcomes = {}
for name, body in json.loads(sys.argv[1]).items():
    tmp = pathlib.Path(sys.argv[2]) / name
    tmp.mkdir()
    names = dict(json=json, os=os, pathlib=pathlib, sys=sys, np=np, vs_pfllib=vs_pfllib,
                 read_leaf_split=read_leaf_split, tmp=tmp)
    try:
        exec(body, names)
        outcomes[name] = "ok"
    except Exception:
        outcomes[name] = traceback.format_exc()
print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every check of `CHECKS` run in one fresh process: "ok" or its traceback, by name."""
    checks = {name: textwrap.dedent(body) for name, body in CHECKS.items()}
    folder = tmp_path_factory.mktemp("vs_pfllib")
    done = run_binary(["-c", EACH_CHECK, json.dumps(checks), str(folder)], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.keys() == CHECKS.keys(), found
    return found


def check(name: str, body: str) -> str:
    """`body` registered as the checks of the test `name` (`CHECKS`)."""
    CHECKS[name] = body
    return name


SKIP = check(
    "test_it_is_skipped_with_the_reason_without_a_checkout_or_torch",
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
)


def test_it_is_skipped_with_the_reason_without_a_checkout_or_torch(
    outcomes: dict[str, str],
) -> None:
    assert outcomes[SKIP] == "ok", outcomes[SKIP]


FORMATS = check(
    "test_both_formats_hold_the_same_examples",
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
)


def test_both_formats_hold_the_same_examples(outcomes: dict[str, str]) -> None:
    assert outcomes[FORMATS] == "ok", outcomes[FORMATS]


TABLE = check(
    "test_the_table_gives_ours_over_pfllib_per_cycle_as_a_range",
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
)


def test_the_table_gives_ours_over_pfllib_per_cycle_as_a_range(outcomes: dict[str, str]) -> None:
    assert outcomes[TABLE] == "ok", outcomes[TABLE]
