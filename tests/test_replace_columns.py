"""compare.py --replace_columns: a committed table's columns rerun with its own command and
spliced in, every other column's rows kept byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_binary, runs_in_one_process

from tff_clustered.cli import replace_columns
from tff_clustered.comparison import column_replacement, table_writer, tuning
from tff_clustered.comparison.committed_tables import committed_problems

# A committed table in small: FedGroup and FeSEM on the digits, one seed, two rounds. Its
# command carries FedGroup's --pretrain_scale, which FeSEM alone refuses.
TABLE = [
    "--table=fedgroup",
    "--algorithms=fedgroup,fesem",
    "--num_clusters=2",
    "--pretrain_scale=2",
    "--rounds=2",
    "--clients_per_round=4",
    "--num_clients=8",
    "--seeds=0",
    "--execution=in_process",
]
# The .csv columns a rerun repeats (its timings are the machine's).
TIMINGS = ("train_seconds", "server_seconds", "eval_seconds", "checkpoint_seconds")


@pytest.fixture(scope="module")
def replacement(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The table run whole and kept as committed with its FeSEM row altered (a sound table
    that no run gives); then, in one compare.py process, the FeSEM column replaced, FeSEM
    alone with FedGroup's --pretrain_scale and a replacement given a run's flag."""
    tmp_path = tmp_path_factory.mktemp("replace_columns")
    table = tmp_path / "table"
    done = run_binary(["binaries/compare.py", *TABLE, f"--output_dir={table}"])
    assert done.returncode == 0, done.stderr[-2000:]
    committed = tmp_path / "committed"
    committed.mkdir()
    for name in ("comparison.md", "comparison.csv"):
        shutil.copy(table / name, committed / name)
    fresh = column_replacement.read_rows((table / "comparison.csv").read_text())[1]
    fesem = next(r for r in fresh if r["algorithm"] == "fesem")
    csv_text = (committed / "comparison.csv").read_text()
    altered = csv_text.replace(
        f",{fesem['max_accuracy']},{fesem['max_accuracy_round']},{fesem['final_accuracy']},",
        f",0.9,{fesem['max_accuracy_round']},0.8,",
    )
    (committed / "comparison.csv").write_text(altered)
    markdown = (committed / "comparison.md").read_text()
    fesem_line = next(x for x in markdown.splitlines() if x.startswith("| digits | fesem | "))
    cells = fesem_line.split(" | ")
    cells[2:4] = ["90.0", "80.0"]
    (committed / "comparison.md").write_text(markdown.replace(fesem_line, " | ".join(cells)))
    before = {p: (committed / p).read_text() for p in ("comparison.md", "comparison.csv")}
    replaced, alone, mixed = runs_in_one_process(
        [
            [
                "--replace_columns=fesem",
                f"--committed_table={committed}",
                f"--output_dir={tmp_path / 'rerun'}",
            ],
            ["--algorithms=fesem", "--pretrain_scale=2", "--plan_only"],
            ["--replace_columns=fesem", "--committed_table=x", "--rounds=3"],
        ],
        "compare",
    )
    after = {p: (committed / p).read_text() for p in ("comparison.md", "comparison.csv")}
    return dict(
        fesem=fesem, before=before, after=after, replaced=replaced, alone=alone, mixed=mixed
    )


def test_a_replaced_column_takes_a_fresh_runs_rows_and_the_others_stay_byte_for_byte(
    replacement: dict,
) -> None:
    """The committed FeSEM row altered (a sound table that no run gives): replaced, it is the
    row FeSEM gives in the whole table's run, timings aside; FedGroup's lines of the .csv and
    the .md are byte for byte the committed ones; the header names the rerun; the table is
    sound for check_results.py."""
    before, after, fesem = replacement["before"], replacement["after"], replacement["fesem"]
    assert committed_problems(before["comparison.csv"], before["comparison.md"])[1] == []
    replaced = replacement["replaced"]
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    for name in after:
        kept = [x for x in before[name].splitlines() if "fesem" not in x]
        assert [x for x in after[name].splitlines() if "fesem" not in x] == kept
    rows = column_replacement.read_rows(after["comparison.csv"])[1]
    spliced = next(r for r in rows if r["algorithm"] == "fesem")
    assert {k: v for k, v in spliced.items() if k not in TIMINGS} == {
        k: v for k, v in fesem.items() if k not in TIMINGS
    }
    header = after["comparison.md"].split("\n\n|")[0]
    assert "- fesem: its rows rerun on " in header and "--algorithms=fesem" in header
    assert "--pretrain_scale=2" in header  # the command, kept whole
    assert committed_problems(after["comparison.csv"], after["comparison.md"])[1] == []


def test_other_columns_flags_are_refused_outside_a_table_and_a_replacement_takes_none(
    replacement: dict,
) -> None:
    """FeSEM alone still refuses FedGroup's --pretrain_scale (the replacement above reran it
    with the table's whole command, which names the table's columns: --table_columns); a
    replacement takes no flag of a run (exit 2, naming it)."""
    refused = replacement["alone"]
    assert refused.returncode == 2 and "takes no --pretrain_scale" in refused.stderr
    mixed = replacement["mixed"]
    assert mixed.returncode == 2 and "drop --rounds" in mixed.stderr


