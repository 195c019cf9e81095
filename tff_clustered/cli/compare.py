"""A paper's comparison table: several algorithms run with the same seeds, clients, sampling.

Runs several algorithms with the same seed, clients and sampling, and writes a paper's
comparison table: comparison.md, comparison.csv, comparison.png.

  python binaries/compare.py                       # FedGroup's Table III on digits
  python binaries/compare.py --table=fesem         # FeSEM's Table 2 shape on digits
  python binaries/compare.py --table=fedtsdp       # FedTSDP's Tables 3-5 shape on digits
  python binaries/compare.py --table=fedac         # FedAC's Table 1 shape on digits
  python binaries/compare.py --table=uapdfl        # UA-PDFL's Tables 1-2 shape on digits
  python binaries/compare.py --table=privacy --dataset=mnist --data_dir=DIR   # privacy-utility
  python binaries/compare.py --table=aggregation --dataset=mnist --data_dir=DIR
  python binaries/compare.py --table=fedtsdp --dataset=cifar10 --data_dir=~/data \
      --model=tsdp_cnn --settings=dirichlet:0.5,dirichlet:0.2 --rounds=200

`--table=fedgroup` (FedGroup, Table III): one dataset, one row per algorithm: max and final
accuracy, rounds to a target, the Eq. 4 discrepancy and the values sent per round.
`--table=fesem` (FeSEM, Table 2) has the same shape; its columns include `fesem:2`,
`fesem:3`, `fesem:4` (`ALGORITHM:K`: the algorithm with K clusters).

`--table=privacy` and `--table=aggregation`: one row per aggregator each cluster's updates go
through (`mean`, `clip`, `epsilon:E`; `robust`, `compression[:BITS[:THRESHOLD]]`, `secure`:
`tff_clustered/comparison/setting_rows.py`), one column per algorithm, in FedGroup's MNIST setup.
A setting of a row's aggregator given on the command line is every such row's: `--table=privacy
--dp_noise=secure` makes each private row's noise secure (no --aggregator needed).

`--table=fedtsdp` (FedTSDP, Tables 3-5): one row per partition setting (`iid`,
`dirichlet:BETA`, `pathological`), one column per algorithm, final test accuracy (%).

Each table's defaults (`table_defaults.TABLES`) say which datasets they are for: its
columns and rows, its paper's protocol (FedTSDP: 20 clients all taking part, E = 2, batch 50,
eta_r = 0.05 * 0.95^(r-1), momentum 0.5) and this project's values where the paper gives none,
on every dataset; and, on the embedded digits (1,797 images), a smaller scale that runs the
whole table in minutes on 2 cores (FedTSDP's: 10 clients, batch 10, decay 0.99, 20 rounds).
A table on another dataset takes its paper's protocol. The run prints the defaults it took,
each with where it comes from, and comparison.md lists them under its command.

Accuracy is each client's test set evaluated with the model it would use (its cluster's, its
personal one), pooled over clients (FedAC and UA-PDFL: the unweighted mean over clients).
`--seeds=0,1,2` runs every cell with each seed (the seed draws the partition, the initial
model, the sampling and every algorithm's choices) and writes mean ± std over them, with
each cell's diagnostics per seed (clusters formed, FedTSDP's triggers, UA-PDFL's regimes), the
command and the date. Each run is kept under OUTPUT_DIR/[sSEED/][SETTING/]ALGORITHM/ with its
checkpoint; running the same command again continues or reuses them, so a stopped table
resumes where it stopped (`--overwrite` reruns them from scratch instead: a run folder made
under other settings is refused without it). Flags given on the command line always win over
a table's defaults;
a baseline the paper ran differently keeps that difference relative to them (UA-PDFL's
DFedAvgM: twice the local work, half the rounds).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from absl import app, flags

from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.algorithms.fedgroup import discrepancy
from tff_clustered.atomic_files import atomic_write_bytes

# TensorFlow is imported (through these) before absl parses flags (see train.py).
from tff_clustered.cli import aggregator_flags, exits, replace_columns, run_flags
from tff_clustered.comparison import numerics, run_rows, table_writer, tuning
from tff_clustered.comparison.setting_rows import SETTINGS_HELP, parse_setting, row_aggregator
from tff_clustered.comparison.table_defaults import (
    PROTOCOLS,
    SETTING_TABLES,
    TABLES,
    Defaults,
)
from tff_clustered.loop.divergence import DivergenceError
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.phases import PhaseTimer
from tff_clustered.report import figures
from tff_clustered.run_folder import (
    COMPARISON_CSV,
    COMPARISON_MD,
    COMPARISON_PNG,
    ComparisonFolder,
)
from tff_clustered.runs import checkpoint, runner
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runtime.context import tff_runtime

FLAGS = flags.FLAGS
flags.DEFINE_enum("table", "fedgroup", list(TABLES), "Which paper's comparison to produce.")
flags.DEFINE_list(
    "algorithms",
    None,
    f"Columns: algorithms to compare ({', '.join(ALGORITHMS)}); ALGORITHM:K runs a clustered "
    "one with K clusters (e.g. fesem:2,fesem:4).",
)
flags.DEFINE_list(
    "settings",
    None,
    "Rows of the fedtsdp, fedac, uapdfl, privacy and aggregation tables: a partition or an "
    f"aggregator ({SETTINGS_HELP}); natural keeps the dataset's own clients (e.g. mnist_writers). "
    "An aggregator row takes the settings of its aggregator given on the command line (e.g. "
    "--dp_noise=secure: every private row's noise secure).",
)
flags.DEFINE_float("target_accuracy", 0.9, "Accuracy for the rounds-to-target column.")
flags.DEFINE_list(
    "seeds",
    None,
    "Seeds to run every cell with (e.g. 0,1,2): the table shows mean ± std over them "
    "(unset: --seed alone).",
)
flags.DEFINE_string(
    "output_dir",
    None,
    "Where outputs go (default runs/compare-TABLE-DATASET-sSEED, or -seedsA-B-C; tuned: then "
    "-tuned, -Nseeds with --tune_seeds=N, -widenW with --tune_widenings=W).",
)
flags.DEFINE_list(
    "tune",
    None,
    "Tune every method first: all (the learning rate and each method's declared knobs, "
    "docs/options.md) or some knobs (e.g. learning_rate,mu). Each method gets --tune_budget "
    "trials on the validation split with the lowest seed (--tune_seeds: the N lowest); its best "
    "values then run on the test split with every seed (docs/tuning.md).",
)
flags.DEFINE_integer(
    "tune_budget",
    8,
    f"Trials per method (in each setting) of --tune (at most {tuning.MAX_BUDGET}).",
    lower_bound=1,
    upper_bound=tuning.MAX_BUDGET,
)
flags.DEFINE_integer(
    "tune_seeds",
    1,
    "Seeds each trial of --tune runs with: the table's N lowest (1 to the number of --seeds); "
    "a trial scores the mean of their validation accuracies (docs/tuning.md).",
)
flags.DEFINE_integer(
    "tune_widenings",
    0,
    "Searches beyond an edge each method of --tune may add: while its chosen value of a range "
    "lies at the range's edge, --tune_budget trials more just beyond it (at most "
    f"{tuning.MAX_WIDENINGS}; 0: none, the Tuning line says the optimum may lie beyond).",
    lower_bound=0,
    upper_bound=tuning.MAX_WIDENINGS,
)
# The flags only --tune reads.
TUNING_FLAGS = ("tune_budget", "tune_seeds", "tune_widenings")
flags.DEFINE_list(
    "table_columns",
    None,
    "The columns of the whole table this command runs some of (set by --replace_columns): a "
    "flag of any of them is accepted and read by the columns that take it, so that a table's "
    "whole command reruns one column; each of --algorithms must be one of them.",
)
flags.DEFINE_bool(
    "overwrite",
    False,
    "Rerun every run of this command from scratch (each cell of its --algorithms, --settings "
    "and --seeds, and their --tune trials): each run folder's run is deleted and a new one "
    "made there. Without it a finished run is read back and a stopped one continues; a run "
    "made under other settings is refused. Interrupted, the same command without --overwrite "
    "continues the new runs.",
)
flags.DEFINE_bool(
    "plan_only",
    False,
    "Print the runs the table would make (seed, setting, algorithm, rounds, local work, "
    "folder) and exit: checks a command or a configs/*.flags file without loading data.",
)


class PlannedRun(NamedTuple):
    seed: int
    setting: Optional[str]
    column: str  # the column's label: its algorithm, with :K if it sets one
    spec: RunSpec
    folder: str


class Column(NamedTuple):
    """A table column: `ALGORITHM`, or `ALGORITHM:K` for the algorithm with K clusters (FeSEM's
    Table 2 has a column per K: `--algorithms=fesem:2,fesem:3,fesem:4`)."""

    label: str
    algorithm: str
    num_clusters: Optional[int]

    @property
    def folder(self) -> str:
        return (
            self.algorithm
            if self.num_clusters is None
            else f"{self.algorithm}_k{self.num_clusters}"
        )


def parse_columns(given: list[str]) -> list[Column]:
    """`--algorithms` as columns; an unknown algorithm, a K that is not a whole number >= 1, a K
    for an algorithm without clusters or a repeated column is an error naming it."""
    if not given:
        raise ValueError(f"no algorithm given; choose from {', '.join(ALGORITHMS)}")
    columns = []
    for label in given:
        algorithm, _, k = label.partition(":")
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"unknown algorithm {algorithm!r} in --algorithms; choose from "
                f"{', '.join(ALGORITHMS)}"
            )
        num_clusters = None
        if k:
            fields = {f.name for f in dataclasses.fields(ALGORITHMS[algorithm].Options)}
            if "num_clusters" not in fields:
                raise ValueError(f"--algorithms={label}: {algorithm} has no clusters to set")
            if not k.isdigit() or int(k) < 1:
                raise ValueError(f"--algorithms={label}: K must be a whole number >= 1")
            num_clusters = int(k)
        columns.append(Column(label, algorithm, num_clusters))
    repeated = sorted({c.label for c in columns if [d.label for d in columns].count(c.label) > 1})
    if repeated:
        raise ValueError(f"--algorithms names {', '.join(repeated)} more than once")
    return columns


def column_spec(column: Column) -> RunSpec:
    """The run the flags describe for one column (its K, if it sets one), the settings of the
    rows' aggregators left to the rows (`row_aggregators`)."""
    spec = run_flags.run_spec_from_flags(column.algorithm, row_aggregators())
    if column.num_clusters is None:
        return spec
    options = dataclasses.replace(spec.algorithm_options, num_clusters=column.num_clusters)
    return dataclasses.replace(spec, algorithm_options=options)


