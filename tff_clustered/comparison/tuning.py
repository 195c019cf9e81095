"""A tuned table: every method given the same number of trials on the validation split.

Each method (a table's column, in each of its settings) gets `budget` trials. A trial draws
every knob of the method's search space (the shared learning rate, `search_space.LEARNING_RATE`,
and the ranges its `Options` declare, `options.search_space_of`) with its own generator,
`seeds.rng_for(seed, TUNING, trial, knob)`, the seed the table's lowest: the same seed gives
the same trials, and trial t gives every method the same learning rate. A trial runs on
`--split=validation` with the plan's seeds (`TuningPlan.seeds`: the table's lowest, or its N
lowest with `--tune_seeds=N`) and is scored by its final validation accuracy (the table's
figure: pooled, or the client mean), its mean over those seeds (`Trial`); the best trial's
values (the first on a tie) are then run on the test split with every seed of the table. No
test example is read before the values are chosen.

A chosen value near an edge of its knob's range (`search_space.edge_of`) may have its optimum
beyond the range. With `--tune_widenings=W` a method searches beyond that edge again, at most W
times (`tune`: `budget` more trials each time, drawing the knobs at an edge just beyond it,
`search_space.beyond`, and holding the others at the chosen trial's values); a chosen value at
an edge that was not searched beyond, as no widening was left or the knob's limit is there, is
said in the method's Tuning line (`Edge`).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered import search_space
from tff_clustered.options import search_space_of
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.seeds import TUNING, rng_for

# `--tune=all`: every knob of each method's search space.
ALL_KNOBS = "all"
# The most trials `--tune_budget` gives each method: already days of runs for a small table
# (`--plan_only` lists each trial, so a budget without bound would never finish listing).
MAX_BUDGET = 1000
# The most searches beyond an edge `--tune_widenings` gives a method: each costs a budget of
# trials, and two take the learning rate a factor of 16 past its range (`search_space.beyond`).
MAX_WIDENINGS = 2


def method_space(spec: RunSpec) -> dict[str, search_space.Space]:
    """The knobs a method is tuned over: the learning rate, then its options' declared ranges."""
    return {
        "learning_rate": search_space.LEARNING_RATE,
        **search_space_of(type(spec.algorithm_options)),
    }


def tuned_space(spec: RunSpec, knobs: Sequence[str]) -> dict[str, search_space.Space]:
    """The part of `spec`'s space `knobs` names (`ALL_KNOBS`: all of it)."""
    space = method_space(spec)
    if ALL_KNOBS in knobs:
        return space
    return {name: knob for name, knob in space.items() if name in knobs}


def check_knobs(specs: Sequence[RunSpec], knobs: Sequence[str]) -> None:
    """Refuses a `--tune` knob no method of the table declares, naming those they do."""
    declared = {name for spec in specs for name in method_space(spec)}
    if not any(k.strip() for k in knobs):
        raise ValueError(
            f"--tune={','.join(knobs)} names no knob: give all, or some of "
            f"{', '.join(sorted(declared))} (or leave --tune unset for an untuned table)"
        )
    unknown = [k.strip() or "''" for k in knobs if k != ALL_KNOBS and k not in declared]
    if unknown:
        raise ValueError(
            f"--tune={','.join(knobs)}: no method of the table searches {', '.join(unknown)}; "
            f"give all, or some of {', '.join(sorted(declared))}"
        )


def configured(spec: RunSpec, name: str) -> Any:
    """A knob's value in `spec`: the learning rate of its training, else its option."""
    if name == "learning_rate":
        return spec.training.learning_rate
    return getattr(spec.algorithm_options, name)


def draw_trials(
    spec: RunSpec,
    space: Mapping[str, search_space.Space],
    budget: int,
    seed: int,
    first: int = 0,
) -> list[dict[str, Any]]:
    """The values of `space`'s knobs in trials `first` to `first + budget - 1`, each drawn
    from its own generator of the seed, the trial and the knob's name (a fixed function of
    them: no state to carry)."""
    return [
        {
            name: knob.draw(
                rng_for(seed, TUNING, trial, zlib.crc32(name.encode())), configured(spec, name)
            )
            for name, knob in space.items()
        }
        for trial in range(first, first + budget)
    ]


