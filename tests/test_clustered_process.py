"""The TFF round and evaluation against NumPy/TF references of the same math on tiny data."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from reference import mclr_mean_loss, mclr_sgd, softmax, weighted_mean

from tff_clustered.federated import batching, client_work, distributors, local_training
from tff_clustered.federated.distributions import (
    Distribution,
    LowestLossCluster,
    Neighbours,
    OwnCluster,
)
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import (
    client_seed,
    evaluation_input,
    round_clients,
    round_hparams,
)
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.models import PersonalSplit, ResolvedSplit, initial_weights, model_spec
from tff_clustered.models.functional import functional_model

pytestmark = pytest.mark.usefixtures("tff_context")
BATCH = 4
SHUFFLE_SEED = 11


def client_sets(rng: np.random.Generator, sizes: list, dim: int, classes: int) -> list:
    return [
        (rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32))
        for n in sizes
    ]


def arrays(x: np.ndarray, y: np.ndarray) -> collections.OrderedDict:
    return collections.OrderedDict(x=x, y=y)


def to_dataset(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    """The one pass a client of these rounds takes (every client shuffles from SHUFFLE_SEED),
    built here in Python by the same function the clients use."""
    return batching.batches(arrays(x, y), BATCH, 1, SHUFFLE_SEED)


def batches(x: np.ndarray, y: np.ndarray) -> list:
    return [(b["x"].numpy(), b["y"].numpy()) for b in to_dataset(x, y)]


def build(
    model_name: str,
    split: PersonalSplit,
    k: int,
    deltas: bool = False,
    prox_mu: float = 0.0,
    work: client_work.ClientWork | None = None,
    **signature_options: object,
) -> tuple:
    spec = model_spec(model_name, (5,), 3, hidden_units=4)
    w0 = initial_weights(spec, 7)
    keras_model = spec.build()
    personal = ResolvedSplit.of(keras_model, split).personal
    shared = tuple(i for i in range(len(w0)) if i not in personal)
    signature = RoundSignature(
        k,
        shared,
        work or client_work.LocalSGD(prox_mu=prox_mu),
        return_model_deltas=deltas,
        **signature_options,
    )
    model = functional_model(keras_model, spec.input_spec())
    process = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0))
    return process, w0


def seeds(n: int) -> list:
    return [client_seed(SHUFFLE_SEED, i) for i in range(n)]


@pytest.mark.parametrize("sent_by", ["broadcast", "select"])
def test_round_is_the_example_weighted_mean_per_cluster_and_empty_cluster_is_unchanged(
    sent_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either way of sending clients their cluster's model (`OwnCluster.sends_every_cluster`:
    a select when a broadcast would cost more) gives the same round."""
    if sent_by == "select":
        monkeypatch.setattr(distributors, "BROADCAST_MS", 1e9)
    rng = np.random.default_rng(0)
    process, _ = build("mclr", PersonalSplit.none(), 3, deltas=True)
    text = process.next.to_building_block().compact_representation()
    assert ("federated_select" in text) is (sent_by == "select")
    state = process.initialize()
    # Give each cluster a different model, as after a cold start.
    state = state._replace(
        cluster_models=tuple(
            rng.normal(size=m.shape).astype(np.float32) for m in state.cluster_models
        )
    )
    data = client_sets(rng, [9, 6, 11, 5], 5, 3)
    keys = [0, 2, 2, 0]
    new_state, outputs, measurements = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([k], np.int32) for k in keys],
            [()] * 4,
            [np.float32(1.0)] * 4,
            seeds(4),
        ),
        round_hparams(0.2, BATCH),
    )
    w_stack, b_stack = state.cluster_models
    trained = [mclr_sgd(w_stack[k], b_stack[k], batches(*d), 0.2) for d, k in zip(data, keys)]
    for cluster in (0, 2):
        members = [i for i, k in enumerate(keys) if k == cluster]
        expected = weighted_mean([trained[i] for i in members], [len(data[i][1]) for i in members])
        for got, want in zip(new_state.cluster_models, expected):
            np.testing.assert_allclose(got[cluster], want, rtol=1e-5, atol=1e-6)
    for got, before in zip(new_state.cluster_models, state.cluster_models):
        assert np.array_equal(got[1], before[1])  # no client in cluster 1: bit for bit unchanged
    np.testing.assert_array_equal(measurements["cluster_weight"], [14.0, 0.0, 17.0])
    for out, (w, b), k in zip(outputs, trained, keys):
        start = np.concatenate([w_stack[k].ravel(), b_stack[k]])
        np.testing.assert_allclose(
            out["model_delta"], np.concatenate([w.ravel(), b]) - start, rtol=1e-4, atol=1e-5
        )