def row_aggregators() -> set[str]:
    """The aggregators the rows of a table with a row per setting run (`--settings`:
    `setting_rows.row_aggregator`): a setting of theirs given on the command line without
    naming them in `--aggregator` (`--dp_noise=secure` on the privacy table) is each such
    row's (`parse_setting`)."""
    if FLAGS.table not in SETTING_TABLES:
        return set()
    return {a for a in map(row_aggregator, FLAGS.settings or []) if a is not None}


def plan_runs(
    columns: list[Column], seeds: list[int], settings: list[Optional[str]], output_dir: str
) -> list[PlannedRun]:
    """Every run of the table, seed by seed (so that an early stop leaves whole tables), each
    as its paper's protocol runs that algorithm (`table_protocol`)."""
    given = aggregator_flags.given_settings()
    changes = {s: parse_setting(s, given) for s in settings if s is not None}
    planned = []
    for seed in seeds:
        for setting in settings:
            for column in columns:
                spec = table_protocol(FLAGS.table, column_spec(column))
                if setting is not None:
                    spec = changes[setting](spec)
                spec = dataclasses.replace(
                    spec, training=dataclasses.replace(spec.training, seed=seed)
                )
                folder = ComparisonFolder(output_dir).run(
                    seed if len(seeds) > 1 else None, setting, column.folder
                )
                planned.append(PlannedRun(seed, setting, column.label, spec, folder.path))
    return planned


