"""The validation split and tuned comparisons: held-out examples, seeded trials, no test read."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import history_rows, run_binary, runs_in_one_process

import tff_clustered
from tff_clustered.comparison import tuning
from tff_clustered.data import registry, validation
from tff_clustered.data.federated_data import DataError, FederatedData, from_arrays
from tff_clustered.data.registry import load_dataset
from tff_clustered.data.spec import DataSpec
from tff_clustered.data.validation import validation_size
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.runs import runner
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runtime.context import RuntimeConfig

DIGITS = DataSpec("digits", num_clients=12)
FEDPROX = RunSpec(
    "fedprox",
    DIGITS,
    training=TrainingConfig(rounds=2, clients_per_round=6, learning_rate=0.1, seed=3),
)


def rows_of(arrays: Mapping[str, np.ndarray]) -> list[bytes]:
    """A client's examples as sorted byte strings (input and label): a multiset to compare."""
    return sorted(x.tobytes() + int(y).to_bytes(2, "little") for x, y in zip(*arrays.values()))


def test_validation_size_holds_out_a_share_never_all_nor_a_lone_example() -> None:
    sizes = {n: validation_size(n) for n in (1, 2, 3, 7, 10, 100, 1000)}
    assert sizes == {1: 0, 2: 1, 3: 1, 7: 1, 10: 2, 100: 15, 1000: 150}


def test_the_validation_split_is_a_seeded_part_of_each_clients_training_examples() -> None:
    """Train and validation of the view are exactly the client's training examples, in the
    rule's sizes; the test examples are not in it; the seed decides, the same seed again."""
    data = load_dataset(DIGITS, seed=3)
    view = load_dataset(dataclasses.replace(DIGITS, split="validation"), seed=3)
    again = load_dataset(dataclasses.replace(DIGITS, split="validation"), seed=3)
    other = load_dataset(DataSpec("digits", num_clients=12, split="validation"), seed=4)
    assert view.evaluated_split == "validation" and data.evaluated_split == "test"
    for client in data.client_ids:
        n = data.train_sizes[client]
        assert view.test_sizes[client] == validation_size(n) == len(view.test_arrays[client]["y"])
        assert view.train_sizes[client] == n - validation_size(n)
        both = {
            k: np.concatenate([view.train_arrays[client][k], view.test_arrays[client][k]])
            for k in ("x", "y")
        }
        assert rows_of(both) == rows_of(data.train_arrays[client])
        for k in ("x", "y"):
            assert np.array_equal(view.test_arrays[client][k], again.test_arrays[client][k])
    assert any(
        not np.array_equal(view.test_arrays[c]["y"], other.test_arrays[c]["y"])
        or not np.array_equal(view.test_arrays[c]["x"], other.test_arrays[c]["x"])
        for c in data.client_ids
    )


def one_example_clients(*larger: int) -> FederatedData:
    """8 clients of one training example each, but clients `larger` of 3, seen as a
    `--split=validation` run sees them."""
    rng = np.random.default_rng(0)
    sizes = [3 if i in larger else 1 for i in range(8)]
    arrays = {
        f"c{i}": (rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2)
        for i, n in enumerate(sizes)
    }
    return validation.validation_view(from_arrays("tiny", arrays, arrays, 2), seed=0)


def test_no_validation_example_is_refused_and_a_cluster_without_any_scores_nothing(
    tmp_path: Path,
) -> None:
    """Issue 64: every client of 1 training example has no validation example: refused where
    the split is made, naming it and the fix, instead of TF's "Expected multiples[0] >= 0" in
    the scoring; an evaluation sample of such clients is refused too; clusters whose members
    have none (IFCA's, with one client of 3 examples) score nothing and the run goes on."""
    with pytest.raises(DataError, match="no client of tiny has a validation example .* or use"):
        one_example_clients()
    data = one_example_clients(5)
    assert [data.test_sizes[f"c{i}"] for i in range(8)] == [0] * 5 + [1] + [0] * 2
    training = TrainingConfig(rounds=1, clients_per_round=3, local_epochs=1)

    def run(algorithm: str, output_dir: Path, **args: Any) -> tff_clustered.RunResult:
        return tff_clustered.run(
            algorithm, data, ModelChoice("mclr"), output_dir=str(output_dir),
            execution="in_process", log=lambda line: None, **args,
        )  # fmt: skip

    sample = dataclasses.replace(training, eval_clients=1)  # c0's alone (seed 0)
    with pytest.raises(DataError, match="none of the 1 scored clients .* has a validation ex"):
        run("fedavg", tmp_path / "a", training=sample)
    done = run("ifca", tmp_path / "b", training=training, options={"num_clusters": 2})
    assert [row["round"] for row in done.history] == [0, 1]


