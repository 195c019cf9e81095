"""binaries/check_results.py: a committed table's cell rerun with its own command, a cell
that no longer reproduces reported as drift with exit code 1, and a table's data path named
as DATA under --data_root."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest
from conftest import ROOT, run_binary

from tff_clustered.cli import check_results, table_commands
from tff_clustered.comparison import committed_tables

COMMAND = (
    "--table=fedgroup --algorithms=fedavg,fedgroup --num_clusters=2 --rounds=1 "
    "--clients_per_round=4 --num_clients=8 --seeds=0,1 --execution=in_process"
)


def test_the_command_is_narrowed_to_one_cell_without_other_algorithms_options() -> None:
    markdown = f"# t\n\n- command: `python binaries/compare.py {COMMAND} --output_dir=x`\n"
    command = table_commands.table_command(markdown)
    assert command is not None and "--output_dir=x" not in command
    cell = table_commands.Cell("digits", "fedavg", (0,))
    narrowed = table_commands.rerun_arguments(command, cell)
    assert "--num_clusters=2" not in narrowed  # fedgroup's, which fedavg refuses
    assert narrowed[-2:] == ["--algorithms=fedavg", "--seeds=0"]
    setting = table_commands.Cell("dirichlet:0.5", "fedgroup", (1, 2))
    narrowed = table_commands.rerun_arguments(command, setting)
    assert "--num_clusters=2" in narrowed and narrowed[-2:] == [
        "--seeds=1,2",
        "--settings=dirichlet:0.5",
    ]
    moved = check_results.compare_cell(
        {"final_accuracy": "0.5", "max_accuracy": "0.6"},
        {"final_accuracy": "0.5", "max_accuracy": "0.7"},
        1e-6,
    )
    assert moved == ["max_accuracy 0.600000 -> 0.700000"]


def test_options_in_a_flagfile_are_narrowed_like_the_command_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flagfile's lines take its --flagfile argument's place (nested ones too; comments and
    blank lines skipped; a later flag winning), so a clustered option inside it is narrowed
    away for a baseline; a missing flagfile exits 2 with one line naming it."""
    nested = tmp_path / "nested.flags"
    nested.write_text("// FedGroup's m\n--num_clusters=3\n")
    flagfile = tmp_path / "clustered.flags"
    flagfile.write_text(
        f"# a comment\n--table=fedgroup\n\n--flagfile={nested}\n--rounds=2\n"
        "--algorithms=fedavg,fedgroup\n"
    )
    command = ["--rounds=1", f"--flagfile={flagfile}", "--seeds=0,1"]
    assert table_commands.expand_flagfiles(command) == [
        "--rounds=1",
        "--table=fedgroup",
        "--num_clusters=3",
        "--rounds=2",
        "--algorithms=fedavg,fedgroup",
        "--seeds=0,1",
    ]
    baseline = table_commands.Cell("digits", "fedavg", (0,))
    expanded = table_commands.expand_flagfiles(command)
    narrowed = table_commands.rerun_arguments(expanded, baseline)
    assert not any(a.startswith(("--num_clusters", "--flagfile")) for a in narrowed)
    assert narrowed[:3] == ["--rounds=1", "--table=fedgroup", "--rounds=2"]
    clustered = table_commands.Cell("digits", "fedgroup", (0,))
    assert "--num_clusters=3" in table_commands.rerun_arguments(expanded, clustered)
    missing = tmp_path / "missing.flags"
    with pytest.raises(SystemExit) as stopped:
        table_commands.expand_flagfiles([f"--flagfile={missing}"])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert str(missing) in line


