"""The command line's aggregator flags (`--aggregator` and the settings of each aggregator),
and the `AggregatorConfig` they describe."""

from __future__ import annotations

from absl import flags

from tff_clustered.loop.config import AGGREGATORS, DP_CLIPPINGS, AggregatorConfig

FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "aggregator",
    "mean",
    list(AGGREGATORS),
    "What each cluster does with its clients' updates: mean (their weighted mean), dp "
    "(DP-FedAvg per cluster: each update clipped to --dp_clip, Gaussian noise of "
    "--dp_noise_multiplier times the clip on every cluster's sum, divided by the cluster's "
    "expected number of clients; clients weigh uniformly), robust (TFF's robust_aggregator per "
    "cluster: adaptive zeroing and clipping, then the weighted mean), compression (robust, "
    "then tensors of more than --quantization_threshold values quantized to "
    "--quantization_bits bits) or secure (robust, then the sum of values clipped to an "
    "adaptive bound as 32-bit integers, TFF's secure sum's arithmetic; the cryptographic "
    "protocol is not run). Not for decentralized algorithms, nor dp for those that read "
    "individual clients' updates (cfl, fesem, fedac, cgpfl, flhc, fedtsdp).",
)
flags.DEFINE_bool(
    "robust_zeroing",
    True,
    "--aggregator=robust/compression/secure: zero a client's whole update when its largest "
    "absolute value exceeds the cluster's adaptive zeroing norm (TFF's defaults).",
)
flags.DEFINE_bool(
    "robust_clipping",
    True,
    "--aggregator=robust/compression/secure: clip each update to the cluster's adaptive L2 "
    "norm (an estimate of its clients' 0.8 quantile; TFF's defaults).",
)
flags.DEFINE_integer(
    "quantization_bits",
    8,
    "--aggregator=compression: bits per value of a quantized tensor (1 to 16; TFF: 8).",
)
flags.DEFINE_integer(
    "quantization_threshold",
    20000,
    "--aggregator=compression: tensors of more than this many values are quantized, the "
    "others sent as float32 (TFF: 20000).",
)
flags.DEFINE_float(
    "dp_noise_multiplier",
    None,
    "--aggregator=dp: the noise's standard deviation over the clip norm (0: clipping only).",
    lower_bound=0.0,
)
flags.DEFINE_float(
    "dp_clip", 1.0, "--aggregator=dp: the clip norm (the start of each cluster's, adaptive)."
)
flags.DEFINE_enum(
    "dp_clipping",
    "fixed",
    list(DP_CLIPPINGS),
    "--aggregator=dp: a fixed clip norm, or adaptive: each cluster's moved toward the "
    "--dp_target_quantile of its clients' update norms (Andrew et al. 2021).",
)
flags.DEFINE_float(
    "dp_target_quantile", 0.5, "--dp_clipping=adaptive: the quantile of update norms aimed at."
)
flags.DEFINE_float(
    "dp_clip_learning_rate", 0.2, "--dp_clipping=adaptive: the clip's geometric learning rate."
)
flags.DEFINE_float(
    "dp_count_stddev",
    None,
    "--dp_clipping=adaptive: the noise on each cluster's below-clip count (unset: the noise "
    "multiplier; it must exceed half of it).",
    lower_bound=0.0,
)
flags.DEFINE_float(
    "dp_delta",
    1e-5,
    "--aggregator=dp: the delta every epsilon is stated at (epsilon columns of metrics.csv, "
    "summary.json's privacy).",
)
flags.DEFINE_float(
    "target_epsilon",
    0.0,
    "--aggregator=dp: stop before a round that would take a client's epsilon past this (0: "
    "never); without --dp_noise_multiplier, the noise multiplier whose --rounds rounds reach it.",
    lower_bound=0.0,
)


def aggregator_config_from_flags() -> AggregatorConfig:
    """The aggregator settings the flags give (checked: a setting of another aggregator is
    refused)."""
    return AggregatorConfig(
        FLAGS.aggregator,
        noise_multiplier=FLAGS.dp_noise_multiplier,
        clip=FLAGS.dp_clip,
        clipping=FLAGS.dp_clipping,
        target_quantile=FLAGS.dp_target_quantile,
        clip_learning_rate=FLAGS.dp_clip_learning_rate,
        count_stddev=FLAGS.dp_count_stddev,
        delta=FLAGS.dp_delta,
        target_epsilon=FLAGS.target_epsilon,
        robust_zeroing=FLAGS.robust_zeroing,
        robust_clipping=FLAGS.robust_clipping,
        quantization_bits=FLAGS.quantization_bits,
        quantization_threshold=FLAGS.quantization_threshold,
    )