def test_the_default_split_records_and_loads_as_before() -> None:
    spec = RunSpec("fedavg", DIGITS)
    assert "split" not in spec.settings()
    assert tuning.on_validation(spec).settings()["split"] == "validation"
    with pytest.raises(ValueError, match="--split=train: choose test"):
        DataSpec("digits", split="train")


def test_the_same_seed_draws_the_same_trials_and_every_method_the_same_learning_rates() -> None:
    space = tuning.tuned_space(FEDPROX, ["all"])
    assert set(space) == {"learning_rate", "mu"}
    trials = tuning.draw_trials(FEDPROX, space, 5, seed=0)
    assert trials == tuning.draw_trials(FEDPROX, space, 5, seed=0)
    assert trials != tuning.draw_trials(FEDPROX, space, 5, seed=1)
    assert len(trials) == 5 and all(0.025 <= t["learning_rate"] <= 0.4 for t in trials)
    assert all(1e-3 <= t["mu"] <= 1.0 for t in trials)
    fedavg = RunSpec("fedavg", DIGITS, training=FEDPROX.training)
    lrs = tuning.draw_trials(fedavg, tuning.tuned_space(fedavg, ["all"]), 5, seed=0)
    assert [t["learning_rate"] for t in lrs] == [t["learning_rate"] for t in trials]
    assert tuning.with_values(FEDPROX, trials[0]).algorithm_options.mu == trials[0]["mu"]


def test_the_best_trial_is_the_first_of_the_highest_and_never_a_nan() -> None:
    assert tuning.best_trial([0.5, float("nan"), 0.7, 0.7]) == 2
    assert tuning.best_trial([float("nan"), 0.1]) == 1
    # every trial diverged: none is chosen, and the method's line says why and what to lower
    assert tuning.best_trial([float("nan"), float("nan")]) is None
    trials = tuple(tuning.Trial({"learning_rate": rate}, (float("nan"),)) for rate in (0.05, 0.3))
    method = tuning.TunedMethod("iid", "fedavg", trials, seeds=(0,))
    assert method.line() == (
        "iid fedavg: no trial of 2 chosen: every trial diverged (learning rates 0.05 to 0.3), "
        "so fedavg has no values to test and no row; lower --learning_rate (the trials draw "
        "within a factor of 4 of it) or the range of its knobs"
    )
    # a search that does not tune the learning rate (--tune=mu): the trials took it as given
    untuned = tuple(tuning.Trial({"mu": mu}, (float("nan"),)) for mu in (0.01, 0.1))
    line = tuning.TunedMethod("iid", "fedprox", untuned, seeds=(0,)).line()
    assert line.endswith(
        "lower --learning_rate (every trial took it as given) or the range of the knobs tuned"
    ), line
    assert tuning.tuning_csv([method]).splitlines()[1:] == [
        "iid,fedavg,0,--learning_rate=0.05,nan,0",
        "iid,fedavg,1,--learning_rate=0.3,nan,0",
    ]


class ReadRecorder(Mapping):
    """A split's arrays whose every read is recorded."""

    def __init__(self, arrays: Mapping, reads: list) -> None:
        self.arrays, self.reads = arrays, reads

    def __getitem__(self, client: str) -> object:
        self.reads.append(client)
        return self.arrays[client]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


def final_accuracies(spec: RunSpec, trials: list) -> list[float]:
    """Each trial of `spec` run in process as tuning runs it, and its final accuracy."""
    scores = []
    for values in trials:
        trial = tuning.on_validation(tuning.with_values(spec, values))
        experiment = runner.spec_experiment(trial, RunExecution(RuntimeConfig("in_process")))
        experiment.start()
        list(experiment.rounds())
        scores.append(history_rows(experiment)[-1]["accuracy"])
    return scores


