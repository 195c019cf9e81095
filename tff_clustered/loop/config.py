"""A run's training settings and its aggregator's settings.

Rounds, client sampling, local training, learning-rate schedule, evaluation, the divergence
policy, the server optimizer and the aggregator (`AggregatorConfig`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection, Sequence
from typing import Any, Optional

from tff_clustered.federated.aggregators import (
    AGGREGATORS,
    NAMED,
    aggregator_class,
    declared_options,
)
from tff_clustered.federated.cluster_aggregators import ClusterAggregator, PrivacyBudget
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.loop.sampling import SAMPLINGS
from tff_clustered.options import checked_fields, described
from tff_clustered.seeds import EVAL_SAMPLE, rng_for

LR_SCHEDULES = ("constant", "exponential", "cosine")


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class AggregatorConfig:
    """What the round does with each client's update between its training and its cluster's
    mean, as settings: the aggregator `kind` (a `federated.cluster_aggregators.
    ClusterAggregator` subclass) and `options`, the values of the settings it declares (its
    `Options`, or its own fields). By name, `AggregatorConfig("dp", noise_multiplier=1.0)`
    (the names and what each takes: `federated.aggregators`, docs/options.md; the flags build
    it so); from a built aggregator, `AggregatorConfig.of(ClusterDP(1.0))` (a user's own
    subclass too). A setting another aggregator declares, changed from its default, is refused
    naming its flag and the aggregators that take it; each aggregator's own checks follow."""

    kind: type[ClusterAggregator]
    options: Any

    def __init__(self, name: str = "mean", **settings: Any) -> None:
        kind = aggregator_class(name)
        refuse_unused_settings(kind, settings)
        if not kind.named:
            raise ValueError(
                f"aggregator {name!r} is given as an object, not by name ({kind.summary}): it "
                f"goes with name {name!r} only as tff_clustered.run's aggregator=<the object>"
            )
        own = {f.name for f in dataclasses.fields(kind.options_type())}
        options = kind.options_type()(**{k: v for k, v in settings.items() if k in own})
        self.__set(kind, options)

    def __set(self, kind: type[ClusterAggregator], options: Any) -> None:
        """Sets the fields; the aggregator is built once here, for its own checks."""
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", options)
        self.build()

    @staticmethod
    def taken_by(name: str) -> frozenset[str]:
        """The settings the aggregator `name` takes (its `Options`' fields)."""
        return frozenset(f.name for f in dataclasses.fields(aggregator_class(name).options_type()))

    @classmethod
    def of(cls, aggregator: ClusterAggregator) -> AggregatorConfig:
        """The settings of a built aggregator (`aggregator.options()`), a user's own subclass
        too: it needs a `name` of its own (what its runs record)."""
        if not isinstance(aggregator, ClusterAggregator):
            raise TypeError(
                "aggregator must be a ClusterAggregator (ClusterDP(...), ClusterRobust(...), "
                f"a subclass of your own...), got {described(aggregator)}"
            )
        kind = type(aggregator)
        registered = AGGREGATORS.get(kind.name)
        if not kind.name or registered not in (None, kind):
            taken = f"; {kind.name!r} is {registered.__name__}'s" if kind.name else ""
            raise ValueError(
                f"{kind.__name__} needs a name of its own (name: ClassVar[str] = ...), which "
                f"its runs record{taken}"
            )
        config = object.__new__(cls)
        config.__set(kind, aggregator.options())
        return config

    @property
    def name(self) -> str:
        return self.kind.name

    def build(self) -> ClusterAggregator:
        """The aggregator these settings describe."""
        return self.kind.from_options(self.options)

    def with_settings(self, **settings: Any) -> AggregatorConfig:
        """These settings with `settings` changed (checked as `AggregatorConfig(...)`)."""
        return AggregatorConfig(self.name, **{**self.kind.record(self.options), **settings})

    def privacy_budget(self) -> Optional[PrivacyBudget]:
        """What the accountant reads of these settings (None: the aggregator adds no noise)."""
        return self.kind.privacy_budget(self.options)

    def with_noise_multiplier(self, noise_multiplier: float) -> AggregatorConfig:
        """These settings with the noise multiplier calibrated to their target epsilon."""
        config = object.__new__(AggregatorConfig)
        config.__set(self.kind, self.kind.with_noise_multiplier(self.options, noise_multiplier))
        return config

    def with_cold_start_noise_multiplier(self, noise_multiplier: float) -> AggregatorConfig:
        """These settings with the private cold start's noise multiplier set by the budget's
        rule (`loop.accounting.cold_start_noise`)."""
        config = object.__new__(AggregatorConfig)
        options = self.kind.with_cold_start_noise_multiplier(self.options, noise_multiplier)
        config.__set(self.kind, options)
        return config

    def settings(self) -> dict[str, Any]:
        """What a run records of these settings (summary.json, checkpoints): the name, every
        named aggregator's settings (at their defaults but this one's: the record's layout is
        the same for every run), then its own settings not among them."""
        values: dict[str, Any] = {"name": self.name}
        for kind in AGGREGATORS.values():
            values.update(kind.record())
        values.update(self.kind.record(self.options))
        return values

    def __repr__(self) -> str:
        return f"AggregatorConfig({self.name!r}, {self.options!r})"


