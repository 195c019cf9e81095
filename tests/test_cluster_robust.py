"""TFF's robust, compressed and secure aggregators per cluster (`federated/cluster_robust.py`,
`federated/cluster_encodings.py`): each cluster is TFF's `robust_aggregator` on its own
clients; the quantizer's levels, unbiasedness and threshold; the secure sum's integers against
TFF's own encoding; the bits a client uploads; the settings and algorithms they are refused
with."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.aggregators import primitives
from test_cluster_dp import SHAPES, random_update, run_aggregator

from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.algorithms.fedavg import FedAvg
from tff_clustered.federated.cluster_aggregators import ClusterMean
from tff_clustered.federated.cluster_dp import ClusterDP
from tff_clustered.federated.cluster_encodings import (
    SECURE_MAX,
    ClusterCompression,
    ClusterSecure,
    secure_integers,
    secure_round_trip,
    stochastic_quantized,
)
from tff_clustered.federated.cluster_robust import ClusterRobust
from tff_clustered.loop.aggregation import check_aggregator
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.runs.api import with_aggregator


def tff_estimates(state: object, zeroing: bool, clipping: bool) -> dict[str, float]:
    """The quantile estimates in the state of TFF's `robust_aggregator`."""
    estimates = {}
    if zeroing:
        estimates["zeroing_quantile"] = float(state["zeroing_norm"][0].current_estimate)
        state = state["inner_agg"]
    if clipping:
        estimates["clipping_quantile"] = float(state["clipping_norm"][0].current_estimate)
    return estimates


def tff_counts(measurements: object, zeroing: bool, clipping: bool) -> dict[str, float]:
    """The zeroed / clipped counts and norms TFF's `robust_aggregator` reports."""
    counts = {}
    if zeroing:
        counts["zeroed_count"] = measurements["zeroed_count"]
        counts["zeroing_norm"] = measurements["zeroing_norm"]
        measurements = measurements["zeroing"]
    if clipping:
        counts["clipped_count"] = measurements["clipped_count"]
        counts["clipping_norm"] = measurements["clipping_norm"]
    return {k: float(v) for k, v in counts.items()}


@pytest.mark.usefixtures("tff_context")
@pytest.mark.parametrize("zeroing,clipping", [(True, True), (False, True), (True, False)])
def test_each_cluster_is_tffs_robust_aggregator_on_its_own_clients(
    zeroing: bool, clipping: bool
) -> None:
    """Three clusters of update norms about 0.5, 3 and 8, example weights 1-30, three rounds;
    cluster 2 has no client in round 1 and a corrupted client (one value 1e4) in round 2:
    each cluster's weighted mean, estimates and counts are those of TFF's `robust_aggregator`
    run on that cluster's clients alone; the empty cluster keeps its estimates and does not
    step; the corrupted update is zeroed and the clips move toward their clusters' norms."""
    rng = np.random.default_rng(3)
    aggregator = ClusterRobust(zeroing=zeroing, clipping=clipping)
    factory = tff.learning.robust_aggregator(zeroing=zeroing, clipping=clipping, weighted=True)
    value_type = tff.types.tensorflow_to_type(tuple(tf.TensorSpec(s, tf.float32) for s in SHAPES))
    process = factory.create(value_type, tff.TensorType(np.float32))
    tff_states = [process.initialize() for _ in range(3)]
    state = aggregator.initial_state(3)
    norms = [0.5, 3.0, 8.0]
    for round_num in range(3):
        clusters = [k for k in range(3) for _ in range(4) if not (k == 2 and round_num == 0)]
        updates = [random_update(rng, norms[k] * rng.uniform(0.7, 1.3)) for k in clusters]
        if round_num == 1:
            updates[-1][0][0] = 1e4  # a corrupted client of cluster 2
        weights = rng.integers(1, 31, len(clusters)).astype(np.float32).tolist()
        before = dict(state)
        means, updated, state, measured = run_aggregator(
            aggregator, updates, clusters, state, np.zeros(3), weights=weights
        )
        assert updated.tolist() == [True, True, round_num > 0]
        for k in range(3):
            members = [i for i, c in enumerate(clusters) if c == k]
            if not members:
                assert all(state[key][k] == before[key][k] for key in state)
                continue
            output = process.next(
                tff_states[k], [updates[i] for i in members], [weights[i] for i in members]
            )
            tff_states[k] = output.state
            for ours, theirs in zip(means, output.result):
                np.testing.assert_allclose(ours[k], np.asarray(theirs), rtol=0, atol=1e-6)
            for key, value in tff_estimates(output.state, zeroing, clipping).items():
                assert state[key][k] == pytest.approx(value, rel=1e-6), (key, k)
            for key, value in tff_counts(output.measurements, zeroing, clipping).items():
                assert measured[key][k] == pytest.approx(value, rel=1e-6), (key, k)
        if zeroing and round_num == 1:
            assert measured["zeroed_count"][2] == 1  # the corrupted update
    if clipping:
        assert state["clipping_quantile"][0] < 1.0 < state["clipping_quantile"][1]


