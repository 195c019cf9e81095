"""FedGroup and FedGrouProx: clients grouped by decomposed similarity of their updates.

FedGroup and FedGrouProx (Duan et al., "FedGroup: Efficient Federated Learning via
Decomposed Similarity-Based Clustering"), with the RCC and RAC ablations.

Before round 1 (Alg. 3, group cold start): alpha*m clients pre-train from w0; their updates are
clustered by EDC or MADC; each group starts from its members' mean pre-trained model, and its
mean update is the group direction. Every other client (newcomer) pre-trains from w0 and joins
the group of least Eq. 9 dissimilarity, eagerly before round 1 or lazily when first sampled;
clients that join mid-run are assigned the same way. Groups are static; each trains by FedAvg
(FedGroup) or FedProx (FedGrouProx) on the shared core; optional inter-group aggregation eta_g
(Alg. 2 line 5). `discrepancy` is the paper's Eq. 4 metric, for comparison tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar, Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    Queries,
    ReleasedUpdates,
    Releases,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
)
from tff_clustered.algorithms.cold_starts import shrunk_toward_start
from tff_clustered.algorithms.fedprox import DEFAULT_MU, MU_HELP, MU_SEARCH
from tff_clustered.options import option
from tff_clustered.search_space import Choice
from tff_clustered.seeds import ALGORITHM, derived_seed

PAPER = (
    "Duan et al., FedGroup: Efficient Federated Learning via Decomposed Similarity-Based "
    "Clustering, ISPA 2021"
)
DEFAULT_GROUPS = 3
# The values a tuned comparison tries for the cold start's scale alpha (the paper's 20, half
# and a quarter of it, twice it) and for its pre-training epochs (the paper implies one); ours.
PRETRAIN_SCALES = (5, 10, 20, 40)
PRETRAIN_EPOCHS = (1, 2, 5)


@dataclasses.dataclass(frozen=True)
class GroupState:
    group_directions: np.ndarray  # (m, D): Dw_0^(g_j), the mean pre-training update per group
    late_clients: frozenset[str]  # clients that join the run at `newcomer_round`
    clustered_clients: frozenset[str] = frozenset()  # the clients of the group cold start


@dataclasses.dataclass(frozen=True)
class FedGroupOptions:
    num_clusters: int = option(DEFAULT_GROUPS, "FedGroup: groups m, each trained by FedAvg.")
    pretrain_scale: int = option(
        20,
        "FedGroup alpha: alpha*m clients cluster at cold start.",
        search=Choice(PRETRAIN_SCALES),
    )
    pretrain_epochs: int = option(
        1, "FedGroup: local epochs of cold-start pre-training.", search=Choice(PRETRAIN_EPOCHS)
    )
    pretrain_steps: int = option(
        0,
        "FedGroup: pre-train for this many minibatches instead of --pretrain_epochs (the "
        "authors' code: 50 steps of batch 10); 0: use epochs.",
    )
    cold_start: str = option(
        "auto",
        "FedGroup: when newcomers are assigned: eager (before round 1), lazy (when first sampled "
        "or evaluated), or auto (eager while the newcomers are at most the run's client "
        "trainings, rounds x clients_per_round, or alpha*m; lazy beyond).",
        ("auto", "eager", "lazy"),
    )
    eta_g: float = option(0.0, "FedGroup: inter-group aggregation rate (0 = off).")
    inter_group_mode: str = option(
        "additive", "FedGroup: inter-group formula.", ("additive", "normalized")
    )
    newcomer_fraction: float = option(0.0, "FedGroup: fraction of clients that join late.")
    newcomer_round: int = option(1, "FedGroup: round in which late clients join.")


@dataclasses.dataclass(frozen=True)
class FedGroupRACOptions(FedGroupOptions):
    rac_draw: str = option(
        "static",
        "FedGroup RAC: a cold client's random group is drawn once (static), or drawn again "
        "every time it is sampled (resample, the authors' code).",
        ("static", "resample"),
    )


@dataclasses.dataclass(frozen=True)
class FedGrouProxOptions(FedGroupOptions):
    mu: float = option(DEFAULT_MU, MU_HELP, search=MU_SEARCH)


class FedGroup(Algorithm):
    """Group cold start by EDC, newcomers by Eq. 9, static groups each trained by FedAvg."""

    name = "fedgroup"
    model_kinds = ("cluster", "global")
    paper = PAPER
    Options = FedGroupOptions
    refused: ClassVar[Mapping[str, str]] = {
        **Algorithm.refused,
        "mu": "FedGroup trains by FedAvg; use --algorithm=fedgrouprox (or fedgrouprox_madc)",
    }
    clustering_method: ClassVar[str] = "edc"  # "edc" | "madc" | "rcc" (random cluster centers)
    random_newcomers: ClassVar[bool] = False  # RAC: newcomers join a random group
    releases: ClassVar[Releases] = Releases(
        cold_start=(
            "FedGroup's cold start: the groups and their initial models, from the first "
            "clients' pre-training updates (Alg. 3)",
            "FedGroup's newcomer placement: each newcomer's group, from its own pre-training "
            "update (Eq. 9)",
        ),
        outside=(
            "FedGroup's evaluation placement: the group an evaluated client not assigned yet "
            "(lazy cold start, a late newcomer) is scored with and clients.csv names, from a "
            "pre-training update of its own (noised as the cold start's, not charged)",
        ),
    )

    def __init__(self, options: Optional[FedGroupOptions] = None) -> None:
        super().__init__(options)
        # The groups evaluation gave clients not assigned yet, for the state of one run.
        self.evaluation_placements: tuple[object, dict[str, int]] = (None, {})
        o = self.options
        check(
            [
                (self.num_clusters >= 1, f"{self.name}: num_clusters must be >= 1"),
                (o.pretrain_scale >= 1, "pretrain_scale must be >= 1"),
                (o.pretrain_epochs >= 1, "pretrain_epochs must be >= 1"),
                (o.pretrain_steps >= 0, "pretrain_steps must be >= 0 (0: use epochs)"),
                (o.eta_g >= 0, "eta_g must be >= 0"),
                (0 <= o.newcomer_fraction < 1, "newcomer_fraction must be in [0, 1)"),
                (o.newcomer_round >= 1, "newcomer_round must be >= 1"),
                (self.prox_mu >= 0, f"{self.name}: mu must be >= 0"),
            ]
        )

    @property
    def num_clusters(self) -> int:
        return int(self.options.num_clusters)

    @property
    def prox_mu(self) -> float:
        if not isinstance(self.options, FedGrouProxOptions):
            return 0.0
        return float(self.options.mu)

    def clustered_count(self, present: int) -> int:
        """Clients of the group cold start among `present` ones: alpha*m (RCC: m)."""
        m = self.num_clusters
        return (
            m if self.clustering_method == "rcc" else min(self.options.pretrain_scale * m, present)
        )

    def run_choices(self, run: RunInfo) -> dict[str, tuple[str, str]]:
        """`--cold_start=auto` (ours: the paper pre-trains every client before round 1, Alg. 1):
        eager while the newcomers it would pre-train before they are needed are at most the
        run's own client trainings (rounds x clients_per_round) or the paper's group cold start
        (alpha*m pre-trainings), so eager never costs more than the training or the cold start
        the run does anyway; lazy beyond. RAC places newcomers at random, without pre-training:
        eager. Counts only: a run of unknown length (`total_rounds` 0) is eager."""
        if self.options.cold_start != "auto":
            return {}
        present = len(run.client_ids) - self.late_count(len(run.client_ids))
        newcomers = len(run.client_ids) - self.clustered_count(present)
        trainings = run.total_rounds * run.clients_per_round
        cold_start = self.options.pretrain_scale * self.num_clusters
        bound = max(trainings, cold_start)
        if self.random_newcomers:
            return {"cold_start": ("eager", "RAC places newcomers at random, no pre-training")}
        mode, relation = ("eager", "<=") if not trainings or newcomers <= bound else ("lazy", ">")
        why = (
            f"{newcomers:,} newcomers to pre-train {relation} {bound:,} (the larger of the run's "
            f"{trainings:,} client trainings, {run.total_rounds} rounds x "
            f"{run.clients_per_round} clients, and the group cold start's alpha*m = "
            f"{cold_start:,} pre-trainings)"
        )
        return {"cold_start": (mode, why)}

    def eager(self, run: RunInfo) -> bool:
        """Whether newcomers are pre-trained before round 1 (`--cold_start`, `auto` resolved)."""
        return self.run_choices(run).get("cold_start", (self.options.cold_start,))[0] == "eager"

    # -- Alg. 3: group cold start ------------------------------------------------------------
    def init(self, run: RunInfo, queries: Queries) -> Decision:
        m = self.num_clusters
        rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM))
        ids = list(run.client_ids)
        num_late = self.late_count(len(ids))
        late = set(rng.choice(ids, num_late, replace=False).tolist()) if num_late else set()
        present = [c for c in ids if c not in late]
        count = self.clustered_count(len(present))
        if count < m:
            raise ValueError(f"{self.name}: {len(present)} clients cannot form {m} groups")
        chosen = sorted(rng.choice(len(present), count, replace=False))
        clustered = [present[i] for i in chosen]
        released = self.pretrain(run, clustered, 0, queries)  # noised in a private run
        updates = released.updates
        similarity = None
        if self.clustering_method == "edc":
            embedding = clustering.edc_embedding(updates, m, seed=run.seed)
            labels = clustering.kmeans_edc(embedding, m, seed=run.seed)
            matrix, measure = clustering.edc_matrix(embedding), "EDC distance (Eq. 8)"
        elif self.clustering_method == "madc":
            matrix, measure = clustering.madc_matrix(updates), "MADC distance (Eq. 7)"
            labels = clustering.agglomerative_madc(matrix, m)
        else:  # RCC: each of m random clients is one group's center
            labels = np.arange(m, dtype=np.int32)
        if self.clustering_method != "rcc":
            similarity = Similarity(
                measure, tuple(clustered), matrix, tuple(int(g) for g in labels), 0
            )
        directions = np.zeros((m, updates.shape[1]))
        for j in range(m):  # empty group: model w0, zero direction
            if np.any(labels == j):
                directions[j] = updates[labels == j].mean(axis=0)
        state = GroupState(directions, frozenset(late), frozenset(clustered))
        assignment = {c: -1 for c in ids}
        assignment.update(zip(clustered, (int(g) for g in labels)))
        newcomers = Decision()
        if self.eager(run):
            pending = [c for c in present if assignment[c] < 0]
            newcomers = self.cold_start(run, state, pending, 0, queries)
            assignment.update(newcomers.assignment)
        counts = np.bincount(labels, minlength=m)  # a noised mean shrunk toward w0 by its noise
        models = shrunk_toward_start(
            run.initial_model,
            run.initial_model[None, :] + directions,
            released,
            counts,
        )
        return Decision(
            assignment=assignment,
            cluster_models=models,
            state=state,
            similarity=similarity,
            released=(released, *newcomers.released),
        )

    # -- newcomers (Eq. 9) -------------------------------------------------------------------
    def cold_start(
        self,
        run: RunInfo,
        state: GroupState,
        client_ids: Sequence[str],
        round_num: int,
        queries: Queries,
    ) -> Decision:
        """Groups of newcomers: pre-train from w0, join the group of least Eq. 9 dissimilarity
        (RAC: a uniformly random group instead); the decision's `released` are the updates
        read (noised in a private run)."""
        if not client_ids:
            return Decision()
        if self.random_newcomers:
            rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, round_num))
            groups = rng.integers(0, self.num_clusters, len(client_ids))
            return Decision(assignment=dict(zip(client_ids, (int(g) for g in groups))))
        released = self.pretrain(run, client_ids, round_num, queries)
        groups = clustering.assign_newcomers(state.group_directions, released.updates)
        return Decision(
            assignment=dict(zip(client_ids, (int(g) for g in groups))), released=(released,)
        )

    def pretrain(
        self, run: RunInfo, client_ids: Sequence[str], round_num: int, queries: Queries
    ) -> ReleasedUpdates:
        """ClientPretrain (Alg. 3): each client's update of local SGD from w0, as the server
        may read it (clipped and noised in a private run: `Queries.released_updates`)."""
        steps = self.options.pretrain_steps or None
        return queries.released_updates(
            client_ids, run.initial_model, self.options.pretrain_epochs, round_num, steps
        )

    def late_count(self, num_clients: int) -> int:
        """How many of `num_clients` clients join late (`newcomer_fraction`)."""
        return int(round(self.options.newcomer_fraction * num_clients))

    def early_eligible(self, num_clients: int) -> tuple[int, ...]:
        late = self.late_count(num_clients)
        return (num_clients - late,) * (self.options.newcomer_round - 1) if late else ()

    def eligible(self, run: RunInfo, view: ServerView) -> Sequence[str]:
        if view.round_num + 1 >= self.options.newcomer_round:
            return run.client_ids
        return [c for c in run.client_ids if c not in view.state.late_clients]

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        if self.eager(run):  # everyone present is assigned at once
            candidates = self.eligible(run, view)
        else:
            candidates = client_ids
        pending = [c for c in candidates if view.assignment[c] < 0]
        newcomers = self.cold_start(run, view.state, pending, view.round_num + 1, queries)
        joined = {**newcomers.assignment, **self.redrawn(run, view, client_ids)}
        clusters = np.array([joined.get(c, view.assignment[c]) for c in client_ids], np.int32)
        return Plan(clusters, decision=Decision(assignment=joined, released=newcomers.released))

    def redrawn(self, run: RunInfo, view: ServerView, client_ids: Sequence[str]) -> dict[str, int]:
        """RAC with `rac_draw=resample`: every sampled cold client (one not clustered at the
        group cold start) gets a fresh uniformly random group."""
        if not (self.random_newcomers and getattr(self.options, "rac_draw", "") == "resample"):
            return {}
        cold = [c for c in client_ids if c not in view.state.clustered_clients]
        rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, view.round_num + 1, 1))
        return dict(zip(cold, (int(g) for g in rng.integers(0, self.num_clusters, len(cold)))))

    def evaluation_clusters(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> np.ndarray:
        """A client not assigned yet (lazy cold start, a late newcomer) is scored with the
        group the eager cold start gives it: pre-trained from w0 as in round 0, placed by Eq. 9
        against the static group directions (its update noised in a private run, and not
        charged: evaluation is outside the guarantee). That placement depends on the client
        alone, so it is made once per run and reused by later evaluations (never by training:
        a sampled client is placed by its own round's pre-training, `plan`). RAC: a random
        group, drawn at each evaluation."""
        waiting = [c for c in client_ids if view.assignment.get(c, -1) < 0]
        if self.random_newcomers:
            joined = self.cold_start(run, view.state, waiting, view.round_num, queries).assignment
        else:
            if self.evaluation_placements[0] is not view.state:  # another run, or resumed
                self.evaluation_placements = (view.state, {})
            joined = self.evaluation_placements[1]
            missing = [c for c in waiting if c not in joined]
            joined.update(self.cold_start(run, view.state, missing, 0, queries).assignment)
        return np.array([joined.get(c, view.assignment.get(c, -1)) for c in client_ids], np.int32)

    # -- Alg. 2 line 5: inter-group aggregation ----------------------------------------------
    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        if not self.options.eta_g:
            return Decision()
        return Decision(
            cluster_models=clustering.inter_group_aggregation(
                view.cluster_models, self.options.eta_g, self.options.inter_group_mode
            )
        )


def discrepancy(run: RunInfo, view: ServerView, result: RoundResult) -> dict[str, float]:
    """FedGroup Eq. 4: mean over participants of ||w_i - w^(g(i))||_2, the client's trained
    model against its cluster's model after aggregation. Defined for algorithms without
    personal tensors (a round metric: `Experiment(round_metrics=[discrepancy])`)."""
    if result.model_deltas is None or len(view.shared) != run.num_tensors:
        return {}
    before, after = result.cluster_models_before, view.cluster_models
    if len(after) != len(before):  # the clusters changed in this round
        return {}
    gaps = [
        np.linalg.norm(before[k] + delta - after[k])
        for k, delta in zip(result.clusters, result.model_deltas)
    ]
    return {"discrepancy": float(np.mean(gaps))}


class FedGroupMADC(FedGroup):
    """FedGroup with MADC clustering (complete-linkage agglomerative) at the cold start."""

    name = "fedgroup_madc"
    clustering_method = "madc"


class FedGrouProx(FedGroup):
    """FedGroup whose groups train by FedProx (`--mu`)."""

    name = "fedgrouprox"
    Options = FedGrouProxOptions


class FedGrouProxMADC(FedGroup):
    """FedGrouProx: FedGroup with FedProx, and MADC clustering at the cold start."""

    name = "fedgrouprox_madc"
    Options = FedGrouProxOptions
    clustering_method = "madc"


class FedGroupRCC(FedGroup):
    """Ablation: m random clients are the group centers; everyone else cold-starts by Eq. 9."""

    name = "fedgroup_rcc"
    clustering_method = "rcc"
    releases = Releases(
        cold_start=(
            "FedGroup-RCC's cold start: each group's initial model, one random client's "
            "pre-training update",
            *FedGroup.releases.cold_start[1:],
        ),
        outside=FedGroup.releases.outside,
    )


class FedGroupRAC(FedGroup):
    """Ablation: EDC group cold start, then newcomers join uniformly random groups."""

    name = "fedgroup_rac"
    Options = FedGroupRACOptions
    random_newcomers = True
    releases = Releases(cold_start=FedGroup.releases.cold_start[:1])  # random newcomers
