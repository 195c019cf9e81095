"""CFL's split statistics in its metrics: every round, for every cluster with sampled members,
the update norms, their ratio, the optimal bipartition's nearest-neighbour gap, the cosine
spread and the code of the test that decided, computed here again from the deltas by hand."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
from conftest import load_script
from test_decisions import DIM, run_info

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import RoundResult, ServerView
from tff_clustered.algorithms.cfl import SplitDecision

STATISTICS = ("mean_norm", "max_norm", "norm_ratio", "separation_gap", "cosine_spread")


def opposed_groups(num_clients: int, noise: float, seed: int = 0) -> np.ndarray:
    """Half the clients update along +d, half along -d, plus their own noise: the mean is
    small, every update large, and the halves are each other's opposite."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=DIM)
    signs = np.where(np.arange(num_clients) % 2 == 0, 1.0, -1.0)
    return signs[:, None] * direction + noise * rng.normal(size=(num_clients, DIM))


def client_ids(num_clients: int) -> tuple[str, ...]:
    return tuple(f"c{i:02d}" for i in range(num_clients))


def round_result(deltas: np.ndarray, clusters: np.ndarray, round_num: int) -> RoundResult:
    return RoundResult(
        round_num=round_num,
        client_ids=client_ids(len(deltas)),
        clusters=np.asarray(clusters, np.int32),
        num_examples=np.full(len(deltas), 30.0),
        loss_sums=np.ones(len(deltas)),
        model_deltas=deltas,
        cluster_models_before=np.zeros((int(np.max(clusters)) + 1, DIM)),
    )


def after_round(
    deltas: np.ndarray, clusters: np.ndarray, round_num: int, **options: object
) -> dict[str, float]:
    cfl = make_algorithm("cfl", **options)
    num_clusters = int(np.max(clusters)) + 1
    ids = client_ids(len(deltas))
    view = ServerView(
        round_num, np.zeros((num_clusters, DIM)), dict(zip(ids, map(int, clusters))), (0, 1), None
    )
    result = round_result(deltas, clusters, round_num)
    decision = cfl.after_round(run_info(ids), view, result, None)  # type: ignore[arg-type]
    return dict(decision.metrics)


def by_hand(updates: np.ndarray, parts: tuple[list[int], list[int]]) -> dict[str, float]:
    """The statistics from their definitions, with loops: norms of the unweighted mean and of
    each update, cosines pair by pair, each client's nearest own-part neighbour."""
    norms = [math.sqrt(sum(v * v for v in u)) for u in updates]
    mean = [sum(u[j] for u in updates) / len(updates) for j in range(updates.shape[1])]
    mean_norm = math.sqrt(sum(v * v for v in mean))
    pairs = list(itertools.permutations(range(len(updates)), 2))
    cosine = {(i, j): float(updates[i] @ updates[j]) / (norms[i] * norms[j]) for i, j in pairs}
    values = list(cosine.values())
    average = sum(values) / len(values)
    spread = math.sqrt(sum((v - average) ** 2 for v in values) / len(values))
    first, second = parts
    nearest = min(
        max(cosine[i, j] for j in part if j != i) for part in (first, second) for i in part
    )
    across = max(cosine[i, j] for i in first for j in second)
    return {
        "mean_norm": mean_norm,
        "max_norm": max(norms),
        "norm_ratio": max(norms) / mean_norm,
        "separation_gap": nearest - across,
        "cosine_spread": spread,
    }


def assert_statistics(metrics: dict[str, float], k: int, expected: dict[str, float]) -> None:
    for name in STATISTICS:
        assert metrics[f"cfl_{name}_{k}"] == pytest.approx(expected[name], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("round_num", "decision"), [(1, SplitDecision.WARMUP), (4, SplitDecision.SPLIT)]
)
def test_statistics_are_logged_in_warmup_rounds_as_after_them(
    round_num: int, decision: SplitDecision
) -> None:
    """The default warm-up of a 20-round run is 4 rounds: in round 1 the opposed groups would
    split but the warm-up holds them; in round 4 they split. Both rounds log the same numbers."""
    deltas = opposed_groups(8, noise=0.05)
    metrics = after_round(deltas, np.zeros(8), round_num)
    assert_statistics(metrics, 0, by_hand(deltas, ([0, 2, 4, 6], [1, 3, 5, 7])))
    assert metrics["cfl_decision_0"] == float(decision)
    assert metrics["num_clusters"] == (2.0 if decision == SplitDecision.SPLIT else 1.0)