def test_a_table_that_no_longer_reproduces_is_reported_and_exits_1(tmp_path: Path) -> None:
    """A one-round FedAvg table, its committed final accuracy altered in seeds 0 and 1: with
    --all_seeds both are rerun (one compare.py run) and reported as DRIFT, exit 1; the
    committed table records no CPU or numerics settings, which the report says, with this
    machine's."""
    table = tmp_path / "t" / "comparison.md"
    table.parent.mkdir()
    table.write_text(f"# t\n\n- command: `python binaries/compare.py {COMMAND}`\n")
    (table.parent / "comparison.csv").write_text(
        "setting,algorithm,seed,max_accuracy,final_accuracy\n"
        "digits,fedavg,0,0.123,0.123\ndigits,fedavg,1,0.123,0.123\n"
    )
    done = run_binary(
        [os.path.join("binaries", "check_results.py"), f"--results={tmp_path}", "--all_seeds"],
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "DRIFT" in done.stdout and "digits / fedavg / seeds 0, 1: seed 0: " in done.stdout
    assert "| seed 1: final_accuracy 0.123000 -> " in done.stdout
    assert "cpu and numerics not recorded in the committed table: a drift" in done.stdout
    assert "reran 1 cells (2 runs)" in done.stdout
    assert "\nthis machine's cpu: " in done.stdout
    assert "\nthis machine's numerics: TensorFlow " in done.stdout


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
        "--tolerance=1": "give at most 0.01",
        "--tolerance=0.0101": "give at most 0.01",
        "--no_such_flag": "Unknown command line flag",
    }
    for argument, message in refused.items():
        done = run_binary([binary, argument], timeout=60)
        assert done.returncode == 2 and message in done.stderr, (argument, done.stderr)
        assert "Traceback" not in done.stderr
    assert run_binary([binary, "--help"], timeout=60).returncode == 0


def test_a_compare_table_without_its_csv_is_malformed(tmp_path: Path) -> None:
    """A table compare.py wrote (its .md names the command) whose .csv was deleted has rows
    that cannot be checked: MALFORMED (a failure), not skipped beside other tables that pass;
    a .md that is not such a table is still skipped."""
    table = tmp_path / "comparison.md"
    table.write_text(f"# t\n\n- command: `python binaries/compare.py {COMMAND}`\n")
    check = check_results.check_table(str(table), None, 1e-6)
    assert check.status == "MALFORMED" and check.status in check_results.FAILURES
    assert check.detail.startswith("comparison.csv, the rows of this compare.py table, is missing")
    notes = tmp_path / "notes.md"
    notes.write_text("# notes beside the tables\n")
    assert check_results.check_table(str(notes), None, 1e-6).status == "skipped"


def test_a_recorded_data_path_names_the_data_folder_as_data() -> None:
    """DATA in --data_dir / --tfds_dir / --glove_path is the data root; a path relative to the
    repository stays there; a machine's own absolute path (or `~`) is refused. Every committed
    table's command is portable."""
    command = [
        "--table=fedgroup",
        "--data_dir=DATA/fashion_mnist",
        "--tfds_dir=DATA",
        "--glove_path=testdata/glove.txt",
        "--output_dir=DATA/x",
    ]
    assert table_commands.data_paths(command) == [
        "DATA/fashion_mnist",
        "DATA",
        "testdata/glove.txt",
    ]
    assert table_commands.with_data_root(command, "/data") == [
        "--table=fedgroup",
        "--data_dir=/data/fashion_mnist",
        "--tfds_dir=/data",
        f"--glove_path={os.path.join(ROOT, 'testdata', 'glove.txt')}",
        "--output_dir=DATA/x",
    ]
    assert table_commands.resolve_data_path("DATA/mnist", None) is None  # no data root
    for recorded in ("/work/shared/data/mnist", "~/data/mnist"):
        with pytest.raises(ValueError, match="one machine's path; write it as DATA/"):
            table_commands.resolve_data_path(recorded, "/data")
    tables = glob.glob(os.path.join(ROOT, "results", "**", "*.md"), recursive=True)
    for table in tables:
        with open(table) as f:
            for recorded in table_commands.data_paths(table_commands.table_command(f.read()) or []):
                assert recorded.startswith("DATA/"), (table, recorded)


