"""FedGroup and FedGrouProx (Duan et al., "FedGroup: Efficient Federated Learning via
Decomposed Similarity-Based Clustering"), with the RCC and RAC ablations.

Before round 1 (Alg. 3, group cold start): alpha*m clients pre-train from w0; their updates are
clustered by EDC or MADC; each group starts from its members' mean pre-trained model, and its
mean update is the group direction. Every other client (newcomer) pre-trains from w0 and joins
the group of least Eq. 9 dissimilarity, eagerly before round 1 or lazily when first sampled;
clients that join mid-run are assigned the same way. Groups are static; each trains by FedAvg
(FedGroup) or FedProx (FedGrouProx) on the shared core; optional inter-group aggregation eta_g.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions
from tff_clustered.algorithms.fedprox import DEFAULT_MU

if TYPE_CHECKING:
    from tff_clustered.orchestration import Experiment

PAPER = (
    "Duan et al., FedGroup: Efficient Federated Learning via Decomposed Similarity-Based "
    "Clustering, ISPA 2021"
)
DEFAULT_GROUPS = 3


class FedGroup(Algorithm):
    name = "fedgroup"
    paper = PAPER
    clustering_method: ClassVar[str] = "edc"  # "edc" | "madc" | "rcc" (random cluster centers)
    random_newcomers: ClassVar[bool] = False  # RAC: newcomers join a random group
    proximal: ClassVar[bool] = False  # FedGrouProx

    def __init__(self, options: Optional[AlgorithmOptions] = None) -> None:
        super().__init__(options)
        self.group_directions: Optional[np.ndarray] = None  # (m, d), Dw_0^(g_j)
        self.late_clients: set[str] = set()

    def default_num_clusters(self, options: AlgorithmOptions) -> int:
        return options.num_clusters or DEFAULT_GROUPS

    def default_prox_mu(self, options: AlgorithmOptions) -> float:
        if not self.proximal:
            return super().default_prox_mu(options)
        return DEFAULT_MU if options.prox_mu is None else options.prox_mu

    # -- Alg. 3: group cold start ------------------------------------------------------------
    def setup(self, experiment: Experiment) -> None:
        from tff_clustered.orchestration import ALGORITHM, derived_seed

        options, m = self.options, self.num_clusters
        rng = np.random.default_rng(derived_seed(experiment.config.seed, ALGORITHM))
        ids = experiment.data.client_ids
        num_late = int(round(options.newcomer_fraction * len(ids)))
        self.late_clients = (
            set(rng.choice(ids, num_late, replace=False).tolist()) if num_late else set()
        )
        present = [c for c in ids if c not in self.late_clients]
        count = (
            m if self.clustering_method == "rcc" else min(options.pretrain_scale * m, len(present))
        )
        if count < m:
            raise ValueError(f"{self.name}: {len(present)} clients cannot form {m} groups")
        chosen = sorted(rng.choice(len(present), count, replace=False))
        clustered = [present[i] for i in chosen]
        updates = experiment.pretrain_updates(clustered, options.pretrain_epochs)
        if self.clustering_method == "edc":
            labels = clustering.cluster_edc(updates, m, seed=experiment.config.seed)
        elif self.clustering_method == "madc":
            labels = clustering.cluster_madc(updates, m)
        else:  # RCC: each of m random clients is one group's center
            labels = np.arange(m, dtype=np.int32)
        directions = np.zeros((m, updates.shape[1]))
        for j in range(m):  # empty group: model w0, zero direction (spec A.5)
            if np.any(labels == j):
                directions[j] = updates[labels == j].mean(axis=0)
        self.group_directions = directions
        experiment.set_cluster_models_matrix(experiment.initial_flat()[None, :] + directions)
        experiment.state.assignment = {c: -1 for c in ids}
        experiment.state.assignment.update(zip(clustered, labels.tolist()))
        if options.cold_start == "eager":
            self.cold_start(experiment, self.unassigned(experiment, present), round_num=0)

    # -- newcomers (Eq. 9) -------------------------------------------------------------------
    def unassigned(self, experiment: Experiment, client_ids: Sequence[str]) -> list[str]:
        return [c for c in client_ids if experiment.state.assignment[c] < 0]

    def cold_start(self, experiment: Experiment, client_ids: Sequence[str], round_num: int) -> None:
        """Assign newcomers: pre-train from w0, join the group of least Eq. 9 dissimilarity
        (RAC: a uniformly random group instead)."""
        if not client_ids:
            return
        if self.random_newcomers:
            from tff_clustered.orchestration import ALGORITHM, derived_seed

            rng = np.random.default_rng(derived_seed(experiment.config.seed, ALGORITHM, round_num))
            groups = rng.integers(0, self.num_clusters, len(client_ids))
        else:
            updates = experiment.pretrain_updates(
                client_ids, self.options.pretrain_epochs, round_num=round_num
            )
            groups = clustering.assign_newcomers(self.group_directions, updates)
        experiment.state.assignment.update(zip(client_ids, (int(g) for g in groups)))

    def eligible_clients(self, experiment: Experiment, round_num: int) -> list[str]:
        ids = experiment.data.client_ids
        if round_num >= self.options.newcomer_round:
            return ids
        return [c for c in ids if c not in self.late_clients]

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        if self.options.cold_start == "eager":  # everyone present is assigned at once
            pending = self.unassigned(experiment, self.eligible_clients(experiment, round_num))
        else:
            pending = self.unassigned(experiment, client_ids)
        self.cold_start(experiment, pending, round_num)
        return super().assign(experiment, round_num, client_ids)

    # -- Alg. 2 line 5: inter-group aggregation ----------------------------------------------
    def after_round(
        self,
        experiment: Experiment,
        round_num: int,
        client_ids: Sequence[str],
        client_outputs: Sequence[dict],
    ) -> None:
        if self.options.eta_g:
            experiment.set_cluster_models_matrix(
                clustering.inter_group_aggregation(
                    experiment.cluster_models_matrix(),
                    self.options.eta_g,
                    self.options.inter_group_mode,
                )
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "group_directions": self.group_directions,
            "late_clients": sorted(self.late_clients),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.group_directions = state["group_directions"]
        self.late_clients = set(state["late_clients"])

    def describe(self) -> dict[str, Any]:
        o = self.options
        return dict(
            super().describe(),
            clustering=self.clustering_method,
            random_newcomers=self.random_newcomers,
            pretrain_scale=o.pretrain_scale,
            pretrain_epochs=o.pretrain_epochs,
            cold_start=o.cold_start,
            eta_g=o.eta_g,
            inter_group_mode=o.inter_group_mode,
        )


class FedGroupMADC(FedGroup):
    name = "fedgroup_madc"
    clustering_method = "madc"


class FedGrouProx(FedGroup):
    name = "fedgrouprox"
    proximal = True


class FedGrouProxMADC(FedGroup):
    name = "fedgrouprox_madc"
    clustering_method = "madc"
    proximal = True


class FedGroupRCC(FedGroup):
    """Ablation: m random clients are the group centers; everyone else cold-starts by Eq. 9."""

    name = "fedgroup_rcc"
    clustering_method = "rcc"


class FedGroupRAC(FedGroup):
    """Ablation: EDC group cold start, then newcomers join uniformly random groups."""

    name = "fedgroup_rac"
    random_newcomers = True
