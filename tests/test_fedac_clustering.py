"""FedAC's server-side clustering math (PCA map, LrCos, E/M steps, CNT), NumPy only, no TFF."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from tff_clustered import clustering
from tff_clustered.clustering import cnt_settings, cnt_statistics

# Planted setting used by the recovery tests: 4 groups of 12 clients in d = 500 around random
# centres N(0, I) plus a common offset (the shared initialization all client models carry),
# with isotropic noise 1.0. A pure cluster then has G_c ~ (1 - 1/12) d / (2 d) ~ 0.46, inside
# (0.2, 0.8); two groups in one cluster have G_c ~ 1 (> 0.8), so CNT splits them. The relative
# rule's separation of two groups is ~ 1 + 6 * 2 d / d = 13 (> 4), of two halves of one ~ 1.
GROUPS, PER_GROUP, DIM, NOISE, OFFSET = 4, 12, 500, 1.0, 3.0
PAPER = clustering.CntSettings(rule="paper")
RULES = [PAPER, clustering.CntSettings()]


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
    models: np.ndarray, labels: np.ndarray, rounds: int, **cnt: object
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


@pytest.mark.parametrize("settings", RULES, ids=lambda s: s.rule)
def test_singletons_merge_into_their_nearest_cluster(settings: clustering.CntSettings) -> None:
    rng = np.random.default_rng(9)
    models, truth = planted_models(rng)
    start = truth.copy()
    start[[3, 15, 40]] = [4, 5, 6]  # three clients in clusters of their own: K = 7
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, start, 7)
    result = clustering.tune_cluster_number(models, centers, start, pca_map, settings=settings)
    np.testing.assert_allclose(result.gc[4:], 0.0)
    assert sorted(result.merges) == [(4, 0), (5, 1), (6, 3)] and not result.splits
    assert result.num_clusters == GROUPS
    np.testing.assert_array_equal(result.assign, truth)
    np.testing.assert_allclose(result.centers, clustering.m_step(models, truth, GROUPS))
    np.testing.assert_allclose(
        result.reduced_centers, clustering.project(pca_map, result.centers), atol=1e-12
    )


@pytest.mark.parametrize("settings", RULES, ids=lambda s: s.rule)
def test_a_cluster_grown_by_a_merge_is_not_split_in_the_same_call(
    settings: clustering.CntSettings,
) -> None:
    rng = np.random.default_rng(16)
    models, truth = planted_models(rng, groups=3)
    mixed = np.minimum(truth, 1).astype(np.int32)  # groups 1 and 2 share cluster 1: G_c > b
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, mixed, 2)
    alone = clustering.tune_cluster_number(models, centers, mixed, pca_map, settings=settings)
    assert alone.splits == (1,) and alone.num_clusters == 3
    with_singleton = mixed.copy()
    with_singleton[30] = 2  # a member of group 2 on its own: merged back into cluster 1
    centers = clustering.m_step(models, with_singleton, 3)
    result = clustering.tune_cluster_number(
        models, centers, with_singleton, pca_map, settings=settings
    )
    assert result.gc[1] > cnt_settings.GC_UPPER
    assert result.merges == ((2, 1),) and result.splits == ()
    np.testing.assert_array_equal(result.assign, mixed)


@pytest.mark.parametrize("settings", RULES, ids=lambda s: s.rule)
def test_planted_partition_is_a_fixed_point(settings: clustering.CntSettings) -> None:
    """Every G_c inside (a, b): no merge, no split, and the E-step keeps every client."""
    models, truth = planted_models(np.random.default_rng(10))
    labels, ks = run_rounds(models, truth, rounds=3, settings=settings)
    assert ks == [GROUPS] * 3
    np.testing.assert_array_equal(labels, truth)
    gc = clustering.gc_ratios(models, clustering.m_step(models, truth, GROUPS), truth)
    assert np.all((gc > cnt_settings.GC_LOWER) & (gc < cnt_settings.GC_UPPER))


@pytest.mark.parametrize("settings", RULES, ids=lambda s: s.rule)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cnt_reaches_the_planted_number_from_fewer_clusters(
    seed: int, settings: clustering.CntSettings
) -> None:
    """From K = 2 (two or more groups per cluster, G_c > b): splits until K = 4, then stays."""
    rng = np.random.default_rng(200 + seed)
    models, truth = planted_models(rng)
    reduced = clustering.project(clustering.fit_pca_map(models), models)
    start = clustering.spherical_kmeans(reduced, 2, seed=seed)
    labels, ks = run_rounds(models, start, rounds=8, settings=settings)
    assert ks[0] > 2 and ks[-3:] == [GROUPS] * 3
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cnt_reaches_the_planted_number_from_more_clusters(seed: int) -> None:
    """Paper rule. From one cluster per client (K = 48, all G_c = 0): the merges stop at
    K_min = 2 in one call, then splits bring K back up to 4.

    A moderate over-split (e.g. K = 8 from k-means: fragments of 5-7 clients) is NOT undone:
    such fragments have G_c ~ 0.4, inside (0.2, 0.8), so Alg. 3 neither merges nor splits them
    (the relative rule does: test_relative_cnt_undoes_an_over_split)."""
    rng = np.random.default_rng(300 + seed)
    models, truth = planted_models(rng)
    start = np.arange(len(truth), dtype=np.int32)
    labels, ks = run_rounds(models, start, rounds=8, settings=PAPER)
    assert ks[0] == cnt_settings.MIN_CLUSTERS and ks[-3:] == [GROUPS] * 3
    assert adjusted_rand_score(truth, labels) == 1.0


def test_cnt_keeps_k_within_bounds() -> None:
    rng = np.random.default_rng(11)
    models, truth = planted_models(rng)
    pca_map = clustering.fit_pca_map(models)
    singletons = np.arange(len(truth), dtype=np.int32)
    centers = clustering.m_step(models, singletons, len(truth))
    merged = clustering.tune_cluster_number(
        models, centers, singletons, pca_map, settings=dataclasses.replace(PAPER, min_clusters=3)
    )
    assert merged.num_clusters == 3 and len(merged.merges) == len(truth) - 3
    # Everything in one pair of clusters, both far above b: K_max = 3 allows one split only.
    pair = (truth >= 2).astype(np.int32)
    centers = clustering.m_step(models, pair, 2)
    assert np.all(clustering.gc_ratios(models, centers, pair) > cnt_settings.GC_UPPER)
    for settings in RULES:  # both split both clusters when free to
        capped = clustering.tune_cluster_number(
            models, centers, pair, pca_map, settings=dataclasses.replace(settings, max_clusters=3)
        )
        assert capped.num_clusters == 3 and len(capped.splits) == 1
        free = clustering.tune_cluster_number(models, centers, pair, pca_map, settings=settings)
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
        models, centers, labels, pca_map, settings=clustering.CntSettings(0, 0, rule="paper")
    )
    assert np.all(result.gc > 0)
    assert result.splits == (2,) and result.num_clusters == 4
    np.testing.assert_array_equal(result.assign, [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3])
    # With s_min = 1 the 3 / 1 split of cluster 0 and a split of cluster 1 go ahead.
    loose = clustering.tune_cluster_number(
        models,
        centers,
        labels,
        pca_map,
        settings=clustering.CntSettings(0, 0, min_split_size=1, rule="paper"),
    )
    assert sorted(loose.splits) == [0, 1, 2] and loose.num_clusters == 6
    sides = np.bincount(loose.assign[:4])
    assert sorted(sides[sides > 0]) == [1, 3] and len(set(loose.assign[:3])) == 1


# ----------------------------------------------------------------------------------------------
# The relative CNT rule (ours): separation and bimodality, and what they do under a mu pull.


def shrunk(models: np.ndarray, labels: np.ndarray, factor: float) -> np.ndarray:
    """Every member moved toward its cluster's mean, w <- Omega + factor (w - Omega): what a pull
    toward the centres does to the spread (the centres stay)."""
    centers = clustering.m_step(models, labels, int(labels.max()) + 1)
    return centers[labels] + factor * (models - centers[labels])


def smaller_joins_larger(labels: np.ndarray, merge: tuple[int, int]) -> bool:
    """Whether a merge (merged, receiving) moved the smaller cluster (ties: the higher index)."""
    (merged, receiving), sizes = merge, np.bincount(labels)
    return bool((sizes[merged], -merged) < (sizes[receiving], -receiving))


def sides_separation(models: np.ndarray, first: np.ndarray) -> float:
    a, b = models[first], models[~first]
    mean_a, mean_b = a.mean(axis=0), b.mean(axis=0)
    return cnt_statistics.separation(
        len(a),
        len(b),
        float(np.sum((mean_a - mean_b) ** 2)),
        float(np.sum((a - mean_a) ** 2)),
        float(np.sum((b - mean_b) ** 2)),
    )


def test_separation_is_about_one_for_halves_of_a_group_and_large_for_two_groups() -> None:
    rng = np.random.default_rng(20)
    models, truth = planted_models(rng, groups=2)
    # the formula: ||mean_a - mean_b||^2 / (s^2 (1/n_a + 1/n_b)), s^2 pooled over n - 2
    expected = 9.0 / ((4.0 + 6.0) / (3 + 5 - 2) * (1 / 3 + 1 / 5))
    assert cnt_statistics.separation(3, 5, 9.0, 4.0, 6.0) == pytest.approx(expected)
    assert cnt_statistics.separation(1, 1, 9.0, 0.0, 0.0, fallback_variance=1.5) == pytest.approx(
        3.0
    )
    assert cnt_statistics.separation(1, 1, 9.0, 0.0, 0.0) == np.inf
    one = models[truth == 0]
    halves = [sides_separation(one, rng.permutation(PER_GROUP) < 6) for _ in range(20)]
    assert 0.8 < np.mean(halves) < 1.2
    two = sides_separation(models, truth == 0)
    assert two > 10
    assert sides_separation(7.0 * models, truth == 0) == pytest.approx(two)
    previous = two
    for factor in (0.3, 0.1, 0.01):  # a pull toward the centres only moves groups apart
        now = sides_separation(shrunk(models, truth, factor), truth == 0)
        assert now > previous
        previous = now


def test_bimodality_reference_values() -> None:
    """Q = between scatter / largest scatter eigenvalue: 1 for two point masses, 3/4 for a
    uniform segment cut at its middle, 2/pi for a Gaussian cut at its mean, at most 1."""
    rng = np.random.default_rng(21)
    uniform = np.sort(rng.uniform(-1, 1, size=20000))[:, None]
    gaussian = np.sort(rng.normal(size=20000))[:, None]
    for values, expected in ((uniform, 0.75), (gaussian, 2 / np.pi)):
        q = cnt_statistics.bimodality(values[values[:, 0] < 0], values[values[:, 0] >= 0])
        assert q == pytest.approx(expected, abs=0.01)
    points = np.array([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    assert cnt_statistics.bimodality(points[:2], points[2:]) == pytest.approx(1.0)
    cloud = rng.normal(size=(30, 5))
    q = cnt_statistics.bimodality(cloud[:10], cloud[10:])
    assert 0 <= q <= 1 and cnt_statistics.bimodality(
        9 * cloud[:10], 9 * cloud[10:]
    ) == pytest.approx(q)


@pytest.mark.parametrize("factor", [1.0, 0.3, 0.1, 0.01])
def test_relative_cnt_never_merges_separated_groups_whatever_the_pull(factor: float) -> None:
    """Members shrunk toward their centres (a strong mu): the relative rule keeps the 4 groups
    and splits none; the paper's G_c (intra / inter) shrinks with factor^2, so from 0.3 on it
    falls below a = 0.2 and the paper's rule merges distinct groups down to K_min."""
    models, truth = planted_models(np.random.default_rng(22))
    models = shrunk(models, truth, factor)
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, truth, GROUPS)
    relative = clustering.tune_cluster_number(models, centers, truth, pca_map)
    assert relative.merges == () and relative.splits == ()
    np.testing.assert_array_equal(relative.assign, truth)
    assert np.all(relative.merge_separations > 10)
    paper = clustering.tune_cluster_number(models, centers, truth, pca_map, settings=PAPER)
    if factor < 1:
        assert paper.num_clusters == cnt_settings.MIN_CLUSTERS and len(paper.merges) == 2
    else:
        assert paper.merges == ()