def test_with_data_the_data_root_comes_from_the_flag_the_variable_or_shared_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--data_root, else $TFF_CLUSTERED_DATA, else ../shared/data; none of them: exit 2 with one
    line naming --data_root. Without --with_data there is no data root."""
    monkeypatch.delenv(table_commands.DATA_ROOT_VARIABLE, raising=False)
    monkeypatch.setattr(table_commands, "SHARED_DATA", str(tmp_path / "no_shared_data"))
    assert check_results.data_root_of_flags(False, None) is None
    with pytest.raises(SystemExit) as stopped:
        check_results.data_root_of_flags(True, None)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "pass --data_root=DIR" in line
    monkeypatch.setattr(table_commands, "SHARED_DATA", str(tmp_path))
    assert check_results.data_root_of_flags(True, None) == str(tmp_path)
    monkeypatch.setenv(table_commands.DATA_ROOT_VARIABLE, str(tmp_path / "variable"))
    (tmp_path / "variable").mkdir()
    assert check_results.data_root_of_flags(True, None) == str(tmp_path / "variable")
    (tmp_path / "flag").mkdir()
    assert check_results.data_root_of_flags(True, str(tmp_path / "flag")) == str(tmp_path / "flag")


def write_table(folder: Path, command: str, setting: str) -> None:
    """A committed table of one FedAvg cell whose accuracy (0.123) no run reproduces."""
    folder.mkdir(parents=True)
    (folder / "comparison.md").write_text(
        f"# t\n\n- command: `python binaries/compare.py {command}`\n"
    )
    (folder / "comparison.csv").write_text(
        f"setting,algorithm,seed,max_accuracy,final_accuracy\n{setting},fedavg,0,0.123,0.123\n"
    )


def test_data_that_is_missing_or_not_portable_is_named_before_any_run(tmp_path: Path) -> None:
    """A data root without a table's dataset folder: exit 2 naming the folder, before any
    table runs; a table recording an absolute data path: NOT PORTABLE, exit 1, with or
    without --with_data. A fraction of a second each (no table reruns)."""
    binary = os.path.join("binaries", "check_results.py")
    write_table(tmp_path / "portable", f"{COMMAND} --data_dir=DATA/fashion_mnist", "digits")
    (tmp_path / "root").mkdir()
    refused = {
        f"--with_data --data_root={tmp_path / 'root'}": "no dataset folder "
        f"{tmp_path / 'root' / 'fashion_mnist'} (",
        f"--with_data --data_root={tmp_path / 'nowhere'}": "is not a folder",
        f"--data_root={tmp_path / 'root'}": "add --with_data",
    }
    for arguments, message in refused.items():
        done = run_binary([binary, f"--results={tmp_path}", *arguments.split()], timeout=60)
        assert done.returncode == 2 and message in done.stderr, (arguments, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
    write_table(tmp_path / "absolute", f"{COMMAND} --data_dir=/work/shared/data/mnist", "digits")
    (tmp_path / "root" / "fashion_mnist").mkdir()
    for arguments in ([], ["--with_data", f"--data_root={tmp_path / 'root'}"]):
        done = run_binary([binary, f"--results={tmp_path / 'absolute'}", *arguments], timeout=60)
        assert done.returncode == 1, done.stderr
        assert "NOT PORTABLE" in done.stdout and "write it as DATA/" in done.stdout


def test_a_table_naming_data_reruns_on_the_data_under_the_data_root(tmp_path: Path) -> None:
    """`--data_dir=DATA/mnist_idx_tiny` with --data_root=testdata reruns on the fixture: the
    cell is compared (DRIFT from its altered accuracy), not failed or skipped."""
    command = (
        f"{COMMAND.replace('--num_clients=8', '--num_clients=4')} --dataset=fashion_mnist "
        "--partition=iid --data_dir=DATA/mnist_idx_tiny"
    )
    write_table(tmp_path / "t", command, "fashion_mnist")
    done = run_binary(
        [
            os.path.join("binaries", "check_results.py"),
            f"--results={tmp_path}",
            "--with_data",
            f"--data_root={os.path.join(ROOT, 'testdata')}",
        ],
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "DRIFT" in done.stdout and "fashion_mnist / fedavg / seed 0" in done.stdout


def table_files(folder: Path, csv_text: str, markdown: str = "") -> None:
    """A committed table: `markdown` under a header naming a digits command and seeds 0-2,
    `csv_text` beside it."""
    folder.mkdir(parents=True)
    (folder / "comparison.md").write_text(
        f"# t\n\n- command: `python binaries/compare.py {COMMAND}`\n"
        f"- seeds: 0, 1, 2 (cells: mean ± sample std over seeds)\n\n{markdown}"
    )
    (folder / "comparison.csv").write_text(csv_text)


HEADER = "setting,algorithm,seed,max_accuracy,final_accuracy\n"
SOUND = HEADER + "".join(f"digits,fedavg,{s},0.9,{a}\n" for s, a in enumerate((0.8, 0.85, 0.9)))
SUMMARY = (
    "Final test accuracy (%), each client with the model it uses, pooled over clients.\n\n"
    "| setting | fedavg |\n|---|---|\n| digits | **85.00 ± 5.00** |\n"
)


def test_a_table_saved_with_a_byte_order_mark_reads_as_its_text(tmp_path: Path) -> None:
    """A .csv a spreadsheet saved as UTF-8 starts with a byte-order mark, which made its first
    column "\ufeffsetting" and the table "no setting column" (issue 64 probe)."""
    saved = tmp_path / "comparison.csv"
    saved.write_bytes(b"\xef\xbb\xbf" + SOUND.encode())
    text = committed_tables.read_table_file(str(saved))
    assert text == SOUND
    assert committed_tables.committed_problems(text, SUMMARY)[1] == []


def test_committed_rows_that_compare_nothing_or_were_altered_are_named() -> None:
    """Every committed row is checked, not only the one rerun: a NaN or out-of-range accuracy,
    a max below the final, a seed's row missing or twice, and seeds 1-2 set to 0 (the .md's
    mean ± std no longer that of the rows) are each named; a sound table has no problem."""
    problems = committed_tables.committed_problems
    assert problems(SOUND, SUMMARY) == (committed_tables.read_csv(SOUND)[0], [])
    altered = {
        SOUND.replace("0,0.9,0.8", "0,nan,nan"): "final_accuracy is nan, not a finite accuracy",
        SOUND.replace("0,0.9,0.8", "0,0.9,1.5"): "final_accuracy 1.5 is not in [0, 1]",
        SOUND.replace("0,0.9,0.8", "0,0.7,0.8"): "max_accuracy 0.7 is below final_accuracy 0.8",
        SOUND.replace("1,0.9,0.85", "1,0.0,0.0").replace("2,0.9,0.9", "2,0.0,0.0"): (
            "the .md says 85.00 ± 5.00 for digits / fedavg (final_accuracy, %), its .csv rows "
            "give 26.67 ± 46.19"
        ),
        SOUND.replace("digits,fedavg,2,", "digits,fedavg,1,"): "seed 1 is on lines 3 and 4",
        HEADER + "digits,fedavg,0,0.9,0.8\n": "has rows of seeds 0; the header lists 0, 1, 2",
        SOUND.replace("0,0.9,0.8", "x,0.9,0.8"): "the seed is not a whole number",
    }
    header = "- seeds: 0, 1, 2 (cells: mean ± sample std over seeds)\n\n"
    for csv_text, message in altered.items():
        found = problems(csv_text, header + SUMMARY)[1]
        assert any(message in p for p in found), (message, found)
    short_row = SUMMARY.replace("| digits | **85.00 ± 5.00** |", "| digits |")
    assert problems(SOUND, short_row)[1] == [
        "the .md's table row 'digits' has 1 cells, its header 2"
    ]
    # A rerun value that is no number compares nothing: it counts as moved.
    nan = check_results.compare_cell(
        {"final_accuracy": "0.5", "max_accuracy": "0.5"},
        {"final_accuracy": "nan", "max_accuracy": "0.5"},
        1e-6,
    )
    assert nan == ["final_accuracy 0.500000 -> nan"]


def test_malformed_tables_are_failures_that_do_not_stop_the_others(tmp_path: Path) -> None:
    """Header only, no final_accuracy column, a NaN committed value, seeds 1-2 set to 0: each
    is reported MALFORMED on its own line naming the file and what is wrong, and every table
    is reported, and the check exits 1 saying no cell was rerun. No TensorFlow starts (a
    fraction of a second)."""
    table_files(tmp_path / "header_only", HEADER, SUMMARY)
    table_files(tmp_path / "no_final", "setting,algorithm,seed,max_accuracy\ndigits,fedavg,0,0.9\n")
    table_files(tmp_path / "nan", SOUND.replace("0,0.9,0.8", "0,nan,nan"), SUMMARY)
    table_files(
        tmp_path / "zeroed",
        SOUND.replace("1,0.9,0.85", "1,0,0").replace("2,0.9,0.9", "2,0,0"),
        SUMMARY,
    )
    # issue 64: a .csv that is a folder (a traceback) or not UTF-8 (a line without the file)
    table_files(tmp_path / "folder", "", SUMMARY)
    os.remove(tmp_path / "folder" / "comparison.csv")
    os.mkdir(tmp_path / "folder" / "comparison.csv")
    table_files(tmp_path / "latin1", "", SUMMARY)
    latin1 = SOUND.replace("digits", "d\xeft").encode("latin-1")
    (tmp_path / "latin1" / "comparison.csv").write_bytes(latin1)
    # issue 64 probe: rows whose comparison.md is gone were passed over beside other tables
    table_files(tmp_path / "no_md", SOUND, SUMMARY)
    os.remove(tmp_path / "no_md" / "comparison.md")
    done = run_binary([os.path.join("binaries", "check_results.py"), f"--results={tmp_path}"])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    expected = {
        "header_only": "comparison.csv: a header and no rows",
        "no_final": "comparison.csv: no final_accuracy column",
        "nan": "final_accuracy is nan",
        "zeroed": "the .md says 85.00 ± 5.00 for digits / fedavg",
        "folder": f"{tmp_path}/folder/comparison.csv is a folder, not a file",
        "latin1": f"{tmp_path}/latin1/comparison.csv is not UTF-8 text (invalid continuation",
        "no_md": f"{tmp_path}/no_md/comparison.md is missing, not a file",
    }
    lines = done.stdout.splitlines()
    for folder, message in expected.items():
        (line,) = [x for x in lines if f"/{folder}/comparison.md" in x]
        assert line.startswith("MALFORMED") and message in line, line
    assert lines[-1].startswith("checked the committed rows of 7 tables; reran 0 cells (0 runs)")


DIAGNOSED = HEADER.replace("\n", ",clusters,cluster_sizes\n") + "".join(
    f"digits,{algorithm},{s},0.9,{a},{k},{sizes}\n"
    for algorithm in ("fedavg", "ifca")
    for s, a, k, sizes in zip(range(3), (0.8, 0.85, 0.9), (1, 2, 3), ("40", "20+20", "20+10+10"))
)
DIAGNOSTICS = (
    "Diagnostics per seed (0/1/2): clusters in use at the end.\n\n"
    "| setting | algorithm | diagnostics |\n|---|---|---|\n"
    + "".join(
        f"| digits | {a} | clusters 1/2/3; sizes 40 / 20+20 / 20+10+10 |\n"
        for a in ("fedavg", "ifca")
    )
)


def test_rows_of_swapped_seeds_are_named_by_their_per_seed_records(tmp_path: Path) -> None:
    """Issue 64: seeds 1 and 2 of the second column swapped keep its mean and std, and only
    the first cell is rerun: the .md's per-seed diagnostics (in seed order) and, where the
    table's folder holds them, the runs' own summary.json name the rows."""
    problems = committed_tables.committed_problems
    assert problems(DIAGNOSED, DIAGNOSTICS)[1] == []
    swapped = DIAGNOSED.replace("ifca,1,", "ifca,x,").replace("ifca,2,", "ifca,1,")
    swapped = swapped.replace("ifca,x,", "ifca,2,")
    assert problems(swapped, DIAGNOSTICS)[1] == [
        "the .md's diagnostics of digits / ifca say clusters 1/2/3, its .csv rows of seeds "
        "0/1/2 give 1/3/2 (rows of other seeds?)",
        "the .md's diagnostics of digits / ifca say sizes 40 / 20+20 / 20+10+10, its .csv rows "
        "of seeds 0/1/2 give 40 / 20+10+10 / 20+20 (rows of other seeds?)",
    ]
    rows = committed_tables.read_csv(SOUND)[0]
    assert committed_tables.run_output_problems(rows, str(tmp_path)) == []  # no runs kept
    for seed, final in enumerate((0.8, 0.9, 0.85)):  # the runs of seeds 1 and 2 swapped
        run = tmp_path / f"s{seed}" / "fedavg"
        run.mkdir(parents=True)
        results = {"final_accuracy": final, "max_accuracy": 0.9}
        summary = {"config": {"training": {"seed": seed}}, "results": results}
        (run / "summary.json").write_text(json.dumps(summary))
    assert committed_tables.run_output_problems(rows, str(tmp_path)) == [
        f"digits / fedavg / seed {seed} has final_accuracy {row} (its run's {run}), from "
        f"{tmp_path}/s{seed}/fedavg/summary.json"
        for seed, row, run in ((1, "0.85", "0.9"), (2, "0.9", "0.85"))
    ]


def test_the_sampled_cell_is_the_first_rows_lowest_seed_or_all_its_seeds() -> None:
    """A table without a seed-0 row reruns its lowest seed; --all_seeds every seed committed
    for the first row's setting and algorithm."""
    rows, problems = committed_tables.read_csv(
        HEADER + "iid,ifca,2,0.9,0.9\niid,fedavg,1,0.9,0.9\niid,ifca,1,0.9,0.9\n"
    )
    assert not problems
    assert table_commands.sampled_cell(rows, all_seeds=False) == ("iid", "ifca", (1,))
    assert table_commands.sampled_cell(rows, all_seeds=True) == ("iid", "ifca", (1, 2))
    assert str(table_commands.Cell("iid", "ifca", (1, 2))) == "iid / ifca / seeds 1, 2"