def test_the_quantizer_has_at_most_2_to_the_bits_levels_between_min_and_max() -> None:
    """3 bits: every decoded value lies on one of the 8 evenly spaced levels from the tensor's
    min to its max, each value on one of the two levels around it; the min and max are kept."""
    rng = np.random.default_rng(4)
    value = tf.constant(rng.normal(size=500).astype(np.float32))
    low, high = float(tf.reduce_min(value)), float(tf.reduce_max(value))
    quantized = stochastic_quantized(value, 3, tf.constant([5, 0], tf.int64)).numpy()
    step = (high - low) / 7
    positions = (quantized - low) / step
    assert np.abs(positions - np.round(positions)).max() < 1e-4
    assert len(np.unique(np.round(positions))) <= 8
    assert np.abs(quantized - value.numpy()).max() <= step * (1 + 1e-5)
    assert quantized.min() == pytest.approx(low, abs=1e-6)
    assert quantized.max() == pytest.approx(high, abs=1e-6)


def test_the_quantizer_is_unbiased() -> None:
    """2 bits, 4000 seeds: each value's mean over the seeds is the value within 5 standard
    errors of the rounding (its variance is at most step^2 / 4), and the seeds draw different
    roundings; one seed always draws the same."""
    rng = np.random.default_rng(5)
    value = tf.constant(rng.uniform(-1, 1, size=40).astype(np.float32))
    step = float(tf.reduce_max(value) - tf.reduce_min(value)) / 3
    seeds = 4000

    @tf.function
    def mean_of_draws() -> tf.Tensor:
        draws = tf.map_fn(
            lambda s: stochastic_quantized(value, 2, tf.stack([s, tf.constant(0, tf.int64)])),
            tf.range(seeds, dtype=tf.int64),
            fn_output_signature=tf.float32,
        )
        return tf.reduce_mean(draws, axis=0)

    error = np.abs(mean_of_draws().numpy() - value.numpy())
    assert error.max() < 5 * (step / 2) / math.sqrt(seeds), error.max()
    first, second = (stochastic_quantized(value, 2, tf.constant([s, 0], tf.int64)) for s in (1, 2))
    assert not np.array_equal(first, second)
    again = stochastic_quantized(value, 2, tf.constant([1, 0], tf.int64))
    np.testing.assert_array_equal(first, again)