def with_values(spec: RunSpec, values: Mapping[str, Any]) -> RunSpec:
    """`spec` with a trial's `values`: the learning rate in its training, the rest options."""
    options = {k: v for k, v in values.items() if k != "learning_rate"}
    training = spec.training
    if "learning_rate" in values:
        training = dataclasses.replace(training, learning_rate=values["learning_rate"])
    return dataclasses.replace(
        spec,
        training=training,
        algorithm_options=dataclasses.replace(spec.algorithm_options, **options),
    )


def on_validation(spec: RunSpec) -> RunSpec:
    """`spec` run on the validation split (`data/validation.py`)."""
    return dataclasses.replace(spec, data=dataclasses.replace(spec.data, split="validation"))


def tuning_seeds(seeds: Sequence[int], count: int) -> tuple[int, ...]:
    """The seeds every trial runs with: the `count` lowest of the table's `seeds` (1: the
    lowest alone). A count below 1 or above the table's seeds is a ValueError naming
    `--tune_seeds` and what to give."""
    table = sorted(seeds)
    given = ", ".join(map(str, table))
    if count < 1:
        raise ValueError(
            f"--tune_seeds={count}: a trial runs with at least one seed; give --tune_seeds from "
            f"1 to {len(table)} (the table's seeds: {given})"
        )
    if count > len(table):
        raise ValueError(
            f"--tune_seeds={count}: a trial runs with the table's {count} lowest seeds, and the "
            f"table has {len(table)} ({given}); give --tune_seeds from 1 to {len(table)}, or "
            f"more seeds in --seeds"
        )
    return tuple(table[:count])


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """What every method of a table is tuned with: the knobs (`--tune`), the trials of each
    search (`--tune_budget`), the seeds each trial runs with (`tuning_seeds`: the table's
    lowest, which also draws the trials, first) and the searches beyond an edge a method may
    add (`--tune_widenings`)."""

    knobs: tuple[str, ...]
    budget: int
    seeds: tuple[int, ...]
    widenings: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.budget <= MAX_BUDGET:
            raise ValueError(f"--tune_budget={self.budget}: give 1 to {MAX_BUDGET} trials")
        if not 0 <= self.widenings <= MAX_WIDENINGS:
            raise ValueError(
                f"--tune_widenings={self.widenings}: give 0 (no search beyond a range) to "
                f"{MAX_WIDENINGS}"
            )
        if not self.seeds or list(self.seeds) != sorted(set(self.seeds)):
            raise ValueError(
                f"a tuning's seeds are distinct and increasing (`tuning_seeds`), not {self.seeds}"
            )

    @classmethod
    def of_table(
        cls,
        knobs: Sequence[str],
        budget: int,
        table_seeds: Sequence[int],
        seed_count: int = 1,
        widenings: int = 0,
    ) -> TuningPlan:
        """The plan of a table run with `table_seeds`: its trials on the `seed_count` lowest."""
        return cls(tuple(knobs), budget, tuning_seeds(table_seeds, seed_count), widenings)

    @property
    def seed(self) -> int:
        """The seed the trials are drawn with: the table's lowest."""
        return self.seeds[0]


def best_trial(scores: Sequence[float]) -> Optional[int]:
    """The trial of the highest score, the first of equal ones; a NaN score (a run that scored
    nothing: its training diverged) never wins, and when every score is NaN no trial does
    (None)."""
    ranked = [(-math.inf if math.isnan(s) else s) for s in scores]
    if all(math.isnan(s) for s in scores):
        return None
    return ranked.index(max(ranked))


def values_text(values: Mapping[str, Any]) -> str:
    """A trial's values as flags: `--learning_rate=0.0731 --mu=0.0042`."""
    return " ".join(
        f"--{name}={value:.3g}" if isinstance(value, float) else f"--{name}={value}"
        for name, value in values.items()
    )


