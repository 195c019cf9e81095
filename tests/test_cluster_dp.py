"""DP-FedAvg per cluster (`federated/cluster_dp.py`): its noise as calibrated, every client's
contribution bounded by its cluster's clip, TFF's own `DifferentiallyPrivateFactory` on each
cluster's clients when the noise is off (the aggregator alone, and a whole round), the event an
accountant composes, the expected counts, the mean left as it was, and what is refused."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from scipy import stats
from tensorflow_federated.python.aggregators.differential_privacy import (
    adaptive_clip_noise_params,
)

import tff_clustered
from tff_clustered.algorithms import ALGORITHMS, make_algorithm
from tff_clustered.federated import client_work
from tff_clustered.federated.cluster_aggregators import ClusterAggregator, ClusterMean
from tff_clustered.federated.cluster_dp import ClusterDP
from tff_clustered.federated.clustered_mean import add_to_cluster
from tff_clustered.federated.distributions import Neighbours
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import client_seed, round_clients, round_hparams
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.loop.aggregation import check_aggregator, expected_counts
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model
from tff_clustered.runs import checkpoint
from tff_clustered.runs.api import with_aggregator
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.weights import unflatten

SHAPES = ((4,), (2, 3))  # an update of two tensors: the clip is their global norm
ROUND_SEED = np.array([7, 0], np.int64)


def run_aggregator(
    aggregator: ClusterAggregator,
    updates: list,
    clusters: list,
    state: dict,
    denominator: np.ndarray,
    seed: np.ndarray = ROUND_SEED,
    weights: Optional[list] = None,
) -> tuple:
    """One round of `aggregator` as the rounds run it: each client's update preprocessed with
    its cluster's parameters, its weight (`weights`, 1 each by default) and its seed
    `[i, 0]`, and added into its cluster's row (`add_to_cluster`, in client order), its
    statistics into its row, then `finalize` -> (means, updated, state, measurements) as NumPy
    values."""
    k = len(denominator)
    params = aggregator.client_params(state)
    sums = tuple(tf.zeros([k, *s]) for s in SHAPES)
    total_weight = tf.zeros([k])
    statistics = tf.zeros([k, aggregator.stats_width])
    weights = [1.0] * len(updates) if weights is None else weights
    for i, (update, cluster) in enumerate(zip(updates, clusters)):
        delta, weight, row = aggregator.preprocess(
            params,
            tuple(tf.constant(t) for t in update),
            tf.constant(cluster),
            tf.constant(weights[i], tf.float32),
            tf.constant([i, 0], tf.int32),
        )
        one_hot = tf.one_hot(cluster, k)
        sums = add_to_cluster(sums, delta, one_hot * weight)
        total_weight += one_hot * weight
        statistics += one_hot[:, None] * row[None, :]
    inputs = aggregator.round_inputs(seed, denominator)
    finalized = aggregator.finalize(sums, total_weight, statistics, state, inputs)
    return tf.nest.map_structure(np.asarray, finalized)


def random_update(rng: np.random.Generator, norm: float) -> tuple:
    """Two tensors of global L2 norm `norm`."""
    parts = [rng.normal(size=s) for s in SHAPES]
    scale = norm / np.sqrt(sum((p**2).sum() for p in parts))
    return tuple((p * scale).astype(np.float32) for p in parts)


def global_norm(update: tuple) -> float:
    return float(np.sqrt(sum((np.asarray(t, np.float64) ** 2).sum() for t in update)))


def test_noise_of_a_cluster_sum_matches_its_calibration() -> None:
    """Zero updates, 400 seeded rounds: each in-use row's noise on its mean has standard
    deviation z_v C_k / E_k (the sum of squares over its 400 x 10 values lies within the
    chi-square distribution's central 99.9%), mean 0, rows and tensors uncorrelated (|r| below
    4 standard errors); a cluster not in use (E_k = 0) gets none. With adaptive clipping the
    below-clip fraction's noise has standard deviation sigma_b / E_k, and z_v is TFF's split."""
    clips = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    denominator = np.array([3.0, 0.0, 5.0, 4.0], np.float32)
    aggregator = ClusterDP(0.2, adaptive=True, count_stddev=0.25)
    expected_z, _ = adaptive_clip_noise_params(0.2, 5.0, 0.25)
    assert aggregator.value_noise_multiplier == pytest.approx(expected_z, rel=1e-12)
    state = {"clip": clips}
    zeros = tuple(tf.zeros([4, *s]) for s in SHAPES)

    @tf.function
    def noised(seed: tf.Tensor) -> tuple:
        inputs = {"seed": seed, "denominator": tf.constant(denominator)}
        means, _, _, measured = aggregator.finalize(
            zeros, tf.zeros([4]), tf.zeros([4, 1]), state, inputs
        )
        rows = tf.concat([tf.reshape(m, [4, -1]) for m in means], axis=1)
        return rows, measured["dp_unclipped_fraction"]

    draws = [noised(tf.constant([11, r], tf.int64)) for r in range(400)]
    values = np.stack([d[0].numpy() for d in draws]).astype(np.float64)  # (rounds, K, 10)
    fractions = np.stack([d[1].numpy() for d in draws]).astype(np.float64)  # (rounds, K)
    assert not values[:, 1].any() and not fractions[:, 1].any()  # not in use: nothing
    n = values.shape[0] * values.shape[2]
    low, high = stats.chi2.ppf([0.0005, 0.9995], n)
    for k in (0, 2, 3):
        sigma = expected_z * clips[k] / denominator[k]
        assert low < (values[:, k] ** 2).sum() / sigma**2 < high, k
        assert abs(values[:, k].mean()) < 4 * sigma / np.sqrt(n), k
        count_noise = (fractions[:, k] - 0.5) * denominator[k] / 0.25  # N(0, 1) each
        assert 0.0 < fractions[:, k].min() and fractions[:, k].max() < 1.0  # never clamped
        low_c, high_c = stats.chi2.ppf([0.0005, 0.9995], len(count_noise))
        assert low_c < (count_noise**2).sum() < high_c, k
    in_use = values[:, [0, 2, 3]]
    for a in range(3):
        for b in range(a + 1, 3):
            r = np.corrcoef(in_use[:, a].ravel(), in_use[:, b].ravel())[0, 1]
            assert abs(r) < 4 / np.sqrt(n), (a, b, r)
    r = np.corrcoef(values[:, 0, :4].ravel(), values[:, 0, 4:8].ravel())[0, 1]
    assert abs(r) < 4 / np.sqrt(values.shape[0] * 4)  # the two tensors of one row


def test_clipping_bounds_every_clients_contribution() -> None:
    """z = 0: a client's contribution is its update clipped to its cluster's norm (unchanged
    when within it), so adding or removing one client moves the stack of sums by at most its
    cluster's clip, and replacing it by another in any row (IFCA's client picking another
    cluster) by at most the two clips."""
    rng = np.random.default_rng(0)
    clips = np.array([0.1, 1.0, 10.0], np.float32)
    aggregator = ClusterDP(0.0)
    params = aggregator.client_params({"clip": clips})
    clusters = rng.integers(0, 3, 40).tolist()
    updates = [random_update(rng, n) for n in 10.0 ** rng.uniform(-3, 4, 40)]

    def contribution(update: tuple, cluster: int) -> tuple:
        delta, _, _ = aggregator.preprocess(
            params, tuple(map(tf.constant, update)), tf.constant(cluster), 1.0, [0, 0]
        )
        return tuple(np.asarray(t) for t in delta)

    def stack(members: list) -> np.ndarray:
        total = np.zeros([3, 10])
        for update, cluster in members:
            total[cluster] += np.concatenate([t.ravel() for t in contribution(update, cluster)])
        return total

    for update, cluster in zip(updates, clusters):
        clipped = contribution(update, cluster)
        assert global_norm(clipped) <= clips[cluster] * (1 + 1e-6)
        if global_norm(update) <= clips[cluster]:
            assert all(np.array_equal(a, b) for a, b in zip(clipped, update))
    members = list(zip(updates, clusters))
    full = stack(members)
    for i, (_, cluster) in enumerate(members):
        removed = stack(members[:i] + members[i + 1 :])
        assert np.linalg.norm(full - removed) <= clips[cluster] * (1 + 1e-5)
        other = (cluster + 1) % 3
        replaced = stack(members[:i] + [(random_update(rng, 1e3), other)] + members[i + 1 :])
        assert np.linalg.norm(full - replaced) <= (clips[cluster] + clips[other]) * (1 + 1e-5)


def tff_dp_process(
    adaptive: bool, expected: float, clip: float
) -> tff.templates.AggregationProcess:
    """TFF's DP factory without noise, normalised by `expected` clients, on our update type."""
    factory = tff.aggregators.DifferentiallyPrivateFactory
    if adaptive:
        made = factory.gaussian_adaptive(
            noise_multiplier=0.0,
            clients_per_round=expected,
            initial_l2_norm_clip=clip,
            target_unclipped_quantile=0.5,
            learning_rate=0.2,
            clipped_count_stddev=0.0,
        )
    else:
        made = factory.gaussian_fixed(noise_multiplier=0.0, clients_per_round=expected, clip=clip)
    value_type = tff.types.tensorflow_to_type(tuple(tf.TensorSpec(s, tf.float32) for s in SHAPES))
    return made.create(value_type)


