"""TFF's compressed and secure aggregators per cluster, and their settings.

The robust aggregator per cluster (`cluster_robust.ClusterRobust`) with its clients' weighted
updates encoded for the upload.

`ClusterCompression` (`tff.learning.compression_aggregator`; Suresh, Yu, Kumar and McMahan,
"Distributed Mean Estimation with Limited Communication", ICML 2017): after zeroing, clipping
and weighting, each tensor of more than `quantization_threshold` values (TFF: 20000) is
uniformly quantized to `quantization_bits` bits (TFF: 8) with stochastic rounding, as
`tff.aggregators.EncodedSumFactory.quantize_above_threshold` does with Tensorflow Model
Optimization's `UniformQuantizationEncodingStage`: with `lo, hi` the tensor's min and max,
`x = (t - lo) / (hi - lo) * (2^b - 1)` is rounded up with probability `x - floor(x)` (so
unbiased), sent bit-packed with `lo` and `hi`, and decoded as `q / (2^b - 1) * (hi - lo) + lo`.
Smaller tensors go as they are. The rounding's uniform draws are stateless, from the client's
seed folded with the tensor's index, on the CPU: both executions and a resumed run draw the
same numbers.

`ClusterSecure` (`tff.learning.secure_aggregator`; Bonawitz et al., "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", CCS 2017): after zeroing, clipping and
weighting, every value is clipped to the cluster's bound `[-B_k, B_k]` and mapped to a 32-bit
integer as TFF's `SecureSumFactory` (`aggregators.primitives.secure_quantized_sum`) does,
`n = round(v (2^32 - 1) / 2B) - round(-B (2^32 - 1) / 2B)`, deterministic rounding; the
server's decoding of the integer sum is linear, so each client's integers are decoded here
before the sum, which then differs from decoding the integer sum only by float32 rounding.
`B_k = 2 S_k`, S_k a no-noise estimate of the 0.95 quantile of the clients' largest absolute
weighted value (start 50, learning rate 1, TFF's defaults), per cluster. The weights are
encoded the same way within `[0, 2^20 - 1]`. What is NOT simulated: the cryptographic protocol
itself (masking, key agreement, dropouts). TFF's own simulation runs the secure-sum intrinsic
as a plain sum and TFF 0.87's C++ worker has no secure intrinsic at all, so what this runs is
the arithmetic (bounded values, integers of a fixed bitwidth) and its effect on accuracy. The
quantile estimates' below-estimate counts, which TFF also sums securely (32-bit, within
[-1, 1]), are summed plainly here (a difference below 1e-9 in each fraction).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import tensorflow as tf

from tff_clustered.federated.cluster_robust import (
    ClusterRobust,
    Indicators,
    NormEstimate,
    RobustOptions,
)
from tff_clustered.options import option

# The fold of a client's seed that draws its quantization's rounding (plus the tensor index).
QUANTIZATION_FOLD = 1 << 21
# TFF's Bitpacking stage packs the quantized values into int32 words of 28 used bits each.
PACKED_WORD_BITS = 28
# TFF's `secure_quantized_sum`: values are sent as integers in [0, 2^32 - 1].
SECURE_BITWIDTH = 32
SECURE_MAX = 2**SECURE_BITWIDTH - 1
# TFF's `secure_aggregator`: the weights' bounds, and the bound's quantile estimate.
SECURE_WEIGHT_BOUND = float(2**20 - 1)
SECURE_BOUND = NormEstimate(50.0, 0.95, 1.0, multiplier=2.0, reports="bound")


@dataclasses.dataclass(frozen=True)
class CompressionOptions(RobustOptions):
    """`ClusterCompression`'s settings as users give them: the robust ones and the
    quantization's (`--quantization_bits`, `--quantization_threshold`)."""

    quantization_bits: int = option(8, "bits per value of a quantized tensor (1 to 16; TFF: 8).")
    quantization_threshold: int = option(
        20000,
        "tensors of more than this many values are quantized, the others sent as float32 "
        "(TFF: 20000).",
    )