@dataclasses.dataclass(frozen=True)
class Trial:
    """One trial: its values and its final validation accuracy on each of the plan's seeds
    (NaN on a seed where its training diverged)."""

    values: dict[str, Any]
    seed_scores: tuple[float, ...]

    @property
    def score(self) -> float:
        """The mean of its seeds' scores (one seed's: that score); NaN when it diverged on any
        seed, so that values which diverge on one seed are never chosen."""
        return float(np.mean(self.seed_scores))

    @property
    def spread(self) -> float:
        """The sample standard deviation of its seeds' scores (NaN with one seed)."""
        if len(self.seed_scores) < 2:
            return math.nan
        return float(np.std(self.seed_scores, ddof=1))


def searches_text(count: int) -> str:
    """`1 search`, `2 searches`."""
    return f"{count} search" + ("es" if count != 1 else "")


def edge_name(side: str) -> str:
    return "top" if side == search_space.HIGH else "bottom"


@dataclasses.dataclass(frozen=True)
class Widening:
    """One knob searched beyond an edge: trials `trials` drew it from `drawn`, just beyond the
    `side` of the range `searched` until then (their other knobs held at the values of the
    trial then chosen)."""

    knob: str
    side: str
    searched: search_space.Range
    drawn: search_space.Range
    trials: range

    def text(self) -> str:
        return (
            f"trials {self.trials[0]:02d}-{self.trials[-1]:02d} drew --{self.knob} beyond the "
            f"{edge_name(self.side)} of {search_space.range_text(self.searched)}, in "
            f"{search_space.range_text(self.drawn)}"
        )


@dataclasses.dataclass(frozen=True)
class Edge:
    """A chosen value at an edge of the range searched for its knob, not searched beyond: the
    knob's limit is there (`at_limit`), or no widening was left (`widenings`, the plan's)."""

    knob: str
    value: float
    side: str
    searched: search_space.Range
    at_limit: bool
    widenings: int

    def text(self) -> str:
        where = (
            f"--{self.knob}={self.value:.3g} lies at the {edge_name(self.side)} of the range "
            f"searched, {search_space.range_text(self.searched)}"
        )
        if self.at_limit:
            return f"{where}, the knob's limit: no value lies beyond it"
        if self.widenings == 0:
            why = "no search beyond it: --tune_widenings=0"
        else:
            why = (
                f"after {searches_text(self.widenings)} beyond it, the most --tune_widenings allows"
            )
        return f"{where}: the optimum may lie beyond it ({why})"


def edges_of(
    searched: Mapping[str, search_space.Range], values: Mapping[str, Any]
) -> dict[str, str]:
    """The knobs whose value in `values` lies at an edge of their range `searched`, and the
    edge (`search_space.edge_of`)."""
    found = {name: search_space.edge_of(r, values[name]) for name, r in searched.items()}
    return {name: side for name, side in found.items() if side is not None}


