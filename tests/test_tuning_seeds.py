"""Tuning over seeds and beyond a range's edge (issue 65): `compare.py --tune_seeds=N` scores a
trial by its mean validation accuracy over the table's N lowest seeds, `--tune_widenings=W`
searches beyond the edge a chosen value lies at; with the defaults a tuned table is made as
before, run for run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_binary, runs_in_one_process
from test_tuning import DIGITS, FEDPROX

from tff_clustered import search_space
from tff_clustered.cli import table_commands
from tff_clustered.comparison import tuning
from tff_clustered.data.spec import DataSpec
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.runs.run_spec import RunSpec

# compare.py with every run replaced by one that trains nothing: its final accuracy is a
# fixed function of the run's learning rate (best at PEAK), seed, mu and split, and each run
# (its folder, split, seed, learning rate, mu) is appended to the file $FAKE_CALLS.
FAKE_RUNS = """
import json, math, os, sys
from absl import app
from tff_clustered.cli import compare, exits

PEAK = float(os.environ["FAKE_PEAK"])


def accuracy(spec):
    t = spec.training
    mu = getattr(spec.algorithm_options, "mu", 0.0)
    a = 0.6 - 0.05 * abs(math.log(t.learning_rate / PEAK)) + 0.004 * t.seed - 0.01 * mu
    return round(a + (0.01 if spec.data.split == "validation" else 0.0), 6)


def run_one(spec, output_dir, execution):
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps([os.path.relpath(output_dir, sys.argv[-1].split("=", 1)[1]),
                            spec.data.split, spec.training.seed, spec.training.learning_rate,
                            getattr(spec.algorithm_options, "mu", None)]) + "\\n")
    a = accuracy(spec)
    row = {"accuracy": a, "loss": 1.0 - a, "client_accuracy_mean": a, "floats_communicated": 1.0}
    start = {"round": 0, "accuracy": 0.1, "loss": 2.0, "client_accuracy_mean": 0.1}
    return {"history": [start, {"round": 1, **row}]}


compare.run_one = run_one
sys.argv = ["compare.py", *sys.argv[1:]]
app.run(compare.main, flags_parser=exits.parse_flags)
"""

TABLE = ["--algorithms=fedavg,fedprox", "--tune=all", "--rounds=1", "--execution=in_process"]

# What compare.py made of `TABLE --tune_budget=3 --seeds=0,1` (PEAK 0.1) before --tune_seeds
# existed (commit b56da7a): its runs in order, its tuning.csv and its Tuning section.
RUNS_BEFORE = [
    ["tuning/s0/fedavg/trial00", "validation", 0, 0.13458174421040978, None],
    ["tuning/s0/fedavg/trial01", "validation", 0, 0.1624349026493707, None],
    ["tuning/s0/fedavg/trial02", "validation", 0, 0.027567198202328, None],
    ["tuning/s0/fedprox/trial00", "validation", 0, 0.13458174421040978, 0.015685911284011988],
    ["tuning/s0/fedprox/trial01", "validation", 0, 0.1624349026493707, 0.009438824575958014],
    ["tuning/s0/fedprox/trial02", "validation", 0, 0.027567198202328, 0.01379190496625813],
    ["s0/fedavg", "test", 0, 0.13458174421040978, None],
    ["s0/fedprox", "test", 0, 0.13458174421040978, 0.015685911284011988],
    ["s1/fedavg", "test", 1, 0.13458174421040978, None],
    ["s1/fedprox", "test", 1, 0.13458174421040978, 0.015685911284011988],
]
TUNING_CSV_BEFORE = """\
setting,algorithm,trial,values,validation_accuracy,chosen
,fedavg,0,--learning_rate=0.135,0.595150,1
,fedavg,1,--learning_rate=0.162,0.585745,0
,fedavg,2,--learning_rate=0.0276,0.545573,0
,fedprox,0,--learning_rate=0.135 --mu=0.0157,0.594993,1
,fedprox,1,--learning_rate=0.162 --mu=0.00944,0.585650,0
,fedprox,2,--learning_rate=0.0276 --mu=0.0138,0.545435,0
"""
TUNING_SECTION_BEFORE = """\
## Tuning

