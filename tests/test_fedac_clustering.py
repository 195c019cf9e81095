"""FedAC's server-side clustering math (PCA map, LrCos, E/M steps, CNT), NumPy only, no TFF."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from tff_clustered import clustering
from tff_clustered.clustering import fedac

# Planted setting used by the recovery tests: 4 groups of 12 clients in d = 500 around random
# centres N(0, I) plus a common offset (the shared initialization all client models carry),
# with isotropic noise 1.0. A pure cluster then has G_c ~ (1 - 1/12) d / (2 d) ~ 0.46, inside
# (0.2, 0.8); two groups in one cluster have G_c ~ 1 (> 0.8), so CNT splits them.
GROUPS, PER_GROUP, DIM, NOISE, OFFSET = 4, 12, 500, 1.0, 3.0


def planted_models(
    rng: np.random.Generator,
    groups: int = GROUPS,
    per_group: int = PER_GROUP,
    dim: int = DIM,
    noise: float = NOISE,
) -> tuple[np.ndarray, np.ndarray]:
    centers = rng.normal(size=(groups, dim))
    labels = np.repeat(np.arange(groups), per_group)
    models = OFFSET + centers[labels] + noise * rng.normal(size=(len(labels), dim))
    return models, labels


def reference_pca(models: np.ndarray, num_components: int) -> tuple[np.ndarray, np.ndarray]:
    """Top principal axes (rows) and the projections of the rows, by SVD of the centred data."""
    centred = models - models.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    rank = int(np.sum(s**2 > 1e-10 * s[0] ** 2))
    axes = vt[: min(num_components, rank)]
    return axes, centred @ axes.T


def reference_lrcos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((len(a), len(b)))
    for i in range(len(a)):
        for k in range(len(b)):
            dot = sum(float(a[i, j]) * float(b[k, j]) for j in range(a.shape[1]))
            out[i, k] = dot / (np.sqrt(np.sum(a[i] ** 2)) * np.sqrt(np.sum(b[k] ** 2)) + 1e-12)
    return out


def run_rounds(
    models: np.ndarray, labels: np.ndarray, rounds: int, **cnt: float
) -> tuple[np.ndarray, list[int]]:
    """The server side of `rounds` FedAC rounds with fixed models: E-step, empties removed,
    M-step, CNT. Returns the final labels and K after each round."""
    pca_map = clustering.fit_pca_map(models)
    reduced = clustering.project(pca_map, models)
    centers = clustering.m_step(models, labels, int(labels.max()) + 1)
    ks = []
    for _ in range(rounds):
        step = clustering.clustering_step(models, centers, pca_map, reduced, **cnt)
        labels, centers = step.assign, step.centers
        ks.append(step.num_clusters)
    return labels, ks


# ----------------------------------------------------------------------------------------------
# PCA map and LrCos against independent references.


def test_gram_pca_matches_svd_pca_up_to_sign() -> None:
    rng = np.random.default_rng(0)
    models = rng.normal(size=(12, 40)) * np.linspace(3.0, 0.1, 40)
    pca_map = clustering.fit_pca_map(models, num_components=5)
    axes, projections = reference_pca(models, 5)
    assert pca_map.num_components == 5
    signs = np.sign(np.sum(pca_map.axes * axes, axis=1))
    np.testing.assert_allclose(pca_map.axes, axes * signs[:, None], atol=1e-10)
    np.testing.assert_allclose(pca_map.axes @ pca_map.axes.T, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(pca_map.offset, models.mean(axis=0), atol=1e-14)
    reduced = clustering.project(pca_map, models)
    np.testing.assert_allclose(reduced, projections * signs, atol=1e-10)
    np.testing.assert_allclose(pca_map.variances, np.sum(projections**2, axis=0), rtol=1e-10)
    # Column blocks of any width and float32 storage give the same map.
    narrow = clustering.fit_pca_map(models, num_components=5, block_columns=7)
    np.testing.assert_allclose(narrow.axes, pca_map.axes, atol=1e-12)
    single = clustering.fit_pca_map(models.astype(np.float32), num_components=5)
    assert single.axes.dtype == np.float32
    np.testing.assert_allclose(single.axes, pca_map.axes, atol=1e-4)


def test_uncentred_map_keeps_the_axes_and_drops_the_offset() -> None:
    rng = np.random.default_rng(1)
    models = 5.0 + rng.normal(size=(10, 30))
    centred = clustering.fit_pca_map(models, 4)
    literal = clustering.fit_pca_map(models, 4, center=False)
    np.testing.assert_array_equal(literal.axes, centred.axes)
    assert not literal.offset.any()
    np.testing.assert_allclose(clustering.project(literal, models), models @ centred.axes.T)
    # Without centring, the shared offset pushes every cosine toward 1.
    mean_cos = {
        name: clustering.lrcos(z, z)[np.triu_indices(len(z), 1)].mean()
        for name, z in [
            ("centred", clustering.project(centred, models)),
            ("literal", clustering.project(literal, models)),
        ]
    }
    assert mean_cos["literal"] > mean_cos["centred"] + 0.3


def test_components_are_clipped_to_the_numerical_rank() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=(4, 25))
    models = base[[0, 1, 2, 3, 0, 1, 1, 2, 3, 3]]  # 10 models, 4 distinct: rank 3 after centring
    pca_map = clustering.fit_pca_map(models, num_components=50)
    assert pca_map.num_components == 3
    assert clustering.project(pca_map, models).shape == (10, 3)
    with pytest.raises(ValueError, match="all models are identical"):
        clustering.fit_pca_map(np.tile(base[:1], (5, 1)))


def test_lrcos_matches_the_explicit_formula_and_ignores_axis_signs() -> None:
    rng = np.random.default_rng(3)
    models = rng.normal(size=(9, 30))
    centers = rng.normal(size=(3, 30))
    pca_map = clustering.fit_pca_map(models, num_components=6)
    z, zeta = clustering.project(pca_map, models), clustering.project(pca_map, centers)
    expected = reference_lrcos(z, zeta)
    np.testing.assert_allclose(clustering.lrcos(z, zeta), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        clustering.lrcos_models(pca_map, models, centers), expected, rtol=1e-12, atol=1e-14
    )
    flipped = pca_map._replace(axes=pca_map.axes * np.array([1, -1, -1, 1, -1, 1])[:, None])
    np.testing.assert_allclose(
        clustering.lrcos_models(flipped, models, centers), expected, rtol=1e-12, atol=1e-14
    )
    # A zero reduced vector has cosine 0 with everything.
    assert not clustering.lrcos(np.zeros((1, 6)), zeta).any()


# ----------------------------------------------------------------------------------------------
# E-step and M-step.


def test_e_step_takes_the_argmax_with_ties_to_the_lowest_index() -> None:
    rng = np.random.default_rng(4)
    z = rng.normal(size=(15, 5))
    zeta = rng.normal(size=(4, 5))
    sims = reference_lrcos(z, zeta)
    np.testing.assert_array_equal(clustering.e_step(z, zeta), [int(np.argmax(s)) for s in sims])
    # Argmax, not Eq. 4's printed argmin: a centre equal to a client wins it.
    assert clustering.e_step(zeta[2:3] * 3.0, zeta)[0] == 2
    tied = np.stack([zeta[1], zeta[0], zeta[1], zeta[0]])
    np.testing.assert_array_equal(clustering.e_step(zeta[:2], tied), [1, 0])


def test_m_step_is_the_member_mean_and_empty_clusters_are_removed() -> None:
    rng = np.random.default_rng(5)
    models = rng.normal(size=(8, 6))
    assign = np.array([4, 0, 4, 2, 0, 4, 2, 0])
    labels, kept = clustering.drop_empty_clusters(assign, 5)
    np.testing.assert_array_equal(kept, [0, 2, 4])
    np.testing.assert_array_equal(labels, [2, 0, 2, 1, 0, 2, 1, 0])
    centers = clustering.m_step(models, labels, 3)
    for k in range(3):
        members = [models[i] for i in range(8) if labels[i] == k]
        np.testing.assert_allclose(centers[k], sum(members) / len(members), rtol=1e-13)
    weights = np.arange(1.0, 9.0)
    weighted = clustering.m_step(models, labels, 3, weights=weights)
    members = labels == 1
    np.testing.assert_allclose(
        weighted[1], (weights[members, None] * models[members]).sum(0) / weights[members].sum()
    )
    with pytest.raises(ValueError, match="drop_empty_clusters"):
        clustering.m_step(models, assign, 5)


def test_e_and_m_steps_recover_planted_clusters_from_a_corrupted_partition() -> None:
    rng = np.random.default_rng(6)
    models, truth = planted_models(rng)
    pca_map = clustering.fit_pca_map(models)
    reduced = clustering.project(pca_map, models)
    labels = truth.copy()
    corrupted = rng.choice(len(labels), size=len(labels) // 3, replace=False)
    labels[corrupted] = rng.integers(GROUPS, size=len(corrupted))
    assert adjusted_rand_score(truth, labels) < 0.7
    for _ in range(5):
        centers = clustering.m_step(models, labels, GROUPS)
        labels = clustering.e_step(reduced, clustering.project(pca_map, centers))
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spherical_kmeans_initialization_recovers_planted_clusters(seed: int) -> None:
    models, truth = planted_models(np.random.default_rng(100 + seed))
    reduced = clustering.project(clustering.fit_pca_map(models), models)
    labels = clustering.spherical_kmeans(reduced, GROUPS, seed=seed)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_identical_models_claim_no_structure() -> None:
    """Common initialization: every cosine ties, so the E-step puts every client in the lowest
    cluster, the other clusters are removed, and CNT leaves K = 1 alone."""
    model = np.random.default_rng(7).normal(size=(1, 20))
    models = np.tile(model, (6, 1))
    labels = clustering.e_step(np.ones((6, 3)), np.ones((4, 3)))
    np.testing.assert_array_equal(labels, np.zeros(6))
    labels, kept = clustering.drop_empty_clusters(labels, 4)
    np.testing.assert_array_equal(kept, [0])
    centers = clustering.m_step(models, labels, 1)
    np.testing.assert_allclose(centers, model)
    pca_map = clustering.random_projection_map(20, 3, seed=0)
    result = clustering.tune_cluster_number(models, centers, labels, pca_map)
    assert result.num_clusters == 1 and not result.merges and not result.splits
    np.testing.assert_array_equal(result.assign, labels)


# ----------------------------------------------------------------------------------------------
# Cluster number tuning.


def test_gc_uses_squared_l2_in_full_dimension_and_excludes_j_equal_k() -> None:
    rng = np.random.default_rng(8)
    models = rng.normal(size=(11, 7))
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 2, 2])
    centers = clustering.m_step(models, labels, 3)
    expected = []
    for k in range(3):
        members = [models[i] for i in range(11) if labels[i] == k]
        intra = sum(float(np.sum((m - centers[k]) ** 2)) for m in members) / len(members)
        inter = sum(float(np.sum((centers[k] - centers[j]) ** 2)) for j in range(3) if j != k)
        expected.append(intra / (inter / 2))
    np.testing.assert_allclose(clustering.gc_ratios(models, centers, labels), expected, rtol=1e-12)


def test_singletons_merge_into_their_nearest_cluster() -> None:
    rng = np.random.default_rng(9)
    models, truth = planted_models(rng)
    start = truth.copy()
    start[[3, 15, 40]] = [4, 5, 6]  # three clients in clusters of their own: K = 7
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, start, 7)
    result = clustering.tune_cluster_number(models, centers, start, pca_map)
    np.testing.assert_allclose(result.gc[4:], 0.0)
    assert sorted(result.merges) == [(4, 0), (5, 1), (6, 3)] and not result.splits
    assert result.num_clusters == GROUPS
    np.testing.assert_array_equal(result.assign, truth)
    np.testing.assert_allclose(result.centers, clustering.m_step(models, truth, GROUPS))
    np.testing.assert_allclose(
        result.reduced_centers, clustering.project(pca_map, result.centers), atol=1e-12
    )


def test_a_cluster_grown_by_a_merge_is_not_split_in_the_same_call() -> None:
    rng = np.random.default_rng(16)
    models, truth = planted_models(rng, groups=3)
    mixed = np.minimum(truth, 1).astype(np.int32)  # groups 1 and 2 share cluster 1: G_c > b
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, mixed, 2)
    alone = clustering.tune_cluster_number(models, centers, mixed, pca_map)
    assert alone.splits == (1,) and alone.num_clusters == 3
    with_singleton = mixed.copy()
    with_singleton[30] = 2  # a member of group 2 on its own: merged back into cluster 1
    centers = clustering.m_step(models, with_singleton, 3)
    result = clustering.tune_cluster_number(models, centers, with_singleton, pca_map)
    assert result.gc[1] > fedac.GC_UPPER
    assert result.merges == ((2, 1),) and result.splits == ()
    np.testing.assert_array_equal(result.assign, mixed)


def test_planted_partition_is_a_fixed_point() -> None:
    """Every G_c inside (a, b): no merge, no split, and the E-step keeps every client."""
    models, truth = planted_models(np.random.default_rng(10))
    labels, ks = run_rounds(models, truth, rounds=3)
    assert ks == [GROUPS] * 3
    np.testing.assert_array_equal(labels, truth)
    gc = clustering.gc_ratios(models, clustering.m_step(models, truth, GROUPS), truth)
    assert np.all((gc > fedac.GC_LOWER) & (gc < fedac.GC_UPPER))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cnt_reaches_the_planted_number_from_fewer_clusters(seed: int) -> None:
    """From K = 2 (two or more groups per cluster, G_c > b): splits until K = 4, then stays."""
    rng = np.random.default_rng(200 + seed)
    models, truth = planted_models(rng)
    reduced = clustering.project(clustering.fit_pca_map(models), models)
    start = clustering.spherical_kmeans(reduced, 2, seed=seed)
    labels, ks = run_rounds(models, start, rounds=8)
    assert ks[0] > 2 and ks[-3:] == [GROUPS] * 3
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cnt_reaches_the_planted_number_from_more_clusters(seed: int) -> None:
    """From one cluster per client (K = 48, all G_c = 0): the merges stop at K_min = 2 in one
    call, then splits bring K back up to 4.

    A moderate over-split (e.g. K = 8 from k-means: fragments of 5-7 clients) is NOT undone:
    such fragments have G_c ~ 0.4, inside (0.2, 0.8), so Alg. 3 neither merges nor splits them."""
    rng = np.random.default_rng(300 + seed)
    models, truth = planted_models(rng)
    start = np.arange(len(truth), dtype=np.int32)
    labels, ks = run_rounds(models, start, rounds=8)
    assert ks[0] == fedac.MIN_CLUSTERS and ks[-3:] == [GROUPS] * 3
    assert adjusted_rand_score(truth, labels) == 1.0


def test_cnt_keeps_k_within_bounds() -> None:
    rng = np.random.default_rng(11)
    models, truth = planted_models(rng)
    pca_map = clustering.fit_pca_map(models)
    singletons = np.arange(len(truth), dtype=np.int32)
    centers = clustering.m_step(models, singletons, len(truth))
    merged = clustering.tune_cluster_number(
        models, centers, singletons, pca_map, settings=clustering.CntSettings(min_clusters=3)
    )
    assert merged.num_clusters == 3 and len(merged.merges) == len(truth) - 3
    # Everything in one pair of clusters, both far above b: K_max = 3 allows one split only.
    pair = (truth >= 2).astype(np.int32)
    centers = clustering.m_step(models, pair, 2)
    assert np.all(clustering.gc_ratios(models, centers, pair) > fedac.GC_UPPER)
    capped = clustering.tune_cluster_number(
        models, centers, pair, pca_map, settings=clustering.CntSettings(max_clusters=3)
    )
    assert capped.num_clusters == 3 and len(capped.splits) == 1
    free = clustering.tune_cluster_number(models, centers, pair, pca_map)
    assert free.num_clusters == 4 and len(free.splits) == 2


def test_splits_respect_the_minimum_side_size() -> None:
    """A split needs 2 * s_min = 4 members and s_min = 2 on each side, else it is cancelled."""
    rng = np.random.default_rng(12)
    far = 10 * rng.normal(size=(3, 50))
    jitter = 0.01 * rng.normal(size=(11, 50))
    outlier = 3 * rng.normal(size=50)
    pair = 3 * rng.normal(size=50)
    models = jitter + np.concatenate(
        [
            far[[0, 0, 0]],  # cluster 0: 3 tight members + 1 outlier, a 3 / 1 split
            far[[0]] + outlier,
            far[[1, 1, 1]] + rng.normal(size=(3, 50)),  # cluster 1: 3 members only
            far[[2, 2, 2, 2]] + np.outer([1, 1, -1, -1], pair),  # cluster 2: two pairs
        ]
    )
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2], np.int32)
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, labels, 3)
    # Bounds (0, 0): every cluster (G_c > 0) asks for a split.
    result = clustering.tune_cluster_number(
        models, centers, labels, pca_map, settings=clustering.CntSettings(0, 0)
    )
    assert np.all(result.gc > 0)
    assert result.splits == (2,) and result.num_clusters == 4
    np.testing.assert_array_equal(result.assign, [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3])
    # With s_min = 1 the 3 / 1 split of cluster 0 and a split of cluster 1 go ahead.
    loose = clustering.tune_cluster_number(
        models, centers, labels, pca_map, settings=clustering.CntSettings(0, 0, min_split_size=1)
    )
    assert sorted(loose.splits) == [0, 1, 2] and loose.num_clusters == 6
    sides = np.bincount(loose.assign[:4])
    assert sorted(sides[sides > 0]) == [1, 3] and len(set(loose.assign[:3])) == 1


# ----------------------------------------------------------------------------------------------
# Determinism, purity and input checks.


def test_same_seed_same_result() -> None:
    def pipeline(seed: int) -> tuple[np.ndarray, ...]:
        models, _ = planted_models(np.random.default_rng(13))
        pca_map = clustering.fit_pca_map(models)
        reduced = clustering.project(pca_map, models)
        start = clustering.spherical_kmeans(reduced, 6, seed=seed)
        step = clustering.clustering_step(models, clustering.m_step(models, start, 6), pca_map)
        projection = clustering.random_projection_map(DIM, 8, seed=np.random.default_rng(seed))
        return (
            start,
            step.assign,
            step.centers,
            projection.axes,
            clustering.random_assignment(30, 4, seed),
        )

    first, second = pipeline(5), pipeline(5)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[3], pipeline(6)[3])
    assert sorted(np.bincount(first[4])) == [7, 7, 8, 8]


def test_inputs_are_not_mutated() -> None:
    models, truth = planted_models(np.random.default_rng(14), groups=2, per_group=6, dim=40)
    labels = np.zeros(len(truth), np.int32)
    labels[::2] = 1
    pca_map = clustering.fit_pca_map(models)
    reduced = clustering.project(pca_map, models)
    centers = clustering.m_step(models, labels, 2)
    inputs = [models, labels, reduced, centers, pca_map.axes, pca_map.offset]
    copies = [a.copy() for a in inputs]
    clustering.clustering_step(models, centers, pca_map, reduced, clustering.CntSettings(0.0, 0.0))
    clustering.tune_cluster_number(
        models, centers, labels, pca_map, reduced, clustering.CntSettings(9, 9)
    )
    clustering.drop_empty_clusters(labels, 3)
    clustering.spherical_kmeans(reduced, 2, seed=0)
    for original, copy in zip(inputs, copies):
        np.testing.assert_array_equal(original, copy)


def test_bad_inputs_raise_clear_errors() -> None:
    rng = np.random.default_rng(15)
    models = rng.normal(size=(5, 8))
    pca_map = clustering.fit_pca_map(models)
    with pytest.raises(ValueError, match="cannot form 6 clusters from 5 clients"):
        clustering.spherical_kmeans(clustering.project(pca_map, models), 6)
    with pytest.raises(ValueError, match="cannot form 6 clusters from 5 clients"):
        clustering.random_assignment(5, 6)
    with pytest.raises(ValueError, match="refit the map"):
        clustering.project(pca_map, rng.normal(size=(5, 9)))
    with pytest.raises(ValueError, match="same layout"):
        clustering.gc_ratios(models, np.zeros((2, 9)), np.zeros(5, int))
    with pytest.raises(ValueError, match="one label per model"):
        clustering.m_step(models, np.zeros(4, int), 1)
    with pytest.raises(ValueError, match="outside 0..1"):
        clustering.m_step(models, np.array([0, 1, 2, 0, 1]), 2)
    with pytest.raises(ValueError, match="at least 2 clusters"):
        clustering.gc_ratios(models, models[:1], np.zeros(5, int))
    with pytest.raises(ValueError, match="reduced_models must be"):
        clustering.tune_cluster_number(
            models, models[:2], np.array([0, 1, 0, 1, 0]), pca_map, np.zeros((5, 1))
        )
    with pytest.raises(ValueError, match="lower <= upper"):
        clustering.CntSettings(lower=0.8, upper=0.2)
    with pytest.raises(ValueError, match="NaN or inf"):
        clustering.fit_pca_map(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="positive finite"):
        clustering.m_step(models, np.zeros(5, int), 1, weights=np.zeros(5))
