"""A `tff.aggregators` factory per cluster (`federated/tff_factory_aggregator.py`): the
weighted mean as the default mean, a fixed clip as that factory on each cluster's own clients,
adaptive clipping's state as the masking makes it, an empty cluster left as it was, and the
Python API's run, resume and refusals."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_clustered
from tff_clustered.data import DataSpec
from tff_clustered.federated import client_work
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import client_seed, round_clients, round_hparams
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.federated.tff_factory_aggregator import (
    TffFactoryPerCluster,
    flat_leaves,
    leaf_types,
)
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.state import RunState
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model
from tff_clustered.report import reporting
from tff_clustered.run_folder import RunFolder
from tff_clustered.runs import checkpoint
from tff_clustered.runs.api import with_aggregator
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runs.state_encoding import decode_tree
from tff_clustered.weights import unflatten

SPEC = model_spec("mlp", (5,), 3, hidden_units=4)
W0 = initial_weights(SPEC, 7)
SHAPES = [tuple(np.shape(w)) for w in W0]
KEYS = [0, 1, 0, 1, 1]  # cluster 2 gets no client
SIZES = (6, 9, 4, 7, 5)
# The aggregator settings every run records at their defaults, in the order checkpoints and
# summary.json hold them (between the name and the factory).
MEAN_RECORD = {
    "noise_multiplier": None,
    "clip": 1.0,
    "clipping": "fixed",
    "target_quantile": 0.5,
    "clip_learning_rate": 0.2,
    "count_stddev": None,
    "noise": "seeded",
    "cold_start_release": "private",
    "cold_start_share": 0.1,
    "cold_start_noise_multiplier": None,
    "delta": 1e-5,
    "target_epsilon": 0.0,
    "robust_zeroing": True,
    "robust_clipping": True,
    "quantization_bits": 8,
    "quantization_threshold": 20000,
}


def built_round(aggregator: object = None) -> object:
    """The TFF round of 3 clusters of the small MLP, clients returning their updates."""
    signature = RoundSignature(
        3, tuple(range(len(W0))), client_work.LocalSGD(), return_model_deltas=True
    )
    if aggregator is not None:
        signature = dataclasses.replace(signature, aggregator=aggregator)
    functional = functional_model(SPEC.build(), SPEC.input_spec())
    return tff_round_parts(round_functions(functional, SPEC.input_spec(), signature, W0))


def clients(round_num: int) -> list:
    rng = np.random.default_rng(round_num)
    data = [
        collections.OrderedDict(
            x=rng.normal(size=(n, 5)).astype(np.float32) * 3,
            y=rng.integers(0, 3, n).astype(np.int32),
        )
        for n in SIZES
    ]
    return round_clients(
        data,
        [np.array([k], np.int32) for k in KEYS],
        [()] * len(KEYS),
        [1.0] * len(KEYS),
        [client_seed(round_num, i) for i in range(len(KEYS))],
    )


def own_updates(outputs: list, cluster: int) -> list:
    """The updates of the clients that trained in `cluster`, as tensors of the shapes."""
    return [
        tuple(unflatten(np.asarray(o["model_delta"]), SHAPES))
        for o, key in zip(outputs, KEYS)
        if key == cluster
    ]


@pytest.fixture(scope="module")
def mean_round(tff_context: object) -> tuple:
    """One round of the default mean: (state before, state after, outputs, measurements)."""
    fed_round = built_round()
    before = fed_round.initialize()
    return (before, *fed_round.next(before, clients(0), round_hparams(0.5, 3)))


def run_without_data(tmp_path: object, factory: object, **options: object) -> None:
    """`tff_clustered.run` of FedAvg with `factory`, given no data and no model: only a refusal
    made before the data is read can end it other than in the data's own refusal."""
    tff_clustered.run(
        "fedavg",
        train={},
        model_fn=lambda: None,
        output_dir=str(tmp_path),
        aggregator=factory,
        **options,
    )


