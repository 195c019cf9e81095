"""A tuned table: every method given the same number of trials on the validation split.

Each method (a table's column, in each of its settings) gets `budget` trials. A trial draws
every knob of the method's search space (the shared learning rate, `search_space.LEARNING_RATE`,
and the ranges its `Options` declare, `options.search_space_of`) with its own generator,
`seeds.rng_for(seed, TUNING, trial, knob)`: the same seed gives the same trials, and trial t
gives every method the same learning rate. A trial runs on `--split=validation` with the
table's lowest seed and is scored by its final validation accuracy (the table's figure: pooled,
or the client mean); the best trial's values (the first on a tie) are then run on the test
split with every seed of the table. No test example is read before the values are chosen.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from tff_clustered import search_space
from tff_clustered.options import search_space_of
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.seeds import TUNING, rng_for

# `--tune=all`: every knob of each method's search space.
ALL_KNOBS = "all"
# The most trials `--tune_budget` gives each method: already days of runs for a small table
# (`--plan_only` lists each trial, so a budget without bound would never finish listing).
MAX_BUDGET = 1000


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
    spec: RunSpec, space: Mapping[str, search_space.Space], budget: int, seed: int
) -> list[dict[str, Any]]:
    """`budget` trials' values of `space`'s knobs, each drawn from its own generator of the
    seed, the trial and the knob's name (a fixed function of them: no state to carry)."""
    return [
        {
            name: knob.draw(
                rng_for(seed, TUNING, trial, zlib.crc32(name.encode())), configured(spec, name)
            )
            for name, knob in space.items()
        }
        for trial in range(budget)
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
class TunedMethod:
    """One method's tuning in one setting: its trials' values and validation scores."""

    setting: Optional[str]
    column: str
    trials: tuple[dict[str, Any], ...]
    scores: tuple[float, ...]

    @property
    def chosen(self) -> Optional[int]:
        """The index of the chosen trial (`best_trial`); None when every trial diverged."""
        return best_trial(self.scores)

    @property
    def chosen_values(self) -> dict[str, Any]:
        """The chosen trial's values, which the table's test runs take."""
        if self.chosen is None:
            raise ValueError(self.line())
        return self.trials[self.chosen]

    def line(self) -> str:
        """Its line in comparison.md: the chosen values and their validation score, or that
        every trial diverged (no values to test: the method's test runs are not made)."""
        where = f"{self.setting} " if self.setting else ""
        if self.chosen is None:
            rates = [t["learning_rate"] for t in self.trials if "learning_rate" in t]
            tried = f" (learning rates {min(rates):.3g} to {max(rates):.3g})" if rates else ""
            return (
                f"{where}{self.column}: no trial of {len(self.trials)} chosen: every trial "
                f"diverged{tried}, so {self.column} has no values to test and no row; lower "
                "--learning_rate (the trials draw within a factor of 4 of it) or the range of "
                "its knobs"
            )
        # a trial whose training diverged (compare.py) scored nothing: never chosen, said so
        diverged = [f"trial{t:02d}" for t, score in enumerate(self.scores) if math.isnan(score)]
        return (
            f"{where}{self.column}: trial{self.chosen:02d} of {len(self.trials)}, "
            f"{values_text(self.trials[self.chosen])}, validation "
            f"{100 * self.scores[self.chosen]:.2f}%"
            + (f" ({', '.join(diverged)} diverged: no score)" if diverged else "")
        )


def tuning_lines(tuned: Sequence[TunedMethod], budget: int, seed: int) -> list[str]:
    """comparison.md's section on the tuning: the budget, then each method's choice."""
    return [
        "",
        "## Tuning",
        "",
        f"Every method had {budget} trials (equal budget), each run on the validation split "
        f"(a seeded 15 % of each client's training examples) with seed {seed} and scored by "
        "its final validation accuracy; the best trial's values were then run on the test "
        "split with the table's seeds. Every trial is in tuning.csv.",
        "",
        *(f"- {method.line()}" for method in tuned),
    ]


def tuning_csv(tuned: Sequence[TunedMethod]) -> str:
    """tuning.csv's text: a line per trial, its values as flags, its score and whether chosen."""
    lines = ["setting,algorithm,trial,values,validation_accuracy,chosen"]
    for method in tuned:
        for trial, (values, score) in enumerate(zip(method.trials, method.scores)):
            lines.append(
                f"{method.setting or ''},{method.column},{trial},{values_text(values)},"
                f"{score:.6f},{int(trial == method.chosen)}"
            )
    return "\n".join(lines) + "\n"