def test_tuning_reads_only_validation_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials run on data whose test labels are poisoned and whose test reads are recorded
    score exactly as on clean data, with no test read; a test-split run on the same data does
    read them and scores otherwise (the instrument works)."""
    trials = tuning.draw_trials(FEDPROX, tuning.tuned_space(FEDPROX, ["all"]), 2, seed=0)
    clean = final_accuracies(FEDPROX, trials)
    reads: list = []
    load = registry.load_federation

    def poisoned(spec: DataSpec, seed: int) -> object:
        data = load(spec, seed)
        test = {
            c: collections.OrderedDict(x=a["x"], y=(a["y"] + 1) % data.num_classes)
            for c, a in data.test_arrays.items()
        }
        return dataclasses.replace(data, test_arrays=ReadRecorder(test, reads))

    monkeypatch.setattr(registry, "load_federation", poisoned)
    assert final_accuracies(FEDPROX, trials) == clean and reads == []
    test_run = runner.spec_experiment(FEDPROX, RunExecution(RuntimeConfig("in_process")))
    test_run.start()
    list(test_run.rounds())
    assert reads and history_rows(test_run)[-1]["accuracy"] < 0.2


# Flags of compare.py's tuning that would do nothing or never end, and the refusal of each.
REFUSED_TUNING = [
    (["--tune="], "--tune= names no knob: give all, or some of learning_rate"),
    (["--tune=,"], "--tune=, names no knob"),
    (["--tune_budget=3"], "--tune_budget=3 set without --tune, which does not use it"),
    (["--tune=all", "--tune_budget=99999999999999999999"], "--tune_budget=9999"),
    (["--tune=all", "--tune_budget=1001"], "1001 is not an integer in the range [1, 1000]"),
]


@pytest.fixture(scope="module")
def compare_plans(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """In one process of compare.py's main (TensorFlow imported once): the plan of a tuned
    table, then each of `REFUSED_TUNING` planned into an empty folder."""
    folder = tmp_path_factory.mktemp("refused_tuning")
    plan = ["--algorithms=fedavg", "--plan_only", f"--output_dir={folder}"]
    planned, *refused = runs_in_one_process(
        [
            ["--algorithms=fedavg,fedprox,fedgroup,fesem", "--plan_only", "--tune=all"]
            + ["--tune_budget=3"],
            *([*plan, *given] for given, _ in REFUSED_TUNING),
        ],
        "compare",
    )
    return {"planned": planned, "refused": refused, "folder": folder}


def test_compare_plans_equal_trials_and_refuses_an_unknown_knob(compare_plans: dict) -> None:
    """`--plan_only` lists the same number of trials for every column, FedGroup's and FeSEM's
    with their own knobs as the seed draws them; a knob no column declares is refused
    (compare.py exits 2 on the ValueError, as on any bad flag)."""
    planned = compare_plans["planned"]
    assert planned.returncode == 0, planned.stderr[-2000:]
    lines = [line for line in planned.stdout.splitlines() if line.startswith("tuning ")]
    for algorithm in ("fedavg", "fedprox", "fedgroup", "fesem"):
        assert len([x for x in lines if f" {algorithm} " in x]) == 3
    for algorithm in ("fedgroup", "fesem"):
        spec = RunSpec(algorithm, DIGITS, training=FEDPROX.training)
        own = {k: v for k, v in tuning.tuned_space(spec, ["all"]).items() if k != "learning_rate"}
        for index, values in enumerate(tuning.draw_trials(spec, own, 3, seed=0)):
            line = f"tuning {algorithm} trial {index}: "
            assert any(
                x.startswith(line) and x.endswith(tuning.values_text(values)) for x in lines
            ), (line, tuning.values_text(values), lines)
    with pytest.raises(ValueError, match="no method of the table searches bogus; give all"):
        tuning.check_knobs([FEDPROX], ["mu", "bogus"])


def test_tuning_flags_that_would_do_nothing_or_never_end_are_refused(compare_plans: dict) -> None:
    """An empty --tune=, --tune_budget without --tune and a budget past `MAX_BUDGET` (which
    --plan_only would list forever) exit 2 naming the flag, nothing written (issue 64)."""
    assert tuning.MAX_BUDGET == 1000
    results = compare_plans["refused"]
    assert len(results) == len(REFUSED_TUNING)
    for (given, message), done in zip(REFUSED_TUNING, results):
        assert done.returncode == 2 and message in done.stderr, (given, done.stderr[-2000:])
        assert done.stderr.count("\n") <= 2 and "Traceback" not in done.stderr, (
            given,
            done.stderr,
        )
    assert not os.listdir(compare_plans["folder"])


# FedGroup's, FeSEM's and UA-PDFL's own knobs (docs/tuning.md), each a value its range holds.
OWN_KNOBS = {
    "fedgroup": {"pretrain_scale": {5, 10, 20, 40}, "pretrain_epochs": {1, 2, 5}},
    "fesem": {"fesem_mu": {0.0, 0.001, 0.01, 0.1, 1.0}, "fesem_init": {"directions", "models"}},
    "uapdfl": {"uapdfl_alike_ratio": (0.5, 1.5), "uapdfl_mu": (1e-3, 0.1)},
}


def test_fedgroup_fesem_and_uapdfl_knobs_are_drawn_from_their_ranges_seeded() -> None:
    """Every declared knob of FedGroup, FeSEM and UA-PDFL is drawn, within its range, by more
    than one value over 12 trials, the same for the same seed, and the values reach the options
    of the runs (compare.py --plan_only lists them: the test above)."""
    for algorithm, knobs in OWN_KNOBS.items():
        spec = RunSpec(algorithm, DIGITS, training=FEDPROX.training)
        space = tuning.tuned_space(spec, ["all"])
        assert set(space) == {"learning_rate", *knobs}
        trials = tuning.draw_trials(spec, space, 12, seed=0)
        assert trials == tuning.draw_trials(spec, space, 12, seed=0)
        for name, allowed in knobs.items():
            drawn = [t[name] for t in trials]
            inside = (
                [allowed[0] <= v <= allowed[1] for v in drawn]
                if isinstance(allowed, tuple)
                else [v in allowed for v in drawn]
            )
            assert all(inside) and len(set(drawn)) > 1, (name, drawn)
        options = tuning.with_values(spec, trials[0]).algorithm_options
        assert all(getattr(options, name) == trials[0][name] for name in knobs)


DIVERGING_TRIAL = """
import sys
from absl import app
from tff_clustered.cli import compare, exits
from tff_clustered.loop.divergence import DivergenceError

