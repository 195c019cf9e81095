"""FedTSDP's server math (Zhu et al.: JS Eqs. 3-5, Hopkins Eq. 6, sampling Eqs. 7-8, weight
distance Eqs. 9-10, two DBSCAN stages, Eq. 11 schedule) against NumPy/SciPy references."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from scipy.spatial.distance import cdist, jensenshannon

from tff_clustered import clustering
from tff_clustered.clustering import density


def softmax_outputs(rng: np.random.Generator, m: int, b: int, c: int) -> np.ndarray:
    logits = rng.normal(size=(m, b, c)) * 2
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------- Jensen-Shannon (Eqs. 3-5)


def test_js_divergence_matches_scipy_reference() -> None:
    rng = np.random.default_rng(0)
    p = softmax_outputs(rng, 5, 7, 4)
    p[0, 0] = [1.0, 0.0, 0.0, 0.0]  # 0 log 0 = 0
    p[3, 2] = [0.0, 0.5, 0.5, 0.0]
    js = clustering.js_divergence_matrix(p)
    assert js.dtype == np.float64 and js.shape == (5, 5)
    for i in range(5):
        for j in range(5):
            # scipy returns the distance (sqrt) with base e by default: square it.
            want = np.mean([jensenshannon(p[i, s], p[j, s]) ** 2 for s in range(7)])
            assert js[i, j] == pytest.approx(want, abs=1e-12)


def test_js_divergence_properties() -> None:
    p = softmax_outputs(np.random.default_rng(1), 6, 9, 5)
    p[4] = p[1]  # identical outputs
    js = clustering.js_divergence_matrix(p)
    assert np.array_equal(js, js.T) and np.all(np.diag(js) == 0)
    assert js[1, 4] == 0.0 and np.all(js >= 0) and js.max() <= np.log(2)
    # Mean over rows == JS of the flattened B*C vectors, each divided by B.
    flat = p.reshape(6, -1) / 9
    assert js[0, 2] == pytest.approx(jensenshannon(flat[0], flat[2]) ** 2, abs=1e-12)
    # Disjoint supports reach the bound ln 2 exactly (natural log, no sqrt).
    disjoint = np.zeros((2, 3, 4))
    disjoint[0, :, :2] = 0.5
    disjoint[1, :, 2:] = 0.5
    assert clustering.js_divergence_matrix(disjoint)[0, 1] == pytest.approx(np.log(2), abs=1e-15)


def test_js_divergence_is_vectorised_and_validates() -> None:
    p = softmax_outputs(np.random.default_rng(2), 20, 50, 100)
    start = time.perf_counter()
    js = clustering.js_divergence_matrix(p)
    assert time.perf_counter() - start < 2.0  # ~10 ms when vectorised
    assert js.shape == (20, 20) and np.array_equal(js, js.T)
    assert clustering.js_divergence_matrix(p[:1]).tolist() == [[0.0]]
    with pytest.raises(ValueError, match="models, samples, classes"):
        clustering.js_divergence_matrix(p[0])
    with pytest.raises(ValueError, match="non-negative"):
        clustering.js_divergence_matrix(-p)


# ------------------------------------------------------------------------- Hopkins (Eq. 6)


def reference_hopkins(points: np.ndarray, seed: int, size: int) -> float:
    """Eq. 6 written directly with cdist, drawing from the RNG in the documented order."""
    rng = np.random.default_rng(seed)
    real = rng.choice(len(points), size, replace=False)
    synthetic = rng.uniform(points.min(0), points.max(0), size=(size, points.shape[1]))
    v = sum(
        min(np.linalg.norm(points[k] - points[j]) for j in range(len(points)) if j != k)
        for k in real
    )
    z = cdist(synthetic, points).min(axis=1).sum()
    return z / (z + v)


def test_hopkins_matches_direct_formula_and_default_sample_size() -> None:
    points = np.random.default_rng(3).normal(size=(20, 30))
    # m~ defaults to max(1, round(0.1 m)) = 2 for m = 20.
    assert clustering.hopkins_statistic(points, np.random.default_rng(7)) == pytest.approx(
        reference_hopkins(points, 7, 2), rel=1e-12
    )
    got = clustering.hopkins_statistic(points, np.random.default_rng(8), sample_size=6)
    assert got == pytest.approx(reference_hopkins(points, 8, 6), rel=1e-12)
    # A sample size above m is capped at m.
    capped = clustering.hopkins_statistic(points[:5], np.random.default_rng(9), sample_size=50)
    assert capped == pytest.approx(reference_hopkins(points[:5], 9, 5), rel=1e-12)


def test_hopkins_is_about_half_without_structure() -> None:
    rng = np.random.default_rng(1)
    uniform = [
        clustering.hopkins_statistic(rng.random((20, 500)), np.random.default_rng(s))
        for s in range(20)
    ]
    assert 0.45 < np.mean(uniform) < 0.6


@pytest.mark.parametrize("groups", [2, 3, 4])
def test_hopkins_is_high_for_well_separated_groups(groups: int) -> None:
    rng = np.random.default_rng(groups)
    centers = rng.random((groups, 500)) * 10
    labels = np.arange(20) % groups
    grouped = centers[labels] + rng.normal(0, 0.05, (20, 500))
    values = [clustering.hopkins_statistic(grouped, np.random.default_rng(s)) for s in range(5)]
    assert min(values) > 0.75


def test_hopkins_never_counts_a_point_as_its_own_neighbour() -> None:
    # Two far-apart pairs: every real point's nearest *other* point is its partner at distance
    # 1, so sum v = 4 with all 4 points sampled. Counting self-distances (0) would give H = 1.
    points = np.array([[0.0, 0.0], [1.0, 0.0], [100.0, 100.0], [101.0, 100.0]])
    h = clustering.hopkins_statistic(points, np.random.default_rng(3), sample_size=4)
    rng = np.random.default_rng(3)
    rng.choice(4, 4, replace=False)
    z = cdist(rng.uniform(points.min(0), points.max(0), (4, 2)), points).min(1).sum()
    assert h == pytest.approx(z / (z + 4.0), rel=1e-12) and h < 1


def test_hopkins_degenerate_cases() -> None:
    rng = np.random.default_rng(0)
    assert clustering.hopkins_statistic(np.zeros((0, 3)), rng) == 0.5
    assert clustering.hopkins_statistic(np.ones((1, 3)), rng) == 0.5  # m < 2
    assert clustering.hopkins_statistic(np.ones((5, 3)), rng) == 0.5  # zero denominator
    with pytest.raises(ValueError, match="sample_size"):
        clustering.hopkins_statistic(np.ones((5, 3)), rng, sample_size=0)
    with pytest.raises(ValueError, match=r"\(m, d\)"):
        clustering.hopkins_statistic(np.ones(5), rng)


# ------------------------------------------------------------- weight distance (Eqs. 9-10)


def test_weight_distance_is_euclidean_without_the_constant() -> None:
    w = np.random.default_rng(2).normal(size=(6, 50))
    d = clustering.weight_distance_matrix(w, 0.0)
    np.testing.assert_allclose(d, cdist(w, w), rtol=1e-12, atol=1e-12)
    assert np.all(np.diag(d) == 0) and np.array_equal(d, d.T)


def test_weight_distance_upper_triangle_with_the_constant_mirrored() -> None:
    w = np.random.default_rng(3).normal(size=(5, 40))
    upsilon = 0.3  # large enough for ||a - b + u e|| != ||b - a + u e|| to show
    d = clustering.weight_distance_matrix(w, upsilon)
    for i in range(5):
        for j in range(i + 1, 5):
            want = np.linalg.norm(w[i] - w[j] + upsilon)
            assert d[i, j] == pytest.approx(want, rel=1e-12) and d[j, i] == d[i, j]
            assert abs(want - np.linalg.norm(w[j] - w[i] + upsilon)) > 1e-3
    assert np.all(np.diag(d) == 0)
    # Default upsilon 1e-6 (PyTorch's pairwise_distance eps).
    d_default = clustering.weight_distance_matrix(w)
    assert d_default[0, 1] == pytest.approx(np.linalg.norm(w[0] - w[1] + 1e-6), rel=1e-14)


def test_weight_distance_on_float32_across_blocks_without_an_m_m_d_array() -> None:
    rng = np.random.default_rng(4)
    m, d = 20, 3 * density._DISTANCE_CHUNK + 123  # several column blocks plus a remainder
    w = rng.normal(size=(m, d)).astype(np.float32)
    w[1] = w[0] + np.float32(1e-3)  # nearly equal rows: no Gram-matrix cancellation
    tracemalloc.start()
    got = clustering.weight_distance_matrix(w, 0.0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < m * d * 8  # far below one float64 copy of w, let alone m * m * d
    w64 = w.astype(np.float64)
    np.testing.assert_allclose(got, cdist(w64, w64), rtol=1e-12, atol=1e-12)
    assert got[0, 1] == pytest.approx(np.linalg.norm(w64[0] - w64[1]), rel=1e-10)
    with pytest.raises(ValueError, match=r"\(m, d\)"):
        clustering.weight_distance_matrix(w[0])


# ----------------------------------------------------------------------- DBSCAN and stages


def test_dbscan_noise_points_become_singletons_in_first_appearance_order() -> None:
    # Positions on a line: 0 noise, (1, 2) pair, 3 noise, (4, 5) pair, 6 noise.
    x = np.array([0.0, 10.0, 10.25, 20.0, 30.0, 30.25, 40.0])[:, None]
    labels = clustering.dbscan_clusters(cdist(x, x), eps=0.5)
    assert labels.tolist() == [0, 1, 1, 2, 3, 3, 4]
    # min_samples counts the point itself, neighbourhood is <= eps (0.25 is exact in binary).
    assert clustering.dbscan_clusters(cdist(x, x), eps=0.25).tolist() == [0, 1, 1, 2, 3, 3, 4]
    assert clustering.dbscan_clusters(cdist(x, x), eps=0.2).tolist() == list(range(7))
    assert clustering.dbscan_clusters(cdist(x, x), eps=0.5, min_samples=3).tolist() == list(
        range(7)
    )
    assert clustering.dbscan_clusters(np.zeros((0, 0)), eps=1.0).tolist() == []
    with pytest.raises(ValueError, match="square"):
        clustering.dbscan_clusters(np.zeros((2, 3)), eps=1.0)
    with pytest.raises(ValueError, match="eps > 0"):
        clustering.dbscan_clusters(np.zeros((2, 2)), eps=0.0)


def planted_clients() -> tuple[np.ndarray, np.ndarray]:
    """9 clients: outputs on classes 0-4 (clients 0-4) or 5-9 (clients 5-7); client 8 random.
    Weights: clients 3-4 form a blob far from 0-2; client 8 far from everyone."""
    rng = np.random.default_rng(4)
    probs = np.full((9, 6, 10), 1e-3)
    probs[:5, :, :5] = 1.0
    probs[5:8, :, 5:] = 1.0
    probs[8] = rng.dirichlet(np.ones(10), 6)
    probs /= probs.sum(-1, keepdims=True)
    weights = rng.normal(0, 0.1, (9, 20))
    weights[3:5] += 10.0
    weights[8] += 50.0
    return clustering.js_divergence_matrix(probs), clustering.weight_distance_matrix(weights)


def test_two_stages_recover_planted_groups() -> None:
    js, wd = planted_clients()
    labels = clustering.two_stage_clusters(js, wd, eps1=0.15, eps2=3.5)
    assert labels.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3]


def test_stage_ablations() -> None:
    js, wd = planted_clients()
    only_js = clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="js")
    assert only_js.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 2]
    only_weights = clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="weights")
    assert only_weights.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 2]


def test_two_stage_labels_are_in_first_appearance_order() -> None:
    # Stage 1: {0, 2, 4} and {1, 3}; stage 2 splits {0, 2, 4} into {0} and {2, 4}. Numbering
    # sub-clusters group by group would give [0, 2, 1, 2, 1].
    group = np.array([0, 1, 0, 1, 0])
    js = np.where(group[:, None] == group[None, :], 0.01, 0.5)
    np.fill_diagonal(js, 0.0)
    x = np.array([0.0, 5.0, 100.0, 5.5, 100.5])[:, None]
    labels = clustering.two_stage_clusters(js, cdist(x, x), eps1=0.15, eps2=3.5)
    assert labels.tolist() == [0, 1, 2, 1, 2]


def test_two_stage_validation() -> None:
    js, wd = planted_clients()
    with pytest.raises(ValueError, match="stages"):
        clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="three")
    with pytest.raises(ValueError, match="same size"):
        clustering.two_stage_clusters(js, wd[:-1, :-1], 0.15, 3.5)
    with pytest.raises(ValueError, match="same size"):
        clustering.two_stage_clusters(js[:, :-1], wd, 0.15, 3.5)


# ------------------------------------------------------------ amended sampling (Eqs. 7-8)


def test_draw_public_batch_is_seeded_weighted_and_without_replacement() -> None:
    n, b = 10_000, 50
    w = np.full(n, 1 / n)
    batch = clustering.draw_public_batch(w, b, np.random.default_rng(0))
    assert len(batch) == b and len(np.unique(batch)) == b and np.all(np.diff(batch) > 0)
    assert np.array_equal(batch, clustering.draw_public_batch(w, b, np.random.default_rng(0)))
    assert not np.array_equal(batch, clustering.draw_public_batch(w, b, np.random.default_rng(1)))
    # Weights steer the draw: zero weight is never drawn, B of 60 positive ones always are.
    skewed = np.zeros(n)
    skewed[:60] = np.arange(1, 61)
    drawn = clustering.draw_public_batch(skewed, b, np.random.default_rng(2))
    assert len(np.unique(drawn)) == b and drawn.max() < 60
    assert clustering.draw_public_batch(w[:30], b, np.random.default_rng(0)).tolist() == list(
        range(30)
    )
    with pytest.raises(ValueError, match="batch_size"):
        clustering.draw_public_batch(w, 0, np.random.default_rng(0))


def test_amended_sampling_concentrates_on_the_used_batch() -> None:
    n, b = 10_000, 50
    w = np.full(n, 1 / n)
    batch = clustering.draw_public_batch(w, b, np.random.default_rng(0))
    new = clustering.amend_sampling_weights(w, batch)
    assert new is not w and np.all(w == 1 / n)  # a new array, the input untouched
    assert new.sum() == pytest.approx(1.0, abs=1e-12)
    others = np.setdiff1d(np.arange(n), batch)
    assert np.all(new[others] == new[others[0]]) and np.all(new[batch] == new[batch[0]])
    assert new[batch[0]] > new[others[0]]
    # Eq. 7 increment N / B = 200 per batch sample, then Eq. 8.
    assert new[batch].sum() == pytest.approx((n + b / n) / (n + 1), rel=1e-12)
    assert new[batch[0]] == pytest.approx((1 / n + n / b) / (1 + n), rel=1e-12)
    # The next draw is (almost surely) the same batch: literal Eqs. 7-8 lock it in.
    again = clustering.draw_public_batch(new, b, np.random.default_rng(5))
    assert len(np.intersect1d(again, batch)) >= b - 1


def test_amended_sampling_custom_increment_and_validation() -> None:
    w = np.array([0.1, 0.2, 0.3, 0.4])
    new = clustering.amend_sampling_weights(w, np.array([1, 3]), increment=1.0)
    np.testing.assert_allclose(new, np.array([0.1, 1.2, 0.3, 1.4]) / 3.0, rtol=1e-12)
    np.testing.assert_allclose(clustering.amend_sampling_weights(w, [2], increment=0.0), w)
    with pytest.raises(ValueError, match="empty"):
        clustering.amend_sampling_weights(w, np.array([], np.int64))
    with pytest.raises(ValueError, match="distinct"):
        clustering.amend_sampling_weights(w, [1, 1])
    with pytest.raises(ValueError, match="distinct"):
        clustering.amend_sampling_weights(w, [4])


def test_raised_sampling_weights_cannot_collapse_onto_one_batch() -> None:
    n, b = 10_000, 50
    w = np.ones(n)
    batch = clustering.draw_public_batch(w, b, np.random.default_rng(0))
    raised = clustering.raise_sampling_weights(w, batch)
    assert np.all(w == 1.0) and np.all(raised[batch] == 1 + n / b)
    share = raised[batch].sum() / raised.sum()
    assert share == pytest.approx((b + n) / (2 * n), rel=1e-12)  # about half, not 1 - 1/n
    # However often the same batch triggers, it keeps that share; other batches dilute it.
    again = clustering.raise_sampling_weights(raised, batch)
    np.testing.assert_array_equal(again, raised)
    w = raised
    for seed in range(1, 20):
        w = clustering.raise_sampling_weights(
            w, clustering.draw_public_batch(w, b, np.random.default_rng(seed))
        )
    assert w[batch].sum() / w.sum() <= share
    assert w.max() == 1 + n / b
    with pytest.raises(ValueError, match="distinct"):
        clustering.raise_sampling_weights(w, [1, 1])


def trained_client_outputs(partition: str, seed: int = 0) -> np.ndarray:
    """Softmax outputs (10 clients, 50 public digits, 10 classes) of logistic regressions
    trained on each client's share of the digits: real trained models' outputs."""
    from sklearn.linear_model import LogisticRegression

    from tff_clustered.data import load_dataset

    data = load_dataset("digits_dirichlet", seed=seed, partition=partition, num_clients=10)
    public = data.public_x[:50].reshape(50, -1)
    outputs = []
    for c in data.client_ids:
        arrays = data.arrays("train", c)
        x, y = arrays["x"], arrays["y"]
        model = LogisticRegression(max_iter=300).fit(x.reshape(len(x), -1), y)
        probs = np.zeros((50, 10))
        probs[:, model.classes_] = model.predict_proba(public)
        outputs.append(probs)
    return np.stack(outputs).reshape(10, -1)


@pytest.mark.parametrize("partition", ["dirichlet", "pathological"])
def test_hopkins_estimate_decides_by_the_threshold_not_the_draw(partition: str) -> None:
    outputs = trained_client_outputs(partition)
    single = [clustering.hopkins_statistic(outputs, np.random.default_rng(s)) for s in range(200)]
    pooled = [clustering.hopkins_estimate(outputs, np.random.default_rng(s))[0] for s in range(60)]
    # m = 10 gives m~ = 1: one draw spreads widely; the pooled estimate is tight.
    assert np.std(single) >= 0.02, np.std(single)
    assert np.std(pooled) <= 0.01, np.std(pooled)
    assert abs(np.mean(pooled) - np.mean(single)) <= 0.05
    # The same trigger decision, whatever the draw, for any h_th not within 3 std of H.
    for threshold in (0.55, 0.6, 0.65, 0.7, 0.75):
        if abs(np.mean(pooled) - threshold) > 3 * max(np.std(pooled), 0.005):
            assert len({h > threshold for h in pooled}) == 1, threshold


def test_hopkins_estimate_validation_and_degenerate_cases() -> None:
    rng = np.random.default_rng(0)
    assert clustering.hopkins_estimate(np.ones((1, 3)), rng) == (0.5, 0)
    assert clustering.hopkins_estimate(np.ones((5, 3)), rng)[0] == 0.5
    with pytest.raises(ValueError, match="target_std"):
        clustering.hopkins_estimate(np.ones((5, 3)), rng, target_std=0)
    grouped = np.repeat(np.eye(4) * 10, 5, axis=0) + rng.normal(0, 0.01, (20, 4))
    h, draws = clustering.hopkins_estimate(grouped, rng)
    assert h > 0.9 and draws >= 16


# --------------------------------------------------------- shared-layer schedule (Eq. 11)


def test_shared_layer_schedule_floor_each_step() -> None:
    count = clustering.shared_tensor_count
    assert [count(8, 0.98, t) for t in range(5)] == [8, 7, 6, 5, 4]
    assert count(62, 0.98, 0) == 62 and count(62, 0.98, 1) == 60  # ResNet18: the FC first
    assert count(8, 0.98, 20, min_shared=2) == 2 and count(8, 0.98, 20) == 0
    assert count(8, 0.98, 20, min_shared=100) == 8  # capped at the tensor count


def test_shared_layer_schedule_floor_at_use() -> None:
    count = clustering.shared_tensor_count
    # 8 * 0.98^t: 7.84, 7.68, ..., 7.09 (t = 6), 6.95 (t = 7).
    assert [count(8, 0.98, t, "floor_at_use") for t in range(9)] == [8, 7, 7, 7, 7, 7, 7, 6, 6]
    assert count(62, 0.98, 1, "floor_at_use") == 60
    assert count(8, 0.98, 200, "floor_at_use", min_shared=3) == 3
    # Float round-off must not drop a tensor: 100 * 0.29 evaluates to 28.999999999999996.
    assert count(100, 0.29, 1) == 29 and count(100, 0.29, 1, "floor_at_use") == 29


def test_shared_layer_schedule_validation() -> None:
    with pytest.raises(ValueError, match="rounding"):
        clustering.shared_tensor_count(8, 0.98, 1, "ceil")
    with pytest.raises(ValueError, match="psi"):
        clustering.shared_tensor_count(8, 1.5, 1)
    with pytest.raises(ValueError, match="non-negative"):
        clustering.shared_tensor_count(8, 0.98, -1)
