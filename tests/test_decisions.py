"""Algorithms' decisions alone: numbers in, `Decision` out, with a NumPy stand-in for the
`Queries` the loop answers (no TFF, no model, no training). Clients belong to planted groups;
a client's local update is its group's direction plus its own noise."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import Queries, RoundResult, RunInfo, ServerView

DIM = 12


class PlantedQueries(Queries):
    """`Queries` over clients in planted groups: local updates (from any start, for any
    budget) are `directions[group] + noise * N(0, 1)`, fixed per client; a cluster model's loss
    on a client is its distance to the model the client's group would reach."""

    def __init__(self, groups: dict[str, int], noise: float = 0.1, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.groups = groups
        self.directions = rng.normal(size=(max(groups.values()) + 1, DIM))
        self.own = {c: noise * rng.normal(size=DIM) for c in groups}
        self.calls: list[tuple[str, int]] = []

    def local_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int,
        steps: Optional[int] = None,
    ) -> np.ndarray:
        self.calls.append(("local_updates", len(client_ids)))
        return np.stack([self.directions[self.groups[c]] + self.own[c] for c in client_ids])

    def cluster_losses(self, cluster_models: np.ndarray, client_ids: Sequence[str]) -> np.ndarray:
        targets = self.local_updates(client_ids, cluster_models[0], 1, 0)
        return np.linalg.norm(cluster_models[None, :, :] - targets[:, None, :], axis=2)

    def client_models(self, client_ids: Sequence[str]) -> np.ndarray:
        return self.local_updates(client_ids, np.zeros(DIM), 1, 0)

    def predict_probabilities(self, models: np.ndarray, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def initial_model(self, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).normal(size=DIM)


def run_info(client_ids: Sequence[str], seed: int = 0) -> RunInfo:
    return RunInfo(
        client_ids=tuple(client_ids),
        train_sizes={c: 30 for c in client_ids},
        seed=seed,
        clients_per_round=10,
        layer_sizes=(2,),
        tensor_sizes=(DIM - 2, 2),
        num_trainable_values=DIM,
        initial_model=np.zeros(DIM),
        total_rounds=20,
    )


def planted(num_clients: int, num_groups: int) -> dict[str, int]:
    return {f"c{i:02d}": i % num_groups for i in range(num_clients)}


def ari(assignment: dict[str, int], groups: dict[str, int]) -> float:
    ids = sorted(groups)
    return adjusted_rand_score([groups[c] for c in ids], [assignment[c] for c in ids])


@pytest.mark.parametrize("algorithm", ["fedgroup", "fedgroup_madc"])
def test_fedgroup_cold_start_groups_the_planted_directions(algorithm: str) -> None:
    """Alg. 3: 5m pre-trained clients are clustered (EDC / MADC) into the planted groups, each
    group's model is w0 plus its members' mean update, and every other client joins its
    group by Eq. 9 (eager cold start)."""
    groups = planted(40, 4)
    queries = PlantedQueries(groups)
    fedgroup = make_algorithm(algorithm, num_clusters=4, pretrain_scale=5, cold_start="eager")
    run = run_info(list(groups))
    decision = fedgroup.init(run, queries)
    assert ari(dict(decision.assignment), groups) == 1.0
    assert decision.cluster_models is not None and decision.cluster_models.shape == (4, DIM)
    for k in range(4):  # w0 (zero here) plus the mean update of the group's pre-trained members
        members = [c for c in decision.state.clustered_clients if decision.assignment[c] == k]
        expected = queries.local_updates(members, run.initial_model, 1, 0).mean(axis=0)
        np.testing.assert_allclose(decision.cluster_models[k], expected, rtol=1e-6)
    assert queries.calls[0] == ("local_updates", 20)  # the pre-trained 5m
    assert queries.calls[1] == ("local_updates", 20)  # the newcomers' cold start


def test_fedgroup_lazy_cold_start_assigns_sampled_newcomers_in_the_plan() -> None:
    groups = planted(30, 3)
    queries = PlantedQueries(groups, seed=1)
    fedgroup = make_algorithm("fedgroup", num_clusters=3, pretrain_scale=2, cold_start="lazy")
    run = run_info(list(groups), seed=1)
    start = fedgroup.init(run, queries)
    waiting = [c for c, g in start.assignment.items() if g < 0]
    assert len(waiting) == 30 - 6
    view = ServerView(0, start.cluster_models, dict(start.assignment), tuple(range(2)), start.state)
    plan = fedgroup.plan(run, view, waiting[:5], queries)
    assignment = {**start.assignment, **plan.decision.assignment}
    assert all(assignment[c] >= 0 for c in waiting[:5])
    assert all(assignment[c] < 0 for c in waiting[5:])
    known = {c: g for c, g in assignment.items() if g >= 0}
    assert ari(known, {c: groups[c] for c in known}) == 1.0
    np.testing.assert_array_equal(plan.clusters, [assignment[c] for c in waiting[:5]])
    # evaluation places each waiting client as the eager cold start would, once per run
    eager = make_algorithm("fedgroup", num_clusters=3, pretrain_scale=2, cold_start="eager")
    expected = eager.init(run, PlantedQueries(groups, seed=1)).assignment
    scored = waiting[3:12]
    calls = len(queries.calls)
    first = fedgroup.evaluation_clusters(run, view, scored, queries)
    np.testing.assert_array_equal(first, [expected[c] for c in scored])
    assert len(queries.calls) == calls + 1  # one pre-training of the scored waiting clients
    again = fedgroup.evaluation_clusters(run, view, waiting[:12], queries)
    np.testing.assert_array_equal(again, [expected[c] for c in waiting[:12]])
    assert queries.calls[-1] == ("local_updates", 3)  # only the three not placed before


def test_fedgroup_auto_cold_start_is_eager_while_newcomers_fit_the_run_s_own_trainings() -> None:
    """`--cold_start=auto` (the default): 54 newcomers (60 clients, alpha*m = 6 clustered) are
    pre-trained before round 1 when the run trains at least 54 clients (6 rounds x 10), or its
    length is unknown, and when first sampled beyond (4 rounds x 10 = 40); each choice decides
    exactly as the option it picks, and says why with the counts. RAC's random newcomers cost
    no pre-training: eager."""
    groups = planted(60, 3)
    auto = make_algorithm("fedgroup", num_clusters=3, pretrain_scale=2)
    assert auto.options.cold_start == "auto"
    for rounds, mode in ((6, "eager"), (0, "eager"), (4, "lazy")):
        run = dataclasses.replace(run_info(list(groups)), total_rounds=rounds)
        value, why = auto.run_choices(run)["cold_start"]
        assert value == mode, why
        assert "54 newcomers" in why and f"{rounds * 10} client trainings" in why
        chosen = make_algorithm("fedgroup", num_clusters=3, pretrain_scale=2, cold_start=mode)
        assert chosen.run_choices(run) == {}  # an explicit choice is not the data's
        decided = auto.init(run, PlantedQueries(groups))
        assert decided.assignment == chosen.init(run, PlantedQueries(groups)).assignment
        waiting = sum(g < 0 for g in decided.assignment.values())
        assert waiting == (54 if mode == "lazy" else 0)
    rac = make_algorithm("fedgroup_rac", num_clusters=3, pretrain_scale=2)  # random newcomers
    assert rac.run_choices(run)["cold_start"][0] == "eager"


def round_result(groups: dict[str, int], queries: PlantedQueries, round_num: int) -> RoundResult:
    ids = tuple(groups)
    deltas = queries.local_updates(ids, np.zeros(DIM), 1, round_num)
    return RoundResult(
        round_num=round_num,
        client_ids=ids,
        clusters=np.zeros(len(ids), np.int32),
        num_examples=np.full(len(ids), 30.0),
        loss_sums=np.ones(len(ids)),
        model_deltas=deltas,
        cluster_models_before=np.zeros((1, DIM)),
    )


def test_cfl_splits_opposed_groups_and_not_one_group() -> None:
    """Alg. 1: two groups whose updates point opposite ways (their mean is small, each large)
    split in two along the plant, each half from its members' mean update; clients of one
    group, differing by noise only, stay together."""
    groups = planted(12, 2)
    queries = PlantedQueries(groups, seed=2)
    queries.directions[1] = -queries.directions[0]
    cfl = make_algorithm("cfl", cfl_warmup_rounds=0)
    run = run_info(list(groups))
    view = ServerView(1, np.zeros((1, DIM)), {c: 0 for c in groups}, (0, 1), None)
    decision = cfl.after_round(run, view, round_result(groups, queries, 1), queries)
    assignment = {c: 0 for c in groups} | dict(decision.assignment)
    assert ari(assignment, groups) == 1.0
    assert decision.cluster_models is not None and len(decision.cluster_models) == 2
    moved = next(iter(decision.assignment.values()))
    np.testing.assert_allclose(
        decision.cluster_models[moved],
        queries.directions[groups[next(iter(decision.assignment))]],
        atol=0.2,
    )
    one_group = {c: 0 for c in groups}
    same = PlantedQueries(one_group, seed=2)
    decision = cfl.after_round(run, view, round_result(one_group, same, 1), same)
    assert not decision.assignment and decision.cluster_models is None
    assert decision.metrics["num_clusters"] == 1.0