@dataclasses.dataclass(frozen=True)
class ClusterCompression(ClusterRobust):
    """Robust, then the weighted tensors of more than `quantization_threshold` values quantized
    to `quantization_bits` bits with stochastic rounding (see the module docstring)."""

    quantization_bits: int = 8
    quantization_threshold: int = 20000

    name: ClassVar[str] = "compression"
    summary: ClassVar[str] = (
        "robust, then tensors of more than --quantization_threshold values quantized to "
        "--quantization_bits bits"
    )
    Options: ClassVar[type] = CompressionOptions

    @classmethod
    def from_options(cls, options: CompressionOptions) -> ClusterCompression:
        return cls(
            zeroing=options.robust_zeroing,
            clipping=options.robust_clipping,
            quantization_bits=options.quantization_bits,
            quantization_threshold=options.quantization_threshold,
        )

    def options(self) -> CompressionOptions:
        return CompressionOptions(
            robust_zeroing=self.zeroing,
            robust_clipping=self.clipping,
            quantization_bits=self.quantization_bits,
            quantization_threshold=self.quantization_threshold,
        )

    def __post_init__(self) -> None:
        super().__post_init__()  # the types first
        if not 1 <= self.quantization_bits <= 16:
            raise ValueError(
                f"quantization_bits must be in [1, 16] (TFF's uniform quantization), got "
                f"{self.quantization_bits}"
            )
        if self.quantization_threshold < 0:
            raise ValueError(
                f"quantization_threshold must be >= 0 (0: quantize every tensor), got "
                f"{self.quantization_threshold}"
            )

    def quantizes(self, size: int) -> bool:
        """Whether a tensor of `size` values is quantized (TFF: more than the threshold)."""
        return size > self.quantization_threshold

    def encode(
        self,
        params: Mapping[str, tf.Tensor],
        weighted: tuple,
        cluster: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, Indicators, Indicators]:
        encoded = []
        with tf.device("/CPU:0"):  # the same stateless draws on every device
            for i, t in enumerate(weighted):
                if self.quantizes(t.shape.num_elements()):
                    draw_seed = tf.random.experimental.stateless_fold_in(
                        tf.cast(seed, tf.int64), QUANTIZATION_FOLD + i
                    )
                    t = stochastic_quantized(t, self.quantization_bits, draw_seed)
                encoded.append(t)
        return tuple(encoded), {}, {}

    def upload_bits(self, tensor_sizes: Sequence[int]) -> int:
        """A quantized tensor: its values bit-packed into 32-bit words of 28 used bits, and its
        min and max (two float32); any other: 32 bits a value."""
        return sum(
            32 * math.ceil(n * self.quantization_bits / PACKED_WORD_BITS) + 64
            if self.quantizes(n)
            else 32 * n
            for n in map(int, tensor_sizes)
        )


@dataclasses.dataclass(frozen=True)
class ClusterSecure(ClusterRobust):
    """Robust, then the weighted values clipped to each cluster's adaptive bound and summed as
    32-bit integers, as TFF's secure sum computes it (see the module docstring: the
    cryptographic protocol is not run)."""

    name: ClassVar[str] = "secure"
    summary: ClassVar[str] = (
        "robust, then the sum of values clipped to an adaptive bound as 32-bit integers, TFF's "
        "secure sum's arithmetic; the cryptographic protocol is not run"
    )

    def estimates(self) -> dict[str, NormEstimate]:
        return {**super().estimates(), "secure": SECURE_BOUND}

    def count_names(self) -> tuple[str, ...]:
        return (*super().count_names(), "secure_clipped_count")

    def encode(
        self,
        params: Mapping[str, tf.Tensor],
        weighted: tuple,
        cluster: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, Indicators, Indicators]:
        estimate = tf.gather(params["secure_quantile"], cluster)
        bound = SECURE_BOUND.reported(estimate)
        largest = tf.reduce_max(tf.stack([tf.reduce_max(t) for t in weighted]))
        smallest = tf.reduce_min(tf.stack([tf.reduce_min(t) for t in weighted]))
        beyond = tf.logical_or(largest > bound, smallest < -bound)
        encoded = tuple(secure_round_trip(t, -bound, bound) for t in weighted)
        below = tf.cast(tf.maximum(tf.abs(smallest), tf.abs(largest)) <= estimate, tf.float32)
        return (
            encoded,
            {"secure": below - 0.5},
            {"secure_clipped_count": tf.cast(beyond, tf.float32)},
        )

    def encoded_weight(self, weight: tf.Tensor) -> tf.Tensor:
        return secure_round_trip(weight, tf.constant(0.0), tf.constant(SECURE_WEIGHT_BOUND))

    def upload_bits(self, tensor_sizes: Sequence[int]) -> int:
        """Every value as one integer of the secure sum's bitwidth (32)."""
        return SECURE_BITWIDTH * sum(int(n) for n in tensor_sizes)


