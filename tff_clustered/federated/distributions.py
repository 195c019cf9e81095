"""How a round sends models to its clients: one `Distribution` per way.

How a round sends models to its clients: one `Distribution` per way, and everything that
depends on that way in one class, from the TF distributor inside the round to what the loop
sends, reads back, evaluates and reports.

* `OwnCluster`: the server picks each client's cluster (FedAvg, FedGroup, FeSEM, ...);
* `LowestLossCluster`: every cluster's model goes to each client, which joins the one of lowest
  loss on its training data (IFCA, Ghosh et al. 2020, Alg. 2);
* `NearestCentreAfterTraining`: every cluster's model goes to each client, which trains from
  the one its plan names and then joins the one nearest its trained model (FeSEM's E-step on
  the client, Long et al. 2023, Eq. 8), its update taken against that one;
* `Neighbours`: decentralized peers (DisPFL, UA-PDFL): the server state is a mailbox of every
  peer's published model; a peer is sent its own row and `num_neighbours` others, and nothing
  is aggregated.

A distribution is a frozen value: it is part of the round's signature (the built round's cache
key), and an algorithm names its own (`Algorithm.distribution`). A new way of distributing is
one subclass here and, for its TF side, one `Distributor` (`distributors.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import numpy as np

from tff_clustered.federated import distributors
from tff_clustered.federated.server_optimizers import ServerOptimizer


@dataclasses.dataclass(frozen=True)
class Distribution:
    """Base: what one way of sending models decides, on both sides of the round."""

    # Peers without a server that aggregates (result tables report no global model for them).
    decentralized: ClassVar[bool] = False

    @property
    def key_width(self) -> int:
        """Server rows each client's key names (its own row first)."""
        return 1

    def distributor(
        self,
        shared: tuple[int, ...],
        shared_spec: tuple,
        num_clusters: int,
        mean_loss: distributors.MeanLoss,
        features: Any,
        num_trainable_shared: int,
    ) -> distributors.Distributor:
        """The round's TF side: what the server sends and what the client makes of it
        (`num_trainable_shared`: the trainable variables, leading `shared`)."""
        raise NotImplementedError

    def keys(
        self,
        algorithm: str,
        num_clients: int,
        clusters: Optional[np.ndarray],
        neighbours: Optional[np.ndarray],
    ) -> np.ndarray:
        """Each sampled client's key from a plan's `clusters` and `neighbours` (int32, one row
        per client), refusing a plan that does not fit this distribution."""
        if clusters is None:
            raise ValueError(f"{algorithm}: its plan must give each sampled client a cluster")
        if neighbours is not None:
            raise ValueError(f"{algorithm}: only decentralized peers are routed neighbours")
        keys = np.asarray(clusters, np.int32)
        if keys.shape != (num_clients,):
            raise ValueError(
                f"{algorithm}: its plan gives clusters of shape {keys.shape} for "
                f"{num_clients} sampled clients"
            )
        return keys

    def row_weights(
        self, assignment: Mapping[str, int], train_sizes: Mapping[str, int], num_rows: int
    ) -> Optional[np.ndarray]:
        """A weight per server row that the clients read (None: none)."""
        return None

    def clusters(self, keys: np.ndarray, outputs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The cluster each client's update counts in, read back after the round."""
        return np.asarray(keys, np.int32).reshape(len(outputs), -1)[:, 0]

    def models_downloaded(self, num_clusters: int) -> int:
        """Cluster models a sampled client downloads in a round (for the bits a round sends)."""
        return 1

    @property
    def rows_are_whole_models(self) -> bool:
        """Whether a client's server row is already its whole model (so a personal model is
        scored like a server one, without joining the client's stored tensors)."""
        return False

    def check_server_optimizer(self, algorithm: str, optimizer: ServerOptimizer) -> None:
        """Refuses a server optimizer this way of distributing has nothing to step with."""


@dataclasses.dataclass(frozen=True)
class OwnCluster(Distribution):
    """The server picks: each client trains the model of the cluster its plan names."""

    def distributor(
        self,
        shared: tuple[int, ...],
        shared_spec: tuple,
        num_clusters: int,
        mean_loss: distributors.MeanLoss,
        features: Any,
        num_trainable_shared: int,
    ) -> distributors.Distributor:
        return distributors.OwnClusterDistributor(shared, shared_spec, num_clusters)


@dataclasses.dataclass(frozen=True)
class ClientPicksCluster(Distribution):
    """Base: each client is sent every cluster's model and picks in the round the cluster its
    update counts in, which it reports (`outputs["cluster"]`)."""

    def clusters(self, keys: np.ndarray, outputs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return np.array([int(o["cluster"]) for o in outputs], np.int32)

    def models_downloaded(self, num_clusters: int) -> int:
        return num_clusters


@dataclasses.dataclass(frozen=True)
class LowestLossCluster(ClientPicksCluster):
    """Each client is sent every cluster's model and joins the one of lowest loss on its
    training data (IFCA's cluster estimate, Ghosh et al. 2020, Alg. 2 line 6)."""

    def distributor(
        self,
        shared: tuple[int, ...],
        shared_spec: tuple,
        num_clusters: int,
        mean_loss: distributors.MeanLoss,
        features: Any,
        num_trainable_shared: int,
    ) -> distributors.Distributor:
        return distributors.LowestLossDistributor(shared, shared_spec, num_clusters, mean_loss)

    def keys(
        self,
        algorithm: str,
        num_clients: int,
        clusters: Optional[np.ndarray],
        neighbours: Optional[np.ndarray],
    ) -> np.ndarray:
        if clusters is not None or neighbours is not None:
            raise ValueError(
                f"{algorithm}: its clients pick their cluster in the round, so its plan gives "
                "neither clusters nor neighbours"
            )
        return np.zeros(num_clients, np.int32)


@dataclasses.dataclass(frozen=True)
class NearestCentreAfterTraining(ClientPicksCluster):
    """Each client is sent every cluster's model, trains from the one its plan names, then
    joins the one nearest (squared L2 over the trainable shared values) its trained model and
    sends its update against it: FeSEM's E-step (Long et al. 2023, Eq. 8) made on the client,
    so that the round's per-cluster aggregate is the M-step (Eq. 9) and no individual model
    leaves it. The server learns each client's pick, as IFCA's."""

    def distributor(
        self,
        shared: tuple[int, ...],
        shared_spec: tuple,
        num_clusters: int,
        mean_loss: distributors.MeanLoss,
        features: Any,
        num_trainable_shared: int,
    ) -> distributors.Distributor:
        return distributors.NearestCentreDistributor(
            shared, shared_spec, num_clusters, num_trainable_shared
        )


@dataclasses.dataclass(frozen=True)
class Neighbours(Distribution):
    """Decentralized peers: each peer's key names its own row, then the `num_neighbours` rows
    routed to it; each routed row is weighted by the training examples its peer holds."""

    num_neighbours: int = 0
    decentralized: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.num_neighbours < 0:
            raise ValueError(f"num_neighbours must be >= 0, got {self.num_neighbours}")

    @property
    def key_width(self) -> int:
        return 1 + self.num_neighbours

    def distributor(
        self,
        shared: tuple[int, ...],
        shared_spec: tuple,
        num_clusters: int,
        mean_loss: distributors.MeanLoss,
        features: Any,
        num_trainable_shared: int,
    ) -> distributors.Distributor:
        return distributors.NeighboursDistributor(shared, shared_spec, self.key_width, features)

    def keys(
        self,
        algorithm: str,
        num_clients: int,
        clusters: Optional[np.ndarray],
        neighbours: Optional[np.ndarray],
    ) -> np.ndarray:
        own = OwnCluster().keys(algorithm, num_clients, clusters, None)
        routed = np.zeros((num_clients, 0), np.int32) if neighbours is None else neighbours
        routed = np.asarray(routed, np.int32)
        if routed.shape != (num_clients, self.num_neighbours):
            raise ValueError(
                f"{algorithm}: its plan routes neighbours of shape {routed.shape}; each of the "
                f"{num_clients} sampled peers receives {self.num_neighbours}"
            )
        return np.concatenate([own[:, None], routed], axis=1)

    def row_weights(
        self, assignment: Mapping[str, int], train_sizes: Mapping[str, int], num_rows: int
    ) -> Optional[np.ndarray]:
        """Training examples held by the peers assigned to each server row."""
        assigned = [(k, train_sizes[c]) for c, k in assignment.items() if k >= 0]
        rows = np.array([k for k, _ in assigned], np.int64)
        sizes = np.array([n for _, n in assigned], np.float64)
        return np.bincount(rows, weights=sizes, minlength=num_rows)[:num_rows].astype(np.float32)

    @property
    def rows_are_whole_models(self) -> bool:
        return True

    def check_server_optimizer(self, algorithm: str, optimizer: ServerOptimizer) -> None:
        if not optimizer.is_identity:
            raise ValueError(
                f"{algorithm} is decentralized: no server aggregates its peers' updates, so "
                f"--server_optimizer={optimizer.name} has nothing to step; leave "
                "--server_optimizer and --server_learning_rate unset"
            )