def tff_clip(state: object) -> float:
    return float(state.query_state.numerator_state.sum_state.l2_norm_clip)


@pytest.mark.usefixtures("tff_context")
@pytest.mark.parametrize("adaptive", [False, True])
def test_without_noise_it_is_tffs_dp_factory_on_each_clusters_own_clients(adaptive: bool) -> None:
    """Three clusters whose clients' update norms are about 1, 4 and 10, 12 rounds of a random
    70% of 15 clients (realised counts vary, the denominators are the expected 3.5): each
    cluster's mean and, adaptive, its clip trajectory are bit for bit those of TFF's
    `gaussian_fixed` / `gaussian_adaptive` run on that cluster's clients only."""
    rng = np.random.default_rng(1)
    norms, expected = [1.0, 4.0, 10.0], 3.5
    aggregator = ClusterDP(0.0, clip=2.0, adaptive=adaptive)
    process = tff_dp_process(adaptive, expected, 2.0)
    tff_states = [process.initialize() for _ in norms]
    state = aggregator.initial_state(3)
    denominator = np.full(3, expected, np.float32)
    for _ in range(12):
        clients = [k for k in range(3) for _ in range(5) if rng.random() < 0.7]
        updates = [random_update(rng, norms[k] * rng.uniform(0.8, 1.2)) for k in clients]
        means, updated, state, _ = run_aggregator(aggregator, updates, clients, state, denominator)
        assert updated.all()
        for k in range(3):
            own = [u for u, c in zip(updates, clients) if c == k]
            output = process.next(tff_states[k], own)
            tff_states[k] = output.state
            for ours, theirs in zip(means, output.result):
                assert np.array_equal(ours[k], np.asarray(theirs)), k
        clips = [tff_clip(s) if adaptive else 2.0 for s in tff_states]
        assert np.array_equal(state["clip"], np.array(clips, np.float32))
    if adaptive:  # the clips moved toward each cluster's median norm
        assert state["clip"][0] < 2.0 < state["clip"][1] < state["clip"][2]


