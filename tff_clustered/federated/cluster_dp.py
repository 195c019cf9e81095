"""Differentially private FedAvg per cluster, its settings and what its accountant reads.

DP-FedAvg: McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent
Language Models", ICLR 2018; adaptive clipping: Andrew, Thakkar, McMahan and Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, as a
`cluster_aggregators.ClusterAggregator`.

Client: its shared update Delta_i (every shared tensor, the BatchNorm statistics they own
included) is clipped to its cluster's norm C_k in global L2 norm,
`Delta_i * min(1, C_k / ||Delta_i||)`, and added with weight 1 into its cluster's row only.

Server: every cluster in use (expected count E_k > 0) gets Gaussian noise of standard
deviation `z_v * C_k` on its sum, whether or not a client of it took part, and is divided by
E_k, the number of its clients the round expects before sampling (the fixed-denominator
estimator of McMahan et al.; never the realised count, which one client changes):

    mean_k = (sum_{i in k} clip(Delta_i, C_k) + N(0, (z_v C_k)^2 I)) / E_k

A client touches one row of the `[K, d]` stack, so the round is one Gaussian mechanism of L2
sensitivity C (add/remove) on the whole stack, whatever K is.

Adaptive clipping (Andrew et al., Algorithm 1, geometric update): each client also sends
`b_i = [||Delta_i|| <= C_k] - 1/2` into its cluster's row; the server moves each clip toward
the `target_quantile` of its clients' update norms,

    b_k = clamp((sum_{i in k} b_i + N(0, sigma_b^2)) / E_k + 1/2, 0, 1)
    C_k <- C_k * exp(-lr * (b_k - target_quantile)).

The count's noise is paid for out of the noise multiplier z as TFF does
(`tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive`): the value noise multiplier
is z_v = (z^-2 - (2 sigma_b)^-2)^(-1/2), so the two Gaussian mechanisms compose to one of
multiplier z. TFF's default sigma_b = 0.05 E is refused at a cluster's usual E of a few
clients (it must exceed z/2), so the default here is sigma_b = z.

Noise is stateless (`tf.random.stateless_normal`: Philox keyed by 128 bits), from the round's
128-bit key split by cluster and by tensor (`noise_keys`: every split keeps 128 bits), on the
CPU, so TFF's worker and the in-process round (on a GPU too) draw the same numbers from the same
key. The key is the loop's round input (`loop.aggregation.noise_key`): with `noise="seeded"`
(the default) a function of the run's seed and the round, so a resumed run repeats an
uninterrupted one and anyone holding the seed can recompute (and subtract) the noise; with
`noise="secure"` 128 fresh bits of the operating system's CSPRNG each round, never written
anywhere, and each noise value the sum of four draws over 2 (Opacus's `secure_mode`, against
the floating-point attacks on one Gaussian draw: Holohan and Braghin, "Secure Random Sampling
in Differential Privacy", ESORICS 2021). With z = 0 the result equals TFF's
`DifferentiallyPrivateFactory` (fixed or adaptive clipping) run on each cluster's own clients
(tests/test_cluster_dp.py).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated.cluster_aggregators import (
    AggregatorOptions,
    ClusterAggregator,
    PrivacyBudget,
    divide_rows,
    geometric_quantile_step,
)
from tff_clustered.options import flag_name, option

# Where the noise's key comes from (`DPOptions.noise`): the run's seed, or the OS's CSPRNG.
DP_NOISE_SOURCES = ("seeded", "secure")
# Secure noise: each value the sum of this many standard normal draws over its square root
# (Opacus's `secure_mode` sums four and halves them).
SECURE_NOISE_DRAWS = 4
# The settings' bounds. The round computes in float32: a clip, a noise standard deviation or a
# count's noise beyond its largest value is infinite.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The least noise multiplier above 0: one Gaussian round of multiplier z has Renyi DP
# alpha / (2 z^2) at order alpha (Mironov, CSF 2017, Proposition 7), an epsilon of about 4/z^2
# (Poisson sampling: about 0.55/z^2), so below 1e-6 one round's epsilon passes 1e12, which
# bounds nothing; near z = 1e-16 a run's epsilon leaves float32 (its metrics and TensorBoard
# scalars), and below 1e-154 z^2 underflows to 0 in the accountant (a division by zero).
MIN_NOISE_MULTIPLIER = 1e-6
# The adaptive clip's step multiplies it by exp(-rate (b - q)) (Andrew et al. 2021), where the
# noised fraction b below the clip is in [0, 1]: one round moves it by up to a factor
# exp(rate max(q, 1 - q)). The rate is refused where that passes e (rate 2 at q = 0.5, ten times
# the paper's 0.2): a faster clip follows the noise on b, not the update norms (a rate of 88 took
# the clip from 1 to 1e-19 in two rounds; e^-44 in one round of every update under the clip).
MAX_CLIP_STEP = 1.0
# Noise of this standard deviation per value (or more) on a cluster's sum is at least a
# model's usual weights (|w| well below 1): a model made non-finite is then blamed on it.
BLAMED_NOISE_STDDEV = 1.0
DP_CLIPPINGS = ("fixed", "adaptive")
# How FedGroup's and FeSEM's cold start reads each client's pre-training update: through the
# Gaussian mechanism (`loop.update_release`), or raw (outside the run's guarantee).
COLD_START_RELEASES = ("private", "raw")
# The share of the run's epsilon the private cold start's one release per client costs when
# its noise multiplier is not given: ours (the papers have no private cold start).
DEFAULT_COLD_START_SHARE = 0.1
# The largest --target_epsilon: beyond it an epsilon bounds nothing, and the noise multiplier
# calibrated to it would fall toward `MIN_NOISE_MULTIPLIER` (1e-6, whose one round already
# passes an epsilon of 1e12).
MAX_TARGET_EPSILON = 1e6


@dataclasses.dataclass(frozen=True)
class DPOptions(AggregatorOptions):
    """`ClusterDP`'s settings as users give them (`--dp_*`, `--target_epsilon`): the mechanism's
    (`clipping` names `ClusterDP.adaptive`; an unset `noise_multiplier` is calibrated to
    `target_epsilon`) and the accountant's (`delta`, `target_epsilon`: `loop.accounting`)."""

    noise_multiplier: Optional[float] = option(
        None,
        "the noise's standard deviation over the clip norm (0: clipping only).",
        flag="dp_noise_multiplier",
        lower_bound=0.0,
    )
    clip: float = option(
        1.0, "the clip norm (the start of each cluster's, adaptive).", flag="dp_clip"
    )
    clipping: str = option(
        "fixed",
        "a fixed clip norm, or adaptive: each cluster's moved toward the --dp_target_quantile "
        "of its clients' update norms (Andrew et al. 2021).",
        choices=DP_CLIPPINGS,
        flag="dp_clipping",
    )
    target_quantile: float = option(
        0.5,
        "with --dp_clipping=adaptive: the quantile of update norms aimed at.",
        flag="dp_target_quantile",
    )
    clip_learning_rate: float = option(
        0.2,
        "with --dp_clipping=adaptive: the clip's geometric learning rate, at most "
        "1/max(q, 1 - q) for --dp_target_quantile q (one round moves the clip by at most e).",
        flag="dp_clip_learning_rate",
    )
    count_stddev: Optional[float] = option(
        None,
        "with --dp_clipping=adaptive: the noise on each cluster's below-clip count (unset: the "
        "noise multiplier; it must exceed half of it).",
        flag="dp_count_stddev",
        lower_bound=0.0,
    )
    noise: str = option(
        "seeded",
        "where the noise comes from: seeded, a function of --seed and the round (repeatable and "
        "resumable, for research: whoever holds the run folder can recompute and remove it, so "
        "no privacy holds against them); secure, a fresh 128-bit key from the operating "
        "system's CSPRNG each round, never stored (no one can recompute it; not repeatable).",
        choices=DP_NOISE_SOURCES,
        flag="dp_noise",
    )
    cold_start_release: str = option(
        "private",
        "FedGroup's and FeSEM's cold start: each client's pre-training update clipped to "
        "--dp_clip and noised before the server clusters it (private: epsilon covers it), or "
        "read raw (outside epsilon).",
        choices=COLD_START_RELEASES,
        flag="dp_cold_start",
    )
    cold_start_share: float = option(
        DEFAULT_COLD_START_SHARE,
        "with --dp_cold_start=private: the share of the run's epsilon (the target, else the "
        "rounds') the cold start's one release per client costs.",
        flag="dp_cold_start_share",
    )
    cold_start_noise_multiplier: Optional[float] = option(
        None,
        "with --dp_cold_start=private: the noise on each client's pre-training update over "
        "--dp_clip (unset: the one --dp_cold_start_share gives).",
        flag="dp_cold_start_noise_multiplier",
        lower_bound=0.0,
    )
    delta: float = option(
        1e-5,
        "the delta every epsilon is stated at (epsilon columns of metrics.csv, summary.json's "
        "privacy).",
        flag="dp_delta",
    )
    target_epsilon: float = option(
        0.0,
        "stop before a round that would take a client's epsilon past this (0: never); without "
        "--dp_noise_multiplier, the noise multiplier whose --rounds rounds reach it.",
        lower_bound=0.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the types first
        if self.clipping not in DP_CLIPPINGS:
            raise ValueError(f"dp_clipping must be one of {DP_CLIPPINGS}, got {self.clipping!r}")
        if self.noise not in DP_NOISE_SOURCES:
            raise ValueError(f"dp_noise must be one of {DP_NOISE_SOURCES}, got {self.noise!r}")
        if self.noise_multiplier is None and not self.target_epsilon > 0:
            raise ValueError(
                "--aggregator=dp needs --dp_noise_multiplier (the noise's standard deviation "
                "over the clip norm; 0: clipping only, no privacy) or --target_epsilon (the "
                "noise multiplier whose rounds reach it)"
            )
        # Settings only another mode reads, set away from their defaults: refused, not ignored.
        unused_in_mode = (
            (
                self.clipping == "fixed",
                ("target_quantile", "clip_learning_rate", "count_stddev"),
                "--dp_clipping=fixed",
                "--dp_clipping=adaptive",
            ),
            (
                self.cold_start_release == "raw",
                ("cold_start_share", "cold_start_noise_multiplier"),
                "--dp_cold_start=raw",
                "--dp_cold_start=private",
            ),
            (  # clipping only: the cold start has no noise to add, its updates are read raw
                self.noise_multiplier == 0,
                ("cold_start_share", "cold_start_noise_multiplier"),
                "--dp_noise_multiplier=0",
                "a noise multiplier above 0",
            ),
        )
        defaults = DPOptions.__dataclass_fields__
        for applies, names, mode, other_mode in unused_in_mode:
            given = [
                flag_name(defaults[n]) for n in names if getattr(self, n) != defaults[n].default
            ]
            if applies and given:
                raise ValueError(
                    f"{', '.join(f'--{g}' for g in given)} set with {mode}, which does not use "
                    f"them: add {other_mode}, or leave them unset"
                )
        if self.noise_multiplier == 0 and self.target_epsilon > 0:
            raise ValueError(
                "--target_epsilon with --dp_noise_multiplier=0: without noise no epsilon holds; "
                "give a noise multiplier above 0, or leave it unset to calibrate one"
            )
        if not 0 < self.delta < 1:
            raise ValueError(f"--dp_delta must be in (0, 1), got {self.delta}")
        check_cold_start(self.cold_start_release, self.cold_start_share)
        if not math.isfinite(self.target_epsilon):
            raise ValueError(f"--target_epsilon must be finite, got {self.target_epsilon}")
        if not 0 <= self.target_epsilon <= MAX_TARGET_EPSILON:
            raise ValueError(
                f"--target_epsilon must be in [0, {MAX_TARGET_EPSILON:g}] (0: none), got "
                f"{self.target_epsilon:g}: an epsilon above {MAX_TARGET_EPSILON:g} bounds "
                f"nothing (a likelihood ratio of e^{MAX_TARGET_EPSILON:g}); give a target of "
                "at most that, or 0 for none"
            )


@dataclasses.dataclass(frozen=True)
class ClusterDP(ClusterAggregator):
    """DP-FedAvg per cluster (see the module docstring). `noise_multiplier`: z, the noise
    standard deviation over the clip norm of the whole mechanism (0: clipping only, no
    privacy); `clip`: the clip norm C (the start of each cluster's with `adaptive`);
    `adaptive`: move each cluster's clip toward the `target_quantile` of its clients' update
    norms at `clip_learning_rate`; `count_stddev`: sigma_b, the noise on the below-clip counts
    (None: z); `noise`: where the noise's key comes from, "seeded" (the run's seed) or
    "secure" (the OS's CSPRNG, each round). The private cold start (`loop.update_release`):
    `cold_start_release` "private" or "raw", its noise multiplier `cold_start_noise_multiplier`
    over `clip` (None: set by the run from `cold_start_share` of its epsilon)."""

    noise_multiplier: float
    clip: float = 1.0
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_stddev: Optional[float] = None
    noise: str = "seeded"
    cold_start_release: str = "private"
    cold_start_share: float = DEFAULT_COLD_START_SHARE
    cold_start_noise_multiplier: Optional[float] = None

    name: ClassVar[str] = "dp"
    uniform_weights: ClassVar[bool] = True
    private: ClassVar[bool] = True
    summary: ClassVar[str] = (
        "DP-FedAvg per cluster: each update clipped to --dp_clip, Gaussian noise of "
        "--dp_noise_multiplier times the clip on every cluster's sum, divided by the cluster's "
        "expected number of clients; clients weigh uniformly"
    )
    Options: ClassVar[type] = DPOptions
    cold_start_settings: ClassVar[tuple[str, ...]] = (
        "cold_start_release",
        "cold_start_share",
        "cold_start_noise_multiplier",
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the types first: ClusterDP(noise_multiplier="1") is refused
        z, clip, rate = self.noise_multiplier, self.clip, self.clip_learning_rate
        max_rate = max_clip_learning_rate(self.target_quantile)
        checks = [
            (
                z == 0 or MIN_NOISE_MULTIPLIER <= z <= FLOAT32_MAX,
                "noise_multiplier",
                f"0 (clipping only, no noise) or in [{MIN_NOISE_MULTIPLIER:g}, "
                f"{FLOAT32_MAX:.4g}] (below {MIN_NOISE_MULTIPLIER:g} one round's epsilon "
                "passes 1e12, which bounds nothing, and smaller ones overflow the accountant; "
                "give 0 for clipping without noise)",
            ),
            (
                0 < clip <= FLOAT32_MAX,
                "clip",
                f"in (0, {FLOAT32_MAX:.4g}] (the clip norm is a float32)",
            ),
            (0 <= self.target_quantile <= 1, "target_quantile", "in [0, 1]"),
            (self.noise in DP_NOISE_SOURCES, "noise", f"one of {DP_NOISE_SOURCES}"),
            (
                0 <= rate <= max_rate,
                "clip_learning_rate",
                f"in [0, {max_rate:.4g}] at target_quantile q = {self.target_quantile:g}: one "
                "round multiplies the clip by up to exp(rate x max(q, 1 - q)), kept within a "
                f"factor e^{MAX_CLIP_STEP:g} (Andrew et al. 2021 use 0.2)",
            ),
            (
                self.count_stddev is None or 0 <= self.count_stddev <= FLOAT32_MAX,
                "count_stddev",
                f"in [0, {FLOAT32_MAX:.4g}] or unset",
            ),
            (
                self.cold_start_noise_multiplier is None
                or MIN_NOISE_MULTIPLIER <= self.cold_start_noise_multiplier <= FLOAT32_MAX,
                "cold_start_noise_multiplier",
                f"in [{MIN_NOISE_MULTIPLIER:g}, {FLOAT32_MAX:.4g}] or unset (a cold start "
                "without noise is --dp_cold_start=raw)",
            ),
        ]
        for ok, name, valid in checks:
            if not ok:  # NaN fails every comparison, infinity every bound
                raise ValueError(
                    f"ClusterDP: {name} (--dp_{name}) must be {valid}, got {getattr(self, name)}"
                )
        check_cold_start(self.cold_start_release, self.cold_start_share)
        sigma = self.effective_count_stddev
        if self.adaptive and z > 0 and z >= 2 * sigma:
            raise ValueError(
                f"dp_count_stddev={sigma:g} is too small for dp_noise_multiplier={z:g}: the "
                "below-clip counts take part of the noise budget, which needs "
                f"dp_count_stddev > {z / 2:g}; raise --dp_count_stddev (unset: {z:g})"
            )
        if self.value_noise_multiplier * clip > FLOAT32_MAX:
            raise ValueError(
                f"ClusterDP: the noise's standard deviation on a cluster's sum, "
                f"{self.value_noise_multiplier:.4g} x clip {clip:g}, overflows float32 "
                f"({FLOAT32_MAX:.4g}); lower --dp_noise_multiplier or --dp_clip"
            )

    def divergence_hint(self) -> str:
        """The DP settings when they may have made a model non-finite: noise of a standard
        deviation per value on a cluster's sum (at the clip the run started with) of at least
        `BLAMED_NOISE_STDDEV`, or an adaptive clip moving by more than e^(1/2) per round (half
        the step `max_clip_learning_rate` allows: a rate above 1 at q = 0.5)."""
        std = self.value_noise_multiplier * self.clip
        fast_rate = max_clip_learning_rate(self.target_quantile) / 2
        fast_clip = self.adaptive and self.clip_learning_rate > fast_rate
        if std < BLAMED_NOISE_STDDEV and not fast_clip:
            return ""
        fixes = ["--dp_noise_multiplier", "--dp_clip"] + ["--dp_clip_learning_rate"] * fast_clip
        return (
            f"the DP settings likely caused it: noise of standard deviation {std:.3g} per value "
            f"on each cluster's sum (--dp_noise_multiplier={self.noise_multiplier:g} x "
            f"--dp_clip={self.clip:g})"
            + (f", an adaptive clip of rate {self.clip_learning_rate:g}" if fast_clip else "")
            + f": lower {' or '.join(fixes)}"
        )

    # -- its settings (`DPOptions`) ------------------------------------------------------------
    @classmethod
    def from_options(cls, options: DPOptions) -> ClusterDP:
        """The mechanism of `options` (an unset noise multiplier, to be calibrated, as 0)."""
        return cls(
            noise_multiplier=float(options.noise_multiplier or 0.0),
            clip=options.clip,
            adaptive=options.clipping == "adaptive",
            target_quantile=options.target_quantile,
            clip_learning_rate=options.clip_learning_rate,
            count_stddev=options.count_stddev,
            noise=options.noise,
            cold_start_release=options.cold_start_release,
            cold_start_share=options.cold_start_share,
            cold_start_noise_multiplier=options.cold_start_noise_multiplier,
        )

    def options(self) -> DPOptions:
        """Its settings, the accountant's at their defaults."""
        return DPOptions(
            noise_multiplier=self.noise_multiplier,
            clip=self.clip,
            clipping="adaptive" if self.adaptive else "fixed",
            target_quantile=self.target_quantile,
            clip_learning_rate=self.clip_learning_rate,
            count_stddev=self.count_stddev,
            noise=self.noise,
            cold_start_release=self.cold_start_release,
            cold_start_share=self.cold_start_share,
            cold_start_noise_multiplier=self.cold_start_noise_multiplier,
        )

    @classmethod
    def privacy_budget(cls, options: DPOptions) -> PrivacyBudget:
        private_cold_start = options.cold_start_release == "private"
        return PrivacyBudget(
            options.delta,
            options.target_epsilon,
            calibrate=options.noise_multiplier is None,
            cold_start_share=options.cold_start_share if private_cold_start else 0.0,
            cold_start_noise_multiplier=options.cold_start_noise_multiplier,
        )

    @classmethod
    def with_cold_start_noise_multiplier(
        cls, options: DPOptions, noise_multiplier: float
    ) -> DPOptions:
        return dataclasses.replace(options, cold_start_noise_multiplier=noise_multiplier)

    def cold_start_mechanism(self) -> Optional[tuple[float, float]]:
        """(`clip`, the cold start's noise multiplier) when the cold start is private and its
        multiplier set (by the run: `loop.accounting.calibrated`), in a run with noise."""
        z = self.cold_start_noise_multiplier
        if self.cold_start_release != "private" or z is None or self.noise_multiplier == 0:
            return None
        return self.clip, float(z)

    @classmethod
    def with_noise_multiplier(cls, options: DPOptions, noise_multiplier: float) -> DPOptions:
        return dataclasses.replace(options, noise_multiplier=noise_multiplier)

    def privacy_record(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "value_noise_multiplier": self.value_noise_multiplier,
            "count_stddev": self.effective_count_stddev if self.adaptive else None,
            "clip": self.clip,
            "clipping": "adaptive" if self.adaptive else "fixed",
            "noise": self.noise,
        }

    @property
    def secure_noise(self) -> bool:
        return self.noise == "secure"

    def resume_warning(self) -> str:
        """A resumed run of secure noise continues with fresh noise (its key was never saved)."""
        if not self.secure_noise or self.noise_multiplier == 0:
            return ""
        return (
            "--dp_noise=secure: the resumed rounds draw fresh noise from the operating system's "
            "CSPRNG (no key was saved), so the models will differ from an uninterrupted run's; "
            "the epsilon will not (it does not depend on the noise's values)"
        )

    # -- what the accountant reads ------------------------------------------------------------
    @property
    def effective_count_stddev(self) -> float:
        """sigma_b, the standard deviation of the noise on a cluster's below-clip count (0
        with fixed clipping, which sends no count)."""
        if not self.adaptive:
            return 0.0
        return self.noise_multiplier if self.count_stddev is None else float(self.count_stddev)

    @property
    def value_noise_multiplier(self) -> float:
        """z_v: the noise standard deviation on a cluster's sum over its clip norm (z with
        fixed clipping; TFF's `adaptive_clip_noise_params` with adaptive)."""
        z = self.noise_multiplier
        if not self.adaptive or z == 0:
            return z
        return (z**-2 - (2 * self.effective_count_stddev) ** -2) ** -0.5

    def round_event(self) -> Any:
        """One round's mechanism before client sampling: a Gaussian of multiplier z (fixed
        clipping), or the Gaussian on the sums (z_v) composed with the one on the below-clip
        counts (sensitivity 1/2: multiplier 2 sigma_b), which compose to one of multiplier z;
        None with z = 0 (clipping only: no differential privacy, no epsilon to account)."""
        import dp_accounting

        if self.noise_multiplier == 0:
            return None
        if not self.adaptive:
            return dp_accounting.GaussianDpEvent(self.noise_multiplier)
        return dp_accounting.ComposedDpEvent(
            [
                dp_accounting.GaussianDpEvent(self.value_noise_multiplier),
                dp_accounting.GaussianDpEvent(2 * self.effective_count_stddev),
            ]
        )

    # -- the aggregator's steps ---------------------------------------------------------------
    @property
    def stats_width(self) -> int:
        return 1 if self.adaptive else 0

    def initial_state(self, num_clusters: int) -> collections.OrderedDict:
        return collections.OrderedDict(clip=np.full([num_clusters], self.clip, np.float32))

    def client_params(self, state: Mapping[str, Any]) -> collections.OrderedDict:
        return collections.OrderedDict(clip=state["clip"])

    def preprocess(
        self,
        params: Mapping[str, tf.Tensor],
        delta: tuple,
        cluster: tf.Tensor,
        weight: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, tf.Tensor, tf.Tensor]:
        """The update clipped to its cluster's norm in global L2 norm over all its tensors;
        with adaptive clipping, the centred below-clip indicator (0 for a client whose update
        diverged, weight 0: it takes no part)."""
        clip = tf.gather(params["clip"], cluster)
        clipped, norm = tf.clip_by_global_norm(list(delta), clip)
        below = tf.cast(norm <= clip, tf.float32) - 0.5
        stats = tf.reshape(below * tf.cast(weight > 0, tf.float32), [1])
        return tuple(clipped), weight, stats[: self.stats_width]

    def finalize(
        self,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        state: Mapping[str, tf.Tensor],
        inputs: Mapping[str, tf.Tensor],
    ) -> tuple[tuple, tf.Tensor, collections.OrderedDict, collections.OrderedDict]:
        """Every cluster in use noised and divided by its expected count; with adaptive
        clipping, its clip moved by its noised below-clip fraction (the others keep theirs)."""
        clip, denominator = state["clip"], inputs["denominator"]
        in_use = denominator > 0
        num_clusters = int(sums[0].shape[0]) if sums else int(clip.shape[0])
        with tf.device("/CPU:0"):  # the same stateless numbers on every device
            keys = noise_keys(inputs["seed"], num_clusters, len(sums) + 1)
            value_scale = clip * self.value_noise_multiplier
            means = []
            for i, total in enumerate(sums):
                noise = tf.stack(
                    [
                        self.standard_normal(total.shape[1:], keys[k][i]) * value_scale[k]
                        for k in range(num_clusters)
                    ]
                )
                means.append(divide_rows(total + masked(noise, in_use), denominator))
        measurements = collections.OrderedDict(dp_clip=clip)
        new_clip = clip
        if self.adaptive:  # the count's noise: each cluster's last key
            with tf.device("/CPU:0"):
                count_noise = tf.stack(
                    [self.standard_normal([], keys[k][len(sums)]) for k in range(num_clusters)]
                )
            noised = stats[:, 0] + count_noise * self.effective_count_stddev
            new_clip, below = geometric_quantile_step(
                clip,
                noised,
                denominator,
                self.target_quantile,
                self.clip_learning_rate,
                in_use,
            )
            measurements["dp_unclipped_fraction"] = tf.where(in_use, below, 0.0)
        state = collections.OrderedDict(clip=new_clip)
        return tuple(means), in_use, state, measurements

    def standard_normal(self, shape: Any, key: tf.Tensor) -> tf.Tensor:
        """Standard normal values of `shape` from the 128-bit `key`: one draw each (seeded), or
        the sum of `SECURE_NOISE_DRAWS` draws over its square root (secure)."""
        if not self.secure_noise:
            return tf.random.stateless_normal(shape, seed=key)
        keys = tf.random.experimental.stateless_split(key, SECURE_NOISE_DRAWS)
        draws = [tf.random.stateless_normal(shape, seed=keys[j]) for j in range(SECURE_NOISE_DRAWS)]
        return tf.add_n(draws) / math.sqrt(SECURE_NOISE_DRAWS)


def noise_keys(round_key: tf.Tensor, num_clusters: int, per_cluster: int) -> list[tf.Tensor]:
    """`per_cluster` keys for each of `num_clusters` clusters (`[per_cluster, 2]` each) from the
    round's key (int64[2]): splits of int64 keys keep all 128 bits, where a fold-in of a Python
    int would leave 32 (`stateless_fold_in` draws the new key in the folded value's dtype)."""
    key = tf.cast(round_key, tf.int64)
    return [
        tf.random.experimental.stateless_split(row, per_cluster)
        for row in tf.unstack(tf.random.experimental.stateless_split(key, num_clusters))
    ]


def max_clip_learning_rate(target_quantile: float) -> float:
    """The largest adaptive clip learning rate at `target_quantile` q: one round multiplies
    the clip by exp(-rate (b - q)), b in [0, 1], so by at most exp(rate max(q, 1 - q)), which
    this keeps within e^`MAX_CLIP_STEP`."""
    return MAX_CLIP_STEP / max(target_quantile, 1.0 - target_quantile)


def check_cold_start(release: str, share: float) -> None:
    """Refuses a cold start other than private or raw, and a share of epsilon outside (0, 1)."""
    if release not in COLD_START_RELEASES:
        raise ValueError(f"--dp_cold_start must be one of {COLD_START_RELEASES}, got {release!r}")
    if not 0 < share < 1:
        raise ValueError(
            f"--dp_cold_start_share must be in (0, 1), got {share}: the share of the run's "
            "epsilon the private cold start costs (for none, --dp_cold_start=raw)"
        )


def masked(noise: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """`noise` on the rows `rows` says (`[K]` bool), 0 on the others."""
    shaped = tf.reshape(rows, [-1] + [1] * (len(noise.shape) - 1))
    return tf.where(shaped, noise, tf.zeros_like(noise))