def mlp_predict(weights: tuple, x: tf.Tensor, training: bool) -> tf.Tensor:
    w1, b1, w2, b2 = weights
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


def test_personal_tensors_are_trained_locally_and_never_aggregated() -> None:
    rng = np.random.default_rng(1)
    process, w0 = build("mlp", PersonalSplit(1, "layers", "top"), 2)
    assert process.functions.io.store_in == (2, 3)
    state = process.initialize()
    data = client_sets(rng, [8, 12, 7], 5, 3)
    keys = [1, 1, 0]
    personal = [
        tuple(rng.normal(size=w0[i].shape).astype(np.float32) for i in (2, 3)) for _ in data
    ]
    new_state, outputs, _ = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([k], np.int32) for k in keys],
            personal,
            [np.float32(1.0)] * 3,
            seeds(3),
        ),
        round_hparams(0.1, BATCH),
    )
    train = tf.function(local_training.train_client, autograph=False)
    forward = local_training.stateless(mlp_predict)
    reference = []
    for d, k, p in zip(data, keys, personal):
        start = [state.cluster_models[0][k], state.cluster_models[1][k], *p]
        r = train(forward, tuple(tf.constant(t) for t in start), to_dataset(*d), tf.constant(0.1))
        reference.append([t.numpy() for t in r.weights])
    for out, ref in zip(outputs, reference):  # personal parts come back to their client
        np.testing.assert_allclose(out["stored"][0], ref[2], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["stored"][1], ref[3], rtol=1e-5, atol=1e-6)
    for i in (2, 3):  # the server's personal slots are never touched
        assert np.array_equal(new_state.cluster_models[i], state.cluster_models[i])
    for cluster in (0, 1):
        members = [j for j, k in enumerate(keys) if k == cluster]
        expected = weighted_mean(
            [reference[j][:2] for j in members], [len(data[j][1]) for j in members]
        )
        for i in (0, 1):
            np.testing.assert_allclose(
                new_state.cluster_models[i][cluster], expected[i], rtol=1e-5, atol=1e-6
            )


def test_purely_local_models_leave_the_server_state_unchanged() -> None:
    rng = np.random.default_rng(2)
    process, w0 = build("mlp", PersonalSplit.all(), 1)
    state = process.initialize()
    data = client_sets(rng, [6, 6], 5, 3)
    new_state, outputs, _ = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([0], np.int32)] * 2,
            [tuple(w0)] * 2,
            [np.float32(1.0)] * 2,
            seeds(2),
        ),
        round_hparams(0.1, BATCH),
    )
    for got, before in zip(new_state.cluster_models, state.cluster_models):
        assert np.array_equal(got, before)
    assert not np.allclose(outputs[0]["stored"][0], w0[0])


def test_evaluation_uses_each_clients_own_cluster_model() -> None:
    rng = np.random.default_rng(3)
    process, _ = build("mclr", PersonalSplit.none(), 2)
    models = tuple(
        rng.normal(size=(2, *s)).astype(np.float32) for s in process.functions.layout.shapes
    )
    data = client_sets(rng, [10, 13], 5, 3)
    keys = [1, 0]
    results = process.evaluate(
        models, [evaluation_input(arrays(*d), k, ()) for d, k in zip(data, keys)], np.int64(BATCH)
    )
    for (x, y), k, r in zip(data, keys, results):
        logits = x @ models[0][k] + models[1][k]
        assert r["num_correct"] == float(np.sum(np.argmax(logits, 1) == y))
        expected_loss = -np.log(softmax(logits.astype(np.float64))[np.arange(len(y)), y]).sum()
        assert r["loss_sum"] == pytest.approx(expected_loss, rel=1e-4)
        assert r["num_examples"] == len(y)


