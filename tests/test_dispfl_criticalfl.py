"""DisPFL and CriticalFL-DFL, UA-PDFL's last two decentralized baselines: their math against
NumPy, equivalences with FedAvg-DFL, and what each must show in a run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import mlp_experiment
from peers import identical_data, linear, peer_inputs, run_mlp

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import RunInfo
from tff_clustered.algorithms.criticalfl import next_contacts
from tff_clustered.algorithms.dispfl import (
    SparsePeerStep,
    active_counts,
    drop_fraction,
    erk_densities,
    masked_tensors,
    next_mask,
)
from tff_clustered.data import load_digits_clusters
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.peer_work import PeerStep
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.models import model_spec
from tff_clustered.models.split import classifier_layers
from tff_clustered.orchestration import Experiment

pytestmark = pytest.mark.usefixtures("tff_context")


# -- DisPFL's pieces ---------------------------------------------------------------------------


def test_erk_densities_keep_the_overall_density() -> None:
    shapes = [(64, 16), (16, 10), (3, 3, 8, 2)]
    densities = erk_densities(shapes, 0.5)
    sizes = np.array([np.prod(s) for s in shapes], float)
    assert float(np.dot(densities, sizes) / sizes.sum()) == pytest.approx(0.5)
    # density_l is proportional to sum(shape) / prod(shape): the smaller tensor is denser
    assert densities[1] > densities[0]
    ratio = densities[1] / densities[0]
    assert ratio == pytest.approx((26 / 160) / (80 / 1024))
    # a tiny tensor next to a large one would pass 1: it is made dense, the rest keep the budget
    dense = erk_densities([(1000, 1000), (2, 2)], 0.5)
    assert dense[1] == 1.0 and dense[0] == pytest.approx((0.5 * 1_000_004 - 4) / 1e6)
    assert masked_tensors([(64, 16), (16,), (3, 3, 1, 4), (4,)]) == (0, 2)
    assert active_counts([(10, 10)], 0.3) == (30,)
    # the budget covers every trainable tensor: a dense bias leaves the kernel less
    assert active_counts([(10, 10), (10,)], 0.5) == (45,)


def test_next_mask_prunes_the_smallest_and_regrows_to_the_count() -> None:
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(8, 5)).astype(np.float32)
    mask = np.zeros(40, bool)
    mask[rng.choice(40, 20, replace=False)] = True
    mask = mask.reshape(8, 5)
    seed = tf.constant([4, 2])
    new = next_mask(tf.constant(weights * mask), tf.constant(mask), 20, tf.constant(0.25), seed)
    new = new.numpy()
    assert new.sum() == 20
    magnitudes = np.abs(weights[mask])
    smallest = np.abs(weights) <= np.sort(magnitudes)[4]  # ceil(0.25 * 20) = 5 pruned
    kept = mask & new
    # the 15 largest active weights are kept; the regrown 5 come from the inactive or pruned
    assert (mask & ~smallest <= new).all() and kept.sum() >= 15
    again = next_mask(tf.constant(weights * mask), tf.constant(mask), 20, tf.constant(0.25), seed)
    np.testing.assert_array_equal(again.numpy(), new)  # seeded
    other = next_mask(
        tf.constant(weights * mask), tf.constant(mask), 20, tf.constant(0.25), tf.constant([5, 2])
    )
    assert not np.array_equal(other.numpy(), new)
    # no pruning: the mask stays; a mask below its count grows back to it
    same = next_mask(tf.constant(weights * mask), tf.constant(mask), 20, tf.constant(0.0), seed)
    np.testing.assert_array_equal(same.numpy(), mask)
    grown = next_mask(tf.constant(weights * mask), tf.constant(mask), 24, tf.constant(0.0), seed)
    assert grown.numpy().sum() == 24 and (mask <= grown.numpy()).all()
    # exactly ceil(0.25 * 20) = 5 pruned: with a count of 15 nothing regrows, and what is
    # left is the 15 largest active weights
    pruned = next_mask(tf.constant(weights * mask), tf.constant(mask), 15, tf.constant(0.25), seed)
    largest = np.abs(weights * mask) >= np.sort(magnitudes)[5]
    np.testing.assert_array_equal(pruned.numpy(), mask & largest)


def test_sparse_peer_averages_each_weight_over_the_masks_that_hold_it() -> None:
    own, other, third = [1.0, 0.0, 1.0, 2.0], [3.0, 5.0, 3.0, 4.0], [0.0, 7.0, 5.0, 9.0]
    step = SparsePeerStep(masked=(0,), active=(1,))  # own mask: the first kernel weight
    out = step(linear, peer_inputs([own, other, third], [1.0, 2.0, 3.0], [4, 1, 7]))
    # held by rows 0 and 1: (1 + 3) / 2; the second weight is off the own mask
    np.testing.assert_allclose(out.weights[0].numpy(), [[2.0, 0.0]])
    np.testing.assert_allclose(out.weights[1].numpy(), [3.0, 5.0])  # dense: every row
    # a padding row (the server row of the peer's own, here with other values to show that
    # rows are left out by their index) is not received
    padded = step(linear, peer_inputs([own, other, third], [1.0, 2.0, 3.0], [4, 1, 4]))
    np.testing.assert_allclose(padded.weights[0].numpy(), [[2.0, 0.0]])
    np.testing.assert_allclose(padded.weights[1].numpy(), [2.0, 3.0])


def test_sparse_peer_counts_the_sparse_values_it_receives() -> None:
    """Masked tensors travel as their non-zero values, dense ones whole (a zero bias too)."""
    own, other, third = [1.0, 0.0, 0.0, 2.0], [3.0, 5.0, 0.0, 4.0], [0.0, 7.0, 5.0, 0.0]
    step = SparsePeerStep(masked=(0,), active=(1,))
    out = step(linear, peer_inputs([own, other, third], [1.0, 2.0, 3.0], [4, 1, 7]))
    assert float(out.metrics["values_received"]) == (2 + 2) + (1 + 2)
    padded = step(linear, peer_inputs([own, other, third], [1.0, 2.0, 3.0], [4, 1, 4]))
    assert float(padded.metrics["values_received"]) == 2 + 2


def test_the_mask_update_anneals_from_the_first_finished_round() -> None:
    """The prune fraction of the round just finished, t = r - 2 for round r (0-based as the
    paper's): alpha at t = 0, 0 at t = T; round 1 updates nothing."""
    assert float(drop_fraction(0.5, tf.constant(0), tf.constant(10))) == pytest.approx(0.5)
    assert float(drop_fraction(0.5, tf.constant(5), tf.constant(10))) == pytest.approx(0.25)
    assert float(drop_fraction(0.5, tf.constant(10), tf.constant(10))) == pytest.approx(0.0)
    own = [[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]]
    kernels, bias = tf.constant([[own[0]]]), tf.constant([[0.0]])
    step = SparsePeerStep(masked=(0,), active=(4,), anneal=1.0)

    def changes(round_num: int, total_rounds: int) -> float:
        inputs = peer_inputs([[1.0, 1.0, 0.0, 0.0]], [1.0], [0], round_num, total_rounds)
        routed = inputs.routed._replace(rows=(kernels, bias), weights=tf.constant([1.0]))
        inputs = inputs._replace(weights=(kernels[0], bias[0]), routed=routed)
        return float(step(dense_forward, inputs).metrics["mask_changes"])

    assert changes(1, 2) == 0  # round 1: the initial mask
    assert changes(2, 1) > 0  # t = 0 of T = 1: alpha = 1, every active weight pruned
    assert changes(3, 1) == 0  # t = 1 = T: nothing pruned


def dense_forward(
    weights: tuple, state: tuple, x: tf.Tensor, training: bool, seed: object = None
) -> tuple[tf.Tensor, tuple]:
    return tf.matmul(tf.ones([tf.shape(x)[0], 1]), weights[0]) + weights[1], tuple(state)


def test_padded_rows_are_not_mixed_by_a_peer() -> None:
    """CriticalFL-DFL pads a short queue with the peer's own row: FedAvg-DFL's mixing over
    the rows it received only, and only those counted."""
    step = PeerStep(head_start=1)
    rows = [[1.0, 2.0, 0.0, 0.0], [3.0, 6.0, 4.0, 8.0], [1.0, 2.0, 0.0, 0.0]]
    out = step(linear, peer_inputs(rows, [1.0, 2.0, 3.0], [5, 2, 5]))
    # |D| weights 1 (own) and 2 (row 1): (1 * own + 2 * row 1) / 3
    np.testing.assert_allclose(out.weights[0].numpy(), [[7 / 3, 14 / 3]], rtol=1e-6)
    np.testing.assert_allclose(out.weights[1].numpy(), [8 / 3, 16 / 3], rtol=1e-6)
    assert int(out.metrics["neighbours_received"]) == 1
    assert float(out.metrics["values_received"]) == 4.0  # one whole model: 2 + 2 values


def test_criticalfl_contacts_grow_in_a_critical_period_and_shrink_after() -> None:
    contacts = np.array([4, 4, 2, 1, 3])
    norms = np.array([5.0, 5.0, 6.0, 1.0, 2.0])
    last = np.array([np.nan, 4.0, 5.0, 2.0, 2.0])
    new, critical = next_contacts(
        contacts, norms, last, threshold=0.01, factor=2.0, most=5, fewest=1
    )
    # first round: critical; +25 %: critical (4 -> 5, capped); +20 %: 2 -> 4;
    # a fall: 1 stays at the floor; no change (0 % < 1 %): 3 -> 1
    np.testing.assert_array_equal(critical, [True, True, True, False, False])
    np.testing.assert_array_equal(new, [5, 5, 4, 1, 1])


# -- runs --------------------------------------------------------------------------------------


IDENTICAL = TrainingConfig(rounds=3, clients_per_round=5, local_epochs=1, seed=2)


@pytest.fixture(scope="module")
def fedavg_dfl_identical() -> Experiment:
    return run_mlp("fedavg_dfl", identical_data(5, 200), IDENTICAL, num_neighbours=2)


def test_dense_dispfl_is_fedavg_dfl(fedavg_dfl_identical: Experiment) -> None:
    """With density 1 no weight is masked and, peers holding equally many examples, DisPFL's
    count average is FedAvg-DFL's |D|-weighted one."""
    data = identical_data(5, 200)
    dense = run_mlp("dispfl", data, IDENTICAL, num_neighbours=2, dispfl_density=1.0)
    ids = list(data.client_ids)
    np.testing.assert_allclose(
        dense.queries.client_models(ids), fedavg_dfl_identical.queries.client_models(ids), atol=1e-5
    )


def test_always_critical_criticalfl_is_fedavg_dfl(fedavg_dfl_identical: Experiment) -> None:
    data = identical_data(5, 200)
    always = run_mlp("criticalfl_dfl", data, IDENTICAL, num_neighbours=2, criticalfl_threshold=-1e9)
    ids = list(data.client_ids)
    np.testing.assert_allclose(
        always.queries.client_models(ids),
        fedavg_dfl_identical.queries.client_models(ids),
        atol=1e-6,
    )
    assert all(r["neighbours_mean"] == 2 for r in always.state.history[1:])


@pytest.fixture(scope="module")
def planted() -> tuple[FederatedData, TrainingConfig]:
    data = load_digits_clusters(num_clients=8, num_groups=2, seed=0)
    config = TrainingConfig(
        rounds=6, clients_per_round=8, local_epochs=2, learning_rate=0.1, seed=0, eval_every=3
    )
    return data, config


def test_dispfl_keeps_every_peer_on_its_own_sparse_mask(
    planted: tuple[FederatedData, TrainingConfig],
) -> None:
    data, config = planted
    exp = run_mlp("dispfl", data, config, num_neighbours=3)
    ids = list(data.client_ids)
    models = exp.queries.client_models(ids)
    offsets = np.concatenate([[0], np.cumsum(exp.run.tensor_sizes)])
    masked = masked_tensors(exp.run.trainable_shapes)
    counts = active_counts(exp.run.trainable_shapes, 0.5)
    patterns = []
    for t, count in zip(masked, counts):
        segment = models[:, offsets[t] : offsets[t + 1]]
        # every peer trained on its count of active kernel weights; a regrown weight no
        # neighbour held starts at 0, and stays 0 when its input is always 0 (the digits'
        # blank border pixels): it leaves the published pattern until the next regrowth
        nonzero = np.count_nonzero(segment, axis=1)
        assert (nonzero <= count).all() and (nonzero >= 0.95 * count).all(), (nonzero, count)
        patterns.append(segment != 0)
    first = np.concatenate(patterns, axis=1)
    assert len({row.tobytes() for row in first}) == len(ids)  # personalized masks
    history = exp.state.history
    assert history[1]["mask_changes_mean"] == 0 and history[2]["mask_changes_mean"] > 0
    # the masks settle as the prune fraction anneals
    assert history[-1]["mask_changes_mean"] < history[2]["mask_changes_mean"]
    # sparse models travel: at most the density's share of the kernels plus the dense rest
    fedavg_values = 3 * models.shape[1] * len(ids)
    assert history[-1]["floats_communicated"] < 0.6 * fedavg_values
    assert history[-1]["client_accuracy_mean"] >= 0.6  # it learns (seen 0.67 - 0.71 at 8 rounds)


def test_criticalfl_pulls_fewer_peers_once_the_gradient_norm_falls(
    planted: tuple[FederatedData, TrainingConfig],
) -> None:
    data, config = planted
    exp = run_mlp("criticalfl_dfl", data, config, num_neighbours=3)
    history = exp.state.history[1:]
    assert history[0]["neighbours_mean"] == 3 and history[0]["criticalfl_critical_peers"] == 8
    assert min(r["neighbours_mean"] for r in history) < 3
    assert history[-1]["client_accuracy_mean"] >= 0.6


def mixed_by_hand(snapshot: np.ndarray, sizes: np.ndarray, queues: np.ndarray) -> np.ndarray:
    """A reference peer-to-peer round without TFF: each peer's |D|-weighted mean of its own
    and its neighbours' models, all read from the same snapshot (the end of the last round)."""
    expected = np.empty_like(snapshot)
    for i, queue in enumerate(queues):
        rows = np.concatenate([[i], queue])
        expected[i] = np.average(snapshot[rows], axis=0, weights=sizes[rows])
    return expected


@pytest.mark.parametrize(
    "algorithm, options, contacts",
    [("fedavg_dfl", {}, 3), ("criticalfl_dfl", {"criticalfl_threshold": 1e9}, 1)],
)
def test_routed_rounds_equal_a_reference_p2p_simulation_of_the_snapshot(
    planted: tuple[FederatedData, TrainingConfig],
    algorithm: str,
    options: dict,
    contacts: int,
) -> None:
    """Round 3 of 3, its learning rate ~0 (exponential decay 1e-6 per round): every peer's model
    is its mixing of the round-2 mailbox, which no peer's round-3 result has overwritten.
    CriticalFL-DFL, never critical after round 1, pulls from the first 3 // 2 = 1 of its 3."""
    data, _ = planted
    config = TrainingConfig(
        rounds=3, clients_per_round=8, local_epochs=1, learning_rate=0.1, seed=5,
        lr_schedule="exponential", lr_decay=1e-6, eval_every=3,
    )  # fmt: skip
    exp = mlp_experiment(algorithm, data, config, num_neighbours=3, **options)
    ids = list(exp.run.client_ids)
    rows = exp.rounds()
    while exp.state.round_num < 2:
        next(rows)
    snapshot = exp.queries.client_models(ids).astype(np.float64)
    list(rows)
    sizes = np.array([data.train_sizes[c] for c in ids], np.float64)
    queues = exp.algorithm.queues(exp.run, 3)[:, :contacts]
    expected = mixed_by_hand(snapshot, sizes, queues)
    np.testing.assert_allclose(exp.queries.client_models(ids), expected, atol=1e-5)
    assert exp.state.history[-1]["neighbours_mean"] == contacts


def test_batchnorm_statistics_mix_with_g_or_stay_local() -> None:
    """A state tensor (a BatchNorm moving mean) is averaged with g's weights, or kept as the
    peer's own with `local_statistics`; the trainable tensors mix the same either way."""
    rows = [[1.0, 2.0, 0.0, 0.0], [3.0, 6.0, 4.0, 8.0]]
    inputs = peer_inputs(rows, [1.0, 3.0])
    stats = tf.constant([[1.0, 1.0], [5.0, 9.0]])
    routed = inputs.routed._replace(rows=(*inputs.routed.rows, stats))
    inputs = inputs._replace(state=(stats[0],), routed=routed)
    mixed = PeerStep(head_start=1)(linear, inputs)
    np.testing.assert_allclose(mixed.state[0].numpy(), [4.0, 7.0])  # (1 * own + 3 * row 1) / 4
    local = PeerStep(head_start=1, local_statistics=True)
    kept = local(linear, inputs)
    np.testing.assert_allclose(kept.state[0].numpy(), [1.0, 1.0])
    np.testing.assert_allclose(kept.weights[0].numpy(), mixed.weights[0].numpy())
    sparse = SparsePeerStep(masked=(0,), active=(2,), local_statistics=True)(linear, inputs)
    np.testing.assert_allclose(sparse.state[0].numpy(), [1.0, 1.0])


def test_the_head_is_the_classifier_after_the_last_convolution() -> None:
    """UA-PDFL's prose split by default: h = the FC layers after the last conv/BN layer."""
    tsdp_cnn = model_spec("tsdp_cnn", (64,), 10, image_shape=(8, 8, 1)).build()
    resnet = model_spec("resnet18", (32, 32, 3), 10).build()
    mlp = model_spec("mlp", (64,), 10).build()
    assert [classifier_layers(m) for m in (tsdp_cnn, resnet, mlp)] == [2, 1, 0]

    def run_info(layer_sizes: tuple[int, ...], classifier: int) -> RunInfo:
        return RunInfo(
            client_ids=("a", "b"), train_sizes={"a": 1, "b": 1}, seed=0, clients_per_round=2,
            layer_sizes=layer_sizes, tensor_sizes=(1,) * sum(layer_sizes),
            num_trainable_values=sum(layer_sizes), initial_model=np.zeros(sum(layer_sizes)),
            classifier_layers=classifier,
        )  # fmt: skip

    uapdfl = make_algorithm("uapdfl")
    assert uapdfl.head_start(run_info((2, 2, 2, 2), 2)) == 4  # tsdp_cnn: conv, conv | fc, fc
    assert uapdfl.head_start(run_info((2, 2), 0)) == 2  # an MLP: its top layer
    assert make_algorithm("uapdfl", dfl_head_layers=3).head_start(run_info((2, 2, 2, 2), 2)) == 2
    with pytest.raises(ValueError, match="lower --dfl_head_layers"):
        make_algorithm("uapdfl", dfl_head_layers=5).head_start(run_info((2, 2, 2, 2), 2))
