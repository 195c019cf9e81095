"""Server-side clustering math (FedGroup EDC/MADC/Eq. 9, FeSEM E/M steps), no TFF."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from tff_clustered import clustering


def planted_updates(
    rng: np.random.Generator, groups: int, per_group: int, dim: int, noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Updates drawn around `groups` random directions, with random positive scales."""
    centers = rng.normal(size=(groups, dim))
    labels = np.repeat(np.arange(groups), per_group)
    scales = rng.uniform(0.2, 5.0, size=(len(labels), 1))
    updates = scales * (centers[labels] + noise * rng.normal(size=(len(labels), dim)))
    return updates, labels


def test_two_forms_of_eq8_agree() -> None:
    rng = np.random.default_rng(0)
    updates, _ = planted_updates(rng, 3, 5, 40, 0.5)
    v = clustering.svd_directions(updates, 3)
    embedding = clustering.decomposed_cosine(updates, v)
    edc = clustering.edc_matrix(embedding)
    for i, j in [(0, 1), (2, 9), (4, 14)]:
        s_i = [updates[i] @ vk / np.linalg.norm(updates[i]) / np.linalg.norm(vk) for vk in v]
        s_j = [updates[j] @ vk / np.linalg.norm(updates[j]) / np.linalg.norm(vk) for vk in v]
        direct = np.sqrt(np.sum((np.array(s_i) - np.array(s_j)) ** 2)) / 3
        assert edc[i, j] == pytest.approx(direct, rel=1e-10)


def test_edc_is_invariant_to_svd_sign_flips_and_update_rescaling() -> None:
    rng = np.random.default_rng(1)
    updates, _ = planted_updates(rng, 3, 6, 30, 0.3)
    v = clustering.svd_directions(updates, 3)
    base = clustering.edc_matrix(clustering.decomposed_cosine(updates, v))
    flipped = v * np.array([[-1.0], [1.0], [-1.0]])
    np.testing.assert_allclose(
        clustering.edc_matrix(clustering.decomposed_cosine(updates, flipped)), base, atol=1e-12
    )
    rescaled = updates * rng.uniform(0.1, 10.0, size=(len(updates), 1))
    np.testing.assert_allclose(
        clustering.edc_matrix(clustering.decomposed_cosine(rescaled, v)), base, atol=1e-12
    )
    assert list(clustering.cluster_edc(rescaled, 3, seed=4)) == list(
        clustering.cluster_edc(updates, 3, seed=4)
    )


def test_madc_is_symmetric_zero_diagonal_with_p_minus_2_denominator() -> None:
    rng = np.random.default_rng(2)
    updates = rng.normal(size=(7, 12))
    madc = clustering.madc_matrix(updates)
    np.testing.assert_allclose(madc, madc.T)
    assert np.all(np.diag(madc) == 0) and np.all(madc >= 0)
    sim = clustering.cosine_similarity(updates, updates)
    i, j = 1, 5
    others = [z for z in range(7) if z not in (i, j)]
    expected = sum(abs(sim[i, z] - sim[j, z]) for z in others) / (7 - 2)
    assert madc[i, j] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("method", ["edc", "madc"])
def test_edc_and_madc_recover_planted_groups(method: str) -> None:
    rng = np.random.default_rng(3)
    updates, labels = planted_updates(rng, 4, 15, 200, 0.6)
    found = (
        clustering.cluster_edc(updates, 4, seed=0)
        if method == "edc"
        else clustering.cluster_madc(updates, 4)
    )
    assert adjusted_rand_score(labels, found) > 0.95


def test_random_updates_have_no_structure_to_recover() -> None:
    # Control for the test above: with no plant, the ARI against arbitrary labels is low.
    rng = np.random.default_rng(4)
    updates = rng.normal(size=(60, 200))
    labels = np.repeat(np.arange(4), 15)
    assert adjusted_rand_score(labels, clustering.cluster_edc(updates, 4)) < 0.2


def test_newcomer_equal_to_a_group_direction_joins_that_group() -> None:
    rng = np.random.default_rng(5)
    directions = rng.normal(size=(5, 50))
    for j in range(5):
        assert clustering.assign_newcomers(directions, directions[j][None] * 3.0)[0] == j
        d = clustering.newcomer_dissimilarity(directions, directions[j])
        assert d[j] == pytest.approx(0.0, abs=1e-12) and d.min() == d[j]
    # A zero direction (empty group) is at dissimilarity 0.5 from everything (cosine 0).
    directions[2] = 0
    assert clustering.newcomer_dissimilarity(directions, rng.normal(size=50))[2] == 0.5


def test_inter_group_aggregation() -> None:
    rng = np.random.default_rng(6)
    models = rng.normal(size=(3, 8))
    for mode in ("additive", "normalized"):
        np.testing.assert_array_equal(clustering.inter_group_aggregation(models, 0.0, mode), models)
    mixed = clustering.inter_group_aggregation(models, 0.1)
    unit = models / np.linalg.norm(models, axis=1, keepdims=True)
    np.testing.assert_allclose(mixed[0], models[0] + 0.1 * (unit[1] + unit[2]))
    normalized = clustering.inter_group_aggregation(models, 0.1, "normalized")
    c = 0.1 / np.linalg.norm(models, axis=1)
    expected = (models[0] + c[1] * models[1] + c[2] * models[2]) / (1 + c[1] + c[2])
    np.testing.assert_allclose(normalized[0], expected)


def test_fesem_e_step_and_m_step() -> None:
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    models = np.array([[1.0, 1.0], [9.0, 1.0], [8.0, -1.0], [0.5, 0.0]])
    labels = clustering.nearest_centers(models, centers)
    assert labels.tolist() == [0, 1, 1, 0]
    new = clustering.mean_per_cluster(models, labels, centers)
    np.testing.assert_allclose(new[0], [0.75, 0.5])  # unweighted mean
    np.testing.assert_allclose(new[1], [8.5, 0.0])
    np.testing.assert_array_equal(new[2], centers[2])  # no member: kept


def test_streamed_svd_directions_match_the_exact_svd_whatever_the_blocks(tmp_path: object) -> None:
    rng = np.random.default_rng(5)
    updates, _ = planted_updates(rng, 4, 30, 300, 0.2)
    updates = updates.astype(np.float32)
    exact = np.linalg.svd(updates.astype(np.float64), full_matrices=False)[2][:4]
    for block_rows in (7, 64, 1000):
        v = clustering.svd_directions(updates, 4, seed=3, block_rows=block_rows)
        assert v.shape == (4, 300)
        # each direction is +-1 times the exact one (a spectrum with a gap)
        np.testing.assert_allclose(np.abs(np.sum(v * exact, axis=1)), 1.0, atol=1e-4)
    # from a disk memmap (how 10,000 clients of a large model fit): the same directions
    on_disk = np.lib.format.open_memmap(
        str(tmp_path / "updates.npy"), mode="w+", dtype=np.float32, shape=updates.shape
    )
    on_disk[:] = updates
    on_disk.flush()
    np.testing.assert_array_equal(
        clustering.svd_directions(on_disk, 4, seed=3, block_rows=64),
        clustering.svd_directions(updates, 4, seed=3, block_rows=64),
    )
    np.testing.assert_allclose(
        clustering.decomposed_cosine(on_disk, exact, block_rows=9),
        clustering.cosine_similarity(updates, exact),
        atol=1e-6,
    )
