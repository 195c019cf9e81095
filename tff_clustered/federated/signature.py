"""What a built round is: its `RoundSignature`, the variable layout and `RoundIO`.

What a built round is: its `RoundSignature` (the cache key: cluster count, split, client
work, distribution, ...), the model's variable layout, and which variables travel where
(`RoundIO`). The values a built round takes each call are `round_inputs.py`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tff_clustered.federated import client_work
from tff_clustered.federated.cluster_aggregators import ClusterAggregator, ClusterMean
from tff_clustered.federated.distributions import Distribution, OwnCluster
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.models.functional import FunctionalModel

CLIENT_WEIGHTINGS = ("num_examples", "uniform")


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    """Shapes of a model's variables (trainable, then state) and which trainable tensor owns
    each state tensor."""

    trainable_shapes: tuple[tuple[int, ...], ...]
    state_shapes: tuple[tuple[int, ...], ...] = ()
    state_owner: tuple[int, ...] = ()

    @classmethod
    def of(cls, model: FunctionalModel) -> ModelLayout:
        return cls(model.trainable_shapes, model.state_shapes, model.state_owner)

    @property
    def num_trainable(self) -> int:
        return len(self.trainable_shapes)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.trainable_shapes + self.state_shapes

    @property
    def num_variables(self) -> int:
        return len(self.shapes)

    def variables_of(self, trainable: Sequence[int]) -> tuple[int, ...]:
        """Variable indices of trainable tensors `trainable` and of the state they own."""
        chosen = set(trainable)
        owned = [self.num_trainable + j for j, o in enumerate(self.state_owner) if o in chosen]
        return tuple(sorted(chosen)) + tuple(owned)

    def complement(self, variables: Sequence[int]) -> tuple[int, ...]:
        chosen = set(variables)
        return tuple(i for i in range(self.num_variables) if i not in chosen)


@dataclasses.dataclass(frozen=True)
class RoundSignature:
    """Everything a built round depends on besides the model; the cache key.

    `shared`: trainable tensor indices each client receives from its cluster (and whose updates
    are aggregated); the rest comes from its own stored model. `keep_client_models`: clients
    return their whole trained model to the store (stateful clients), not only the rest.
    `return_model_deltas`: clients also return the flattened update of all their variables
    (server-side clustering needs it). `distribution`: how models reach the clients
    (`distributions.py`: own cluster, lowest-loss pick, routed neighbours). `anchor`: trainable
    tensor indices of an extra model the server broadcasts to every client beside its cluster's
    (FedAC's global embedding); the client work reads it as `ClientInputs.anchor`.
    `server_optimizer`: the
    finalizer's step with each cluster's mean update (`server_optimizers.server_step`; its
    state is part of the server state unless it is the identity, FedAvg's "add the mean").
    `aggregator` (`cluster_aggregators.py`): what becomes of each client's update between its
    work and its cluster's mean; the default `ClusterMean` is the weighted mean per cluster
    (`clustered_mean.py`); every aggregator runs on the round's one path (a private one,
    `cluster_dp.ClusterDP`, weighs clients uniformly).
    """

    num_clusters: int
    shared: tuple[int, ...]
    work: Any = client_work.LocalSGD()
    keep_client_models: bool = False
    return_model_deltas: bool = False
    client_weighting: str = "num_examples"
    distribution: Distribution = OwnCluster()
    anchor: tuple[int, ...] = ()
    server_optimizer: ServerOptimizer = ServerOptimizer()
    aggregator: ClusterAggregator = ClusterMean()

    def __post_init__(self) -> None:
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {self.num_clusters}")
        if not isinstance(self.distribution, Distribution):
            raise TypeError(
                f"distribution must be a distributions.Distribution, got {self.distribution!r}"
            )
        if self.client_weighting not in CLIENT_WEIGHTINGS:
            raise ValueError(
                f"client_weighting must be one of {CLIENT_WEIGHTINGS}, got {self.client_weighting}"
            )
        if not isinstance(self.aggregator, ClusterAggregator):
            raise TypeError(
                "aggregator must be a cluster_aggregators.ClusterAggregator, got "
                f"{self.aggregator!r}"
            )
        if self.distribution.decentralized and self.aggregator.voided_by_individual_updates:
            raise ValueError(
                f"decentralized peers aggregate nothing: no {self.aggregator.name} aggregator"
            )
        if self.aggregator.uniform_weights and self.client_weighting != "uniform":
            raise ValueError(
                f"the {self.aggregator.name} aggregator weighs every client 1 in its cluster's "
                "sum: give the round client_weighting='uniform'"
            )


@dataclasses.dataclass(frozen=True)
class RoundIO:
    """Which variables travel where in a round of one signature."""

    shared: tuple[int, ...]  # from the cluster, aggregated
    store_in: tuple[int, ...]  # from the client's stored model
    store_out: tuple[int, ...]  # back into the client's stored model

    @classmethod
    def of(cls, layout: ModelLayout, signature: RoundSignature) -> RoundIO:
        shared = layout.variables_of(signature.shared)
        rest = layout.complement(shared)
        everything = tuple(range(layout.num_variables))
        store_in = everything if signature.work.reads_own_model else rest
        keep_all = signature.keep_client_models or signature.work.reads_own_model
        return cls(shared, store_in, everything if keep_all else rest)
