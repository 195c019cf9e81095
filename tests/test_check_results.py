"""binaries/check_results.py: a committed table's cell rerun with its own command, and a cell
that no longer reproduces reported as drift with exit code 1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import ROOT, run_binary

sys.path.insert(0, os.path.join(ROOT, "binaries"))
import check_results  # noqa: E402

COMMAND = (
    "--table=fedgroup --algorithms=fedavg,fedgroup --num_clusters=2 --rounds=1 "
    "--clients_per_round=4 --num_clients=8 --seeds=0,1 --execution=in_process"
)


def test_the_command_is_narrowed_to_one_cell_without_other_algorithms_options() -> None:
    markdown = f"# t\n\n- command: `python binaries/compare.py {COMMAND} --output_dir=x`\n"
    command = check_results.table_command(markdown)
    assert command is not None and "--output_dir=x" not in command
    cell = {"setting": "digits", "algorithm": "fedavg", "seed": "0"}
    narrowed = check_results.rerun_arguments(command, cell)
    assert "--num_clusters=2" not in narrowed  # fedgroup's, which fedavg refuses
    assert narrowed[-2:] == ["--algorithms=fedavg", "--seeds=0"]
    setting = {"setting": "dirichlet:0.5", "algorithm": "fedgroup", "seed": "0"}
    narrowed = check_results.rerun_arguments(command, setting)
    assert "--num_clusters=2" in narrowed and narrowed[-1] == "--settings=dirichlet:0.5"
    moved = check_results.compare_cell(
        {"final_accuracy": "0.5", "max_accuracy": "0.6"},
        {"final_accuracy": "0.5", "max_accuracy": "0.7"},
        1e-6,
    )
    assert moved == ["max_accuracy 0.600000 -> 0.700000"]


def test_a_table_that_no_longer_reproduces_is_reported_and_exits_1(tmp_path: Path) -> None:
    """A one-round FedAvg table, its committed final accuracy altered: DRIFT, exit 1."""
    table = tmp_path / "t" / "comparison.md"
    table.parent.mkdir()
    table.write_text(f"# t\n\n- command: `python binaries/compare.py {COMMAND}`\n")
    (table.parent / "comparison.csv").write_text(
        "setting,algorithm,seed,max_accuracy,final_accuracy\ndigits,fedavg,0,0.123,0.123\n"
    )
    done = run_binary(
        [os.path.join("binaries", "check_results.py"), f"--results={tmp_path}"], timeout=600
    )
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "DRIFT" in done.stdout and "digits / fedavg / seed 0" in done.stdout
    assert "final_accuracy 0.123000 -> " in done.stdout


def test_a_check_that_checks_nothing_or_cannot_fail_is_refused(tmp_path: Path) -> None:
    """No table checked (a missing folder, an empty one, every table skipped) and a tolerance
    that passes or fails everything (nan, inf, negative) exit 2 with one line saying what to
    pass; --help exits 0. All before TensorFlow loads: a fraction of a second each."""
    skipped = tmp_path / "skipped"
    skipped.mkdir()
    (skipped / "comparison.md").write_text("# a table without its .csv\n")
    (tmp_path / "empty").mkdir()
    binary = os.path.join("binaries", "check_results.py")
    refused = {
        f"--results={tmp_path / 'nowhere'}": "is not a folder",
        f"--results={tmp_path / 'empty'}": "holds no .md table",
        f"--results={skipped}": "all 1 tables under",
        "--tolerance=nan": "give a finite number",
        "--tolerance=inf": "give a finite number",
        "--tolerance=-1": "not a non-negative number",
        "--no_such_flag": "Unknown command line flag",
    }
    for argument, message in refused.items():
        done = run_binary([binary, argument], timeout=60)
        assert done.returncode == 2 and message in done.stderr, (argument, done.stderr)
        assert "Traceback" not in done.stderr
    assert run_binary([binary, "--help"], timeout=60).returncode == 0
