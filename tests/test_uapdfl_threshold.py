"""The NumPy part of UA-PDFL's calibrated th_I (`--uapdfl_threshold=0`): the share of peer
pairs whose first-round updates agree, and the threshold it gives as a quantile."""

from __future__ import annotations

import numpy as np
import pytest

from tff_clustered.algorithms.uapdfl import (
    alike_share,
    divergence_matrix,
    quantile_threshold,
)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_divergence_matrix_is_the_symmetrised_kl() -> None:
    p = softmax(np.array([[0.0, 1.0, 2.0], [2.0, 0.0, -1.0]]))
    d = divergence_matrix(p, p)
    kl = np.sum(p[0] * np.log(p[0] / p[1]))
    kl_back = np.sum(p[1] * np.log(p[1] / p[0]))
    assert d[0, 1] == pytest.approx(0.5 * kl + 0.5 * kl_back)
    np.testing.assert_allclose(d, d.T)
    np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-12)
    assert np.all(divergence_matrix(p, p, "js") <= np.log(2) + 1e-12)


def test_peers_moving_together_are_all_alike() -> None:
    rng = np.random.default_rng(0)
    start = np.zeros(10)
    drift = rng.normal(size=10)
    ends = softmax(start + drift + 0.1 * rng.normal(size=(8, 10)))
    assert alike_share(softmax(start), ends) == 1.0


def test_planted_groups_give_the_within_group_share() -> None:
    rng = np.random.default_rng(1)
    start = np.zeros(10)
    drifts = 2.0 * np.eye(10)[:4] - 0.5  # four groups moving to four different classes
    groups = np.repeat(np.arange(4), 3)  # 12 peers, 3 per group
    ends = softmax(start + drifts[groups] + 0.05 * rng.normal(size=(12, 10)))
    within = 4 * 3 / (12 * 11 / 2)  # 12 of the 66 pairs share a group
    assert alike_share(softmax(start), ends) == pytest.approx(within)


def test_threshold_is_the_quantile_of_the_finite_divergences() -> None:
    div = np.array([[0.1, 0.4, np.nan], [0.2, 0.3, 0.5]])
    assert quantile_threshold(div, 1.0) == pytest.approx(0.5)
    assert quantile_threshold(div, 0.0) == pytest.approx(0.1)
    assert quantile_threshold(div, 0.5) == pytest.approx(0.3)
    assert quantile_threshold(np.array([np.nan]), 0.5) == np.inf


@pytest.mark.parametrize(
    "ratio, pairs_alike",
    [(0.3, 5), (0.75, 9), (1.25, 12), (1.7, 14)],
)
def test_the_alike_ratio_counts_pairs_whose_updates_cosine_exceeds_one_minus_it(
    ratio: float, pairs_alike: int
) -> None:
    """Six peers' small first-round updates of equal size, 30 degrees apart in a plane of
    logits (the quadratic regime of Div): a pair i, j has cosine cos(30 |i - j| degrees), and
    `--uapdfl_alike_ratio` r counts it alike when that cosine exceeds 1 - r (0.3: the 5
    neighbouring pairs; 0.75: and the 4 at 60 degrees; 1.25: and the 3 at 90; 1.7: and the 2
    at 120), of the 15 pairs."""
    basis = np.linalg.qr(np.c_[np.ones(10), np.eye(10)[:, :2]])[0][:, 1:3]  # zero-mean plane
    angles = np.radians(30 * np.arange(6))
    updates = 0.01 * (np.cos(angles)[:, None] * basis[:, 0] + np.sin(angles)[:, None] * basis[:, 1])
    start = np.zeros(10)
    share = alike_share(softmax(start), softmax(start + updates), ratio=ratio)
    assert share == pytest.approx(pairs_alike / 15)
