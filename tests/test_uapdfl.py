"""UA-PDFL and the decentralized baselines: the peer's math, the routing, and what the
algorithm must achieve."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from peers import identical_data, linear, peer_inputs, run_mlp

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.uapdfl import (
    DROPOUT,
    PERSONAL_HEAD,
    UAPDFLPeerStep,
    divergence,
)
from tff_clustered.data import load_digits_clusters
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec

pytestmark = pytest.mark.usefixtures("tff_context")


def test_divergence_is_the_symmetrised_kl() -> None:
    p = tf.constant([0.7, 0.2, 0.1])
    q = tf.constant([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    got = divergence(p, q).numpy()
    pn, qn = p.numpy(), q.numpy()
    expected = 0.5 * (pn * np.log(pn / qn)).sum(1) + 0.5 * (qn * np.log(qn / pn)).sum(1)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got[0] == pytest.approx(0.0, abs=1e-7) and got[1] > got[2] > 0
    back = divergence(q[1], tf.reshape(p, [1, 3])).numpy()[0]
    assert back == pytest.approx(got[1], rel=1e-5)  # symmetric
    js = divergence(p, q, "js").numpy()
    assert (js <= np.log(2) + 1e-6).all() and js[1] < got[1]


def test_peer_regimes_and_weights() -> None:
    """No training (an empty dataset) so the mixed model is what comes back: dropout copies one
    neighbour whole; otherwise g is the |D| mean over all and h over the similar ones."""
    own, near, far = [1.0, 0.0, 0.0, 0.0], [0.9, 0.0, 0.1, 0.0], [0.0, 5.0, 0.0, 0.0]
    step = UAPDFLPeerStep(head_start=1, input_shape=(1,), threshold=0.05)
    out = step(linear, peer_inputs([own, near, near], [1.0, 2.0, 3.0]))
    assert int(out.metrics["regime"]) == DROPOUT
    np.testing.assert_allclose(out.own_weights[0].numpy(), [near[:2]])  # a neighbour, whole
    np.testing.assert_allclose(out.own_weights[1].numpy(), near[2:])
    out = step(linear, peer_inputs([own, near, far], [1.0, 2.0, 3.0]))
    assert int(out.metrics["similar_neighbours"]) == 1
    g = (1 * np.array(own[:2]) + 2 * np.array(near[:2]) + 3 * np.array(far[:2])) / 6
    h = (1 * np.array(own[2:]) + 2 * np.array(near[2:])) / 3
    np.testing.assert_allclose(out.own_weights[0].numpy(), [g], rtol=1e-6)
    np.testing.assert_allclose(out.own_weights[1].numpy(), h, rtol=1e-6)
    out = step(linear, peer_inputs([own, far, far], [1.0, 2.0, 3.0]))
    assert int(out.metrics["regime"]) == PERSONAL_HEAD
    np.testing.assert_allclose(out.own_weights[1].numpy(), own[2:])  # h stays its own
    # received values (Sec. 3.5): 2 x (C + d_aux + 1) fingerprints + 2 g + 0 h (C = d_aux = 2)
    assert float(out.metrics["values_received"]) == 2 * (2 + 2 + 1) + 2 * 2


def test_a_padding_row_is_neither_mixed_nor_compared() -> None:
    """A queue padded with the peer's own row (a shorter queue): no divergence reported for
    the pad, and the pad is not a neighbour to copy, mix or count."""
    rows = [[1.0, 2.0, 0.0, 0.0], [3.0, 6.0, 4.0, 8.0], [1.0, 2.0, 0.0, 0.0]]
    step = UAPDFLPeerStep(head_start=1, input_shape=(1,), threshold=1e-9)
    out = step(linear, peer_inputs(rows, [1.0, 2.0, 3.0], [5, 2, 5]))
    divergences = out.metrics["divergence"].numpy()
    assert np.isfinite(divergences[0]) and np.isnan(divergences[1])
    assert int(out.metrics["neighbours_received"]) == 1
    # personal head: g over the two received rows, h its own
    np.testing.assert_allclose(out.own_weights[0].numpy(), [[7 / 3, 14 / 3]], rtol=1e-6)
    np.testing.assert_allclose(out.own_weights[1].numpy(), [0.0, 0.0], atol=1e-7)


def test_uapdfl_with_no_neighbours_is_local() -> None:
    data = load_digits_clusters(num_clients=6, num_groups=2, seed=1)
    config = TrainingConfig(rounds=2, clients_per_round=6, local_epochs=1, seed=1)
    uapdfl = run_mlp("uapdfl", data, config, num_neighbours=0)
    local = run_mlp("local", data, config)
    ids = list(data.client_ids)
    np.testing.assert_allclose(
        uapdfl.queries.client_models(ids), local.queries.client_models(ids), atol=1e-6
    )
    assert uapdfl.state.history[-1]["client_accuracy_mean"] == pytest.approx(
        local.state.history[-1]["client_accuracy_mean"]
    )
    assert uapdfl.state.history[-1]["floats_communicated"] == 0


def test_identical_data_keeps_uapdfl_with_fedavg_dfl() -> None:
    """Every peer holds the same examples: divergences stay small, dropout is frequent, and
    UA-PDFL stays within 2 points of FedAvg-DFL."""
    data = identical_data(6)
    config = TrainingConfig(rounds=4, clients_per_round=6, local_epochs=1, seed=0, eval_every=4)
    uapdfl = run_mlp("uapdfl", data, config, num_neighbours=2)
    fedavg = run_mlp("fedavg_dfl", data, config, num_neighbours=2)
    a = uapdfl.state.history[-1]["client_accuracy_mean"]
    b = fedavg.state.history[-1]["client_accuracy_mean"]
    assert abs(a - b) <= 0.02, (a, b)
    assert sum(r["peers_dropout"] for r in uapdfl.state.history[1:]) >= 6


@pytest.fixture(scope="module")
def two_groups() -> tuple[Experiment, Experiment]:
    """Digits in 2 label-permutation groups of 5 peers; each pulls 3 others per round. UA-PDFL
    with the constant th_I = 0.1: the calibrated default does not separate label-permutation
    groups (round 1 does not reveal them on the one X_unit input; docs/uapdfl.md)."""
    data = load_digits_clusters(num_clients=10, num_groups=2, seed=0)
    config = TrainingConfig(
        rounds=8, clients_per_round=10, local_epochs=2, learning_rate=0.1, seed=0, eval_every=4
    )
    return (
        run_mlp("uapdfl", data, config, num_neighbours=3, uapdfl_threshold=0.1),
        run_mlp("fedavg_dfl", data, config, num_neighbours=3),
    )


def test_divergence_is_lower_within_a_planted_group(
    two_groups: tuple[Experiment, Experiment],
) -> None:
    uapdfl, _ = two_groups
    ids = list(uapdfl.data.client_ids)
    unit = np.ones((1, *uapdfl.run.input_shape), np.float32)
    probs = uapdfl.queries.predict_probabilities(uapdfl.queries.client_models(ids), unit)[:, 0, :]
    groups = np.array([uapdfl.data.true_clusters[c] for c in ids])
    div = np.stack(
        [divergence(tf.constant(p, tf.float32), probs.astype(np.float32)) for p in probs]
    )
    same = groups[:, None] == groups[None, :]
    off = ~np.eye(len(ids), dtype=bool)
    for i in range(len(ids)):  # each peer is closer to its own group than to the other
        assert div[i][same[i] & off[i]].mean() < div[i][~same[i]].mean(), (i, div[i])


def test_uapdfl_beats_fedavg_dfl_on_two_planted_groups(
    two_groups: tuple[Experiment, Experiment],
) -> None:
    """Averaging both groups' classifiers (FedAvg-DFL) cannot fit two label mappings; UA-PDFL
    keeps each head with its own group. Margin: 0.05. Seen on seed 0: 0.82 against 0.75;
    FedAvg-DFL's peers are scored after their own local epochs, which re-fit the averaged
    head to their mapping, so the gap is smaller than a server-side FedAvg's would be."""
    uapdfl, fedavg = two_groups
    a = uapdfl.state.history[-1]["client_accuracy_mean"]
    b = fedavg.state.history[-1]["client_accuracy_mean"]
    assert a >= b + 0.05, (a, b)
    last = uapdfl.state.history[-1]
    assert last["peers_dropout"] + last["peers_partial"] + last["peers_personal_head"] == 10
    assert last["peers_dropout"] == 0  # the groups differ: some neighbour is always far


def test_queues_are_distinct_others_and_seeded() -> None:
    algorithm = make_algorithm("uapdfl", num_neighbours=4)
    data = load_digits_clusters(num_clients=8, num_groups=2, seed=0)
    exp = Experiment(
        data,
        model_spec("mlp", data.input_shape, data.num_classes, hidden_units=4),
        algorithm,
        TrainingConfig(rounds=1, clients_per_round=8, seed=5),
    )
    queues = algorithm.queues(exp.run, 3)
    assert queues.shape == (8, 4)
    for i, q in enumerate(queues):
        assert len(set(q.tolist())) == 4 and i not in q
    np.testing.assert_array_equal(queues, algorithm.queues(exp.run, 3))
    assert not np.array_equal(queues, algorithm.queues(exp.run, 4))
    with pytest.raises(ValueError, match="set --clients_per_round to the number of peers"):
        Experiment(
            data,
            exp.model,
            algorithm,
            TrainingConfig(rounds=1, clients_per_round=4, seed=5),
        ).start()
