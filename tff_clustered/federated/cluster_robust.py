"""TFF's robust aggregator per cluster, and its settings.

`tff.learning.robust_aggregator(zeroing=True, clipping=True, weighted=True)`, as a
`cluster_aggregators.ClusterAggregator`, and the base of the compressed and secure ones
(`cluster_encodings.py`: `tff.learning.compression_aggregator`,
`tff.learning.secure_aggregator`).

Client i of cluster k, its shared update Delta_i and weight w_i (the weight the algorithm's
mean uses: its examples, or 1):

1. zeroing (`tff.aggregators.zeroing_factory`, TFF's default L-infinity norm): the whole
   update is set to 0 when its largest absolute value exceeds the cluster's zeroing norm
   `2 Z_k + 1`, its weight unchanged;
2. clipping (`tff.aggregators.clipping_factory`): the (zeroed) update scaled into the L2 ball of
   radius C_k, `Delta * C_k / ||Delta||` when `||Delta|| > C_k` (TFF's global L2 norm over every
   tensor);
3. the weighted value `w_i Delta_i` (`tff.aggregators.MeanFactory`), encoded for the upload by
   a subclass (quantized, or as secure summation's integers), is added into its cluster's
   row; the weight goes beside it in the statistics row;
4. the server divides each cluster's sum by its clients' total weight: the weighted mean.

Z_k and C_k are quantile estimates without noise (TFF's `PrivateQuantileEstimationProcess.
no_noise`; Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021, geometric update): Z_k of the 0.98 quantile of the clients'
L-infinity norms (start 10, learning rate ln 10), C_k of the 0.8 quantile of their zeroed
updates' L2 norms (start 1, learning rate 0.2), TFF's defaults. Each cluster's estimates are
its own state row, moved only by the clients of that cluster in the round, each counting once
(the fraction below is over the round's clients of the cluster, as TFF's `NoPrivacyAverage
Query` counts them); a cluster no client trained in keeps its estimates and its model. A client
whose update diverged (weight 0) takes no part. Nothing is random: both executions and a
resumed run give the same numbers. Per cluster this is TFF's `robust_aggregator` run on the
cluster's own clients (tests/test_cluster_robust.py). It gives no differential privacy.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from tff_clustered.federated.cluster_aggregators import (
    AggregatorOptions,
    ClusterAggregator,
    divide_rows,
    geometric_quantile_step,
)
from tff_clustered.options import option

Indicators = dict[str, tf.Tensor]  # a statistics column's name -> one client's value


@dataclasses.dataclass(frozen=True)
class NormEstimate:
    """TFF's `PrivateQuantileEstimationProcess.no_noise(initial_estimate, target_quantile,
    learning_rate, multiplier, increment)`: an estimate C of the `target_quantile` of the
    clients' norms, reported as `multiplier * C + increment`."""

    initial: float
    target_quantile: float
    learning_rate: float
    multiplier: float = 1.0
    increment: float = 0.0
    reports: str = "norm"  # what the reported value is: a metrics.csv column `<name>_<reports>`

    def reported(self, estimate: tf.Tensor) -> tf.Tensor:
        """The norm the clients use: the affine map of the estimate (TFF's `_affine_transform`)."""
        if self.multiplier == 1.0 and self.increment == 0.0:
            return estimate
        return self.multiplier * estimate + self.increment


# `tff.learning.model_update_aggregator`'s `_default_zeroing` and `_default_clipping`.
ZEROING = NormEstimate(10.0, 0.98, math.log(10.0), multiplier=2.0, increment=1.0)
CLIPPING = NormEstimate(1.0, 0.8, 0.2)


@dataclasses.dataclass(frozen=True)
class RobustOptions(AggregatorOptions):
    """`ClusterRobust`'s settings as users give them (`--robust_zeroing`, `--robust_clipping`)."""

    robust_zeroing: bool = option(
        True,
        "zero a client's whole update when its largest absolute value exceeds the cluster's "
        "adaptive zeroing norm (TFF's defaults).",
    )
    robust_clipping: bool = option(
        True,
        "clip each update to the cluster's adaptive L2 norm (an estimate of its clients' 0.8 "
        "quantile; TFF's defaults).",
    )


@dataclasses.dataclass(frozen=True)
class ClusterRobust(ClusterAggregator):
    """TFF's robust aggregator per cluster (see the module docstring): adaptive `zeroing`, then
    adaptive `clipping` (either can be off), then the client-weighted mean."""

    zeroing: bool = True
    clipping: bool = True

    name: ClassVar[str] = "robust"
    summary: ClassVar[str] = (
        "TFF's robust_aggregator per cluster: adaptive zeroing and clipping, then the weighted mean"
    )
    Options: ClassVar[type] = RobustOptions

    @classmethod
    def from_options(cls, options: RobustOptions) -> ClusterRobust:
        return cls(zeroing=options.robust_zeroing, clipping=options.robust_clipping)

    def options(self) -> RobustOptions:
        return RobustOptions(robust_zeroing=self.zeroing, robust_clipping=self.clipping)

    # -- what a subclass changes: how the weighted value is sent, what it estimates -----------
    def estimates(self) -> dict[str, NormEstimate]:
        """Each quantile estimate the aggregator keeps per cluster, by the name of its state
        entry (`<what>_quantile`) and of its reported value (`<what>_norm`, as it `reports`)."""
        estimates = {}
        if self.zeroing:
            estimates["zeroing"] = ZEROING
        if self.clipping:
            estimates["clipping"] = CLIPPING
        return estimates

    def count_names(self) -> tuple[str, ...]:
        """The per-cluster counts of clients the round reports (metrics.csv columns)."""
        return tuple(
            name
            for name, on in (("zeroed_count", self.zeroing), ("clipped_count", self.clipping))
            if on
        )

    def encode(
        self,
        params: Mapping[str, tf.Tensor],
        weighted: tuple,
        cluster: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, Indicators, Indicators]:
        """One client's weighted update as the server receives it (sent as it is here), with
        its centred below-estimate indicators and its counts for the encoding's own
        estimates (none here)."""
        return weighted, {}, {}

    def encoded_weight(self, weight: tf.Tensor) -> tf.Tensor:
        """The client's weight as the server receives it (as it is here)."""
        return weight

    # -- the aggregator's steps ---------------------------------------------------------------
    @property
    def stats_width(self) -> int:
        """The weight, each estimate's centred below-estimate indicator, each count."""
        return 1 + len(self.estimates()) + len(self.count_names())

    def initial_state(self, num_clusters: int) -> collections.OrderedDict:
        return collections.OrderedDict(
            (f"{name}_quantile", np.full([num_clusters], estimate.initial, np.float32))
            for name, estimate in self.estimates().items()
        )

    def client_params(self, state: Mapping[str, Any]) -> collections.OrderedDict:
        return collections.OrderedDict(state)

    def preprocess(
        self,
        params: Mapping[str, tf.Tensor],
        delta: tuple,
        cluster: tf.Tensor,
        weight: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, tf.Tensor, tf.Tensor]:
        """The update zeroed, clipped, weighted and encoded; its weight 1 in the cluster's sum
        (it counts the clients; 0 for a client whose update diverged) and its own weight in the
        statistics row, before the indicators and counts (0 for a diverged client)."""
        value = tuple(delta)
        below: Indicators = {}
        counts: Indicators = {}
        if self.zeroing:
            estimate = tf.gather(params["zeroing_quantile"], cluster)
            norm = global_inf_norm(value)
            zeroed = norm > ZEROING.reported(estimate)
            value = tuple(tf.where(zeroed, tf.zeros_like(t), t) for t in value)
            below["zeroing"] = tf.cast(norm <= estimate, tf.float32) - 0.5
            counts["zeroed_count"] = tf.cast(zeroed, tf.float32)
        if self.clipping:
            clip = tf.gather(params["clipping_quantile"], cluster)
            norm = global_l2_norm(value)
            clipped = norm > clip
            value = tuple(tf.where(clipped, t / (norm / clip), t) for t in value)
            below["clipping"] = tf.cast(norm <= clip, tf.float32) - 0.5
            counts["clipped_count"] = tf.cast(clipped, tf.float32)
        weight = tf.cast(weight, tf.float32)
        weighted = tuple(t * weight for t in value)  # TFF's MeanFactory, at the client
        encoded, encoding_below, encoding_counts = self.encode(params, weighted, cluster, seed)
        below.update(encoding_below)
        counts.update(encoding_counts)
        taking_part = tf.cast(weight > 0, tf.float32)
        columns = [self.encoded_weight(weight)]
        columns += [below[name] * taking_part for name in self.estimates()]
        columns += [counts[name] * taking_part for name in self.count_names()]
        return encoded, taking_part, tf.stack(columns)

    def finalize(
        self,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        state: Mapping[str, tf.Tensor],
        inputs: Mapping[str, tf.Tensor],
    ) -> tuple[tuple, tf.Tensor, collections.OrderedDict, collections.OrderedDict]:
        """Each cluster's weighted mean (its sum over its clients' total weight) for the
        clusters some client trained in, each of their estimates moved by the fraction of
        those clients below it (the others keep theirs); the norms the round used and its
        counts as measurements."""
        clients = total_weight  # each client taking part weighs 1 in the sums' rows
        trained = clients > 0
        means = tuple(divide_rows(total, stats[:, 0]) for total in sums)
        new_state = collections.OrderedDict()
        measurements = collections.OrderedDict()
        for column, (name, estimate) in enumerate(self.estimates().items(), start=1):
            current = state[f"{name}_quantile"]
            measurements[f"{name}_{estimate.reports}"] = estimate.reported(current)
            new_state[f"{name}_quantile"], _ = geometric_quantile_step(
                current,
                stats[:, column],
                clients,
                estimate.target_quantile,
                estimate.learning_rate,
                trained,
            )
        first = 1 + len(self.estimates())
        for column, name in enumerate(self.count_names(), start=first):
            measurements[name] = stats[:, column]
        return means, trained, new_state, measurements


def global_l2_norm(value: tuple) -> tf.Tensor:
    """The L2 norm over all tensors of `value`, as TFF's `robust._global_l2_norm` computes it."""
    return tf.math.sqrt(tf.reduce_sum(tf.stack([tf.norm(t, ord=2) ** 2 for t in value])))


def global_inf_norm(value: tuple) -> tf.Tensor:
    """The largest absolute value over all tensors of `value` (TFF's `robust._global_inf_norm`)."""
    return tf.reduce_max(tf.stack([tf.norm(t, ord=np.inf) for t in value]))
