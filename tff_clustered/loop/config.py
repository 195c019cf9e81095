"""A run's training settings: rounds, client sampling, local training, learning-rate
schedule, evaluation, the divergence policy, the server optimizer and the aggregator."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

from tff_clustered.federated.cluster_aggregators import ClusterAggregator, ClusterMean
from tff_clustered.federated.cluster_dp import ClusterDP
from tff_clustered.federated.cluster_encodings import ClusterCompression, ClusterSecure
from tff_clustered.federated.cluster_robust import ClusterRobust
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.federated.tff_factory_aggregator import TffFactoryPerCluster
from tff_clustered.loop.sampling import SAMPLINGS
from tff_clustered.options import checked_fields
from tff_clustered.seeds import EVAL_SAMPLE, rng_for

LR_SCHEDULES = ("constant", "exponential", "cosine")
AGGREGATORS = ("mean", "dp", "robust", "compression", "secure")  # the flags' (--aggregator)
ROBUST_AGGREGATORS = ("robust", "compression", "secure")
# A `tff.aggregators` factory per cluster: a Python object, so the Python API's only.
FACTORY_AGGREGATOR = TffFactoryPerCluster.name
DP_CLIPPINGS = ("fixed", "adaptive")
# The largest --target_epsilon: beyond it an epsilon bounds nothing, and the noise multiplier
# calibrated to it would fall toward `cluster_dp.MIN_NOISE_MULTIPLIER` (1e-6, whose one round
# already passes an epsilon of 1e12).
MAX_TARGET_EPSILON = 1e6


@dataclasses.dataclass(frozen=True)
class AggregatorConfig:
    """What the round does with each client's update between its training and its cluster's
    mean (`federated.cluster_aggregators`), as the flags name it: `name` "mean" (the weighted
    mean per cluster), "dp" (DP-FedAvg per cluster, `federated.cluster_dp.ClusterDP`: each
    update clipped, Gaussian noise of `noise_multiplier` times the clip norm on every cluster's
    sum, uniform client weights), or one of TFF's robust aggregators per cluster: "robust"
    (`federated.cluster_robust.ClusterRobust`: adaptive zeroing and clipping, then the weighted
    mean), "compression" (robust, then the large tensors quantized,
    `federated.cluster_encodings.ClusterCompression`) or "secure" (robust, then a bounded
    integer sum, `ClusterSecure`). "tff_factory" (the Python API's only: a factory is a Python
    object, no flag) runs `factory`, a `TffFactoryPerCluster`: one instance of any
    `tff.aggregators` factory per cluster.

    dp: `clip` is the clip norm (the start of each cluster's with `clipping="adaptive"`, which
    moves it toward the `target_quantile` of its clients' update norms at
    `clip_learning_rate`); `count_stddev`: the noise on the adaptive clip's counts (None: the
    noise multiplier). `delta`: the delta every epsilon is stated at; `target_epsilon` (> 0):
    the run stops before a round that would take a client's epsilon past it, and sets the noise
    multiplier when none is given (`loop.accounting.calibrated`). robust, compression, secure:
    `robust_zeroing` and `robust_clipping` turn the adaptive zeroing and clipping on or off;
    compression: `quantization_bits` per value of the tensors of more than
    `quantization_threshold` values. A setting keeps its default with an aggregator that does
    not use it (`FIELD_USERS`)."""

    name: str = "mean"
    noise_multiplier: Optional[float] = None
    clip: float = 1.0
    clipping: str = "fixed"
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_stddev: Optional[float] = None
    delta: float = 1e-5
    target_epsilon: float = 0.0
    robust_zeroing: bool = True
    robust_clipping: bool = True
    quantization_bits: int = 8
    quantization_threshold: int = 20000
    factory: Optional[TffFactoryPerCluster] = None

    def __post_init__(self) -> None:
        for name, value in checked_fields(self, "AggregatorConfig").items():
            object.__setattr__(self, name, value)
        if self.name not in (*AGGREGATORS, FACTORY_AGGREGATOR):
            raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {self.name!r}")
        if (self.name == FACTORY_AGGREGATOR) != (self.factory is not None):
            raise ValueError(
                f"aggregator {self.name!r} with factory={self.factory!r}: a tff.aggregators "
                f"factory goes with name {FACTORY_AGGREGATOR!r} only; give it to "
                "tff_clustered.run as aggregator=<the factory>"
            )
        if self.clipping not in DP_CLIPPINGS:
            raise ValueError(f"dp_clipping must be one of {DP_CLIPPINGS}, got {self.clipping!r}")
        self.refuse_unused_settings()
        if self.name == "dp" and self.noise_multiplier is None and not self.target_epsilon > 0:
            raise ValueError(
                "--aggregator=dp needs --dp_noise_multiplier (the noise's standard deviation "
                "over the clip norm; 0: clipping only, no privacy) or --target_epsilon (the "
                "noise multiplier whose rounds reach it)"
            )
        if self.clipping == "fixed":
            adaptive_only = ("target_quantile", "clip_learning_rate", "count_stddev")
            given = [f"--dp_{n}" for n in adaptive_only if getattr(self, n) != FIELD_DEFAULTS[n]]
            if given:
                raise ValueError(
                    f"{', '.join(given)} set with --dp_clipping=fixed, which does not use them: "
                    "add --dp_clipping=adaptive, or leave them unset"
                )
        if self.noise_multiplier == 0 and self.target_epsilon > 0:
            raise ValueError(
                "--target_epsilon with --dp_noise_multiplier=0: without noise no epsilon holds; "
                "give a noise multiplier above 0, or leave it unset to calibrate one"
            )
        if not 0 < self.delta < 1:
            raise ValueError(f"--dp_delta must be in (0, 1), got {self.delta}")
        if not math.isfinite(self.target_epsilon):
            raise ValueError(f"--target_epsilon must be finite, got {self.target_epsilon}")
        if not 0 <= self.target_epsilon <= MAX_TARGET_EPSILON:
            raise ValueError(
                f"--target_epsilon must be in [0, {MAX_TARGET_EPSILON:g}] (0: none), got "
                f"{self.target_epsilon:g}: an epsilon above {MAX_TARGET_EPSILON:g} bounds "
                f"nothing (a likelihood ratio of e^{MAX_TARGET_EPSILON:g}); give a target of "
                "at most that, or 0 for none"
            )
        self.build()  # the mechanism's own checks, here where the settings are made

    def refuse_unused_settings(self) -> None:
        """A setting changed from its default that `name`'s aggregator does not use is refused,
        naming its flag and the aggregators that use it."""
        unused = [
            field
            for field, (_, users) in FIELD_USERS.items()
            if self.name not in users and getattr(self, field) != FIELD_DEFAULTS[field]
        ]
        if not unused:
            return
        flags = ", ".join(f"--{FIELD_USERS[field][0]}" for field in unused)
        users = FIELD_USERS[unused[0]][1]
        fix = " or ".join(f"--aggregator={name}" for name in users)
        does = "adds no noise and clips nothing" if self.name == "mean" else "does not use them"
        raise ValueError(
            f"{flags} set with --aggregator={self.name}, which {does}: add {fix}, or leave "
            "them unset"
        )

    def with_noise_multiplier(self, noise_multiplier: float) -> AggregatorConfig:
        return dataclasses.replace(self, noise_multiplier=noise_multiplier)

    def build(self) -> ClusterAggregator:
        """The aggregator these settings describe."""
        robust = dict(zeroing=self.robust_zeroing, clipping=self.robust_clipping)
        if self.name == "robust":
            return ClusterRobust(**robust)
        if self.name == "compression":
            return ClusterCompression(
                **robust,
                quantization_bits=self.quantization_bits,
                quantization_threshold=self.quantization_threshold,
            )
        if self.name == "secure":
            return ClusterSecure(**robust)
        if self.name == "mean":
            return ClusterMean()
        if self.factory is not None:
            return self.factory
        return ClusterDP(
            noise_multiplier=float(self.noise_multiplier or 0.0),
            clip=self.clip,
            adaptive=self.clipping == "adaptive",
            target_quantile=self.target_quantile,
            clip_learning_rate=self.clip_learning_rate,
            count_stddev=self.count_stddev,
        )

    @classmethod
    def of(cls, aggregator: ClusterAggregator) -> AggregatorConfig:
        """The settings of a built aggregator (`ClusterMean`, `ClusterDP`, `ClusterRobust`,
        `ClusterCompression`, `ClusterSecure` or `TffFactoryPerCluster`)."""
        if isinstance(aggregator, TffFactoryPerCluster):
            return cls(FACTORY_AGGREGATOR, factory=aggregator)
        if isinstance(aggregator, ClusterDP):
            return cls(
                "dp",
                noise_multiplier=aggregator.noise_multiplier,
                clip=aggregator.clip,
                clipping="adaptive" if aggregator.adaptive else "fixed",
                target_quantile=aggregator.target_quantile,
                clip_learning_rate=aggregator.clip_learning_rate,
                count_stddev=aggregator.count_stddev,
            )
        if isinstance(aggregator, ClusterRobust):
            quantization = {}
            if isinstance(aggregator, ClusterCompression):
                quantization = dict(
                    quantization_bits=aggregator.quantization_bits,
                    quantization_threshold=aggregator.quantization_threshold,
                )
            return cls(
                aggregator.name,
                robust_zeroing=aggregator.zeroing,
                robust_clipping=aggregator.clipping,
                **quantization,
            )
        if isinstance(aggregator, ClusterMean):
            return cls()
        raise TypeError(
            "aggregator must be ClusterMean(), ClusterDP(...), ClusterRobust(...), "
            "ClusterCompression(...), ClusterSecure(...) or a tff.aggregators factory, got "
            f"{type(aggregator).__name__}"
        )

    def settings(self) -> dict[str, Any]:
        """What a run records of these settings (summary.json, checkpoints): the fields, a
        factory as its description (a Python object is not a value a file holds) and, beside
        it, its parameters (`factory_inspection.factory_parameters`): the readable ones by
        path, and the paths of those inside TFF computations, which cannot be read."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["factory"] = None if self.factory is None else self.factory.description
        if self.factory is not None:
            parameters = self.factory.parameters
            values["factory_parameters"] = dict(parameters.values)
            values["factory_parameters_unread"] = list(parameters.unread)
        return values


FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AggregatorConfig)}
# Each setting's flag and the aggregators that use it.
FIELD_USERS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{
        name: (f"dp_{name}", ("dp",))
        for name in ("noise_multiplier", "clip", "clipping", "target_quantile")
        + ("clip_learning_rate", "count_stddev", "delta")
    },
    "target_epsilon": ("target_epsilon", ("dp",)),
    "robust_zeroing": ("robust_zeroing", ROBUST_AGGREGATORS),
    "robust_clipping": ("robust_clipping", ROBUST_AGGREGATORS),
    "quantization_bits": ("quantization_bits", ("compression",)),
    "quantization_threshold": ("quantization_threshold", ("compression",)),
}


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