def test_compression_quantizes_only_the_tensors_above_the_threshold() -> None:
    """Threshold 5 with tensors of 4 and 6 values: the 4-value tensor is the robust
    aggregator's weighted value bit for bit, the 6-value one is quantized (at 1 bit: two
    levels, the same again from the same client seed); at threshold 6 both pass unchanged
    through the whole aggregation."""
    rng = np.random.default_rng(6)
    updates = [random_update(rng, 0.5) for _ in range(3)]
    robust = run_aggregator(
        ClusterRobust(),
        updates,
        [0, 0, 0],
        ClusterRobust().initial_state(1),
        np.zeros(1),
        weights=[2.0, 3.0, 4.0],
    )
    for threshold, quantized in ((5, True), (6, False)):
        aggregator = ClusterCompression(quantization_bits=1, quantization_threshold=threshold)
        params = aggregator.client_params(aggregator.initial_state(1))
        plain = ClusterRobust().preprocess(
            params, updates[0], tf.constant(0), tf.constant(2.0), tf.constant([0, 0])
        )[0]
        sent = aggregator.preprocess(
            params, updates[0], tf.constant(0), tf.constant(2.0), tf.constant([0, 0])
        )[0]
        np.testing.assert_array_equal(sent[0], plain[0])
        assert np.array_equal(sent[1], plain[1]) != quantized
        if quantized:
            assert len(np.unique(sent[1])) <= 2
            again = aggregator.preprocess(
                params, updates[0], tf.constant(0), tf.constant(2.0), tf.constant([0, 0])
            )[0]
            np.testing.assert_array_equal(sent[1], again[1])
        else:
            compressed = run_aggregator(
                aggregator,
                updates,
                [0, 0, 0],
                aggregator.initial_state(1),
                np.zeros(1),
                weights=[2.0, 3.0, 4.0],
            )
            for ours, theirs in zip(compressed[0], robust[0]):
                np.testing.assert_array_equal(ours, theirs)


def test_the_secure_sum_is_tffs_integer_sum_within_its_quantization_error() -> None:
    """20 clients' values within a bound B = 3, and two beyond it: each client's integers are
    those of TFF's own client encoding; the sum of what the clients send (each decoded here)
    is TFF's decoding of the integer sum within float32 rounding, and the plain sum of the
    values clipped to [-B, B] within 20 half steps of 2B / (2^32 - 1) plus float32 rounding;
    the values beyond B are clipped to it."""
    rng = np.random.default_rng(7)
    bound = tf.constant(3.0)
    values = rng.uniform(-3, 3, size=(20, 50)).astype(np.float32)
    values[3, 7], values[11, 0] = 40.0, -7.5
    integers = [secure_integers(tf.constant(v), -bound, bound) for v in values]
    for v, ours in zip(values, integers):
        theirs = primitives._client_tensor_shift_for_secure_sum(tf.constant(v), -bound, bound)
        np.testing.assert_array_equal(ours, theirs)
    integer_sum = tf.add_n(integers)
    decoded = primitives._server_tensor_shift_for_secure_sum(
        tf.constant(20), integer_sum, -bound, bound, tf.float32
    ).numpy()
    sent = np.stack([secure_round_trip(tf.constant(v), -bound, bound).numpy() for v in values])
    float_rounding = 20 * 3.0 * np.finfo(np.float32).eps
    np.testing.assert_allclose(sent.sum(axis=0), decoded, rtol=0, atol=float_rounding)
    clipped = np.clip(values.astype(np.float64), -3.0, 3.0)
    half_step = 6.0 / SECURE_MAX / 2
    np.testing.assert_allclose(
        decoded, clipped.sum(axis=0), rtol=0, atol=20 * half_step + float_rounding
    )
    assert sent[3, 7] == pytest.approx(3.0, abs=1e-6) and sent[11, 0] == pytest.approx(
        -3.0, abs=1e-6
    )


def test_secure_clips_to_each_clusters_adaptive_bound() -> None:
    """Two clusters, weighted values about 1 and about 400 (beyond the first bound 2 x 50):
    cluster 1's clients are clipped to the bound and counted, its mean is bounded by it, and
    its bound's estimate rises toward its values (none below: by exp(0.95)); cluster 0's
    are within it and its mean is the robust aggregator's within the secure sum's error."""
    rng = np.random.default_rng(8)
    aggregator = ClusterSecure(zeroing=False, clipping=False)
    updates = [random_update(rng, 1.0) for _ in range(3)] + [
        tuple(np.full(s, 400.0, np.float32) for s in SHAPES) for _ in range(2)
    ]
    clusters, weights = [0, 0, 0, 1, 1], [1.0, 2.0, 3.0, 1.0, 1.0]
    state = aggregator.initial_state(2)
    means, _, new_state, measured = run_aggregator(
        aggregator, updates, clusters, state, np.zeros(2), weights=weights
    )
    assert measured["secure_bound"].tolist() == [100.0, 100.0]
    assert measured["secure_clipped_count"].tolist() == [0.0, 2.0]
    assert all(np.all(m[1] == pytest.approx(100.0, rel=1e-6)) for m in means)
    assert new_state["secure_quantile"][1] == pytest.approx(50.0 * math.exp(0.95), rel=1e-6)
    plain = run_aggregator(
        ClusterRobust(zeroing=False, clipping=False),
        updates,
        clusters,
        {},
        np.zeros(2),
        weights=weights,
    )[0]
    for ours, theirs in zip(means, plain):
        np.testing.assert_allclose(ours[0], theirs[0], rtol=0, atol=1e-6)