@pytest.mark.usefixtures("tff_context")
def test_mean_factory_per_cluster_is_the_default_mean(mean_round: tuple) -> None:
    """`MeanFactory()` per cluster gives the default mean's cluster models (to float
    tolerance: its sums are TFF's own), the empty cluster 2 bit for bit unchanged, no state."""
    before, after, _, measured = mean_round
    fed_round = built_round(TffFactoryPerCluster(tff.aggregators.MeanFactory()))
    state = fed_round.initialize()
    assert len(state.aggregator["state"]) == 0  # MeanFactory keeps none
    hparams = round_hparams(0.5, 3, aggregator_params={})
    new_state, _, factory_measured = fed_round.next(state, clients(0), hparams)
    for ours, mean, start in zip(
        new_state.cluster_models, after.cluster_models, before.cluster_models
    ):
        np.testing.assert_allclose(ours, mean, rtol=0, atol=1e-6)
        assert np.array_equal(ours[2], start[2])  # no client: kept
        assert not np.array_equal(ours[0], start[0])
    np.testing.assert_array_equal(factory_measured["cluster_weight"], measured["cluster_weight"])


def clipping(adaptive: bool) -> tff.aggregators.WeightedAggregationFactory:
    """A clip of the updates' global norm before TFF's weighted mean: fixed at 0.05, or
    adaptive from 0.05 toward the median norm (no noise)."""
    norm = 0.05
    if adaptive:
        norm = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
            initial_estimate=0.05, target_quantile=0.5, learning_rate=0.5
        )
    return tff.aggregators.clipping_factory(norm, tff.aggregators.MeanFactory())


@pytest.mark.usefixtures("tff_context")
@pytest.mark.parametrize("adaptive", [False, True])
def test_clipping_per_cluster_against_the_factory_on_each_clusters_own_clients(
    adaptive: bool,
) -> None:
    """Two rounds. A fixed clip: each cluster's new model is its old one plus the factory's
    result on its own clients alone, and its clipped count theirs. An adaptive clip: the
    first round's result is the same, but the norm estimate then differs from its own
    clients' alone: the masked clients' zero updates count as below it (it moves as the
    factory run on the round's every client, the others with zero updates and weights)."""
    factory = clipping(adaptive)
    fed_round = built_round(TffFactoryPerCluster(factory))
    value_type = tff.types.tensorflow_to_type(tuple(tf.TensorSpec(s, tf.float32) for s in SHAPES))
    process = factory.create(value_type, tff.TensorType(np.float32))
    alone = [process.initialize() for _ in range(2)]  # each cluster's own clients only
    masked = [process.initialize() for _ in range(2)]  # the round's clients, others zeros
    server = fed_round.initialize()
    for round_num in range(2):
        before = [np.asarray(m) for m in server.cluster_models]
        hparams = round_hparams(0.5, 3, aggregator_params={})
        server, outputs, measured = fed_round.next(server, clients(round_num), hparams)
        weights = [np.float32(o["num_examples"]) for o in outputs]
        for k in range(2):
            own = own_updates(outputs, k)
            own_weights = [w for w, key in zip(weights, KEYS) if key == k]
            output = process.next(alone[k], own, own_weights)
            zeros = tuple(np.zeros(s, np.float32) for s in SHAPES)
            every = [own.pop(0) if key == k else zeros for key in KEYS]
            masked_weights = [w if key == k else np.float32(0) for w, key in zip(weights, KEYS)]
            masked_output = process.next(masked[k], every, masked_weights)
            alone[k], masked[k] = output.state, masked_output.state
            expected = masked_output.result if adaptive else output.result
            for got, old, mean in zip(server.cluster_models, before, expected):
                np.testing.assert_allclose(got[k], old[k] + mean, rtol=0, atol=1e-6)
            if round_num == 0 or not adaptive:
                for got, old, mean in zip(server.cluster_models, before, output.result):
                    np.testing.assert_allclose(got[k], old[k] + mean, rtol=0, atol=1e-6)
            assert measured["clipped_count"][k] == output.measurements["clipped_count"]
            assert measured["clipping_norm"][k] == pytest.approx(
                float(masked_output.measurements["clipping_norm"])
            )
        assert measured["clipped_count"][:2].sum() > 0  # the clip bites
        for old, new in zip(before, server.cluster_models):
            assert np.array_equal(old[2], new[2])  # no client of cluster 2
    state = server.aggregator["state"]
    if not adaptive:
        assert len(state) == 0  # a fixed norm keeps no state
        return
    path = "clipping_norm/0/current_estimate"
    estimate = state[path]
    paths = [p for p, _ in leaf_types(process.initialize.type_signature.result.member)]
    for k in range(2):
        mine, theirs = (dict(zip(paths, flat_leaves(s)))[path] for s in (masked[k], alone[k]))
        assert estimate[k] == pytest.approx(float(mine), rel=1e-6)
        assert float(mine) < float(theirs)  # the masked zeros pulled it down
    assert estimate[2] == pytest.approx(0.05)  # cluster 2 had no client: its initial state


