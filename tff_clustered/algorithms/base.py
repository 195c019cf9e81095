"""The interface every algorithm implements.

An algorithm is a configuration of the shared cluster-indexed core (how many clusters, which
tensors are personal, the proximal strength) plus optional **server-side steps between
rounds**: `setup` before round 1 (cold start, initial clusters), `assign` before a round (which
cluster each sampled client trains in), `after_round` (re-cluster, move the base/personal
boundary, ...). The core never needs to change for a new algorithm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import numpy as np

from tff_clustered.models.split import PersonalSplit

if TYPE_CHECKING:
    from tff_clustered.orchestration import Experiment


@dataclasses.dataclass(frozen=True)
class AlgorithmOptions:
    """Hyperparameters common to the algorithms; each uses those it needs."""

    num_clusters: Optional[int] = None  # None: the algorithm's default
    prox_mu: Optional[float] = None  # None: the algorithm's default
    personal_layers: Optional[int] = None  # None: the algorithm's default split
    # FedGroup family (spec A.5-A.8, A.10).
    pretrain_scale: int = 20  # alpha: alpha * m clients take part in group cold start
    pretrain_epochs: int = 1  # local epochs of ClientPretrain (A.14-#3)
    cold_start: str = "eager"  # newcomers: "eager" (before round 1) or "lazy" (when sampled)
    eta_g: float = 0.0  # inter-group aggregation rate (0 = off)
    inter_group_mode: str = "additive"  # "additive" (paper) or "normalized" (authors' code)
    newcomer_fraction: float = 0.0  # fraction of clients that join the run late ...
    newcomer_round: int = 1  # ... in this round
    # FeSEM's distance term (spec B.4): "constant" uses --mu for every client; "paper" uses
    # mu_i = 2 * lambda * n_avg / n_i (Eq. 7 divided by alpha_i).
    fesem_reg: str = "constant"
    fesem_lambda: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            (self.pretrain_scale >= 1, "pretrain_scale must be >= 1"),
            (self.pretrain_epochs >= 1, "pretrain_epochs must be >= 1"),
            (self.cold_start in ("eager", "lazy"), "cold_start must be eager or lazy"),
            (self.eta_g >= 0, "eta_g must be >= 0"),
            (
                self.inter_group_mode in ("additive", "normalized"),
                "inter_group_mode must be additive or normalized",
            ),
            (0 <= self.newcomer_fraction < 1, "newcomer_fraction must be in [0, 1)"),
            (self.newcomer_round >= 1, "newcomer_round must be >= 1"),
            (self.fesem_reg in ("constant", "paper"), "fesem_reg must be constant or paper"),
            (self.fesem_lambda >= 0, "fesem_lambda must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class Algorithm:
    """Base class: plain FedAvg-style training of every client in its assigned cluster."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    # Whether each client's flattened model update is needed on the server after a round.
    needs_model_deltas: ClassVar[bool] = False
    # How clients are weighted in each cluster's mean: "num_examples" or "uniform".
    client_weighting: ClassVar[str] = "num_examples"
    # Models each sampled client receives per round (IFCA: all clusters).
    models_sent_per_client: ClassVar[str] = "own"

    def __init__(self, options: Optional[AlgorithmOptions] = None) -> None:
        options = options or AlgorithmOptions()
        self.options = options
        self.num_clusters = self.default_num_clusters(options)
        self.prox_mu = self.default_prox_mu(options)
        self.split = self.default_split(options)
        if self.num_clusters < 1:
            raise ValueError(f"{self.name}: num_clusters must be >= 1, got {self.num_clusters}")
        if self.prox_mu < 0:
            raise ValueError(f"{self.name}: mu must be >= 0, got {self.prox_mu}")

    # -- configuration of the core -----------------------------------------------------------
    def default_num_clusters(self, options: AlgorithmOptions) -> int:
        if options.num_clusters not in (None, 1):
            raise ValueError(
                f"{self.name} trains one model; drop --num_clusters or pick a clustered algorithm"
            )
        return 1

    def default_prox_mu(self, options: AlgorithmOptions) -> float:
        return options.prox_mu or 0.0

    def default_split(self, options: AlgorithmOptions) -> PersonalSplit:
        if options.personal_layers not in (None, 0):
            raise ValueError(
                f"{self.name} keeps no personal layers; drop --personal_layers or use fedper"
            )
        return PersonalSplit.none()

    # -- server-side steps between rounds ----------------------------------------------------
    def eligible_clients(self, experiment: Experiment, round_num: int) -> list[str]:
        """Clients that can be sampled in `round_num` (default: all)."""
        return experiment.data.client_ids

    def setup(self, experiment: Experiment) -> None:
        """Before round 1: by default every client is in cluster 0."""
        experiment.state.assignment = {cid: 0 for cid in experiment.data.client_ids}

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        """Cluster of each sampled client for this round (default: its stored assignment)."""
        return np.array([experiment.state.assignment[c] for c in client_ids], np.int32)

    def prox_scales(self, experiment: Experiment, client_ids: Sequence[str]) -> list[float]:
        """Per-client factor of the proximal strength mu (default 1: the same mu for all)."""
        return [1.0] * len(client_ids)

    def after_round(
        self,
        experiment: Experiment,
        round_num: int,
        client_ids: Sequence[str],
        client_outputs: Sequence[dict],
    ) -> None:
        """After aggregation; `client_outputs` hold `model_delta` if `needs_model_deltas`."""

    def floats_per_round(self, num_sampled: int, base_parameters: int) -> int:
        """Model values communicated in one round: each sampled client downloads its model
        (IFCA: all cluster models) and uploads its update; personal tensors never travel."""
        downloads = self.num_clusters if self.models_sent_per_client == "all" else 1
        return num_sampled * base_parameters * (downloads + 1)

    # -- checkpointing of algorithm-specific state -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def describe(self) -> dict[str, Any]:
        return dict(
            algorithm=self.name,
            num_clusters=self.num_clusters,
            prox_mu=self.prox_mu,
            personal_split=dataclasses.asdict(self.split),
        )


class IndependentClusters(Algorithm):
    """Clusters that start from independently initialised models, one seed each (IFCA, FeSEM;
    spec A.14-#24). A client counts in evaluation once it has been assigned (spec A.11)."""

    default_clusters: ClassVar[int] = 3

    def default_num_clusters(self, options: AlgorithmOptions) -> int:
        return options.num_clusters or self.default_clusters

    def setup(self, experiment: Experiment) -> None:
        from tff_clustered import weights as flat
        from tff_clustered.models.keras_models import initial_weights
        from tff_clustered.orchestration import ALGORITHM, derived_seed

        seeds = [
            derived_seed(experiment.config.seed, ALGORITHM, k) for k in range(self.num_clusters)
        ]
        experiment.set_cluster_models_matrix(
            np.stack([flat.flatten(initial_weights(experiment.model, s)) for s in seeds])
        )
        experiment.state.assignment = {c: -1 for c in experiment.data.client_ids}
