"""CFL's server math (Sattler et al., Alg. 1): cosine similarities, the split criterion on
update norms, the complete-linkage bipartition and alpha_cross^max."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from tff_clustered import clustering


def two_direction_updates(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """7 updates around two random directions (4 + 3 clients), shuffled, with random scales;
    returns the updates and the planted membership."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=300), rng.normal(size=300)
    membership = rng.permutation([0, 0, 0, 0, 1, 1, 1])
    updates = np.stack([(a, b)[g] + rng.normal(0, 0.3, 300) for g in membership])
    return updates * rng.uniform(0.1, 10.0, (7, 1)), membership


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bipartition_recovers_two_planted_directions(seed: int) -> None:
    updates, membership = two_direction_updates(seed)
    first, second = clustering.optimal_bipartition(clustering.pairwise_cosine(updates))
    planted = [np.flatnonzero(membership == g) for g in (membership[0], 1 - membership[0])]
    assert first.tolist() == planted[0].tolist() and second.tolist() == planted[1].tolist()
    assert first[0] == 0  # the part holding client 0 first, each part sorted


def test_cross_similarity_is_below_within_similarity() -> None:
    updates, _ = two_direction_updates(3)
    sim = clustering.pairwise_cosine(updates)
    first, second = clustering.optimal_bipartition(sim)
    cross = clustering.max_cross_similarity(sim, first, second)
    assert cross == pytest.approx(max(sim[i, j] for i in first for j in second))
    assert cross < min(sim[np.ix_(first, first)].min(), sim[np.ix_(second, second)].min())
    with pytest.raises(ValueError, match="non-empty"):
        clustering.max_cross_similarity(sim, first, np.array([], np.int64))


def test_pairwise_cosine() -> None:
    u = np.random.default_rng(4).normal(size=(5, 8))
    sim = clustering.pairwise_cosine(u)
    want = (u @ u.T) / np.outer(np.linalg.norm(u, axis=1), np.linalg.norm(u, axis=1))
    np.testing.assert_allclose(sim, want, rtol=1e-12)
    np.testing.assert_allclose(np.diag(sim), 1.0)
    with pytest.raises(ValueError, match="clients, d"):
        clustering.pairwise_cosine(u[0])


@pytest.mark.parametrize("seed", range(5))
def test_bipartition_is_scipy_complete_linkage_on_negative_similarity(seed: int) -> None:
    # Reference: complete linkage of -S (shifted by 1 to be non-negative; complete linkage
    # merges in the same order under a constant shift) cut into 2 clusters.
    rng = np.random.default_rng(seed)
    sim = clustering.pairwise_cosine(rng.normal(size=(9, 4)))
    first, second = clustering.optimal_bipartition(sim)
    distance = 1.0 - sim
    np.fill_diagonal(distance, 0.0)
    cut = fcluster(linkage(squareform(distance, checks=False), "complete"), 2, "maxclust")
    assert first.tolist() == np.flatnonzero(cut == cut[0]).tolist()
    assert second.tolist() == np.flatnonzero(cut != cut[0]).tolist()
    again = clustering.optimal_bipartition(sim)  # deterministic
    assert again[0].tolist() == first.tolist() and again[1].tolist() == second.tolist()


def test_bipartition_differs_from_single_linkage_on_a_chain() -> None:
    # Points on a line 0, 1, ..., 9 and 10.5: single linkage (the exact argmin of
    # alpha_cross^max) cuts off the last point; complete linkage (reference code) halves it.
    x = np.array([*range(10), 10.5])
    sim = -np.abs(x[:, None] - x[None, :])
    first, second = clustering.optimal_bipartition(sim)
    assert len(second) > 1 and len(first) > 1
    with pytest.raises(ValueError, match="at least 2"):
        clustering.optimal_bipartition(np.ones((1, 1)))
    with pytest.raises(ValueError, match="square"):
        clustering.optimal_bipartition(np.ones((2, 3)))