def describe(run: PlannedRun) -> str:
    t = run.spec.training
    work = f"{t.local_steps} steps" if t.local_steps else f"{t.local_epochs} epochs"
    return (
        f"seed {run.seed} {run.setting or run.spec.data.dataset:>16} {run.column:>18}: "
        f"{t.rounds} rounds x {t.clients_per_round} clients, {work} of batch {t.batch_size}, "
        f"lr {t.learning_rate:g}, {run.spec.model_choice.model} -> {run.folder}"
    )


def table_defaults(table: str, dataset: str) -> dict[str, tuple[Any, Defaults]]:
    """Flag name -> (value, the group it comes from) of `table`'s defaults on `dataset`."""
    resolved: dict[str, tuple[Any, Defaults]] = {}
    for group in TABLES[table]:
        if group.applies_to(dataset):
            resolved.update({name: (value, group) for name, value in group.values.items()})
    return resolved


def apply_table_defaults(table: str) -> list[str]:
    """The table's defaults on its dataset (`--dataset`, else the table's) for every flag not
    given on the command line. Returns which values it took from where, one line per source
    in the table's order (printed, and written in the table's header)."""
    dataset = FLAGS.dataset
    if not FLAGS["dataset"].present:
        dataset = table_defaults(table, "").get("dataset", (FLAGS.dataset,))[0]
    resolved = table_defaults(table, dataset)
    taken = [name for name in resolved if not FLAGS[name].present]
    for name in taken:
        FLAGS[name].value = resolved[name][0]
    lines = []
    for group in TABLES[table]:
        values = [f"{n}={flag_text(resolved[n][0])}" for n in taken if resolved[n][1] is group]
        if values:
            lines.append(f"{group.source}: {', '.join(values)}")
    return lines