def test_a_rerun_on_another_cpu_or_numerics_setting_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The committed table's `- cpu:` / `- numerics:` header lines against the rerun's: a field
    that differs, or that the committed table does not record, is named with both values. The
    rerun runs under the numerics variables the committed table records (set or unset)."""
    here = "# t\n\n- cpu: X (x86_64); avx2\n- numerics: TensorFlow 2.14.1, oneDNN on\n\n| a |\n"
    assert check_results.machine_notes(here, here) == ()
    other = here.replace("oneDNN on", "oneDNN off")
    assert check_results.machine_notes(other, here) == (
        "numerics: committed TensorFlow 2.14.1, oneDNN off; here TensorFlow 2.14.1, oneDNN on",
    )
    assert check_results.machine_notes("# old\n", here) == (
        "cpu and numerics not recorded in the committed table",
    )
    assert check_results.machine_text(here) == (
        "cpu: X (x86_64); avx2",
        "numerics: TensorFlow 2.14.1, oneDNN on",
    )
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "2")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    recorded = (
        "# t\n\n- numerics: TensorFlow 2.14.1, oneDNN off (TF_ENABLE_ONEDNN_OPTS=0, "
        "TF_NUM_INTRAOP_THREADS unset, TF_NUM_INTEROP_THREADS=1); 2 CPUs usable\n"
    )
    environment = table_commands.rerun_environment(recorded)
    assert (
        environment["TF_ENABLE_ONEDNN_OPTS"] == "0" and "TF_NUM_INTRAOP_THREADS" not in environment
    )
    assert environment["TF_NUM_INTEROP_THREADS"] == "1"
    assert table_commands.rerun_environment("# old\n")["TF_ENABLE_ONEDNN_OPTS"] == "1"


def test_a_table_of_secure_noise_is_checked_but_never_rerun(tmp_path: Path) -> None:
    """Secure noise is drawn from the operating system and recorded nowhere: its table's rows
    are checked, and no rerun is attempted (it could only differ)."""
    committed = Path(ROOT, "results", "fedgroup-digits")
    markdown = (committed / "comparison.md").read_text()
    assert "--dp_noise" not in markdown and "binaries/compare.py " in markdown
    (tmp_path / "comparison.md").write_text(
        markdown.replace("binaries/compare.py ", "binaries/compare.py --dp_noise=secure ", 1)
    )
    (tmp_path / "comparison.csv").write_text((committed / "comparison.csv").read_text())
    check = check_results.check_table(str(tmp_path / "comparison.md"), None, 1e-6)
    assert check.status == "skipped" and "--dp_noise=secure" in check.detail, check
    assert "committed rows sound" in check.detail