@pytest.mark.parametrize("cut", ["split_sides", "random"])
def test_relative_cnt_rejoins_a_group_cut_in_two(cut: str) -> None:
    """Each group in turn cut in two (as CNT's split would cut it, or at random): the two
    halves merge back, the other groups stay; the paper's rule leaves such halves apart."""
    rng = np.random.default_rng(23)
    models, truth = planted_models(rng)
    pca_map = clustering.fit_pca_map(models)
    reduced = clustering.project(pca_map, models)
    reduced_centers = clustering.project(pca_map, clustering.m_step(models, truth, GROUPS))
    for group in range(GROUPS):
        members = np.flatnonzero(truth == group)
        if cut == "split_sides":
            second = cnt_statistics.split_sides(reduced[members], reduced_centers[group])
        else:
            second = rng.permutation(len(members)) < len(members) // 2
        labels = truth.copy()
        labels[members[second]] = GROUPS
        centers = clustering.m_step(models, labels, GROUPS + 1)
        result = clustering.tune_cluster_number(models, centers, labels, pca_map, reduced)
        # the smaller half joins the larger one
        assert len(result.merges) == 1 and set(result.merges[0]) == {group, GROUPS}
        assert smaller_joins_larger(labels, result.merges[0]) and result.splits == ()
        assert adjusted_rand_score(truth, result.assign) == 1.0
        paper = clustering.tune_cluster_number(
            models, centers, labels, pca_map, reduced, settings=PAPER
        )
        assert paper.merges == ()