@pytest.mark.usefixtures("tff_context")
def test_a_round_without_noise_is_tffs_adaptive_dp_factory_on_each_clusters_own_clients() -> None:
    """The whole TFF round (clients training an MLP, each update clipped to its cluster's clip
    in the round's hyperparameters, summed into its row, finished on the server), three rounds
    of 2 clusters: each cluster's new model is its old one plus TFF's `gaussian_adaptive` mean
    (no noise) of its own clients' updates, and the clips follow TFF's."""
    spec = model_spec("mlp", (5,), 3, hidden_units=4)
    w0 = initial_weights(spec, 7)
    shapes = [tuple(np.shape(w)) for w in w0]
    aggregator = ClusterDP(0.0, clip=0.05, adaptive=True)
    signature = RoundSignature(
        2,
        tuple(range(len(w0))),
        client_work.LocalSGD(),
        return_model_deltas=True,
        client_weighting="uniform",
        aggregator=aggregator,
    )
    functional = functional_model(spec.build(), spec.input_spec())
    fed_round = tff_round_parts(round_functions(functional, spec.input_spec(), signature, w0))
    factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=0.0,
        clients_per_round=2.5,
        initial_l2_norm_clip=0.05,
        target_unclipped_quantile=0.5,
        learning_rate=0.2,
        clipped_count_stddev=0.0,
    )
    process = factory.create(
        tff.types.tensorflow_to_type(tuple(tf.TensorSpec(s, tf.float32) for s in shapes))
    )
    tff_states = [process.initialize(), process.initialize()]
    rng = np.random.default_rng(2)
    server = fed_round.initialize()
    state = aggregator.initial_state(2)
    clips = np.full(2, 0.05, np.float32)
    for round_num in range(3):
        keys = [0, 1, 0, 1, 1]
        data = [
            collections.OrderedDict(
                x=rng.normal(size=(n, 5)).astype(np.float32),
                y=rng.integers(0, 3, n).astype(np.int32),
            )
            for n in (6, 9, 4, 7, 5)
        ]
        clients = round_clients(
            data,
            [np.array([k], np.int32) for k in keys],
            [()] * 5,
            [1.0] * 5,
            [client_seed(round_num, i) for i in range(5)],
        )
        inputs = aggregator.round_inputs(ROUND_SEED, np.array([2.5, 2.5]))
        server = server._replace(aggregator=aggregator.server_slot(state, inputs))
        hparams = round_hparams(0.5, 3, aggregator_params=aggregator.client_params(state))
        before = [np.asarray(m) for m in server.cluster_models]
        server, outputs, measured = fed_round.next(server, clients, hparams)
        state = server.aggregator["state"]
        for k in range(2):
            own = [
                tuple(unflatten(np.asarray(o["model_delta"]), shapes))
                for o, key in zip(outputs, keys)
                if key == k
            ]
            output = process.next(tff_states[k], own)
            tff_states[k] = output.state
            for got, old, mean in zip(server.cluster_models, before, output.result):
                np.testing.assert_allclose(got[k], old[k] + mean, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(measured["dp_clip"], clips)  # the clip of the round
        clips = np.array([tff_clip(s) for s in tff_states], np.float32)
        np.testing.assert_array_equal(state["clip"], clips)
    assert clips.max() > 0.05  # the updates are larger than the first clip: it grew


def test_the_accountants_event_is_one_gaussian_of_the_noise_multiplier() -> None:
    """Fixed clipping: one Gaussian of multiplier z. Adaptive: the sums' Gaussian (z_v)
    composed with the counts' (2 sigma_b, sensitivity 1/2), which the RDP accountant finds
    as private as one Gaussian of multiplier z (TFF's split of the noise)."""
    assert ClusterDP(1.3).round_event() == dp_accounting.GaussianDpEvent(1.3)
    adaptive = ClusterDP(1.3, adaptive=True)
    assert adaptive.effective_count_stddev == 1.3  # the default sigma_b = z
    assert adaptive.value_noise_multiplier == pytest.approx(1.3 / np.sqrt(0.75), rel=1e-12)

    def epsilon(event: dp_accounting.DpEvent) -> float:
        accountant = dp_accounting.rdp.RdpAccountant()
        sampled = dp_accounting.PoissonSampledDpEvent(0.02, event)
        accountant.compose(dp_accounting.SelfComposedDpEvent(sampled, 200))
        return accountant.get_epsilon(1e-5)

    ours = epsilon(adaptive.round_event())
    assert ours == pytest.approx(epsilon(dp_accounting.GaussianDpEvent(1.3)), rel=1e-9)
    assert ours < epsilon(dp_accounting.GaussianDpEvent(1.2))


def test_expected_counts_spread_the_unassigned_clients_evenly() -> None:
    """E_k = m_t n_k / N_t over the eligible clients, the unassigned ones spread evenly over
    the clusters; the counts add up to the clients sampled, m_t = min(m, N_t)."""
    assignment = {"a": 0, "b": 0, "c": 1, "d": -1, "e": 2, "f": -1, "g": 0}
    eligible = ["a", "b", "c", "d", "e", "f"]
    counts = expected_counts(assignment, eligible, 3, 3)
    np.testing.assert_allclose(counts, 3 / 6 * np.array([2 + 2 / 3, 1 + 2 / 3, 1 + 2 / 3]))
    assert counts.sum() == pytest.approx(3.0)
    np.testing.assert_allclose(expected_counts(assignment, eligible, 10, 3).sum(), 6.0)
    np.testing.assert_allclose(expected_counts({}, ["x", "y"], 1, 2), [0.5, 0.5])


@pytest.mark.usefixtures("tff_context")
def test_the_mean_is_the_default_and_builds_todays_round() -> None:
    """A signature without an aggregator is the mean's; its round keeps the mean's types (an
    empty aggregator state, no aggregator parameters among the hyperparameters, clients return
    an update, a weight and their outputs); the run's default settings build the mean."""
    mean = RoundSignature(2, (0, 1, 2, 3))
    assert mean == RoundSignature(2, (0, 1, 2, 3), aggregator=ClusterMean())
    assert hash(mean) == hash(RoundSignature(2, (0, 1, 2, 3), aggregator=ClusterMean()))
    assert TrainingConfig().aggregator.build() == ClusterMean()
    spec = model_spec("mlp", (5,), 3, hidden_units=4)
    w0 = initial_weights(spec, 7)
    functional = functional_model(spec.build(), spec.input_spec())
    dp = dataclasses.replace(mean, client_weighting="uniform", aggregator=ClusterDP(1.0))
    types = {}
    for signature in (mean, dp):
        parts = tff_round_parts(round_functions(functional, spec.input_spec(), signature, w0))
        state_type, clients_type, hparams_type = parts.next.type_signature.parameter
        outputs = parts.next.type_signature.result[1].member
        types[signature.aggregator.name] = (state_type.member, hparams_type.member, outputs)
    state, hparams, outputs = types["mean"]
    assert len(state.aggregator) == 0
    assert "aggregator" not in dir(hparams)
    assert "stats" not in str(outputs)
    state, hparams, _ = types["dp"]
    assert [name for name, _ in tff.structure.iter_elements(state.aggregator)] == [
        "state",
        "inputs",
    ]
    assert "aggregator" in dir(hparams)


def test_settings_and_algorithms_a_private_aggregator_refuses() -> None:
    """One-line errors naming the fix: dp settings with the mean, dp without a noise multiplier,
    an adaptive count noise too small for the multiplier, dp for an algorithm that sets models
    from individual clients' updates (and any aggregator but the mean for decentralized
    peers), and a private aggregator with example-weighted clients."""
    with pytest.raises(ValueError, match="--dp_clip set with --aggregator=mean"):
        AggregatorConfig(clip=2.0)
    with pytest.raises(ValueError, match="needs --dp_noise_multiplier"):
        AggregatorConfig("dp")
    with pytest.raises(ValueError, match="raise --dp_count_stddev"):
        AggregatorConfig("dp", noise_multiplier=1.0, clipping="adaptive", count_stddev=0.4)
    with pytest.raises(ValueError, match="client_weighting='uniform'"):
        RoundSignature(1, (0,), aggregator=ClusterDP(1.0))
    with pytest.raises(ValueError, match="decentralized peers aggregate nothing"):
        RoundSignature(
            1, (0,), client_weighting="uniform", distribution=Neighbours(), aggregator=ClusterDP(1)
        )
    dp = AggregatorConfig("dp", noise_multiplier=1.0)
    refused = {"cfl", "fesem", "fedac", "cgpfl", "flhc", "fedtsdp"}
    for name in ALGORITHMS:
        algorithm = make_algorithm(name)
        if algorithm.distribution.decentralized:
            with pytest.raises(ValueError, match="is decentralized.*leave --aggregator unset"):
                check_aggregator(algorithm, dp.build())
        elif name in refused:
            with pytest.raises(ValueError, match=f"{name} reads individual clients'"):
                RunSpec(name, training=TrainingConfig(aggregator=dp))
        else:
            check_aggregator(algorithm, dp.build())
        check_aggregator(algorithm, ClusterMean())
    assert {n for n in ALGORITHMS if not make_algorithm(n).models_from_aggregate} == refused


def test_a_checkpoint_older_than_the_aggregator_settings_resumes_as_the_mean() -> None:
    """A run's settings from before aggregators existed are the mean's settings now."""
    now = RunSpec("fedavg").settings()
    before = dict(now, training=dict(now["training"]))
    del before["training"]["aggregator"]
    assert checkpoint.same_settings(before, now)
    dp = RunSpec(
        "fedavg", training=TrainingConfig(aggregator=AggregatorConfig("dp", noise_multiplier=1.0))
    )
    assert not checkpoint.same_settings(before, dp.settings())


def test_a_private_cold_start_older_checkpoint_resumes_only_as_the_raw_one_it_was() -> None:
    """A private FedGroup run checkpointed before the private cold start read its cold start
    raw: it resumes with --dp_cold_start=raw, and the private default is refused, naming the
    setting (its ledger charged no cold start, so it must not claim one). FedAvg reads no
    cold start: its old private checkpoint resumes under the default."""

    def settings(algorithm: str, **dp: Any) -> dict:
        aggregator = AggregatorConfig("dp", noise_multiplier=1.0, **dp)
        return RunSpec(algorithm, training=TrainingConfig(aggregator=aggregator)).settings()

    for algorithm, resumes_by_default in (("fedgroup", False), ("fedavg", True)):
        now = settings(algorithm)
        before = dict(now, training=dict(now["training"]))
        before["training"]["aggregator"] = {
            k: v for k, v in now["training"]["aggregator"].items() if not k.startswith("cold_start")
        }
        assert checkpoint.same_settings(before, now) is resumes_by_default, algorithm
        assert checkpoint.same_settings(before, settings(algorithm, cold_start_release="raw")) is (
            algorithm == "fedgroup"
        )
    fedgroup = settings("fedgroup")
    old = dict(fedgroup, training=dict(fedgroup["training"]))
    old["training"]["aggregator"] = before["training"]["aggregator"]
    message = checkpoint.other_settings_message("c.npz", old, fedgroup)
    assert "cold_start_release: checkpoint (none), now 'private'" in message, message


def test_the_experiment_weighs_clients_uniformly_under_dp() -> None:
    """FedAvg weighs by examples; under dp its rounds weigh every client 1 (a private mean's
    sensitivity needs it), and round metrics, which read each client's update, are refused."""
    from tff_clustered.data import load_dataset
    from tff_clustered.loop.execution import RunExecution
    from tff_clustered.loop.orchestration import Experiment

    data = load_dataset("digits_dirichlet", seed=0, num_clients=4, dirichlet_beta=0.5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=4)
    dp = TrainingConfig(
        rounds=1, clients_per_round=2, aggregator=AggregatorConfig("dp", noise_multiplier=0.0)
    )
    fedavg = make_algorithm("fedavg")
    assert fedavg.client_weighting == "num_examples"
    experiment = Experiment(data, model, fedavg, dp, execution=RunExecution.of("in_process"))
    experiment.start()
    assert experiment.signature().client_weighting == "uniform"
    assert experiment.signature().aggregator == ClusterDP(0.0)
    with pytest.raises(ValueError, match="round metrics read each client's own update"):
        Experiment(
            data,
            model,
            fedavg,
            dp,
            round_metrics=[lambda *a: {}],
            execution=RunExecution.of("in_process"),
        )


def test_the_python_api_takes_the_aggregator_and_refuses_it_where_the_flags_do(
    tmp_path: object,
) -> None:
    """`run(..., aggregator=ClusterDP(...))` becomes the training's aggregator settings (what
    checkpoints and summary.json record); a contradicting or unknown one, and dp for an
    algorithm that reads individual updates, are refused before any data is read."""
    private = ClusterDP(1.0, clip=0.5, adaptive=True)
    training = with_aggregator(TrainingConfig(), private)
    assert training.aggregator == AggregatorConfig(
        "dp", noise_multiplier=1.0, clip=0.5, clipping="adaptive"
    )
    assert training.aggregator.build() == private
    assert with_aggregator(training, None) is training
    with pytest.raises(ValueError, match="contradicts training.aggregator"):
        with_aggregator(training, ClusterDP(2.0))
    with pytest.raises(ValueError, match="give one of 'mean'.*or the aggregator itself"):
        with_aggregator(TrainingConfig(), "dp")
    with pytest.raises(ValueError, match="cfl reads individual clients'"):
        tff_clustered.run(
            "cfl", train={}, model_fn=lambda: None, output_dir=str(tmp_path), aggregator=private
        )


# Issue 49 (items 5, 11, 15, 18): every DP number, as the Python API and the flags give it, in
# its meaningful range, and of its type: (arguments, the argument the one-line error names).
BAD_DP_SETTINGS = [
    (dict(noise_multiplier=1.0, adaptive=True, clip_learning_rate=np.inf), "clip_learning_rate"),
    (dict(noise_multiplier=1.0, adaptive=True, clip_learning_rate=1e6), "clip_learning_rate"),
    # 88 took the clip from 1 to 1e-19 in two rounds: a rate whose one round can move the clip by
    # more than a factor e is refused, at the default quantile and at a skewed one
    (dict(noise_multiplier=1.0, adaptive=True, clip_learning_rate=88.0), "clip_learning_rate"),
    (dict(noise_multiplier=1.0, adaptive=True, clip_learning_rate=2.01), "clip_learning_rate"),
    (
        dict(noise_multiplier=1.0, adaptive=True, target_quantile=0.9, clip_learning_rate=1.2),
        "clip_learning_rate",
    ),
    (dict(noise_multiplier=1.0, adaptive=True, count_stddev=np.inf), "count_stddev"),
    (dict(noise_multiplier=1.0, adaptive=True, count_stddev=np.nan), "count_stddev"),
    (dict(noise_multiplier=1e-300), "noise_multiplier"),  # the accountant divided by 0
    (dict(noise_multiplier=1e-20), "noise_multiplier"),  # epsilon beyond float32
    (dict(noise_multiplier=1e300), "noise_multiplier"),
    (dict(noise_multiplier=1.0, clip=1e300), "clip"),
    (dict(noise_multiplier=1.0, adaptive=True, target_quantile=np.nan), "target_quantile"),
]


@pytest.mark.parametrize("arguments, named", BAD_DP_SETTINGS)
def test_dp_settings_outside_their_range_are_refused_naming_the_argument(
    arguments: dict, named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^ClusterDP: {named} \(--dp_{named}\) must be"):
        ClusterDP(**arguments)
    adaptive = arguments.pop("adaptive", False)
    config = {"clipping": "adaptive"} if adaptive else {}
    with pytest.raises(ValueError, match=rf"--dp_{named}\) must be"):  # the flags' path
        AggregatorConfig("dp", **config, **arguments)


def test_dp_settings_at_their_bounds_are_taken() -> None:
    ClusterDP(noise_multiplier=1e-6)
    ClusterDP(noise_multiplier=0.0, clip=float(np.finfo(np.float32).max))
    ClusterDP(noise_multiplier=1.0, adaptive=True, clip_learning_rate=2.0, count_stddev=1e30)
    ClusterDP(noise_multiplier=1.0, adaptive=True, target_quantile=0.9, clip_learning_rate=1.1)
    AggregatorConfig("dp", target_epsilon=1e6)


def test_a_clip_learning_rate_is_refused_with_its_bound_and_the_step_it_allows() -> None:
    """The geometric step exp(-rate (b - q)) moves the clip by up to exp(rate max(q, 1 - q)):
    the message gives the bound at the run's quantile, for the API and the flags alike."""
    with pytest.raises(ValueError, match=r"must be in \[0, 2\] at target_quantile q = 0.5: "):
        ClusterDP(noise_multiplier=1.0, adaptive=True, clip_learning_rate=88.0)
    bound = r"--dp_clip_learning_rate\) must be in \[0, 1.25\] at target_quantile q = 0.2: .*e\^1"
    with pytest.raises(ValueError, match=bound):
        AggregatorConfig(
            "dp",
            noise_multiplier=1.0,
            clipping="adaptive",
            target_quantile=0.2,
            clip_learning_rate=1.3,
        )


def test_an_absurd_target_epsilon_is_refused_with_the_range() -> None:
    with pytest.raises(ValueError, match=r"--target_epsilon must be in \[0, 1e\+06\]"):
        AggregatorConfig("dp", target_epsilon=1e300)


@pytest.mark.parametrize(
    "make, named, fix",
    [
        (lambda: ClusterDP(noise_multiplier="1"), "ClusterDP: noise_multiplier", "write 1.0"),
        (lambda: ClusterDP(1.0, clip=[1.0]), "ClusterDP: clip", "give a number"),
        (lambda: ClusterDP(1.0, adaptive="yes"), "ClusterDP: adaptive", "True or False"),
        (lambda: ClusterDP(1.0, count_stddev="2"), "ClusterDP: count_stddev", "write 2.0"),
        (lambda: tff_clustered.ClusterRobust(zeroing="no"), "ClusterRobust: zeroing", "True"),
        (
            lambda: tff_clustered.ClusterCompression(quantization_bits=8.0),
            "ClusterCompression: quantization_bits",
            "write 8",
        ),
        (lambda: tff_clustered.ClusterSecure(clipping=1), "ClusterSecure: clipping", "True"),
    ],
)
def test_an_aggregator_argument_of_a_wrong_type_is_named_with_its_type(
    make: object, named: str, fix: str
) -> None:
    with pytest.raises(TypeError, match=f"^{named} must be .*{fix}"):
        make()


def test_a_model_made_non_finite_by_dp_noise_names_the_dp_settings() -> None:
    """Noise of 1e20 per value: the round after it diverges, and the message names the noise
    and the clip, not the learning rate alone."""
    from tff_clustered.data import load_dataset
    from tff_clustered.loop.divergence import DivergenceError
    from tff_clustered.loop.execution import RunExecution
    from tff_clustered.loop.orchestration import Experiment

    data = load_dataset("digits_dirichlet", seed=0, num_clients=4, dirichlet_beta=0.5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=4)
    noisy = TrainingConfig(
        rounds=3, clients_per_round=2, aggregator=AggregatorConfig("dp", noise_multiplier=1e20)
    )
    experiment = Experiment(
        data, model, make_algorithm("fedavg"), noisy, execution=RunExecution.of("in_process")
    )
    experiment.start()
    with pytest.raises(DivergenceError) as raised:
        list(experiment.rounds())
    message = str(raised.value)
    assert "the DP settings likely caused it" in message, message
    assert "standard deviation 1e+20" in message and "lower --dp_noise_multiplier" in message
    assert ClusterDP(1.0, clip=0.1).divergence_hint() == ""  # ordinary noise: not blamed


def test_clients_diverging_in_round_1_are_not_blamed_on_the_dp_settings() -> None:
    """Round 1's clients train from the initial model, which no aggregation (no DP noise, no
    clip) has touched: their NaN updates (--learning_rate=1e30) name the learning rate only.
    From round 2 on the model they start from was aggregated, and the DP settings are named
    first."""
    from tff_clustered.loop.divergence import DivergenceError, check_diverged_clients

    hint = ClusterDP(1.0).divergence_hint()  # --dp_clip's default 1: a standard deviation of 1
    assert hint
    for round_num, blamed in ((1, False), (2, True)):
        with pytest.raises(DivergenceError) as raised:
            check_diverged_clients(
                np.array([False, False]), ["a", "b"], round_num, 1e30, 0.25, hint
            )
        message = str(raised.value)
        assert ("the DP settings likely caused it" in message) == blamed, message
        assert "learning rate 1e+30 may be too high" in message