Every method had 3 trials (equal budget), each run on the validation split (a seeded 15 % of \
each client's training examples) with seed 0 and scored by its final validation accuracy; the \
best trial's values were then run on the test split with the table's seeds. Every trial is in \
tuning.csv.

- fedavg: trial00 of 3, --learning_rate=0.135, validation 59.51%
- fedprox: trial00 of 3, --learning_rate=0.135 --mu=0.0157, validation 59.50%
"""


def fake_table(tmp_path: Path, peak: float, *flags: str) -> tuple[list[list[Any]], str, str]:
    """`TABLE` with `flags` run by `FAKE_RUNS`: its runs, its tuning.csv and comparison.md."""
    out, calls = tmp_path / "out", tmp_path / "calls"
    done = run_binary(
        ["-c", FAKE_RUNS, *TABLE, *flags, f"--output_dir={out}"],
        env_extra={"FAKE_CALLS": str(calls), "FAKE_PEAK": str(peak)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads(line) for line in calls.read_text().splitlines()]
    return runs, (out / "tuning.csv").read_text(), (out / "comparison.md").read_text()


def tuning_section(markdown: str) -> str:
    """comparison.md's Tuning section: its heading to its last method's line."""
    lines = markdown[markdown.index("## Tuning") :].splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith("- "))
    return "".join(lines[: last + 1])


def test_one_seed_makes_the_same_runs_choices_and_files_as_before(tmp_path: Path) -> None:
    """--tune_seeds=1 (the default, and given) runs the same trials with the same seeds and
    values, in the same folders, chooses the same and writes the same tuning.csv and Tuning
    section, byte for byte, as compare.py before --tune_seeds (recorded above)."""
    seeds = ["--tune_budget=3", "--seeds=0,1"]
    for given in ([], ["--tune_seeds=1", "--tune_widenings=0"]):
        runs, csv_text, markdown = fake_table(tmp_path / str(len(given)), 0.1, *seeds, *given)
        assert runs == RUNS_BEFORE
        assert csv_text == TUNING_CSV_BEFORE
        assert tuning_section(markdown) == TUNING_SECTION_BEFORE


def test_several_seeds_score_each_trial_on_each_and_keep_the_first_seeds_draws(
    tmp_path: Path,
) -> None:
    """--tune_seeds=2 of seeds 2,0,1 runs each trial with seeds 0 and 1 (the two lowest), the
    trials drawn as with one seed; the runs stay those of --tune_seeds=1 plus seed 1's."""
    runs, csv_text, markdown = fake_table(
        tmp_path, 0.1, "--tune_budget=3", "--seeds=2,0,1", "--tune_seeds=2"
    )
    trials = [run for run in runs if run[1] == "validation"]
    before = [run for run in RUNS_BEFORE if run[1] == "validation"]
    assert [r for r in trials if r[2] == 0] == before
    assert [r for r in trials if r[2] == 1] == [
        [folder.replace("/s0/", "/s1/"), split, 1, rate, mu]
        for folder, split, _, rate, mu in before
    ]
    header, *lines = csv_text.splitlines()
    assert header.endswith(",chosen,validation_std,validation_seed0,validation_seed1")
    assert "with seeds 0, 1 (--tune_seeds=2) and scored by the mean" in markdown
    # the default folder of a table tuned otherwise is another: no run is shared
    planned = run_binary(
        ["binaries/compare.py", "--algorithms=fedavg", "--tune=all", "--seeds=0,1",
         "--tune_seeds=2", "--tune_widenings=1", "--plan_only"]
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "tuning: each trial on seeds 0, 1; up to 1 search beyond an edge" in planned.stdout
    assert planned.stdout.rstrip().endswith("compare-fedgroup-digits-seeds0-1-tuned-2seeds-widen1")


def summary_results(folder: Path) -> dict[str, Any]:
    with open(folder / "summary.json") as f:
        summary = json.load(f)
    assert summary["results"]["split"] == "validation"
    return {**summary["results"], "seed": summary["config"]["training"]["seed"]}


def test_a_trials_score_is_the_mean_of_its_seeds_validation_accuracies(tmp_path: Path) -> None:
    """A real tuned table on the digits (1 round), --tune_seeds=2: each trial ran on seeds 0
    and 1 in their own folders; tuning.csv's score of a trial is the mean of the final
    validation accuracies those runs recorded, its std their sample std, and its Tuning line
    gives the chosen trial's margin over the runner-up in their spread."""
    out = tmp_path / "table"
    done = run_binary(
        ["binaries/compare.py", "--algorithms=fedavg", "--tune=learning_rate",
         "--tune_budget=2", "--seeds=0,1", "--tune_seeds=2", "--rounds=1",
         "--clients_per_round=4", "--local_epochs=1", "--execution=in_process",
         f"--output_dir={out}"],
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "tuning.csv") as f:
        header, *lines = f.read().splitlines()
    columns = header.split(",")
    rows = [dict(zip(columns, line.split(","))) for line in lines]
    assert len(rows) == 2
    for row in rows:
        trial = f"trial{int(row['trial']):02d}"
        recorded = [summary_results(out / "tuning" / f"s{s}" / "fedavg" / trial) for s in (0, 1)]
        assert [r["seed"] for r in recorded] == [0, 1]
        accuracies = [r["final_accuracy"] for r in recorded]
        assert [float(row["validation_seed0"]), float(row["validation_seed1"])] == [
            pytest.approx(a, abs=5e-7) for a in accuracies
        ]
        mean = (accuracies[0] + accuracies[1]) / 2
        assert float(row["validation_accuracy"]) == pytest.approx(mean, abs=5e-7)
        std = abs(accuracies[0] - accuracies[1]) / math.sqrt(2)
        assert float(row["validation_std"]) == pytest.approx(std, abs=5e-7)
    chosen = next(row for row in rows if row["chosen"] == "1")
    assert float(chosen["validation_accuracy"]) == max(
        float(r["validation_accuracy"]) for r in rows
    )
    with open(out / "comparison.md") as f:
        line = next(x for x in f.read().splitlines() if x.startswith("- fedavg: trial"))
    assert f"validation {100 * float(chosen['validation_accuracy']):.2f}% ± " in line
    assert "points above the runner-up trial0" in line and "times their spread" in line


def test_the_committed_femnist_tuning_replayed_is_the_same_and_says_its_edge() -> None:
    """results/fedgroup-femnist_leaf-tuned replayed through `tuning.tune` with one seed and no
    widening, each trial scored as its tuning.csv records: the same trials are drawn, the same
    chosen, tuning.csv and the Tuning section's first lines come out byte for byte, and each
    method's line ends saying its learning rate 0.0117 lies at the top of the range searched."""
    folder = Path(ROOT) / "results" / "fedgroup-femnist_leaf-tuned"
    committed_csv = (folder / "tuning.csv").read_text()
    rows = [line.split(",") for line in committed_csv.splitlines()[1:]]
    plan = tuning.TuningPlan.of_table(["all"], 4, [0, 1, 2])
    training = TrainingConfig(learning_rate=0.003)  # configs/fedgroup_femnist.flags
    methods = []
    for column in dict.fromkeys(row[1] for row in rows):
        recorded = {int(r[2]): (r[3], float(r[4])) for r in rows if r[1] == column}

        def score_trial(
            index: int, values: dict[str, Any], recorded: dict = recorded
        ) -> tuple[float, ...]:
            text, score = recorded[index]
            assert tuning.values_text(values) == text
            return (score,)

        spec = RunSpec(column, DataSpec("femnist_leaf"), training=training)
        methods.append(tuning.tune(plan, spec, None, column, score_trial))
    assert tuning.tuning_csv(methods) == committed_csv
    markdown = (folder / "comparison.md").read_text()
    lines = tuning.tuning_lines(methods, plan)
    assert "\n".join(lines[:4]) in markdown
    edge = (
        "; --learning_rate=0.0117 lies at the top of the range searched, [0.00075, 0.012]: the "
        "optimum may lie beyond it (no search beyond it: --tune_widenings=0)"
    )
    for line in lines[5:]:
        assert line.endswith(edge) and line[: -len(edge)] in markdown.splitlines(), line


# A method's tuning with `tuning.tune`, scored without training: a trial's score on each seed
# is `accuracy(values)` plus the seed's offset.
def tuned(
    spec: RunSpec, knobs: list[str], widenings: int, accuracy: Any, budget: int = 4
) -> tuple[tuning.TunedMethod, list[tuple[int, dict[str, Any]]]]:
    plan = tuning.TuningPlan.of_table(knobs, budget, [0, 1, 2], 2, widenings)
    calls: list[tuple[int, dict[str, Any]]] = []

    def score_trial(index: int, values: dict[str, Any]) -> tuple[float, ...]:
        calls.append((index, dict(values)))
        return tuple(accuracy(values) + 0.01 * seed for seed in plan.seeds)

    return tuning.tune(plan, spec, None, spec.algorithm, score_trial), calls


def rising(values: dict[str, Any]) -> float:
    """Better the larger the learning rate, without bound: the optimum beyond any range."""
    return 0.5 + 0.01 * math.log(values["learning_rate"])


def test_a_value_at_the_edge_is_searched_beyond_it_at_most_twice() -> None:
    """FedProx's learning rate rising past its range (0.025 to 0.4 around 0.1): the chosen
    trial's value lies at the top, so 4 more trials draw it from [0.4, 1.6] (a factor of 4
    beyond, half the range's log width), mu held at the chosen trial's; then from [1.6, 6.4];
    then no widening is left and its Tuning line says the optimum may lie beyond [0.025, 6.4].
    The trials are numbered on, each knob drawn by its trial's own generator: the same again."""
    method, calls = tuned(FEDPROX, ["all"], 2, rising)
    assert [index for index, _ in calls] == list(range(12)) and len(method.trials) == 12
    first = tuning.draw_trials(FEDPROX, tuning.tuned_space(FEDPROX, ["all"]), 4, seed=0)
    assert [t.values for t in method.trials[:4]] == first
    best = max(first, key=rising)
    widened = [t.values for t in method.trials[4:8]]
    assert all(0.4 <= v["learning_rate"] <= 1.6 and v["mu"] == best["mu"] for v in widened)
    assert all(1.6 <= t.values["learning_rate"] <= 6.4 for t in method.trials[8:])
    assert [(w.knob, w.side, w.trials) for w in method.widenings] == [
        ("learning_rate", "high", range(4, 8)),
        ("learning_rate", "high", range(8, 12)),
    ]
    assert method.widenings[1].searched == search_space.LogUniform(0.025, 1.6)
    (edge,) = method.edges
    assert edge.searched.low == 0.025 and edge.searched.high == pytest.approx(6.4)
    assert method.chosen == 8 + max(range(4), key=lambda t: rising(method.trials[8 + t].values))
    line = method.line()
    assert "trials 04-07 drew --learning_rate beyond the top of [0.025, 0.4], in [0.4, 1.6]" in line
    assert line.endswith(
        f"; --learning_rate={edge.value:.3g} lies at the top of the range searched, [0.025, 6.4]: "
        "the optimum may lie beyond it (after 2 searches beyond it, the most --tune_widenings "
        "allows)"
    )
    assert tuned(FEDPROX, ["all"], 2, rising)[0] == method


def test_without_widening_the_edge_is_said_and_the_trials_are_the_first_ones() -> None:
    method, calls = tuned(FEDPROX, ["learning_rate"], 0, rising)
    assert len(calls) == 4 and method.widenings == ()
    assert method.line().endswith(
        "the optimum may lie beyond it (no search beyond it: --tune_widenings=0)"
    )
    # a chosen value inside its range: no widening, no edge, the line as before
    inside, calls = tuned(FEDPROX, ["learning_rate"], 2, lambda v: -abs(v["learning_rate"] - 0.1))
    assert len(calls) == 4 and inside.edges == () and inside.widenings == ()
    assert inside.line().startswith("fedprox: trial") and "beyond" not in inside.line()


def test_a_range_at_its_knobs_limit_is_not_widened_past_it() -> None:
    """UA-PDFL's alike ratio r (uniform 0.5 to 1.5; at r = 2 every pair of peers is alike, its
    limit) rising: its chosen value at the top, 8 trials draw it from [1.5, 2] (half the
    range's width further, which reaches the limit), mu held at the chosen trial's; the new
    choice lies at 2, the limit: no further search though a widening is left, and the line
    says no value lies beyond it."""
    uapdfl = RunSpec("uapdfl", DIGITS, training=FEDPROX.training)
    method, calls = tuned(uapdfl, ["all"], 2, lambda v: v["uapdfl_alike_ratio"], budget=8)
    assert [w.drawn for w in method.widenings] == [
        search_space.Uniform(1.5, 2.0, limits=(0.0, 2.0))
    ]
    assert len(calls) == 16
    first = max(method.trials[:8], key=lambda t: t.values["uapdfl_alike_ratio"]).values
    assert first["uapdfl_alike_ratio"] > 1.4
    assert {v["uapdfl_mu"] for _, v in calls[8:]} == {first["uapdfl_mu"]}
    (edge,) = method.edges
    assert edge.knob == "uapdfl_alike_ratio" and edge.at_limit and edge.value > 1.85
    assert method.line().endswith(
        f"; --uapdfl_alike_ratio={edge.value:.3g} lies at the top of the range searched, "
        "[0.5, 2], the knob's limit: no value lies beyond it"
    )


def test_edges_and_what_lies_beyond_them() -> None:
    """`edge_of`: within 10 % of the range's width (on its scale) of an edge; `beyond`: half
    the width further by default of `tune`, cut at the knob's limits; `joined`: both."""
    rate = search_space.LEARNING_RATE.range_of(0.003)  # FEMNIST's: 0.00075 to 0.012
    assert search_space.edge_of(rate, 0.0117) == search_space.HIGH  # the committed choice
    assert search_space.edge_of(rate, 0.003) is None
    assert search_space.edge_of(rate, 0.0008) == search_space.LOW
    step = search_space.width(rate) / 2
    above = search_space.beyond(rate, search_space.HIGH, step)
    assert above == search_space.LogUniform(0.012, pytest.approx(0.048))
    below = search_space.beyond(rate, search_space.LOW, step)
    assert below == search_space.LogUniform(pytest.approx(0.0001875), 0.00075)
    assert search_space.joined(rate, above) == search_space.LogUniform(0.00075, above.high)
    ratio = search_space.Uniform(0.5, 1.5, limits=(0.0, 2.0))  # UA-PDFL's alike ratio
    assert search_space.edge_of(ratio, 1.45) == search_space.HIGH
    assert search_space.edge_of(ratio, 1.35) is None
    assert search_space.beyond(ratio, search_space.HIGH, 0.5) == search_space.Uniform(
        1.5, 2.0, limits=(0.0, 2.0)
    )
    assert search_space.beyond(ratio, search_space.LOW, 0.75) == search_space.Uniform(
        0.0, 0.5, limits=(0.0, 2.0)
    )
    assert search_space.Choice((1, 2)).range_of(1) is None


def test_bad_tune_seeds_and_widenings_are_refused_in_one_line(tmp_path: Path) -> None:
    """--tune_seeds below 1, above the table's seeds, or without --tune, and --tune_widenings
    outside 0 to 2 exit 2 with one line naming the flag and what to give; the Python API
    (`TuningPlan.of_table`) refuses the same with the same words."""
    plan = ["--algorithms=fedavg", "--plan_only", f"--output_dir={tmp_path}"]
    cases = [
        (["--tune=all", "--seeds=0,1", "--tune_seeds=0"],
         "--tune_seeds=0: a trial runs with at least one seed; give --tune_seeds from 1 to 2"),
        (["--tune=all", "--seeds=0,1", "--tune_seeds=3"],
         "--tune_seeds=3: a trial runs with the table's 3 lowest seeds, and the table has 2 "
         "(0, 1); give --tune_seeds from 1 to 2, or more seeds in --seeds"),
        (["--tune=all", "--tune_seeds=2"], "the table has 1 (0); give --tune_seeds from 1 to 1"),
        (["--seeds=0,1", "--tune_seeds=2"], "--tune_seeds=2 set without --tune"),
        (["--tune_widenings=1"], "--tune_widenings=1 set without --tune"),
        (["--tune=all", "--tune_widenings=3"], "3 is not an integer in the range [0, 2]"),
    ]  # fmt: skip
    results = runs_in_one_process([[*plan, *given] for given, _ in cases], "compare")
    for (given, message), done in zip(cases, results, strict=True):
        assert done.returncode == 2 and message in done.stderr, (given, done.stderr[-2000:])
        assert done.stderr.count("\n") <= 2 and "Traceback" not in done.stderr, given
    assert not os.listdir(tmp_path)
    with pytest.raises(ValueError, match=r"^--tune_seeds=3: .* or more seeds in --seeds$"):
        tuning.TuningPlan.of_table(["all"], 4, [1, 0], 3)
    with pytest.raises(ValueError, match=r"^--tune_seeds=0: a trial runs with at least one"):
        tuning.TuningPlan.of_table(["all"], 4, [0], 0)
    with pytest.raises(ValueError, match=r"^--tune_widenings=3: give 0 .* to 2$"):
        tuning.TuningPlan.of_table(["all"], 4, [0], 1, 3)
    assert tuning.TuningPlan.of_table(["all"], 4, [2, 0, 1], 2).seeds == (0, 1)


def test_a_check_of_a_table_tuned_over_seeds_reruns_its_cell_with_the_tuning_seeds() -> None:
    """check_results.py narrows a table's command to one cell and its lowest seed; a table
    tuned over 3 seeds keeps the 3 its trials ran with (only the cell's seed is compared)."""
    command = ["--table=fedgroup", "--algorithms=fedavg,ifca", "--seeds=2,0,1", "--tune=all"]
    cell = table_commands.Cell("digits", "fedavg", (0,))
    assert table_commands.rerun_arguments(command, cell)[-1] == "--seeds=0"
    tuned_over_seeds = table_commands.rerun_arguments([*command, "--tune_seeds=3"], cell)
    assert tuned_over_seeds[-1] == "--seeds=0,1,2"
    every_seed = table_commands.Cell("digits", "fedavg", (0, 1, 2))
    assert table_commands.rerun_arguments([*command, "--tune_seeds=2"], every_seed)[-1] == (
        "--seeds=0,1,2"
    )