def test_relative_cnt_undoes_an_over_split() -> None:
    """K = 8 from k-means (fragments of the 4 groups): merged back to the 4 groups, which then
    stay (the paper's rule keeps the fragments: test_cnt_reaches_the_planted_number_from_more_
    clusters)."""
    models, truth = planted_models(np.random.default_rng(24))
    reduced = clustering.project(clustering.fit_pca_map(models), models)
    start = clustering.spherical_kmeans(reduced, 8, seed=0)
    assert len(np.unique(start)) == 8
    labels, ks = run_rounds(models, start, rounds=3)
    assert ks == [GROUPS] * 3
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("factor", [1.0, 0.1])
def test_relative_cnt_splits_a_mixed_cluster_and_no_pure_one_whatever_the_pull(
    factor: float,
) -> None:
    """Groups 2 and 3 in one cluster, every cluster shrunk toward its own centre: the mixed one
    is split into the two groups (its sides' separation and bimodality do not change with the
    shrinkage), the pure ones are not."""
    models, truth = planted_models(np.random.default_rng(25))
    mixed = np.minimum(truth, 2).astype(np.int32)
    models = shrunk(models, mixed, factor)
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, mixed, 3)
    result = clustering.tune_cluster_number(models, centers, mixed, pca_map)
    assert result.splits == (2,) and result.merges == ()
    assert adjusted_rand_score(truth, result.assign) == 1.0
    assert np.all(result.split_separations[:2] < cnt_settings.SPLIT_SEPARATION)
    assert result.split_separations[2] > 10 and result.split_bimodalities[2] > 0.9