def stochastic_quantized(value: tf.Tensor, bits: int, seed: tf.Tensor) -> tf.Tensor:
    """`value` as Tensorflow Model Optimization's `UniformQuantizationEncodingStage(bits,
    stochastic=True)` encodes and decodes it: its `2^bits` levels evenly spaced from its min to
    its max, each value rounded to one of the two nearest at random, unbiased; the uniform
    draws stateless from `seed` (int64[2])."""
    low, high = tf.reduce_min(value), tf.reduce_max(value)
    levels = tf.constant(2**bits - 1, value.dtype)
    scaled = tf.math.divide_no_nan(value - low, high - low) * levels
    floored = tf.floor(scaled)
    draws = tf.random.stateless_uniform(tf.shape(value), seed=seed, dtype=value.dtype)
    quantized = floored + tf.cast(draws < scaled - floored, value.dtype)
    return quantized / levels * (high - low) + low


def secure_integers(value: tf.Tensor, lower: tf.Tensor, upper: tf.Tensor) -> tf.Tensor:
    """`value` clipped to `[lower, upper]` and mapped to int64 in `[0, 2^32 - 1]` (TFF's
    `primitives._client_tensor_shift_for_secure_sum` for floats, step for step)."""
    clipped = tf.clip_by_value(value, lower, upper)
    scale = tf.math.divide_no_nan(
        tf.constant(SECURE_MAX, tf.float64), tf.cast(upper - lower, tf.float64)
    )
    rounded = tf.saturate_cast(tf.round(tf.cast(clipped, tf.float64) * scale), tf.int64)
    shifted = rounded - tf.saturate_cast(tf.round(tf.cast(lower, tf.float64) * scale), tf.int64)
    return tf.clip_by_value(shifted, tf.constant(0, tf.int64), tf.constant(SECURE_MAX, tf.int64))


def secure_decoded(
    total: tf.Tensor, lower: tf.Tensor, upper: tf.Tensor, num_summands: tf.Tensor
) -> tf.Tensor:
    """The float32 sum that `num_summands` clients' summed integers `total` stand for (TFF's
    `primitives._server_tensor_shift_for_secure_sum` for floats, step for step; here
    `lower < upper` always: the bounds are `-B, B` with B > 0, or the weights' fixed ones)."""
    scale = tf.math.divide_no_nan(
        tf.constant(SECURE_MAX, tf.float64), tf.cast(upper - lower, tf.float64)
    )
    offset = tf.saturate_cast(tf.round(tf.cast(lower, tf.float64) * scale), tf.int64)
    shifted = total + offset * tf.cast(num_summands, tf.int64)
    decoded = tf.cast(shifted, tf.float64) * (tf.cast(upper - lower, tf.float64) / SECURE_MAX)
    return tf.cast(decoded, tf.float32)


def secure_round_trip(value: tf.Tensor, lower: tf.Tensor, upper: tf.Tensor) -> tf.Tensor:
    """One client's `value` as the server decodes its secure-sum integers."""
    return secure_decoded(secure_integers(value, lower, upper), lower, upper, 1)
