"""What a run does before round 1: an in-process run imports no TFF, and round 0's evaluation is
a choice (`--eval_at_start`)."""

from __future__ import annotations

import csv
import os

from conftest import ROOT, run_binary

TRAIN = os.path.join(ROOT, "binaries", "train.py")


def test_an_in_process_run_imports_no_tff_and_can_skip_round_0(tmp_path: object) -> None:
    out = str(tmp_path)
    done = run_binary(
        [
            "-X",
            "importtime",
            TRAIN,
            "--algorithm=fedavg",
            "--rounds=2",
            "--execution=in_process",
            "--noeval_at_start",
            f"--output_dir={out}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "tensorflow" in imported  # the probe sees the imports
    assert "tensorflow_federated" not in imported
    with open(os.path.join(out, "metrics.csv")) as f:
        rounds = [row["round"] for row in csv.DictReader(f)]
    assert rounds == ["1", "2"]  # no round 0 row