def flag_text(value: Any) -> str:
    """A flag's value as it is written on the command line (`0.05`, `iid,pathological`)."""
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def table_protocol(table: str, spec: RunSpec) -> RunSpec:
    """A baseline run as the table's paper ran it (`PROTOCOLS`): UA-PDFL gives DFedAvgM twice
    the local iterations and half the rounds of the others."""
    change = PROTOCOLS.get(table, {}).get(spec.algorithm)
    if change is None:
        return spec
    t = spec.training
    training = dataclasses.replace(
        t,
        local_epochs=t.local_epochs * change.get("local_work", 1),
        local_steps=t.local_steps * change.get("local_work", 1),
        rounds=max(1, int(t.rounds * change.get("rounds", 1))),
    )
    return dataclasses.replace(spec, training=training)


def run_one(spec: RunSpec, output_dir: str, execution: RunExecution) -> dict[str, Any]:
    aggregator = spec.training.aggregator.kind
    summary = runner.run(
        spec,
        output_dir,
        execution,
        checkpoint_every=FLAGS.checkpoint_every,
        resume=not FLAGS.overwrite,
        overwrite=FLAGS.overwrite,
        log=lambda message: None,
        # Eq. 4's discrepancy reads each client's own update, which any aggregator but the
        # mean keeps inside its per-cluster sums.
        round_metrics=[] if aggregator.voided_by_individual_updates else [discrepancy],
    )
    return summary