def test_per_client_proximal_scale_multiplies_mu() -> None:
    """FedProx term mu * scale_i (w - w^t) per client (FeSEM's mu_i, spec B.4)."""
    rng = np.random.default_rng(4)
    process, w0 = build("mclr", PersonalSplit.none(), 1, deltas=True, prox_mu=0.5)
    state = process.initialize()
    data = client_sets(rng, [9, 9, 9], 5, 3)
    scales = [0.0, 1.0, 4.0]
    _, outputs, _ = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([0], np.int32)] * 3,
            [()] * 3,
            [np.float32(s) for s in scales],
            seeds(3),
        ),
        round_hparams(0.3, BATCH),
    )
    start = np.concatenate([w0[0].ravel(), w0[1]])
    for out, d, s in zip(outputs, data, scales):
        w, b = mclr_sgd(w0[0], w0[1], batches(*d), 0.3, mu=0.5 * s)
        np.testing.assert_allclose(
            out["model_delta"], np.concatenate([w.ravel(), b]) - start, rtol=1e-4, atol=1e-5
        )


def test_batchnorm_statistics_follow_their_layer_shared_or_personal() -> None:
    """ResNet18 (width 4): the shared BN layers' moving statistics are averaged like weights;
    the stored ones of personal layers come back to their client only."""
    spec = model_spec("resnet18", (32, 32, 3), 10, resnet_width=4)
    keras_model = spec.build()
    model = functional_model(keras_model, spec.input_spec())
    variables = initial_weights(spec, 1) + list(model.initial_state)
    shared = tuple(range(58))  # the last block's second BN (58, 59) and the FC are personal
    signature = RoundSignature(1, shared, keep_client_models=True)
    process = tff_round_parts(round_functions(model, spec.input_spec(), signature, variables))
    personal_bn = [62 + j for j, owner in enumerate(model.state_owner) if owner >= 58]
    assert process.functions.io.store_in == (58, 59, 60, 61, *personal_bn)
    rng = np.random.default_rng(5)
    data = [
        (
            rng.normal(size=(n, 32, 32, 3)).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int32),
        )
        for n in (8, 4)
    ]
    state = process.initialize()
    new_state, outputs, _ = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([0], np.int32)] * 2,
            [tuple(variables[i] for i in process.functions.io.store_in)] * 2,
            [np.float32(1.0)] * 2,
            seeds(2),
        ),
        round_hparams(0.05, BATCH),
    )
    kept = [dict(zip(process.functions.io.store_out, o["stored"])) for o in outputs]
    for j, owner in enumerate(model.state_owner):
        index = 62 + j
        got = new_state.cluster_models[index][0]
        if owner < 58:  # shared: the example-weighted mean of the clients' statistics
            want = (8 * kept[0][index] + 4 * kept[1][index]) / 12
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
            assert not np.allclose(got, variables[index])
        else:  # personal: the server's slot is untouched, each client keeps its own
            np.testing.assert_array_equal(got, variables[index])
            assert not np.allclose(kept[0][index], kept[1][index])


def test_clients_pick_the_lowest_loss_in_use_cluster_and_train_it() -> None:
    """IFCA's distributor: every client gets all cluster models, scores each on its training
    data, trains the best, and its update lands in that cluster only. A padding cluster (past
    `num_clusters`) is never picked, even where its model would score best."""
    rng = np.random.default_rng(5)
    process, _ = build("mclr", PersonalSplit.none(), 3, distribution=LowestLossCluster())
    state = process.initialize()
    # cluster 2 (padding): the zero model, whose uniform prediction beats random models here
    w = np.concatenate([rng.normal(size=(2, 5, 3)), np.zeros((1, 5, 3))]).astype(np.float32)
    b = np.concatenate([rng.normal(size=(2, 3)), np.zeros((1, 3))]).astype(np.float32)
    state = state._replace(cluster_models=(w, b))
    data = client_sets(rng, [9, 6, 11, 5, 8, 7], 5, 3)
    losses = np.array([[mclr_mean_loss(w[j], b[j], *d) for j in range(3)] for d in data])
    assert (losses.argmin(1) == 2).any()  # the padding model would win somewhere
    picks = losses[:, :2].argmin(1)
    assert len(set(picks.tolist())) == 2  # both in-use clusters get members

    def run(num_clusters: int) -> tuple:
        return process.next(
            state,
            round_clients(
                [arrays(*d) for d in data],
                [np.array([0], np.int32)] * len(data),  # ignored: the clients pick
                [()] * len(data),
                [np.float32(1.0)] * len(data),
                seeds(len(data)),
            ),
            round_hparams(0.2, BATCH, num_clusters=num_clusters),
        )

    new_state, outputs, _ = run(2)
    assert [int(o["cluster"]) for o in outputs] == picks.tolist()
    trained = [mclr_sgd(w[k], b[k], batches(*d), 0.2) for d, k in zip(data, picks)]
    for cluster in (0, 1):
        members = [i for i, k in enumerate(picks) if k == cluster]
        expected = weighted_mean([trained[i] for i in members], [len(data[i][1]) for i in members])
        for got, want in zip(new_state.cluster_models, expected):
            np.testing.assert_allclose(got[cluster], want, rtol=1e-5, atol=1e-6)
    for got, before in zip(new_state.cluster_models, state.cluster_models):
        assert np.array_equal(got[2], before[2])
    _, all_three, _ = run(3)
    assert [int(o["cluster"]) for o in all_three] == losses.argmin(1).tolist()


