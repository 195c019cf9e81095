"""DisPFL and CriticalFL-DFL, UA-PDFL's last two decentralized baselines: their math against
NumPy, equivalences with FedAvg-DFL, and what each must show in a run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.criticalfl import next_contacts
from tff_clustered.algorithms.dfl import PeerStep
from tff_clustered.algorithms.dispfl import (
    SparsePeerStep,
    active_counts,
    erk_densities,
    masked_tensors,
    next_mask,
)
from tff_clustered.data import load_digits_clusters
from tff_clustered.data.federated_data import FederatedData, from_arrays
from tff_clustered.federated import client_work
from tff_clustered.models import model_spec
from tff_clustered.orchestration import Experiment, TrainingConfig

pytestmark = pytest.mark.usefixtures("tff_context")


def run(
    algorithm: str, data: FederatedData, config: TrainingConfig, **options: object
) -> Experiment:
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(data, model, make_algorithm(algorithm, **options), config)
    exp.start()
    list(exp.rounds())
    return exp


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


def linear(
    weights: tuple, state: tuple, x: tf.Tensor, training: bool, seed: object = None
) -> tuple[tf.Tensor, tuple]:
    return tf.matmul(x, weights[0]) + weights[1], tuple(state)


def routed_inputs(
    kernels: list[list[float]], biases: list[list[float]], rows: list[int], round_num: int = 1
) -> client_work.ClientInputs:
    """A peer of a 1-input, 2-class linear model (kernel (1, 2), bias (2,)) with no training
    examples: what it returns is what it mixed."""
    k = tf.constant([[r] for r in kernels])
    b = tf.constant(biases)
    dataset = tf.data.Dataset.from_tensors({"x": tf.zeros([1, 1]), "y": tf.constant([0])})
    return client_work.ClientInputs(
        (k[0], b[0]), (), (), (), dataset.take(0), tf.constant(0.1), tf.constant(1.0),
        tf.constant([3, 0]), inbox=(k, b), inbox_weights=tf.constant([1.0, 2.0, 3.0]),
        inbox_rows=tf.constant(rows), round_num=tf.constant(round_num, tf.int64),
        total_rounds=tf.constant(10, tf.int64),
    )  # fmt: skip


def test_sparse_peer_averages_each_weight_over_the_masks_that_hold_it() -> None:
    kernels = [[1.0, 0.0], [3.0, 5.0], [0.0, 7.0]]  # own mask: first weight only
    biases = [[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]]
    step = SparsePeerStep(masked=(0,), active=(1,))
    out = step(linear, routed_inputs(kernels, biases, [4, 1, 7]))
    # held by rows 0 and 1: (1 + 3) / 2; the second weight is off the own mask
    np.testing.assert_allclose(out.weights[0].numpy(), [[2.0, 0.0]])
    np.testing.assert_allclose(out.weights[1].numpy(), np.mean(biases, 0))  # dense: all rows
    assert float(out.metrics["values_received"]) == 2 + 1 + 2 + 2  # non-zeros of rows 1, 2
    # a padding row (the peer's own row again) is not received
    padded = step(linear, routed_inputs(kernels, biases, [4, 1, 4]))
    np.testing.assert_allclose(padded.weights[0].numpy(), [[2.0, 0.0]])
    np.testing.assert_allclose(padded.weights[1].numpy(), [2.0, 3.0])
    assert float(padded.metrics["values_received"]) == 2 + 2
    # from round 2 on the peer updates its mask first: still one active weight
    later = step(linear, routed_inputs(kernels, biases, [4, 1, 7], round_num=3))
    assert int(np.count_nonzero(later.weights[0].numpy())) == 1
    assert float(later.metrics["mask_changes"]) in (0.0, 2.0)


def test_padded_rows_are_not_mixed_by_a_peer() -> None:
    """CriticalFL-DFL pads a short queue with the peer's own row: FedAvg-DFL's mixing over
    the rows it received only, and only those counted as received."""
    step = PeerStep("fedavg", head_start=1, input_shape=(1,))
    kernels = [[1.0, 2.0], [3.0, 6.0], [1.0, 2.0]]
    biases = [[0.0, 0.0], [4.0, 8.0], [0.0, 0.0]]
    inputs = routed_inputs(kernels, biases, [5, 2, 5])._replace(
        features=lambda w, s, x, head: x * w[0][0]
    )
    out = step(linear, inputs)
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


def identical_data(peers: int) -> FederatedData:
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:200], order[200:300]
    return from_arrays(
        "identical",
        {f"p{i:02d}": (x[train], y[train]) for i in range(peers)},
        {f"p{i:02d}": (x[test], y[test]) for i in range(peers)},
        10,
    )


IDENTICAL = TrainingConfig(rounds=3, clients_per_round=5, local_epochs=1, seed=2)


@pytest.fixture(scope="module")
def fedavg_dfl_identical() -> Experiment:
    return run("fedavg_dfl", identical_data(5), IDENTICAL, num_neighbours=2)


def test_dense_dispfl_is_fedavg_dfl(fedavg_dfl_identical: Experiment) -> None:
    """With density 1 no weight is masked and, peers holding equally many examples, DisPFL's
    count average is FedAvg-DFL's |D|-weighted one."""
    data = identical_data(5)
    dense = run("dispfl", data, IDENTICAL, num_neighbours=2, dispfl_density=1.0)
    ids = list(data.client_ids)
    np.testing.assert_allclose(
        dense.client_models(ids), fedavg_dfl_identical.client_models(ids), atol=1e-5
    )


def test_always_critical_criticalfl_is_fedavg_dfl(fedavg_dfl_identical: Experiment) -> None:
    data = identical_data(5)
    always = run("criticalfl_dfl", data, IDENTICAL, num_neighbours=2, criticalfl_threshold=-1e9)
    ids = list(data.client_ids)
    np.testing.assert_allclose(
        always.client_models(ids), fedavg_dfl_identical.client_models(ids), atol=1e-6
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
    exp = run("dispfl", data, config, num_neighbours=3)
    ids = list(data.client_ids)
    models = exp.client_models(ids)
    offsets = np.concatenate([[0], np.cumsum(exp.run.tensor_sizes)])
    masked = masked_tensors(exp.run.trainable_shapes)
    counts = active_counts([exp.run.trainable_shapes[t] for t in masked], 0.5)
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
    exp = run("criticalfl_dfl", data, config, num_neighbours=3)
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
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    exp = Experiment(data, model, make_algorithm(algorithm, num_neighbours=3, **options), config)
    exp.start()
    ids = list(exp.run.client_ids)
    rows = exp.rounds()
    while exp.state.round_num < 2:
        next(rows)
    snapshot = exp.client_models(ids).astype(np.float64)
    list(rows)
    sizes = np.array([data.train_sizes[c] for c in ids], np.float64)
    queues = exp.algorithm.queues(exp.run, 3)[:, :contacts]
    expected = mixed_by_hand(snapshot, sizes, queues)
    np.testing.assert_allclose(exp.client_models(ids), expected, atol=1e-5)
    assert exp.state.history[-1]["neighbours_mean"] == contacts