def test_the_bits_one_client_uploads() -> None:
    """float32 for the mean, dp, robust and secure (32-bit integers); compression: a tensor
    above the threshold as bits-per-value packed into 28-bit words of 32 bits, plus its min and
    max; the round's bits count downloads at 32 a value (IFCA downloads every cluster)."""
    sizes = [50000, 20000, 10]
    floats = 32 * sum(sizes)
    for aggregator in (ClusterMean(), ClusterDP(1.0), ClusterRobust(), ClusterSecure()):
        assert aggregator.upload_bits(sizes) == floats
    compression = ClusterCompression()
    assert compression.upload_bits(sizes) == 32 * math.ceil(50000 * 8 / 28) + 64 + 32 * 20010
    assert ClusterCompression(quantization_threshold=0).upload_bits(sizes) == sum(
        32 * math.ceil(n * 8 / 28) + 64 for n in sizes
    )
    assert 3.4 < floats / ClusterCompression(quantization_threshold=0).upload_bits(sizes) < 3.5
    fedavg, ifca = FedAvg(), ALGORITHMS["ifca"]()
    assert fedavg.values_sent_per_round(5, 100, 1) == 5 * 200
    assert fedavg.values_sent_per_round(5, 100, 1, value_bits=32, upload_bits=800) == 5 * (
        3200 + 800
    )
    assert ifca.values_sent_per_round(5, 100, 3, value_bits=32, upload_bits=800) == 5 * (
        3 * 3200 + 800
    )


def test_settings_of_another_aggregator_are_refused_and_built_ones_map_back() -> None:
    """One-line errors naming the flag and the aggregator that uses it; each built aggregator
    maps back to its settings (the Python API's instances and names); every algorithm whose
    models come from the aggregate takes them; decentralized ones, and those that read
    individual updates beside the aggregate, refuse them."""
    with pytest.raises(
        ValueError,
        match="--quantization_bits set with --aggregator=robust.*add --aggregator=compression",
    ):
        AggregatorConfig("robust", quantization_bits=4)
    with pytest.raises(
        ValueError, match="--robust_zeroing set with --aggregator=mean.*--aggregator=robust or"
    ):
        AggregatorConfig(robust_zeroing=False)
    with pytest.raises(ValueError, match="--dp_noise_multiplier set with --aggregator=secure"):
        AggregatorConfig("secure", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="quantization_bits must be in \\[1, 16\\]"):
        AggregatorConfig("compression", quantization_bits=17)
    built = [
        ClusterRobust(zeroing=False),
        ClusterCompression(clipping=False, quantization_bits=4, quantization_threshold=100),
        ClusterSecure(),
    ]
    for aggregator in built:
        config = AggregatorConfig.of(aggregator)
        assert config.name == aggregator.name and config.build() == aggregator
        assert with_aggregator(TrainingConfig(), aggregator).aggregator == config
    assert with_aggregator(TrainingConfig(), "secure").aggregator.build() == ClusterSecure()
    for cls in ALGORITHMS.values():
        for aggregator in built:
            if cls.distribution.decentralized:
                with pytest.raises(ValueError, match="is decentralized"):
                    check_aggregator(cls, aggregator)
            elif (
                not cls.models_from_aggregate
            ):  # individual updates sent whole beside the aggregate
                with pytest.raises(ValueError, match="neither bound, shrink nor hide"):
                    check_aggregator(cls, aggregator)
            else:
                check_aggregator(cls, aggregator)