trained = compare.table_row

def table_row(run, dataset, execution):
    if run.folder.endswith("trial01") or "/fedprox/trial" in run.folder:
        raise DivergenceError("round 2: planted: the updates of 1 of 4 sampled clients are NaN")
    return trained(run, dataset, execution)

compare.table_row = table_row
sys.argv = ["compare.py", *sys.argv[1:]]
app.run(compare.main, flags_parser=exits.parse_flags)
"""


def test_a_trial_that_diverges_scores_nothing_and_the_tuning_goes_on(tmp_path: object) -> None:
    """A trial whose training diverges (its values are too much for the data) is recorded
    with no score, never chosen, and said so; the table's other trials and runs go on. A method
    every trial of which diverged (FedProx's, planted) has no trial chosen: no test run, no row,
    and its Tuning line says so (issue 64: it took a NaN trial's values to the test split)."""
    out = str(tmp_path)
    done = run_binary(
        ["-c", DIVERGING_TRIAL, "--algorithms=fedavg,fedprox", "--tune=learning_rate",
         "--tune_budget=2",
         "--seeds=0", "--rounds=2", "--clients_per_round=4", "--execution=in_process",
         f"--output_dir={out}"],
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tuning fedavg trial01 diverged: round 2: planted" in done.stdout
    with open(f"{out}/tuning.csv") as f:
        trials = [line.split(",") for line in f.read().splitlines()[1:]]
    assert [(t[2], t[4], t[5]) for t in trials][1] == ("1", "nan", "0")
    assert trials[0][5] == "1" and 0 <= float(trials[0][4]) <= 1
    assert [(t[1], t[4], t[5]) for t in trials][2:] == [("fedprox", "nan", "0")] * 2
    with open(f"{out}/comparison.md") as f:
        table = f.read()
    assert "(trial01 diverged: no score)" in table
    assert "- fedprox: no trial of 2 chosen: every trial diverged (learning rates" in table
    with open(f"{out}/comparison.csv") as f:
        assert [row.split(",")[1] for row in f.read().splitlines()[1:]] == ["fedavg"]
    assert not os.path.exists(f"{out}/fedprox")