@dataclasses.dataclass(frozen=True)
class TunedMethod:
    """One method's tuning in one setting: its trials (values and validation scores on the
    plan's `seeds`), the searches beyond an edge it made and the edges its choice lies at."""

    setting: Optional[str]
    column: str
    trials: tuple[Trial, ...]
    seeds: tuple[int, ...]
    widenings: tuple[Widening, ...] = ()
    edges: tuple[Edge, ...] = ()

    @property
    def scores(self) -> tuple[float, ...]:
        return tuple(trial.score for trial in self.trials)

    @property
    def chosen(self) -> Optional[int]:
        """The index of the chosen trial (`best_trial`); None when every trial diverged."""
        return best_trial(self.scores)

    @property
    def chosen_values(self) -> dict[str, Any]:
        """The chosen trial's values, which the table's test runs take."""
        if self.chosen is None:
            raise ValueError(self.line())
        return self.trials[self.chosen].values

    @property
    def runner_up(self) -> Optional[int]:
        """The best trial but the chosen one (None without another trial that scored)."""
        if self.chosen is None:
            return None
        others = [math.nan if t == self.chosen else s for t, s in enumerate(self.scores)]
        return best_trial(others)

    def margin_text(self) -> str:
        """With several seeds: the chosen trial's lead over the runner-up, in points and in
        their spread (the two trials' pooled standard deviation over the seeds)."""
        if self.chosen is None or self.runner_up is None or len(self.seeds) < 2:
            return ""
        chosen, runner_up = self.trials[self.chosen], self.trials[self.runner_up]
        margin = chosen.score - runner_up.score
        spread = math.sqrt((chosen.spread**2 + runner_up.spread**2) / 2)
        lead = f"{100 * margin:.2f} points above the runner-up trial{self.runner_up:02d}"
        if spread == 0:
            return f"; {lead}, whose spread over the seeds is 0"
        within = ": within it" if margin < spread else ""
        return f"; {lead}, {margin / spread:.1f} times their spread (± {100 * spread:.2f}){within}"

    def line(self) -> str:
        """Its line in comparison.md: the chosen values and their validation score (with
        several seeds, its std and its margin over the runner-up), the searches beyond an
        edge and an edge the choice still lies at; or that every trial diverged (no values to
        test: the method's test runs are not made)."""
        where = f"{self.setting} " if self.setting else ""
        if self.chosen is None:
            rates = [t.values["learning_rate"] for t in self.trials if "learning_rate" in t.values]
            tried = f" (learning rates {min(rates):.3g} to {max(rates):.3g})" if rates else ""
            fix = (
                "lower --learning_rate (the trials draw within a factor of 4 of it) or the range "
                "of its knobs"
                if rates
                else "lower --learning_rate (every trial took it as given) or the range of the "
                "knobs tuned"
            )
            return (
                f"{where}{self.column}: no trial of {len(self.trials)} chosen: every trial "
                f"diverged{tried}, so {self.column} has no values to test and no row; {fix}"
            )
        chosen = self.trials[self.chosen]
        score = f"validation {100 * chosen.score:.2f}%"
        if len(self.seeds) > 1:
            score += f" ± {100 * chosen.spread:.2f}"
        return (
            f"{where}{self.column}: trial{self.chosen:02d} of {len(self.trials)}, "
            f"{values_text(chosen.values)}, {score}"
            + self.diverged_text()
            + self.margin_text()
            + "".join(f"; {w.text()}" for w in self.widenings)
            + "".join(f"; {e.text()}" for e in self.edges)
        )

    def diverged_text(self) -> str:
        """The trials whose training diverged (compare.py), on which seeds when several: they
        scored nothing and were never chosen."""
        diverged = []
        for index, trial in enumerate(self.trials):
            seeds = [s for s, x in zip(self.seeds, trial.seed_scores) if math.isnan(x)]
            if seeds:
                on = f" on seed {', '.join(map(str, seeds))}" if len(self.seeds) > 1 else ""
                diverged.append(f"trial{index:02d}{on}")
        return f" ({', '.join(diverged)} diverged: no score)" if diverged else ""


# A trial run: its number and values -> its final validation accuracy on each of the plan's
# seeds (NaN where its training diverged).
ScoreTrial = Callable[[int, dict[str, Any]], tuple[float, ...]]


