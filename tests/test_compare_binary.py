"""`binaries/compare.py`: Table III structure and the expected shape on planted clusters."""

from __future__ import annotations

import csv
import functools
import glob
import json
import os
import uuid

import pytest
from conftest import (
    ROOT,
    TRAIN_IN_ONE_PROCESS,
    run_binary,
    runs_in_one_process,
    worker_pids_with_tag,
)

from tff_clustered.run_folder import LOCK_NAME, RunFolder
from tff_clustered.runs import checkpoint

TABLE_III = ["--algorithms=fedavg,ifca", "--rounds=12"]
FEDTSDP_TABLE = [
    "--table=fedtsdp",
    "--algorithms=fedavg,fedtsdp",
    "--settings=iid,dirichlet:0.2",
    "--rounds=1",
]
REFUSED = [
    (["--algorithms=fedavg,fedmagic"], "fedmagic"),
    # an option none of the listed algorithms takes is refused, not silently dropped
    (["--algorithms=fedavg,fedgroup", "--mu=1"], "take no --mu"),
    (["--algorithms=ifca,fesem", "--pretrain_epochs=2"], "take no --pretrain_epochs"),
]


@pytest.fixture(scope="module")
def compare_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The module's compare.py runs, in two processes of compare's main (TensorFlow imported
    once in each, not per run), each with a TFF_CLUSTERED_RUN_TAG of its own: Table III and
    the FedTSDP table; then Table III again in the same folder (its rows read in between),
    the `REFUSED` flags, a FedTSDP table with a bad setting, and a compare on a table folder
    held as a first run would hold it."""
    root = tmp_path_factory.mktemp("compare")
    folders = {name: root / name for name in ("table_iii", "fedtsdp", "held")}
    refused = [root / f"refused_{i}" for i in range(len(REFUSED))]
    for folder in refused:
        folder.mkdir()
    tags = [uuid.uuid4().hex, uuid.uuid4().hex]
    table_iii = [*TABLE_III, f"--output_dir={folders['table_iii']}"]
    first = runs_in_one_process(
        [table_iii, [*FEDTSDP_TABLE, f"--output_dir={folders['fedtsdp']}"]],
        "compare",
        {"TFF_CLUSTERED_RUN_TAG": tags[0]},
    )
    left = worker_pids_with_tag(tags[0])
    table_iii_rows = read_rows(str(folders["table_iii"] / "comparison.csv"))
    with checkpoint.hold_run_folder(str(folders["held"])):
        second = runs_in_one_process(
            [
                table_iii,
                *(
                    [*flags, f"--output_dir={folder}"]
                    for (flags, _), folder in zip(REFUSED, refused)
                ),
                ["--table=fedtsdp", "--settings=dirichlet"],
                ["--algorithms=fedavg", f"--output_dir={folders['held']}"],
            ],
            "compare",
            {"TFF_CLUSTERED_RUN_TAG": tags[1]},
        )
    return {
        "folders": folders,
        "table_iii": first[0],
        "table_iii_rows": table_iii_rows,
        "table_iii_again": second[0],
        "fedtsdp": first[1],
        "workers_left": [left, worker_pids_with_tag(tags[1])],
        "refused": list(zip(refused, second[1 : 1 + len(REFUSED)])),
        "fedtsdp_bad_setting": second[-2],
        "held": second[-1],
    }


def read_rows(path: str) -> dict[str, dict]:
    """A comparison.csv's rows by algorithm (none if the file is missing)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["algorithm"]: r for r in csv.DictReader(f)}