def test_the_anchor_is_broadcast_and_pulls_its_tensors() -> None:
    """An anchor over the kernel only (FedAC's global embedding): each client's local loss gets
    lambda/2 ||W - anchor||^2, the FedProx pull toward its cluster stays, and the anchor itself
    is server state the round leaves alone."""
    rng = np.random.default_rng(6)
    work = client_work.LocalSGD(prox_mu=0.2, anchor_lambda=1.5)
    process, w0 = build("mclr", PersonalSplit.none(), 2, work=work, anchor=(0,))
    state = process.initialize()
    np.testing.assert_array_equal(state.anchor[0], w0[0])  # starts as the initial model
    target = rng.normal(size=(5, 3)).astype(np.float32)
    state = state._replace(anchor=(target,))
    data = client_sets(rng, [8, 10, 6], 5, 3)
    keys = [1, 0, 1]
    new_state, outputs, _ = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([k], np.int32) for k in keys],
            [()] * 3,
            [np.float32(1.0)] * 3,
            seeds(3),
        ),
        round_hparams(0.1, BATCH),
    )
    w_stack, b_stack = state.cluster_models
    trained = [
        mclr_sgd(w_stack[k], b_stack[k], batches(*d), 0.1, 0.2, kernel_pull=(1.5, target))
        for d, k in zip(data, keys)
    ]
    for cluster in (0, 1):
        members = [i for i, k in enumerate(keys) if k == cluster]
        expected = weighted_mean([trained[i] for i in members], [len(data[i][1]) for i in members])
        for got, want in zip(new_state.cluster_models, expected):
            np.testing.assert_allclose(got[cluster], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(new_state.anchor[0], target)


def test_a_diverged_client_is_left_out_of_its_cluster_mean() -> None:
    """A client whose training overflows (inputs of 1e30) reports finite=False and adds
    nothing: its cluster's model is the mean of the others, bit for bit finite."""
    rng = np.random.default_rng(7)
    process, _ = build("mclr", PersonalSplit.none(), 2)
    state = process.initialize()
    data = client_sets(rng, [8, 6, 10], 5, 3)
    data[1] = (data[1][0] * np.float32(1e30), data[1][1])
    keys = [0, 0, 1]
    new_state, outputs, measurements = process.next(
        state,
        round_clients(
            [arrays(*d) for d in data],
            [np.array([k], np.int32) for k in keys],
            [()] * 3,
            [np.float32(1.0)] * 3,
            seeds(3),
        ),
        round_hparams(0.2, BATCH),
    )
    assert [bool(o["finite"]) for o in outputs] == [True, False, True]
    np.testing.assert_array_equal(measurements["cluster_weight"], [8.0, 10.0])
    w_stack, b_stack = state.cluster_models
    alone = mclr_sgd(w_stack[0], b_stack[0], batches(*data[0]), 0.2)
    for got, want in zip(new_state.cluster_models, alone):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "distribution, selects",
    [
        (OwnCluster(), False),
        (LowestLossCluster(), False),
        (Neighbours(num_neighbours=1), True),
    ],
)
def test_only_peers_rows_go_by_federated_select(distribution: Distribution, selects: bool) -> None:
    """A client of a cluster is sent every cluster's shared variables by broadcast (a reference
    on the worker) and takes its row: `tff.federated_select` builds a dataset per client
    (3.4 ms a client for the MLP, `benchmark.py --benchmarks=tff_client_costs`). Only a
    decentralized peer, whose rows differ per client, is sent them by select."""
    spec = model_spec("mclr", (5,), 3)
    w0 = initial_weights(spec, 7)
    model = functional_model(spec.build(), spec.input_spec())
    signature = RoundSignature(
        3, tuple(range(len(w0))), client_work.LocalSGD(), distribution=distribution
    )
    parts = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0))
    text = parts.next.to_building_block().compact_representation()
    assert ("federated_select" in text) is selects
    assert "federated_broadcast" in text