def tune(
    plan: TuningPlan,
    spec: RunSpec,
    setting: Optional[str],
    column: str,
    score_trial: ScoreTrial,
) -> TunedMethod:
    """One method tuned: `plan.budget` trials drawn (`draw_trials`) and scored, then, while
    the chosen trial has a knob at an edge of the range searched for it and `plan.widenings`
    allow, `plan.budget` trials more beyond each such edge (`search_space.beyond`, by half the
    knob's first range's width on its scale: a factor of 4 for the learning rate), which draw
    those knobs there and hold the others at the chosen trial's values; the trials are
    numbered on (trial t, whatever its search, draws with `rng_for(seed, TUNING, t, knob)`).
    The edges the final choice lies at are kept (`Edge`)."""
    space = tuned_space(spec, plan.knobs)
    trials: list[Trial] = []

    def run(values: dict[str, Any]) -> None:
        trials.append(Trial(values, tuple(score_trial(len(trials), values))))

    for values in draw_trials(spec, space, plan.budget, plan.seed):
        run(values)
    ranges = {name: knob.range_of(configured(spec, name)) for name, knob in space.items()}
    searched = {name: r for name, r in ranges.items() if r is not None}
    steps = {name: search_space.width(r) / 2 for name, r in searched.items()}
    widenings: list[Widening] = []
    for _ in range(plan.widenings):
        chosen = best_trial([t.score for t in trials])
        if chosen is None:
            break
        held = trials[chosen].values
        sides = edges_of(searched, held)
        drawn = {
            name: r
            for name, side in sides.items()
            if (r := search_space.beyond(searched[name], side, steps[name])) is not None
        }
        if not drawn:
            break
        first = len(trials)
        for values in draw_trials(spec, drawn, plan.budget, plan.seed, first):
            run({**held, **values})
        for name, r in drawn.items():
            widened = range(first, len(trials))
            widenings.append(Widening(name, sides[name], searched[name], r, widened))
            searched[name] = search_space.joined(searched[name], r)
    method = TunedMethod(setting, column, tuple(trials), plan.seeds, tuple(widenings))
    if method.chosen is None:
        return method
    return dataclasses.replace(method, edges=edges_chosen(method, searched, steps, plan))


def edges_chosen(
    method: TunedMethod,
    searched: Mapping[str, Any],
    steps: Mapping[str, float],
    plan: TuningPlan,
) -> tuple[Edge, ...]:
    """The edges of the ranges `searched` that `method`'s chosen values lie at, each saying
    whether a search beyond it (by `steps`) would pass the knob's limits."""
    return tuple(
        Edge(
            name,
            method.chosen_values[name],
            side,
            searched[name],
            search_space.beyond(searched[name], side, steps[name]) is None,
            plan.widenings,
        )
        for name, side in edges_of(searched, method.chosen_values).items()
    )


def tuning_lines(tuned: Sequence[TunedMethod], plan: TuningPlan) -> list[str]:
    """comparison.md's section on the tuning: the budget and the seeds, then each method's
    choice."""
    if len(plan.seeds) == 1:
        seeds = f"with seed {plan.seed} and scored by its final validation accuracy"
    else:
        seeds = (
            f"with seeds {', '.join(map(str, plan.seeds))} (--tune_seeds={len(plan.seeds)}) "
            "and scored by the mean of its final validation accuracies over them (± their "
            "standard deviation; a margin over the runner-up is also said in the two trials' "
            "pooled standard deviation, their spread)"
        )
    widening = (
        f" A method whose chosen value lay within {100 * search_space.EDGE_SHARE:g} % of an "
        "edge of its range (on the range's scale) searched beyond that edge, "
        f"{plan.budget} trials more each time, at most {plan.widenings} times "
        "(--tune_widenings; docs/tuning.md)."
        if plan.widenings
        else ""
    )
    return [
        "",
        "## Tuning",
        "",
        f"Every method had {plan.budget} trials (equal budget), each run on the validation "
        f"split (a seeded 15 % of each client's training examples) {seeds}; the best trial's "
        f"values were then run on the test split with the table's seeds.{widening} Every "
        "trial is in tuning.csv.",
        "",
        *(f"- {method.line()}" for method in tuned),
    ]


def tuning_csv(tuned: Sequence[TunedMethod]) -> str:
    """tuning.csv's text: a line per trial, its values as flags, its score and whether chosen;
    with several seeds the score is their mean, and its std and each seed's score follow."""
    seeds = tuned[0].seeds if tuned else ()
    per_seed = len(seeds) > 1
    header = "setting,algorithm,trial,values,validation_accuracy,chosen"
    if per_seed:
        header += ",validation_std," + ",".join(f"validation_seed{s}" for s in seeds)
    lines = [header]
    for method in tuned:
        for index, trial in enumerate(method.trials):
            line = (
                f"{method.setting or ''},{method.column},{index},{values_text(trial.values)},"
                f"{trial.score:.6f},{int(index == method.chosen)}"
            )
            if per_seed:
                line += "," + ",".join(f"{x:.6f}" for x in (trial.spread, *trial.seed_scores))
            lines.append(line)
    return "\n".join(lines) + "\n"