def test_compare_writes_table_iii_and_clustered_methods_beat_fedavg(compare_runs: dict) -> None:
    done = compare_runs["table_iii"]
    out = str(compare_runs["folders"]["table_iii"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert compare_runs["workers_left"][0] == []
    rows = compare_runs["table_iii_rows"]
    assert list(rows) == ["fedavg", "ifca"]
    for r in rows.values():
        for column in ("max_accuracy", "final_accuracy"):
            assert 0.0 <= float(r[column]) <= 1.0
        assert float(r["max_accuracy"]) >= float(r["final_accuracy"])
    fedavg = float(rows["fedavg"]["max_accuracy"])
    # 4 label-permutation groups: one model per group must win by a wide margin (FedGroup's
    # margin on the same groups: test_default_run_recovers_the_planted_groups_and_beats_fedavg).
    assert float(rows["ifca"]["max_accuracy"]) >= fedavg + 0.3
    # IFCA sends every cluster model to each sampled client: (4 + 1) / (1 + 1) of FedAvg's.
    ratio = float(rows["ifca"]["floats_per_round"]) / float(rows["fedavg"]["floats_per_round"])
    assert ratio == 2.5
    assert float(rows["ifca"]["mean_discrepancy"]) < float(rows["fedavg"]["mean_discrepancy"])
    for name in ("comparison.md", "comparison.png", "ifca/metrics.csv"):
        assert os.path.exists(os.path.join(out, name))
    # Running it again reuses the finished runs instead of recomputing or overwriting them.
    again = compare_runs["table_iii_again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["max_accuracy"] for r in read_rows(os.path.join(out, "comparison.csv")).values()] == [
        r["max_accuracy"] for r in rows.values()
    ]


@pytest.mark.parametrize("flags, message", REFUSED)
def test_compare_rejects_bad_algorithms_and_options(
    compare_runs: dict, flags: list, message: str
) -> None:
    folder, done = compare_runs["refused"][REFUSED.index((flags, message))]
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert not os.listdir(folder)


def test_a_second_compare_on_a_held_table_folder_is_refused_before_its_worker(
    compare_runs: dict,
) -> None:
    """The same compare started twice: the second is refused at once, naming the first's pid,
    and writes nothing into the table folder (no worker log either)."""
    done = compare_runs["held"]
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"is in use by another run (pid {os.getpid()})" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert os.listdir(compare_runs["folders"]["held"]) == [LOCK_NAME]
    assert compare_runs["workers_left"][1] == []


def test_compare_writes_the_fedtsdp_table_shape(compare_runs: dict) -> None:
    done = compare_runs["fedtsdp"]
    out = str(compare_runs["folders"]["fedtsdp"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert compare_runs["workers_left"][0] == []
    table = open(os.path.join(out, "comparison.md")).read().splitlines()
    assert "| setting | fedavg | fedtsdp |" in table
    diagnostics_start = next(i for i, line in enumerate(table) if line.startswith("Diagnostics"))
    settings = ("| iid", "| dirichlet:0.2")
    rows = [line for line in table[:diagnostics_start] if line.startswith(settings)]
    assert len(rows) == 2 and all(len(r.split("|")) == 5 for r in rows)
    standings_start = next(i for i, line in enumerate(table) if line.startswith("Each paper"))
    notes = [line for line in table[diagnostics_start:standings_start] if line.startswith(settings)]
    assert len(notes) == 4 and all("triggers 0" in n for n in notes if "fedtsdp" in n)
    # FedTSDP against FedAvg, the one baseline here, in each setting.
    standings = [line for line in table[standings_start:] if line.startswith(settings)]
    assert len(standings) == 2 and all(
        "| fedtsdp |" in line and "vs fedavg" in line for line in standings
    )
    with open(os.path.join(out, "comparison.csv")) as f:
        runs = list(csv.DictReader(f))
    assert {(r["setting"], r["algorithm"]) for r in runs} == {
        (s, a) for s in ("iid", "dirichlet:0.2") for a in ("fedavg", "fedtsdp")
    }
    assert os.path.exists(os.path.join(out, "dirichlet-0.2", "fedtsdp", "metrics.csv"))
    bad = compare_runs["fedtsdp_bad_setting"]
    assert bad.returncode == 2 and "dirichlet:BETA" in bad.stderr


PLAN_EVERY_TABLE = """
import glob, sys
sys.argv = ["compare.py"]
from tff_clustered.cli import launch
compare = launch.imported("compare")
from absl import flags

for path in sorted(glob.glob("configs/*.flags")):
    if path.endswith("default_run.flags"):  # train.py's: the default run's test runs it
        continue
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["compare.py", f"--flagfile={path}", "--data_dir=/nowhere", "--plan_only"])
    print("== " + path, flush=True)
    assert compare.main(["compare.py"]) == 0
"""


def test_every_paper_table_flagfile_plans_three_seeds_of_its_columns() -> None:
    """configs/*.flags, the README's table commands: each parses, passes every algorithm's
    option checks and plans seeds 0-2 of its columns, without data (`--plan_only`)."""
    plans = table_flags_probe()[0].split("== ")[1:]
    assert len(plans) == len(glob.glob(os.path.join(ROOT, "configs", "*.flags"))) - 1
    for plan in plans:
        path = plan.splitlines()[0]
        with open(os.path.join(ROOT, path)) as f:
            given = dict(line.strip()[2:].split("=", 1) for line in f if line.startswith("--"))
        for algorithm in given["algorithms"].split(","):
            for seed in given["seeds"].split(","):
                assert f"seed {seed} " in plan and f" {algorithm}: " in plan, (path, plan)
        assert "runs; outputs would be in" in plan, plan


# After `PLAN_EVERY_TABLE` (its imports) in one process: `table_flags_probe`.
COLUMNS_OF_FESEM_TABLE = """
flags.FLAGS(["compare.py", "--table=fesem"])
compare.apply_table_defaults("fesem")
for column in compare.parse_columns(flags.FLAGS.algorithms):
    spec = compare.column_spec(column)
    k = getattr(spec.algorithm_options, "num_clusters", "-")
    print(column.label, spec.algorithm, column.folder, k)
for bad in (["fedavg:3"], ["fesem:0"], ["fesem:x"], ["fesem:2", "fesem:2"], ["nope"]):
    try:
        compare.parse_columns(bad)
    except ValueError as e:
        print("refused", e)
"""


@functools.cache
def table_flags_probe() -> tuple[str, str, str]:
    """One process (TensorFlow loads once) for the checks of the tables' flags: the stdout of
    `PLAN_EVERY_TABLE`, then that of `COLUMNS_OF_FESEM_TABLE`, then `DEFAULTS_BY_DATASET`'s."""
    script = "\nprint('@@')\nflags.FLAGS.unparse_flags()\n".join(
        [PLAN_EVERY_TABLE, COLUMNS_OF_FESEM_TABLE, DEFAULTS_BY_DATASET]
    )
    done = run_binary(["-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    plans, columns, defaults = done.stdout.split("@@\n")
    return plans, columns, defaults


def test_a_column_per_k_runs_the_algorithm_with_that_many_clusters() -> None:
    """FeSEM's Table 2 has a column per K: `fesem:2` is FeSEM with K = 2 in its own folder;
    a K for an algorithm without clusters, a K below 1 or a repeated column is refused."""
    stdout = table_flags_probe()[1]
    lines = stdout.splitlines()
    assert "fesem:2 fesem fesem_k2 2" in lines and "fesem:4 fesem fesem_k4 4" in lines
    assert "ifca:3 ifca ifca_k3 3" in lines and "local local local -" in lines
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == 5, stdout
    assert "fedavg has no clusters" in refused[0] and "K must be" in refused[1]
    assert "K must be" in refused[2] and "more than once" in refused[3]
    assert "unknown algorithm 'nope'" in refused[4]


DEFAULTS_BY_DATASET = """
F = flags.FLAGS
for given in (
    ["--table=uapdfl"],
    ["--table=uapdfl", "--dataset=fashion_mnist", "--batch_size=7"],
    ["--table=fedac", "--dataset=cifar100"],
):
    F.unparse_flags()
    F(["compare.py", *given])
    lines = compare.apply_table_defaults(given[0].split("=")[1])
    print("==", " ".join(given))
    print("resolved", F.dataset, F.num_clients, F.num_neighbours, F.batch_size, F.lr_decay,
          F.rounds, F.classes_per_client, F.learning_rate)
    print("\\n".join(lines))
"""


def test_a_tables_digits_defaults_stay_on_the_digits_and_every_default_names_its_source() -> None:
    """UA-PDFL's table on the digits takes the digits' scale (batch 10, N_com = 3, decay
    0.99); on Fashion-MNIST the paper's protocol (batch 50, N_com = 5, decay 0.95, 30 peers,
    150 rounds), a flag given on the command line winning; FedAC's on CIFAR-100 its n = 8
    classes per client. Each value taken is listed under where it comes from."""
    stdout = table_flags_probe()[2]
    digits, fashion, cifar = (block.splitlines() for block in stdout.split("== ")[1:])
    assert digits[1] == "resolved digits_dirichlet 10 3 10 0.99 20 2 0.05"
    assert any(line.startswith("the embedded digits' scale: num_clients=10,") for line in digits)
    assert any(line.startswith("UA-PDFL Sec. 5.1: learning_rate=0.05") for line in digits)
    assert fashion[1] == "resolved fashion_mnist 30 5 7 0.95 150 2 0.05"
    assert not any("digits" in line or "batch_size" in line for line in fashion[2:]), fashion
    assert "UA-PDFL Sec. 5.1: num_clients=30, clients_per_round=30, num_neighbours=5, " in (
        "\n".join(fashion)
    )
    assert any(line.startswith("FedTSDP Sec. 4.1.4, by the same authors") for line in fashion)
    assert cifar[1].startswith("resolved cifar100 100 ") and cifar[1].endswith(" 1000 8 0.05")
    assert "FedAC Sec. 5.1 on CIFAR-100: classes_per_client=8" in cifar
    assert any(line.startswith("this project's (FedAC has lr 0.01") for line in cifar)


# compare.py's main run once per case in one process (importing TensorFlow once), as `app.run`
# would: each case's exit code and stderr as a JSON line.
EACH_COMPARE_CASE = (
    TRAIN_IN_ONE_PROCESS
    + """
for case in ARGUMENT:
    run_train(case)
"""
)


def compare_cases(cases: list[list[str]]) -> list[tuple[int, str]]:
    done = run_binary(["-c", EACH_COMPARE_CASE, json.dumps(cases), "compare"])
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(json.loads(line)) for line in done.stdout.splitlines() if line.startswith("[")]


def test_overwrite_reruns_the_cells_that_a_changed_command_or_a_lost_checkpoint_refuses(
    tmp_path: object,
) -> None:
    """A cell's run folder made under other settings (--rounds changed), or holding a finished
    run whose checkpoint is gone, is refused naming --overwrite, which compare.py now takes:
    it reruns the command's cells from scratch in their folders."""
    out = str(tmp_path / "table")
    cell = RunFolder(os.path.join(out, "fedavg"))
    run = [
        "--algorithms=fedavg",
        "--execution=in_process",
        "--local_epochs=1",
        f"--output_dir={out}",
    ]
    first = compare_cases([[*run, "--rounds=1"], [*run, "--rounds=2"]])
    assert first[0][0] == 0, first[0][1][-2000:]
    code, stderr = first[1]
    assert code == 2 and "rounds: checkpoint 1, now 2" in stderr, stderr[-2000:]
    assert "start over with --overwrite" in stderr
    assert [r["round"] for r in csv_rows(cell.metrics_csv)] == ["0", "1"]  # left as it was
    os.remove(cell.checkpoint)
    again = compare_cases([[*run, "--rounds=1"], [*run, "--rounds=2", "--overwrite"]])
    code, stderr = again[0]
    assert code == 2 and "no checkpoint.npz to resume from; pass --overwrite to replace it" in (
        stderr
    ), stderr[-2000:]
    assert again[1][0] == 0, again[1][1][-2000:]
    assert [r["round"] for r in csv_rows(cell.metrics_csv)] == ["0", "1", "2"]
    assert checkpoint.saved_settings(cell.checkpoint)["training"]["rounds"] == 2
    with open(os.path.join(out, "comparison.md")) as f:
        assert "2 rounds" in f.read()


def csv_rows(path: str) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


# The cells of the privacy table planned for several command lines, in one process: each
# command's (setting, column, the run's aggregator settings) per cell, or its error.
PRIVATE_ROWS = """
import json, sys
sys.argv = ["compare.py"]
from tff_clustered.cli import launch
compare = launch.imported("compare")
from absl import flags

def cells(*argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["compare.py", "--table=privacy", "--data_dir=/nowhere", *argv])
    compare.apply_table_defaults("privacy")
    columns = compare.parse_columns(flags.FLAGS.algorithms)
    try:
        return compare.plan_runs(columns, [0], flags.FLAGS.settings, "out")
    except ValueError as e:
        return str(e)

secure = cells("--dp_noise=secure")
named = cells(
    "--aggregator=dp", "--dp_clipping=adaptive", "--dp_noise=secure", "--target_epsilon=8"
)
print(json.dumps({
    "secure": [[r.setting, r.column, r.spec.training.aggregator.settings()] for r in secure],
    "same_runs": [a.spec == b.spec and a.folder == b.folder for a, b in zip(secure, named)],
    "seeded": [r.spec.training.aggregator.settings().get("noise") for r in cells()],
    "no_private_row": cells("--dp_noise=secure", "--settings=mean"),
}))
"""


def test_one_dp_flag_gives_every_private_row_of_the_table_its_setting() -> None:
    """`--dp_noise=secure` alone on the privacy table makes every private cell's noise secure
    (adaptive clipping and each row's epsilon as ever): the same runs as the command that named
    --aggregator=dp --dp_clipping=adaptive --dp_noise=secure --target_epsilon=8 for it. The mean
    row takes none of it; without a row that takes it, the flag is refused as before."""
    done = run_binary(["-c", PRIVATE_ROWS])
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    cells = found["secure"]
    assert {(s, c) for s, c, _ in cells} == {
        (s, c)
        for s in ("mean", "epsilon:8", "epsilon:4", "epsilon:1")
        for c in ("fedavg", "ifca", "fedgroup", "fesem", "fedper")
    }
    for setting, _, aggregator in cells:
        if setting == "mean":
            assert aggregator["name"] == "mean" and aggregator["noise"] == "seeded"
            continue
        assert aggregator["name"] == "dp" and aggregator["noise"] == "secure"
        assert aggregator["clipping"] == "adaptive"
        assert aggregator["target_epsilon"] == float(setting.split(":")[1])
    assert found["same_runs"] == [True] * len(cells)
    assert set(found["seeded"]) == {"seeded"}  # without the flag, every row's noise is seeded
    assert found["no_private_row"] == (
        "--dp_noise set with --aggregator=mean, which does not use them: add --aggregator=dp, "
        "or leave them unset"
    )