def test_update_norms() -> None:
    rng = np.random.default_rng(5)
    a = rng.normal(size=50)
    mean_norm, max_norm = clustering.update_norms(np.stack([a, a, -a, -a]))
    assert mean_norm == pytest.approx(0.0, abs=1e-12)
    assert max_norm == pytest.approx(np.linalg.norm(a))
    u = rng.normal(size=(4, 50)).astype(np.float32)
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    mean_norm, max_norm = clustering.update_norms(u, weights)
    u64 = u.astype(np.float64)
    want = np.linalg.norm((weights[:, None] * u64).sum(0) / weights.sum())
    assert mean_norm == pytest.approx(want, rel=1e-12)
    assert max_norm == pytest.approx(max(np.linalg.norm(r) for r in u64), rel=1e-12)
    unweighted, _ = clustering.update_norms(u)
    assert unweighted == pytest.approx(np.linalg.norm(u64.mean(0)), rel=1e-12)
    assert unweighted != pytest.approx(mean_norm)
    with pytest.raises(ValueError, match="one entry per update"):
        clustering.update_norms(u, weights[:3])


def test_split_criterion() -> None:
    split = clustering.should_split
    assert split(0.1, 2.0, 3, eps1=0.4, eps2=1.6)
    assert not split(0.5, 2.0, 3, eps1=0.4, eps2=1.6)  # not yet stationary
    assert not split(0.1, 1.0, 3, eps1=0.4, eps2=1.6)  # every client stationary too
    assert not split(0.1, 2.0, 2, eps1=0.4, eps2=1.6)  # size must exceed min_size = 2
    assert split(0.1, 2.0, 2, eps1=0.4, eps2=1.6, min_size=1)
    assert not split(0.4, 2.0, 3, eps1=0.4, eps2=1.6)  # strict inequalities
    assert not split(0.1, 1.6, 3, eps1=0.4, eps2=1.6)
    # From updates: opposite halves give a small mean but large members -> split.
    a = np.random.default_rng(6).normal(size=50)
    assert split(*clustering.update_norms(np.stack([a, a, -a, -a])), 4, 0.4, 1.6)
    assert not split(*clustering.update_norms(np.stack([a, a, a])), 3, 0.4, 1.6)


def test_separation_gap_is_positive_only_for_separated_groups() -> None:
    rng = np.random.default_rng(0)
    directions = rng.normal(size=(2, 50))
    grouped = np.repeat(directions, 5, axis=0) + rng.normal(0, 0.3, (10, 50))
    s = clustering.pairwise_cosine(grouped)
    first, second = clustering.optimal_bipartition(s)
    assert clustering.separation_gap(s, first, second) > 0.5
    noise = clustering.pairwise_cosine(rng.normal(size=(10, 50)))
    first, second = clustering.optimal_bipartition(noise)
    assert clustering.separation_gap(noise, first, second) < 0
    # hand-made: within 0.9 / 0.8, across at most 0.1 -> 0.8 - 0.1
    s = np.array([[1, 0.9, 0.1, 0.0], [0.9, 1, 0.0, -0.2], [0.1, 0.0, 1, 0.8], [0.0, -0.2, 0.8, 1]])
    gap = clustering.separation_gap(s, np.array([0, 1]), np.array([2, 3]))
    assert gap == pytest.approx(0.7)
    assert clustering.separation_gap(s, np.array([0]), np.array([1])) == -np.inf


def test_the_neighbour_gap_accepts_a_split_of_four_groups_that_the_separation_gap_refuses() -> None:
    """Four groups of updates: the optimal bipartition keeps every group whole but puts two on
    each side, so some within-part cosine is below a cross-part one (separation gap < 0), while
    every client's nearest neighbour is in its own group (neighbour gap > 0). Noise: neither."""
    rng = np.random.default_rng(1)
    directions = rng.normal(size=(4, 200))
    groups = np.arange(16) % 4
    s = clustering.pairwise_cosine(directions[groups] + rng.normal(0, 0.5, (16, 200)))
    first, second = clustering.optimal_bipartition(s)
    assert set(groups[first].tolist()).isdisjoint(groups[second].tolist())  # groups kept whole
    assert clustering.separation_gap(s, first, second) < 0
    spread = np.std(s[~np.eye(16, dtype=bool)])  # CFL's margin
    assert clustering.neighbour_separation_gap(s, first, second) > max(spread, 0.3)
    misses = 0
    for _ in range(50):
        noise = clustering.pairwise_cosine(rng.normal(size=(16, 200)) + 0.5 * rng.normal(size=200))
        first, second = clustering.optimal_bipartition(noise)
        misses += clustering.neighbour_separation_gap(noise, first, second) > 0
    assert misses == 0
    # a part of one client has no neighbour
    assert clustering.neighbour_separation_gap(s, np.array([0]), np.arange(1, 16)) == -np.inf