def seeds_from_flags() -> list[int]:
    """`--seeds` (each >= 0, no repeats), else `--seed` alone."""
    if not FLAGS.seeds:
        return [FLAGS.seed]
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise ValueError(
            f"--seeds={','.join(FLAGS.seeds)}: give whole numbers, e.g. 0,1,2"
        ) from None
    if min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds={','.join(FLAGS.seeds)}: give distinct numbers >= 0")
    if FLAGS["seed"].present:
        raise ValueError("give --seeds or --seed, not both")
    return seeds


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    with run_flags.reported_errors(lambda: "finished runs are kept, run again to continue"):
        if FLAGS.replace_columns or FLAGS.committed_table:
            return replace_columns.run()
        defaults_taken = apply_table_defaults(FLAGS.table)
        columns = parse_columns(FLAGS.algorithms)
        run_flags.refuse_other_algorithms_flags(accepted_algorithms(columns))
        seeds = seeds_from_flags()
        # Each algorithm reads only its own options from the command line (an algorithm with
        # one model has no --num_clusters, one without a proximal term no --mu), so one
        # command line serves the whole table.
        base = column_spec(columns[0])
        seed_part = f"s{seeds[0]}" if len(seeds) == 1 else "seeds" + "-".join(map(str, seeds))
        tuned_part = tuned_folder_part() if FLAGS.tune else ""
        output_dir = FLAGS.output_dir or os.path.join(
            "runs", f"compare-{FLAGS.table}-{base.data.dataset}-{seed_part}{tuned_part}"
        )
        settings = FLAGS.settings if FLAGS.table in SETTING_TABLES else [None]
        planned = plan_runs(columns, seeds, settings, output_dir)
        plan = tuning_plan([run.spec for run in planned], seeds)
        if defaults_taken:
            print(f"{FLAGS.table} table on {base.data.dataset}, defaults of the flags not given:")
            print("\n".join(f"  {line}" for line in defaults_taken), flush=True)
        if FLAGS.plan_only:
            print("\n".join(map(describe, planned)))
            for run, trials in trials_of(planned, plan).items() if plan else ():
                print(
                    "\n".join(
                        f"tuning {run.column} trial {i}: {tuning.values_text(t)}"
                        for i, t in enumerate(trials)
                    )
                )
            if plan and (len(plan.seeds) > 1 or plan.widenings):
                print(
                    f"tuning: each trial on seeds {', '.join(map(str, plan.seeds))}; up to "
                    f"{tuning.searches_text(plan.widenings)} beyond an edge of {plan.budget} "
                    "trials each, drawn once the trials above are scored"
                )
            print(f"{len(planned)} runs; outputs would be in {output_dir}")
            return 0
        # The table folder is held for the whole comparison (each run also holds its own
        # subfolder), before the worker writes its log there: a second compare on it is refused.
        with checkpoint.hold_run_folder(output_dir):
            rows, histories, tuned = run_planned(planned, base.data.dataset, output_dir, plan)
            write_outputs(rows, histories, base, output_dir, defaults_taken, tuned, plan)
    return 0


def tuned_folder_part() -> str:
    """The default output folder's end for a tuned table: `-tuned`, then `-Nseeds` with
    `--tune_seeds=N` > 1 and `-widenW` with `--tune_widenings=W` > 0, so that tables tuned
    otherwise (whose test runs may take other values) never share their runs."""
    seeds = f"-{FLAGS.tune_seeds}seeds" if FLAGS.tune_seeds > 1 else ""
    widen = f"-widen{FLAGS.tune_widenings}" if FLAGS.tune_widenings > 0 else ""
    return f"-tuned{seeds}{widen}"


def accepted_algorithms(columns: list[Column]) -> list[str]:
    """The algorithms whose flags the command may give: its columns', or with --table_columns
    those of the whole table its columns belong to (each of them one of the table's)."""
    if not FLAGS.table_columns:
        return [c.algorithm for c in columns]
    table = parse_columns(FLAGS.table_columns)
    outside = [c.label for c in columns if c.label not in [t.label for t in table]]
    if outside:
        raise ValueError(
            f"--algorithms={','.join(FLAGS.algorithms)}: {', '.join(outside)} is not one of "
            f"--table_columns={','.join(FLAGS.table_columns)}"
        )
    return [t.algorithm for t in table]


