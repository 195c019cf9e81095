"""FedTSDP's and CFL's server math against NumPy/SciPy references and known cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist, jensenshannon

from tff_clustered import clustering


def softmax_outputs(rng: np.random.Generator, m: int, b: int, c: int) -> np.ndarray:
    logits = rng.normal(size=(m, b, c)) * 2
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_js_divergence_matches_scipy_and_its_properties() -> None:
    rng = np.random.default_rng(0)
    p = softmax_outputs(rng, 5, 7, 4)
    p[0, 0] = [1.0, 0.0, 0.0, 0.0]  # 0 log 0 = 0
    js = clustering.js_divergence_matrix(p)
    for i in range(5):
        for j in range(5):
            want = np.mean([jensenshannon(p[i, s], p[j, s]) ** 2 for s in range(7)])
            assert js[i, j] == pytest.approx(want, abs=1e-10)
    assert np.array_equal(js, js.T) and np.all(np.diag(js) == 0) and js.max() <= np.log(2)
    flat = p.reshape(5, -1) / 7  # the same as the JS of the flattened outputs divided by B
    assert js[1, 2] == pytest.approx(jensenshannon(flat[1], flat[2]) ** 2, abs=1e-10)


def test_hopkins_is_about_half_without_structure_and_near_one_for_groups() -> None:
    rng = np.random.default_rng(1)
    uniform = [
        clustering.hopkins_statistic(rng.random((20, 500)), np.random.default_rng(s))
        for s in range(20)
    ]
    assert 0.45 < np.mean(uniform) < 0.6
    centers = rng.random((3, 500)) * 10
    grouped = np.concatenate([c + rng.normal(0, 0.05, (7, 500)) for c in centers])
    assert clustering.hopkins_statistic(grouped, np.random.default_rng(0)) > 0.75


def test_hopkins_never_counts_a_point_as_its_own_neighbour() -> None:
    # Two far-apart pairs: every real point's nearest other point is its partner at distance 1.
    points = np.array([[0.0, 0.0], [1.0, 0.0], [100.0, 100.0], [101.0, 100.0]])
    h = clustering.hopkins_statistic(points, np.random.default_rng(3), sample_size=4)
    assert 0 < h < 1  # with self-distances (0) the sum of v would vanish and H would be 1
    assert clustering.hopkins_statistic(points[:1], np.random.default_rng(0)) == 0.5
    assert clustering.hopkins_statistic(np.ones((5, 3)), np.random.default_rng(0)) == 0.5


def test_weight_distance_is_euclidean_without_the_constant() -> None:
    w = np.random.default_rng(2).normal(size=(6, 50))
    np.testing.assert_allclose(clustering.weight_distance_matrix(w, 0.0), cdist(w, w), atol=1e-9)
    shifted = clustering.weight_distance_matrix(w, 1e-6)
    assert np.array_equal(shifted, shifted.T) and np.all(np.diag(shifted) == 0)


def test_dbscan_noise_becomes_singletons_and_two_stages_recover_planted_groups() -> None:
    rng = np.random.default_rng(4)
    # Stage 1: two groups of outputs (classes 0-4 vs 5-9); stage 2: group A splits in two
    # weight blobs far apart, group B stays one; one client is noise in both.
    probs = np.full((9, 6, 10), 1e-3)
    probs[:5, :, :5] = 1.0
    probs[5:8, :, 5:] = 1.0
    probs[8] = rng.dirichlet(np.ones(10), 6)
    probs /= probs.sum(-1, keepdims=True)
    weights = rng.normal(0, 0.1, (9, 20))
    weights[3:5] += 10.0
    weights[8] += 50.0
    js = clustering.js_divergence_matrix(probs)
    wd = clustering.weight_distance_matrix(weights)
    labels = clustering.two_stage_clusters(js, wd, eps1=0.15, eps2=3.5)
    assert labels.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3]
    assert clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="js").tolist() == [
        0, 0, 0, 0, 0, 1, 1, 1, 2,
    ]  # fmt: skip
    by_weights = clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="weights")
    assert by_weights.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 2]
    with pytest.raises(ValueError, match="stages"):
        clustering.two_stage_clusters(js, wd, 0.15, 3.5, stages="three")


def test_amended_sampling_concentrates_on_the_used_batch() -> None:
    n, b = 10_000, 50
    w = np.full(n, 1 / n)
    batch = clustering.draw_public_batch(w, b, np.random.default_rng(0))
    assert len(np.unique(batch)) == b
    assert np.array_equal(batch, clustering.draw_public_batch(w, b, np.random.default_rng(0)))
    new = clustering.amend_sampling_weights(w, batch)
    assert new.sum() == pytest.approx(1.0)
    changed = np.flatnonzero(new != new[np.setdiff1d(np.arange(n), batch)[0]])
    assert set(changed) == set(batch)
    assert new[batch].sum() == pytest.approx((n + b / n) / (n + 1))


def test_shared_layer_schedule() -> None:
    count = clustering.shared_tensor_count
    assert [count(8, 0.98, t) for t in range(4)] == [8, 7, 6, 5]
    assert [count(8, 0.98, t, "floor_at_use") for t in (0, 1, 6, 7)] == [8, 7, 7, 6]
    assert count(62, 0.98, 1) == 60  # ResNet18: the FC becomes personal first
    assert count(8, 0.98, 20, min_shared=2) == 2 and count(8, 0.98, 20) == 0


def test_cfl_bipartition_and_split_criterion() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=200), rng.normal(size=200)
    updates = np.stack([a + rng.normal(0, 0.2, 200) for _ in range(4)] + [
        b + rng.normal(0, 0.2, 200) for _ in range(3)
    ])  # fmt: skip
    sim = clustering.pairwise_cosine(updates)
    first, second = clustering.optimal_bipartition(sim)
    assert first.tolist() == [0, 1, 2, 3] and second.tolist() == [4, 5, 6]
    cross = clustering.max_cross_similarity(sim, first, second)
    assert cross < sim[np.ix_(first, first)].min()
    # Opposite updates: the mean is small while each is large -> split.
    opposed = np.stack([a, a, -a, -a])
    mean_norm, max_norm = clustering.update_norms(opposed)
    assert mean_norm == pytest.approx(0.0) and max_norm == pytest.approx(np.linalg.norm(a))
    assert clustering.should_split(mean_norm, max_norm, 4, eps1=0.4, eps2=1.6)
    assert not clustering.should_split(mean_norm, max_norm, 2, eps1=0.4, eps2=1.6)
    assert not clustering.should_split(*clustering.update_norms(np.stack([a, a])), 3, 0.4, 1.6)