def saved_state(folder: str) -> object:
    """The run state in `folder`'s checkpoint."""
    meta, arrays = checkpoint._read(RunFolder(folder).checkpoint)
    return decode_tree(meta["state"], arrays)


def without_seconds(history: list) -> list:
    """Rows without their timings (NaN as None, so that rows compare with ==)."""
    return [
        {
            k: None if isinstance(v, float) and np.isnan(v) else v
            for k, v in row.items()
            if not k.endswith("_seconds")
        }
        for row in history
    ]


class Interrupted(Exception):
    """Stands for a run killed after a round's checkpoint."""


def test_an_interrupted_api_run_resumes_to_the_uninterrupted_run(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IFCA on the embedded digits with TFF's robust aggregator (adaptive clipping) per
    cluster through the Python API: the factory's states are in the checkpoint, so a run
    stopped after round 2 and resumed ends as the run left alone (models, every row, the
    clipping norms' state), and each cluster's scalar measurements are metrics columns."""
    kwargs = dict(
        train=DataSpec("digits", num_clients=6),
        model_fn=ModelChoice("mlp", hidden_units=8),
        options={"num_clusters": 2},
        training=TrainingConfig(rounds=3, clients_per_round=4, eval_every=3),
        aggregator=tff.learning.robust_aggregator(zeroing=False),
        checkpoint_every=1,
        log=lambda _: None,
    )
    whole = tff_clustered.run("ifca", output_dir=str(tmp_path / "whole"), **kwargs)
    update = reporting.Progress.update

    def interrupted(progress: object, row: dict) -> None:
        if row["round"] == 3:  # after round 2's checkpoint, before round 3's
            raise Interrupted
        update(progress, row)

    monkeypatch.setattr(reporting.Progress, "update", interrupted)
    with pytest.raises(Interrupted):
        tff_clustered.run("ifca", output_dir=str(tmp_path / "cut"), **kwargs)
    monkeypatch.undo()
    resumed = tff_clustered.run("ifca", output_dir=str(tmp_path / "cut"), resume=True, **kwargs)
    np.testing.assert_array_equal(resumed.cluster_models, whole.cluster_models)
    assert without_seconds(resumed.history) == without_seconds(whole.history)
    states = [saved_state(str(tmp_path / name)).aggregator_state for name in ("whole", "cut")]
    norms = [row["clipping_norm_cluster_0"] for row in whole.history[1:]]
    assert len(set(norms)) > 1  # adaptive: the norm moved
    for key, value in states[0].items():
        np.testing.assert_array_equal(states[1][key], value)
    assert states[0]["clipping_norm/0/current_estimate"].shape == (2,)
    factory = whole.summary["config"]["training"]["aggregator"]
    assert factory["name"] == "tff_factory" and "Factory" in factory["factory"]


def test_the_api_takes_a_bare_factory_and_refuses_what_cannot_run_it(tmp_path: object) -> None:
    """A bare factory given to `run` becomes a `TffFactoryPerCluster` in the training
    settings, recorded by its description; the in-process execution, several workers, a
    non-factory and dp settings beside a factory are refused with the fix, before any data
    is read."""
    factory = tff.aggregators.MeanFactory()
    training = with_aggregator(TrainingConfig(), factory)
    assert training.aggregator == AggregatorConfig.of(TffFactoryPerCluster(factory))
    assert training.aggregator.build().factory is factory
    described = training.settings()["aggregator"]["factory"]
    assert described.endswith("MeanFactory")
    mean = TrainingConfig().settings()  # the mean's: the plain settings, no factory's
    assert mean["aggregator"] == {"name": "mean", **MEAN_RECORD, "factory": None}
    assert list(mean["aggregator"]) == ["name", *MEAN_RECORD, "factory"]
    assert {k: v for k, v in mean.items() if k != "aggregator"} == {
        k: v for k, v in dataclasses.asdict(TrainingConfig()).items() if k != "aggregator"
    }
    assert not checkpoint.same_settings(
        RunSpec("fedavg").settings(),
        dict(RunSpec("fedavg").settings(), training=training.settings()),
    )
    with pytest.raises(ValueError, match="use execution='tff'"):
        run_without_data(tmp_path, factory, execution="in_process")
    with pytest.raises(ValueError, match="run it on one worker"):
        TffFactoryPerCluster(factory).check_workers(num_workers=2)
    with pytest.raises(TypeError, match="takes a tff.aggregators.WeightedAggregationFactory"):
        TffFactoryPerCluster(tff.learning.optimizers.build_sgdm())
    with pytest.raises(ValueError, match="goes with name 'tff_factory' only"):
        AggregatorConfig("tff_factory")
    with pytest.raises(ValueError, match="--dp_clip set with --aggregator=tff_factory"):
        AggregatorConfig("tff_factory", clip=2.0, factory=TffFactoryPerCluster(factory))


def test_a_factory_with_a_secure_sum_is_refused_before_any_data_is_read(tmp_path: object) -> None:
    """TFF 0.87's C++ worker has no secure intrinsic: `tff.learning.secure_aggregator()` failed
    in round 1 with gRPC's "Cannot embed a federated value" (issue 49, item 9). A secure sum
    nested anywhere is found; the fix named is the project's own secure aggregator."""
    nested = tff.aggregators.MeanFactory(value_sum_factory=tff.aggregators.SecureSumFactory(1.0))
    for factory in (tff.learning.secure_aggregator(), nested):
        with pytest.raises(ValueError, match='sums securely .*; use aggregator="secure"'):
            run_without_data(tmp_path, factory)
    assert TffFactoryPerCluster(nested).secure_intrinsics == ("federated_secure_sum_bitwidth",)
    for plain in (tff.learning.robust_aggregator(), tff.learning.dp_aggregator(1.0, 50)):
        assert TffFactoryPerCluster(plain).secure_intrinsics == ()
        TffFactoryPerCluster(plain).check_workers()


def test_a_factory_resumed_with_another_parameter_is_refused_naming_it(tmp_path: object) -> None:
    """The settings record the factory's parameters (issue 49, item 5): its noise changed from
    0.01 to 50 on resume is refused, naming it; the same factory made again resumes. A
    factory with parts inside TFF computations (robust's norm processes) is compared where it
    can be read, and its resume warns that the rest could not be."""

    def settings(noise: float) -> dict:
        factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(noise, 5, 1.0)
        return RunSpec("fedavg", training=with_aggregator(TrainingConfig(), factory)).settings()

    path = str(tmp_path / "checkpoint.npz")
    state = RunState(round_num=1, cluster_models=np.zeros((1, 3), np.float32))
    checkpoint.save(path, state, settings(0.01))
    assert checkpoint.load(path, settings(0.01)) is not None
    with pytest.raises(checkpoint.CheckpointError, match=r"_stddev: checkpoint 0\.01, now 50\.0"):
        checkpoint.load(path, settings(50.0))
    from tff_clustered.federated.factory_inspection import unread_warning

    robust, private = (
        TffFactoryPerCluster(tff.learning.robust_aggregator()),
        TffFactoryPerCluster(
            tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(1.0, 5, 1.0)
        ),
    )
    assert "were not compared" in unread_warning(robust.description, robust.parameters)
    assert unread_warning(private.description, private.parameters) == ""
    recorded = with_aggregator(TrainingConfig(), robust).settings()["aggregator"]
    assert recorded["factory_parameters"]["init_fn_impl/clipping_norm_process/class"].endswith(
        "Process"
    )


@pytest.mark.usefixtures("tff_context")
def test_an_unweighted_mean_per_cluster_divides_by_the_rounds_every_client() -> None:
    """`UnweightedMeanFactory()` per cluster: the masked clients count, so each cluster's
    update is the sum of its own clients' updates over all 5 clients of the round (not its
    own 2 or 3); cluster 2, with no client, is left as it was."""
    fed_round = built_round(TffFactoryPerCluster(tff.aggregators.UnweightedMeanFactory()))
    server = fed_round.initialize()
    before = [np.asarray(m) for m in server.cluster_models]
    hparams = round_hparams(0.5, 3, aggregator_params={})
    server, outputs, _ = fed_round.next(server, clients(0), hparams)
    for k in range(2):
        total = [sum(parts) for parts in zip(*own_updates(outputs, k))]
        for got, old, summed in zip(server.cluster_models, before, total):
            np.testing.assert_allclose(got[k], old[k] + summed / len(KEYS), rtol=0, atol=1e-6)
    for got, old in zip(server.cluster_models, before):
        assert np.array_equal(got[2], old[2])