def tuning_plan(specs: list[RunSpec], seeds: list[int]) -> Optional[tuning.TuningPlan]:
    """The table's tuning (`--tune` and the flags it reads), None without --tune; a knob no
    method declares, a --tune_seeds outside the table's seeds or a tuning flag without --tune
    is a ValueError naming it."""
    if not FLAGS["tune"].present:
        given = [name for name in TUNING_FLAGS if FLAGS[name].present]
        if given:
            raise ValueError(
                f"--{given[0]}={FLAGS[given[0]].value} set without --tune, which does not use "
                "it: add --tune=all (or some knobs), or leave it unset"
            )
        return None
    tuning.check_knobs(specs, FLAGS.tune)
    return tuning.TuningPlan.of_table(
        FLAGS.tune, FLAGS.tune_budget, seeds, FLAGS.tune_seeds, FLAGS.tune_widenings
    )


def trials_of(
    planned: list[PlannedRun], plan: tuning.TuningPlan
) -> dict[PlannedRun, list[dict[str, Any]]]:
    """Each method's first trials (`tuning.draw_trials`), keyed by its planned run of the
    table's lowest seed: the seed the trials are drawn with (and the one a check of the
    committed table reruns, `table_commands.sampled_cell`)."""
    return {
        run: tuning.draw_trials(
            run.spec, tuning.tuned_space(run.spec, plan.knobs), plan.budget, plan.seed
        )
        for run in planned
        if run.seed == plan.seed
    }


def trial_score(
    run: PlannedRun,
    index: int,
    values: dict[str, Any],
    output_dir: str,
    dataset: str,
    execution: RunExecution,
) -> float:
    """Trial `index` of `run`'s method with `values`, run (or read back) on the validation
    split with `run`'s seed under OUTPUT_DIR/tuning/[sSEED/][SETTING/]ALGORITHM/trialNN/: the
    table's figure, NaN when its training diverged."""
    folder = os.path.join(
        output_dir, "tuning", os.path.relpath(run.folder, output_dir), f"trial{index:02d}"
    )
    spec = tuning.on_validation(tuning.with_values(run.spec, values))
    try:
        row = table_row(run._replace(spec=spec, folder=folder), dataset, execution)
    except DivergenceError as e:  # a trial's values may diverge: it scores nothing
        print(f"tuning {run.column} trial{index:02d} diverged: {e} (seed {run.seed})", flush=True)
        return math.nan
    return row[figure_key()]


def tune_methods(
    planned: list[PlannedRun],
    dataset: str,
    output_dir: str,
    execution: RunExecution,
    plan: tuning.TuningPlan,
) -> tuple[list[PlannedRun], list[tuning.TunedMethod]]:
    """Every method tuned (`tuning.tune`): its trials run (or read back) on the validation
    split under OUTPUT_DIR/tuning/, each with every seed of the plan, scored by the table's
    figure; returns the planned runs with each method's chosen values, and the tunings."""
    tuned: dict[tuple[Optional[str], str], tuning.TunedMethod] = {}
    for run in planned:
        if run.seed != plan.seed:
            continue
        by_seed = {r.seed: r for r in planned if (r.setting, r.column) == (run.setting, run.column)}

        def score_trial(
            index: int, values: dict[str, Any], by_seed: dict[int, PlannedRun] = by_seed
        ) -> tuple[float, ...]:
            return tuple(
                trial_score(by_seed[seed], index, values, output_dir, dataset, execution)
                for seed in plan.seeds
            )

        method = tuning.tune(plan, run.spec, run.setting, run.column, score_trial)
        print(f"tuned {method.line()}", flush=True)
        tuned[(run.setting, run.column)] = method
    # A method every trial of which diverged has no values to test: no test runs, no row; its
    # Tuning line says why (`TunedMethod.line`).
    chosen = [
        run._replace(
            spec=tuning.with_values(run.spec, tuned[(run.setting, run.column)].chosen_values)
        )
        for run in planned
        if tuned[(run.setting, run.column)].chosen is not None
    ]
    if not chosen:
        raise ValueError(f"tuning: {'; '.join(m.line() for m in tuned.values())}")
    return chosen, list(tuned.values())