def test_every_sampled_cluster_gets_its_statistics_and_the_test_that_held_it_back() -> None:
    """Three clusters in one round after the warm-up: opposed groups (split), clients sharing
    one direction (the norms do not call for a split), two clients (too few members); a
    cluster with no sampled member has no columns."""
    opposed = opposed_groups(6, noise=0.05, seed=1)
    rng = np.random.default_rng(2)
    aligned = rng.normal(size=DIM) + 0.05 * rng.normal(size=(5, DIM))
    pair = rng.normal(size=(2, DIM))
    deltas = np.concatenate([opposed, aligned, pair])
    clusters = np.array([0] * 6 + [1] * 5 + [3] * 2)
    metrics = after_round(deltas, clusters, 10)
    assert_statistics(metrics, 0, by_hand(opposed, ([0, 2, 4], [1, 3, 5])))
    assert metrics["cfl_decision_0"] == SplitDecision.SPLIT
    expected_aligned = by_hand(aligned, ([0, 1], [2, 3, 4]))  # parts only for the gap
    for name in ("mean_norm", "max_norm", "norm_ratio", "cosine_spread"):
        assert metrics[f"cfl_{name}_1"] == pytest.approx(expected_aligned[name], rel=1e-9)
    assert metrics["cfl_norm_ratio_1"] < 2
    assert metrics["cfl_decision_1"] == SplitDecision.NORMS
    assert metrics["cfl_decision_3"] == SplitDecision.TOO_FEW_MEMBERS
    assert metrics["cfl_separation_gap_3"] == -math.inf  # a bipartition of two: no neighbours
    assert not any(column.endswith("_2") for column in metrics)


def test_the_gap_max_clusters_and_a_lone_member_are_reported() -> None:
    """Noise around zero: the norms call for a split (the updates cancel) but the bipartition
    does not separate neighbours, so the relative test's gap decides; the paper's absolute test
    with eps1, eps2 around those norms splits it; a full set of clusters holds it back."""
    deltas = np.random.default_rng(3).normal(size=(10, DIM))
    relative = after_round(deltas, np.zeros(10), 10)
    assert relative["cfl_norm_ratio_0"] > 2
    assert relative["cfl_separation_gap_0"] <= relative["cfl_cosine_spread_0"]
    assert relative["cfl_decision_0"] == SplitDecision.GAP
    absolute = after_round(
        deltas, np.zeros(10), 10, cfl_criterion="absolute", cfl_eps1=10.0, cfl_eps2=0.1
    )
    assert absolute["cfl_decision_0"] == SplitDecision.SPLIT
    full = after_round(deltas, np.zeros(10), 10, cfl_max_clusters=1)
    assert full["cfl_decision_0"] == SplitDecision.MAX_CLUSTERS
    for name in STATISTICS:  # the same statistics whichever test decides
        assert full[f"cfl_{name}_0"] == relative[f"cfl_{name}_0"] == absolute[f"cfl_{name}_0"]
    lone = after_round(deltas[:3], np.array([0, 0, 1]), 10)
    assert lone["cfl_norm_ratio_1"] == pytest.approx(1.0)
    assert math.isnan(lone["cfl_separation_gap_1"]) and math.isnan(lone["cfl_cosine_spread_1"])
    assert lone["cfl_decision_1"] == SplitDecision.TOO_FEW_MEMBERS


def test_the_summary_script_reads_the_decisions_and_ranges_from_metrics_rows() -> None:
    """`scripts/cfl_split_summary.py` on metrics.csv rows (strings, as read back): the count of
    each code, the split round, the statistics' ranges and the largest gap - spread."""
    summary = load_script(os.path.join("scripts", "cfl_split_summary.py"))
    deltas = opposed_groups(8, noise=0.05)
    rows = []
    for round_num in (1, 2, 3, 4):
        metrics = after_round(deltas, np.zeros(8), round_num)
        rows.append({"round": str(round_num), **{k: f"{v:.6g}" for k, v in metrics.items()}})
    lines = summary.summarise(rows, window=2)
    assert lines[0] == "cluster 0: 4 rounds; split 1, warmup 3; split in rounds [4]"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  rounds 1-2",
        "  rounds 3-4",
        "  after the warm-up",
    ]
    gap = metrics["cfl_separation_gap_0"] - metrics["cfl_cosine_spread_0"]
    assert lines[-1].endswith(f"max(gap - spread) {gap:.3f}")
    with pytest.raises(ValueError, match="not a CFL run"):
        summary.summarise([{"round": "1", "accuracy": "0.5"}], window=2)
