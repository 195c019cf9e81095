"""What a built round is: its `RoundSignature` (the cache key: cluster count, split, client
work, distribution, ...), the model's variable layout, which variables travel where (`RoundIO`),
and the per-round values `next` takes (`round_hparams`, `client_seed`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.federated import client_work
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.models.functional import FunctionalModel

CLIENT_WEIGHTINGS = ("num_examples", "uniform")
# What the distributor sends each client: its own cluster's shared variables (chosen by the
# server), or every cluster's, the client joining the one of lowest loss on its data (IFCA), or
# the rows its keys name, its own first (decentralized peers: the server state is a mailbox of
# every peer's published model and only routes them; UA-PDFL).
DISTRIBUTIONS = ("own_cluster", "lowest_loss_cluster", "neighbours")


def evaluation_batch_size(batch_size: int) -> int:
    """Batch size of a scoring pass (no gradients: larger batches, same sums)."""
    return max(int(batch_size), 64)


def round_hparams(
    learning_rate: float,
    batch_size: int,
    epochs: int = 1,
    *,
    num_clusters: float = np.inf,
    max_steps: int = -1,
    row_weights: Optional[Sequence[float]] = None,
    round_num: int = 0,
    total_rounds: int = 0,
) -> dict:
    """The SERVER-placed per-round hyperparameters `next` takes (broadcast to clients): the
    learning rate; how many of the built round's clusters are in use (a client that picks its
    cluster never picks a padding one); and how each client batches its arrays: `epochs`
    passes of `batch_size` (-1: without end), cut after `max_steps` minibatches (-1: no cut),
    the scoring pass's batch size, a weight per server row (the examples its peer holds,
    read by peers that receive rows; one 1 otherwise), and where the round stands in the run
    (`round_num` of `total_rounds`, 1-based; 0 of 0 outside a run), for client work with a
    schedule (DisPFL's mask annealing)."""
    return collections.OrderedDict(
        learning_rate=np.float32(learning_rate),
        num_clusters=np.float32(num_clusters),
        batch_size=np.int64(batch_size),
        epochs=np.int64(epochs),
        max_steps=np.int64(max_steps),
        eval_batch_size=np.int64(evaluation_batch_size(batch_size)),
        row_weights=np.asarray([1.0] if row_weights is None else row_weights, np.float32),
        round_num=np.int64(round_num),
        total_rounds=np.int64(total_rounds),
    )


def client_seed(shuffle: int, dropout: int) -> dict:
    """One client's seeds for a round: its batches' shuffle, and its stateless random ops'
    (dropout) `[dropout, 0]`."""
    return collections.OrderedDict(
        shuffle=np.int64(shuffle), dropout=np.array([dropout, 0], np.int32)
    )


def client_input(data: dict, key: Any, stored: Sequence[Any], scalar: float, seed: dict) -> dict:
    """One client's input to a round's `next` (one CLIENTS-placed value): its examples as arrays
    (any length; it batches them itself as the round's hyperparameters say), its key (its
    cluster, ignored when clients pick theirs; or its own row then its neighbours'), its stored
    variables that the round reads (`RoundIO.store_in`), the scalar its algorithm's plan sets
    for the round (FedProx/FeSEM: a factor of the proximal strength, 1.0 by default; UA-PDFL:
    th_I) and its seeds (`client_seed`)."""
    return collections.OrderedDict(
        data=data,
        key=np.atleast_1d(np.asarray(key, np.int32)),
        stored=tuple(stored),
        scalar=np.float32(scalar),
        seed=seed,
    )


def evaluation_input(data: dict, key: Any, stored: Sequence[Any]) -> dict:
    """One client's input to a round's `evaluate` (one CLIENTS-placed value): its examples to
    score, its key (the cluster whose model it is scored with) and its stored variables that the
    round joins with that model (`RoundIO.store_in`)."""
    return collections.OrderedDict(
        data=data, key=np.atleast_1d(np.asarray(key, np.int32)), stored=tuple(stored)
    )


def round_clients(
    datasets: Sequence[dict],
    keys: Sequence[Any],
    stored: Sequence[Sequence[Any]],
    scalars: Sequence[float],
    seeds: Sequence[dict],
) -> list[dict]:
    """`client_input` of every client from lists of one entry per client each."""
    lengths = {len(values) for values in (datasets, keys, stored, scalars, seeds)}
    if len(lengths) > 1:
        raise ValueError(f"per-client inputs of different lengths: {sorted(lengths)}")
    return [client_input(*values) for values in zip(datasets, keys, stored, scalars, seeds)]


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
    (server-side clustering needs it). `distribution`: see `DISTRIBUTIONS`. `anchor`: trainable
    tensor indices of an extra model the server broadcasts to every client beside its cluster's
    (FedAC's global embedding); the client work reads it as `ClientInputs.anchor`.
    `num_neighbours`: with `distribution="neighbours"`, how many rows besides its own each
    client receives (its key holds its own row, then theirs); the work reads them stacked as
    `ClientInputs.routed` and nothing is aggregated on the server. `server_optimizer`: the
    finalizer's step with each cluster's mean update (`server_optimizers.server_step`; its
    state is part of the server state unless it is the identity, FedAvg's "add the mean").
    """

    num_clusters: int
    shared: tuple[int, ...]
    work: Any = client_work.LocalSGD()
    keep_client_models: bool = False
    return_model_deltas: bool = False
    client_weighting: str = "num_examples"
    distribution: str = "own_cluster"
    anchor: tuple[int, ...] = ()
    num_neighbours: int = 0
    server_optimizer: ServerOptimizer = ServerOptimizer()

    def __post_init__(self) -> None:
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {self.num_clusters}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution}"
            )
        if self.num_neighbours < 0 or (self.num_neighbours and self.distribution != "neighbours"):
            raise ValueError("num_neighbours >= 1 goes with distribution='neighbours'")
        if self.client_weighting not in CLIENT_WEIGHTINGS:
            raise ValueError(
                f"client_weighting must be one of {CLIENT_WEIGHTINGS}, got {self.client_weighting}"
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