def figure_key() -> str:
    """The row's figure a table ranks by: the final client mean or the pooled accuracy."""
    client_mean = SETTING_TABLES.get(FLAGS.table, False)
    return "final_client_mean_accuracy" if client_mean else "final_accuracy"


def table_row(run: PlannedRun, dataset: str, execution: RunExecution) -> dict[str, Any]:
    """One planned run run (or read back, when finished) and its row of figures."""
    history = run_one(run.spec, run.folder, execution.timed_anew())["history"]
    row = run_rows.run_row(
        run.setting or dataset,
        run.column,
        run.seed,
        history,
        FLAGS.target_accuracy,
        ALGORITHMS[run.spec.algorithm],
    )
    return {**row, "history": history}


def run_planned(
    planned: list[PlannedRun],
    dataset: str,
    output_dir: str,
    plan: Optional[tuning.TuningPlan] = None,
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list], list[tuning.TunedMethod]]:
    """Runs (or reads back, when finished) every planned run on one TFF runtime, each method
    tuned first by `plan` (`--tune`): the table's rows, each (setting, algorithm)'s histories
    and the tunings."""
    rows: list[dict[str, Any]] = []
    histories: dict[tuple[str, str], list] = {}
    tuned: list[tuning.TunedMethod] = []
    execution = run_flags.execution_from_flags(output_dir, PhaseTimer())
    with tff_runtime(execution.runtime):
        if plan is not None:
            planned, tuned = tune_methods(planned, dataset, output_dir, execution, plan)
        for run in planned:
            row = table_row(run, dataset, execution)
            history = row.pop("history")
            seed, column = run.seed, run.column
            rows.append(row)
            histories.setdefault((row["setting"], column), []).append(history)
            print(
                f"seed {seed} {row['setting']:>16} {column:>18}: "
                f"max {row['max_accuracy']:.4f}  final {row['final_accuracy']:.4f}  "
                f"client mean {row['final_client_mean_accuracy']:.4f}",
                flush=True,
            )
    return rows, histories, tuned


def write_outputs(
    rows: list[dict[str, Any]],
    histories: dict[tuple[str, str], list],
    base: RunSpec,
    output_dir: str,
    defaults_taken: list[str],
    tuned: Sequence[tuning.TunedMethod] = (),
    plan: Optional[tuning.TuningPlan] = None,
) -> None:
    """comparison.md / .csv / .png in `output_dir`, with the command, the date, the table's
    defaults it took (`apply_table_defaults`) and this machine's CPU and TensorFlow numerics
    settings (`numerics.machine_lines`)."""
    title = (
        f"{FLAGS.table} table: {base.data.dataset} / {base.model_choice.model}, "
        f"{base.training.rounds} rounds, {base.training.clients_per_round} clients per round"
    )
    client_mean = SETTING_TABLES.get(FLAGS.table, False)
    markdown = table_writer.write_tables(
        output_dir,
        rows,
        title,
        by_setting=FLAGS.table in SETTING_TABLES,
        client_mean=client_mean,
        target_accuracy=FLAGS.target_accuracy,
        command=shlex.join(["python", *sys.argv]),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        defaults_taken=defaults_taken,
        machine=numerics.machine_lines(),
        tuning=tuning.tuning_lines(tuned, plan) if tuned and plan else (),
    )
    if tuned:
        atomic_write_bytes(
            os.path.join(output_dir, "tuning.csv"), tuning.tuning_csv(tuned).encode()
        )
    figures.write_comparison_png(
        ComparisonFolder(output_dir).comparison_png,
        histories,
        title,
        "client_accuracy_mean" if client_mean else "accuracy",
    )
    print(markdown)
    print(f"outputs in {output_dir}: {COMPARISON_MD}, {COMPARISON_CSV}, {COMPARISON_PNG}")


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    app.run(main, flags_parser=exits.parse_flags)