def test_relative_split_needs_the_same_split_in_two_calls() -> None:
    """With `previous_splits` (as FedAC runs it): a split goes ahead only when the earlier calls
    allowed it too. A mixed cluster splits on the second call; a pure group in which each call
    a different third of the members has just moved together (the clients that trained in the
    round) looks two-sided every time, but never along the same line twice."""
    rng = np.random.default_rng(26)
    models, truth = planted_models(rng)
    mixed = np.minimum(truth, 2).astype(np.int32)
    pca_map = clustering.fit_pca_map(models)
    centers = clustering.m_step(models, mixed, 3)
    none = np.full(len(truth), -1, np.int32)
    first = clustering.tune_cluster_number(models, centers, mixed, pca_map, previous_splits=none)
    assert first.splits == () and first.num_clusters == 3
    sides = first.split_candidates[truth >= 2]
    assert len(set(sides[truth[truth >= 2] == 2])) == 1 and set(sides) == {0, 1}
    second = clustering.tune_cluster_number(
        models, centers, mixed, pca_map, previous_splits=first.split_candidates
    )
    assert second.splits == (2,) and adjusted_rand_score(truth, second.assign) == 1.0
    for rows, splits in (
        ([none, first.split_candidates], ()),
        ([first.split_candidates] * 2, (2,)),
    ):
        # several earlier calls (FedAC: a full pass): every one of them must have allowed it
        again = clustering.tune_cluster_number(
            models, centers, mixed, pca_map, previous_splits=np.stack(rows)
        )
        assert again.splits == splits

    members = np.flatnonzero(truth == 0)
    direction = rng.normal(size=DIM)
    previous, unchecked = none, []
    for _ in range(4):
        moved = models.copy()
        fresh = rng.choice(members, size=4, replace=False)
        moved[fresh] += 1.5 * direction  # 4 of 12 members trained this round
        pca_map = clustering.fit_pca_map(moved)
        centers = clustering.m_step(moved, truth, GROUPS)
        result = clustering.tune_cluster_number(
            moved, centers, truth, pca_map, previous_splits=previous
        )
        assert result.splits == () and (result.split_candidates[members] >= 0).all()
        previous = result.split_candidates
        unchecked.append(clustering.tune_cluster_number(moved, centers, truth, pca_map).splits)
    assert all(splits == (0,) for splits in unchecked)  # without the check: split every time


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
    clustering.clustering_step(
        models, centers, pca_map, reduced, clustering.CntSettings(0.0, 0.0, rule="paper")
    )
    clustering.tune_cluster_number(
        models, centers, labels, pca_map, reduced, clustering.CntSettings(9, 9, rule="paper")
    )
    clustering.tune_cluster_number(
        models,
        centers,
        labels,
        pca_map,
        reduced,
        clustering.CntSettings(merge_separation=0.0, split_separation=0.0),
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
    with pytest.raises(ValueError, match="CNT rule must be one of"):
        clustering.CntSettings(rule="fedac")
    with pytest.raises(ValueError, match="merge_separation <= split_separation"):
        clustering.CntSettings(merge_separation=5.0)
    with pytest.raises(ValueError, match="bimodality bound"):
        clustering.CntSettings(unimodal_bimodality=1.5)
    with pytest.raises(ValueError, match="members on both sides"):
        cnt_statistics.separation(0, 3, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        clustering.fit_pca_map(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="positive finite"):
        clustering.m_step(models, np.zeros(5, int), 1, weights=np.zeros(5))