@functools.cache
def named_at_defaults() -> tuple[str, ...]:
    """The aggregators taken by name alone (`run(aggregator="robust")`, a comparison table's
    row): those whose settings' defaults build one (dp needs a noise multiplier or a target
    epsilon)."""
    names = []
    for name in NAMED:
        try:
            AggregatorConfig(name)
        except ValueError:
            continue
        names.append(name)
    return tuple(names)


def refuse_unused_settings(
    kind: type[ClusterAggregator], settings: dict[str, Any], given: Collection[str] = ()
) -> None:
    """A setting another named aggregator declares, changed from its default or among `given`
    (a flag on the command line, whatever its value), is refused with `kind`, naming its flag
    and the aggregators that take it; a setting none declares is a TypeError."""
    own = {f.name for f in dataclasses.fields(kind.options_type())}
    declared = declared_options()
    unknown = sorted(set(settings) - own - set(declared))
    if unknown:
        raise TypeError(
            f"AggregatorConfig takes no setting {unknown[0]!r}; the {kind.name} aggregator "
            f"takes {', '.join(sorted(own)) or 'none'}"
        )
    unused = [
        name
        for name, value in settings.items()
        if name not in own and (value != declared[name].default or name in given)
    ]
    if not unused:
        return
    flags = ", ".join(f"--{declared[name].flag}" for name in unused)
    fix = " or ".join(f"--aggregator={user}" for user in declared[unused[0]].users)
    raise ValueError(
        f"{flags} set with --aggregator={kind.name}, which does not use them: add {fix}, or "
        "leave them unset"
    )


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    rounds: int = 30
    clients_per_round: int = 10
    local_epochs: int = 1
    # > 0: each sampled client takes this many minibatch steps per round instead of
    # `local_epochs` passes (its batches reshuffled whenever its data runs out).
    local_steps: int = 0
    batch_size: int = 10
    learning_rate: float = 0.05
    lr_schedule: str = "constant"
    lr_decay: float = 0.98  # per round, for the exponential schedule
    momentum: float = 0.0
    seed: int = 0
    eval_every: int = 1
    # Score the models before round 1 (metrics.csv's round 0: the first point of curves.png, the
    # cold start's result). Off, round 1's row is the first: start-up to round 1 without it.
    eval_at_start: bool = True
    # > 0: each evaluation scores this many clients, the same seeded sample in every round
    # (`evaluation_sample`); 0 (or at least the number of clients): every client.
    eval_clients: int = 0
    # > 0: also score each client after this many minibatches of plain local SGD on its
    # training data from its global/cluster model (the "finetuned" model kind).
    fine_tune_steps: int = 0
    # A client whose update has NaN or infinity is left out of the round; more than this
    # fraction of a round's clients doing so stops the run (the learning rate is too high).
    max_diverged_fraction: float = 0.25
    # What the server does with each cluster's mean update (`federated.server_optimizers`):
    # add it (FedAvg), or an optimizer step with it as the negative gradient (FedAvgM, FedAdam).
    server_optimizer: ServerOptimizer = ServerOptimizer()
    # How each round's clients are drawn from the eligible ones (`loop.sampling`): "fixed",
    # exactly `clients_per_round` without replacement; "poisson", each independently with
    # probability clients_per_round / eligible (a round may then have none).
    client_sampling: str = "fixed"
    # What becomes of each client's update before its cluster's mean (`AggregatorConfig`).
    aggregator: AggregatorConfig = AggregatorConfig()

    def __post_init__(self) -> None:
        # Types first (a bool, a whole float or a string of digits is not an int), as the
        # command line's flag parser refuses them; NumPy scalars become Python values.
        for name, value in checked_fields(self, "TrainingConfig").items():
            object.__setattr__(self, name, value)
        checks = [
            (self.rounds >= 1, "rounds must be >= 1"),
            (self.clients_per_round >= 1, "clients_per_round must be >= 1"),
            (self.local_epochs >= 1, "local_epochs must be >= 1"),
            (self.local_steps >= 0, "local_steps must be >= 0 (0: --local_epochs passes)"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (
                self.learning_rate > 0 and math.isfinite(self.learning_rate),
                "learning_rate must be > 0",
            ),
            (self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}"),
            (0 < self.lr_decay <= 1, "lr_decay must be in (0, 1]"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.eval_clients >= 0, "eval_clients must be >= 0 (--eval_clients=0: every client)"),
            (self.fine_tune_steps >= 0, "fine_tune_steps must be >= 0 (0: no fine-tuned kind)"),
            (self.seed >= 0, "seed must be >= 0"),
            (0 <= self.max_diverged_fraction <= 1, "max_diverged_fraction must be in [0, 1]"),
            (self.client_sampling in SAMPLINGS, f"client_sampling must be one of {SAMPLINGS}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def settings(self) -> dict[str, Any]:
        """`dataclasses.asdict` of these settings, the aggregator's as it records them
        (`AggregatorConfig.settings`): what a run's summary.json and checkpoints hold."""
        values = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, AggregatorConfig):
                values[field.name] = value.settings()
            elif dataclasses.is_dataclass(value):
                values[field.name] = dataclasses.asdict(value)
            else:
                values[field.name] = value
        return values

    def evaluation_sample(self, client_ids: Sequence[str]) -> list[str]:
        """The clients every evaluation of the run scores, in the order of `client_ids`: all of
        them when `eval_clients` is 0 or at least their number, else `eval_clients` of the
        sorted ids drawn without replacement from the seed stream `EVAL_SAMPLE`. It depends on
        the seed and the set of ids only, never on the algorithm or the round, so every
        algorithm of a table and every round of a run score the same clients."""
        ids = list(client_ids)
        if not self.eval_clients or self.eval_clients >= len(ids):
            return ids
        ordered = sorted(ids)
        rng = rng_for(self.seed, EVAL_SAMPLE)
        drawn = rng.choice(len(ordered), self.eval_clients, replace=False)
        chosen = {ordered[i] for i in drawn.tolist()}
        return [c for c in ids if c in chosen]

    def learning_rate_at(self, round_num: int) -> float:
        """Learning rate of round `round_num` (1-based): eta_0 * decay^(r-1) when exponential."""
        t = round_num - 1
        if self.lr_schedule == "exponential":
            return self.learning_rate * self.lr_decay**t
        if self.lr_schedule == "cosine":
            return self.learning_rate * 0.5 * (1 + math.cos(math.pi * t / self.rounds))
        return self.learning_rate