def rows_of(columns: dict[str, tuple[float, float]]) -> list[dict]:
    """A setting table's rows (two settings, two seeds) with the given accuracies by column."""
    return [
        dict(setting=setting, algorithm=column, method=column, seed=seed, max_accuracy=high,
             final_accuracy=low, final_client_mean_accuracy=low + 0.01 * seed)
        for setting in ("iid", "dirichlet:0.5")
        for seed in (0, 1)
        for column, (high, low) in columns.items()
    ]  # fmt: skip


def written(folder: Path, rows: list[dict], trials: list[tuning.TunedMethod]) -> dict[str, str]:
    """A tuned setting table's files, as compare.py writes them."""
    body = table_writer.write_tables(
        str(folder),
        rows,
        "t",
        by_setting=True,
        client_mean=True,
        target_accuracy=0.9,
        command="python binaries/compare.py --table=fedac",
        date="today",
        tuning=tuning.tuning_lines(trials, tuning.TuningPlan(("all",), 2, (0, 1))),
    )
    return {"md": body, "csv": (folder / "comparison.csv").read_text()}


def trials_of(column: str, score: float) -> list[tuning.TunedMethod]:
    """A method's two trials in each setting, tuned over seeds 0 and 1 (`--tune_seeds=2`: the
    tuning.csv of a score per seed and the Tuning lines of a margin)."""
    trials = tuple(
        tuning.Trial({"learning_rate": rate}, (mean - 0.01, mean + 0.01))
        for rate, mean in ((0.1, 0.5), (0.2, score))
    )
    return [
        tuning.TunedMethod(setting, column, trials, seeds=(0, 1))
        for setting in ("iid", "dirichlet:0.5")
    ]


def test_a_setting_tables_cells_tuning_and_standings_are_spliced_as_a_full_rewrite_gives(
    tmp_path: Path,
) -> None:
    """In a tuned table with a row per setting, replacing FedAvg (a baseline the standings
    are measured against) gives the .md a table written from the new rows gives (cells, bold,
    tuning lines, standings), with one header line more; tuning.csv takes the rerun's trials;
    a rerun that lacks a committed row is refused."""
    old = {"fedavg": (0.75, 0.5), "fedper": (0.875, 0.625), "fedac": (0.625, 0.5)}
    new = {**old, "fedavg": (1.0, 0.875)}
    committed_trials = trials_of("fedavg", 0.25) + trials_of("fedac", 0.75)
    rerun_trials = trials_of("fedavg", 0.625)
    committed = written(tmp_path / "a", rows_of(old), committed_trials)
    rerun = written(tmp_path / "b", rows_of({"fedavg": new["fedavg"]}), rerun_trials)
    whole = written(tmp_path / "c", rows_of(new), rerun_trials + trials_of("fedac", 0.75))
    out = column_replacement.replaced_table(
        column_replacement.TableFiles(
            committed["csv"], committed["md"], tuning.tuning_csv(committed_trials)
        ),
        column_replacement.TableFiles(rerun["csv"], rerun["md"], tuning.tuning_csv(rerun_trials)),
        ["fedavg"],
        "- fedavg: rerun",
        dict(by_setting=True, client_mean=True, target_accuracy=0.9),
    )
    lines = out.markdown.splitlines()
    assert lines.pop(lines.index("- fedavg: rerun")) and lines == whole["md"].splitlines()
    assert out.csv_text == whole["csv"]
    assert out.tuning_csv == tuning.tuning_csv(rerun_trials + trials_of("fedac", 0.75))
    short = "\n".join(rerun["csv"].splitlines()[:-1]) + "\n"
    with pytest.raises(ValueError, match="no rerun row of dirichlet:0.5 / fedavg / 1"):
        column_replacement.replaced_table(
            column_replacement.TableFiles(committed["csv"], committed["md"]),
            column_replacement.TableFiles(short, rerun["md"]),
            ["fedavg"],
            "- fedavg: rerun",
            dict(by_setting=True, client_mean=True, target_accuracy=0.9),
        )


def test_a_committed_file_that_is_a_folder_or_not_utf8_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """Issue 64: a comparison.csv that is a folder was a traceback, one not UTF-8 an exit-2
    line without the file: each is one ValueError (exit 2) naming the path."""
    (tmp_path / "comparison.md").write_text("# t\n")
    (tmp_path / "comparison.csv").mkdir()
    with pytest.raises(ValueError, match=f"^{tmp_path}/comparison.csv is a folder, not a file"):
        replace_columns.read_table(str(tmp_path), "--committed_table")
    (tmp_path / "comparison.csv").rmdir()
    (tmp_path / "comparison.csv").write_bytes(b"setting\n\xff\n")
    with pytest.raises(ValueError, match=f"^{tmp_path}/comparison.csv is not UTF-8 text"):
        replace_columns.read_table(str(tmp_path), "--committed_table")
