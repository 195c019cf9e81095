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


class Algorithm:
    """Base class: plain FedAvg-style training of every client in its assigned cluster."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    # Whether each client's flattened model update is needed on the server after a round.
    needs_model_deltas: ClassVar[bool] = False

    def __init__(self, options: AlgorithmOptions = AlgorithmOptions()) -> None:
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
    def setup(self, experiment: Experiment) -> None:
        """Before round 1: by default every client is in cluster 0."""
        experiment.state.assignment = {cid: 0 for cid in experiment.data.client_ids}

    def assign(
        self, experiment: Experiment, round_num: int, client_ids: Sequence[str]
    ) -> np.ndarray:
        """Cluster of each sampled client for this round (default: its stored assignment)."""
        return np.array([experiment.state.assignment[c] for c in client_ids], np.int32)

    def after_round(
        self,
        experiment: Experiment,
        round_num: int,
        client_ids: Sequence[str],
        client_outputs: Sequence[dict],
    ) -> None:
        """After aggregation; `client_outputs` hold `model_delta` if `needs_model_deltas`."""

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
