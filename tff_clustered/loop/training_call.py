"""One training call of a built round's `next`, from the loop's request to its results.

A `TrainRequest` (the loop's NumPy values) is turned into the round's typed inputs
(`ServerState`, hyperparameters, one `ClientInput` per client) and its results back
(`TrainedRound`). It changes nothing of the run: what to store and apply is the caller's
(`round_step.py`)."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_inputs import (
    ClientInput,
    ClientSeed,
    client_input,
    client_seed,
    round_hparams,
)
from tff_clustered.federated.server_state import ServerState, padded
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.loop.aggregation import AggregatorRound
from tff_clustered.loop.client_store import ClientStore
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.seeds import DROPOUT, SHUFFLE, derived_seed


class TrainedRound(NamedTuple):
    """What one call of a round's `next` returns: the new cluster models (flat, the real ones),
    the server optimizer's new state (None without one), each client's outputs, the
    round's measurements (`cluster_weight`; an aggregator's own) and the aggregator's new
    state (None for the mean)."""

    cluster_models: np.ndarray
    optimizer_state: Optional[dict[str, np.ndarray]]
    outputs: list[dict]
    measurements: dict
    aggregator_state: Optional[dict[str, np.ndarray]] = None


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """How the clients of one call train: `epochs` passes over their data, or `steps`
    minibatches when given, at `learning_rate`, shuffled from seed stream `stream`."""

    epochs: int
    learning_rate: float
    steps: Optional[int] = None
    stream: int = SHUFFLE


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """One call of a built round's `next`: `client_ids` of round `round_num`, client i starting
    from the rows `keys[i]` of the flat `cluster_models` and training as `training` says, with
    `client_scalars[i]` for its work (1.0 each when None); `anchor` (flat) for a round that
    sends one, `row_weights` for one that routes rows, `optimizer_state` (one row per cluster)
    for one whose finalizer keeps a state, `aggregator` for one whose aggregator is not the
    mean."""

    fed_round: FederatedRound
    round_num: int
    client_ids: Sequence[str]
    keys: np.ndarray
    cluster_models: np.ndarray
    training: LocalTraining
    client_scalars: Optional[Sequence[float]] = None
    anchor: Optional[np.ndarray] = None
    row_weights: Optional[np.ndarray] = None
    optimizer_state: Optional[dict[str, np.ndarray]] = None
    aggregator: Optional[AggregatorRound] = None


class TrainingCalls:
    """Calls of the built rounds' `next` for one run's data, model layout and training
    settings (`train`)."""

    def __init__(
        self,
        data: FederatedData,
        layout: ModelLayout,
        rounds_cache: RoundCache,
        config: TrainingConfig,
    ) -> None:
        self.data, self.layout, self.rounds_cache, self.config = data, layout, rounds_cache, config
        self.shapes = layout.shapes
        self.client_index = data.client_index
        self._initial_aggregator_states: dict[RoundSignature, dict[str, np.ndarray]] = {}

    def initial_aggregator_state(self, fed_round: FederatedRound) -> dict[str, np.ndarray]:
        """The aggregator state of the built round's initial server state (once per round)."""
        signature = fed_round.signature
        if signature not in self._initial_aggregator_states:
            slot = fed_round.initialize().aggregator
            self._initial_aggregator_states[signature] = {
                key: plain_array(value) for key, value in slot["state"].items()
            }
        return self._initial_aggregator_states[signature]

    def seeds(
        self, round_num: int, client_ids: Sequence[str], stream: int = SHUFFLE
    ) -> list[ClientSeed]:
        """Each client's seeds of a round: its batches' shuffle (from seed stream `stream`)
        and its dropout."""
        seed, index = self.config.seed, self.client_index
        return [
            client_seed(
                derived_seed(seed, stream, round_num, index[c]),
                derived_seed(seed, DROPOUT, round_num, index[c]),
            )
            for c in client_ids
        ]

    def train(self, request: TrainRequest, store: Optional[ClientStore] = None) -> TrainedRound:
        """One call of the request's round `next`, each client joined with its variables in
        `store` (none without one)."""
        fed_round = request.fed_round
        state, aggregator_params = self.server_state(request)
        hparams = self.hparams(request, aggregator_params)
        clients = self.client_inputs(request, store)
        new_state, outputs, measurements = fed_round.next(state, clients, hparams)
        return self.trained_round(request, new_state, outputs, measurements)

    def server_state(self, request: TrainRequest) -> tuple[ServerState, Optional[Mapping]]:
        """The round's server state from the request's flat rows, padded to the built round's
        clusters, and what its clients read of the aggregator's state (None: nothing)."""
        fed_round, shapes = request.fed_round, self.shapes
        signature = fed_round.signature
        capacity = signature.num_clusters
        anchor: tuple = ()
        if signature.anchor:
            whole = flat.unflatten(request.anchor, shapes)
            anchor = tuple(whole[i] for i in signature.anchor)
        optimizer: collections.OrderedDict = collections.OrderedDict()
        if request.optimizer_state is not None:
            optimizer.update((k, padded(v, capacity)) for k, v in request.optimizer_state.items())
        aggregator_slot, aggregator_params = server_slot(
            signature.aggregator,
            request.aggregator,
            len(request.cluster_models),
            capacity,
            functools.partial(self.initial_aggregator_state, fed_round),
        )
        models = flat.matrix_to_stacked(padded(request.cluster_models, capacity), shapes)
        return ServerState(tuple(models), anchor, optimizer, aggregator_slot), aggregator_params

    def hparams(
        self, request: TrainRequest, aggregator_params: Optional[Mapping]
    ) -> collections.OrderedDict:
        """The round's hyperparameters (`round_inputs.round_hparams`) of the request."""
        training = request.training
        return round_hparams(
            training.learning_rate,
            self.config.batch_size,
            -1 if training.steps is not None else training.epochs,
            num_clusters=len(request.cluster_models),
            max_steps=-1 if training.steps is None else training.steps,
            row_weights=request.row_weights,
            round_num=request.round_num,
            total_rounds=self.config.rounds,
            aggregator_params=aggregator_params,
        )

    def client_inputs(
        self, request: TrainRequest, store: Optional[ClientStore]
    ) -> list[ClientInput]:
        """Each client's `ClientInput`: its examples (or the reference a worker reads them
        by), its key, its stored variables the round reads, its scalar and seeds."""
        client_ids, training = request.client_ids, request.training
        scalars = request.client_scalars
        scalars = [1.0] * len(client_ids) if scalars is None else scalars
        if not len(request.keys) == len(scalars) == len(client_ids):
            raise ValueError(
                f"{len(client_ids)} clients with {len(request.keys)} keys and {len(scalars)} "
                "scalars"
            )
        store_in = request.fed_round.io.store_in
        stored = [store.variables(c, store_in) if store else () for c in client_ids]
        seeds = self.seeds(request.round_num, client_ids, training.stream)
        on_worker, sizes = self.rounds_cache.worker_data, self.data.train_sizes
        examples = (  # read by the worker, or here (the ones not cached read together)
            [on_worker.reference(c, sizes[c]) for c in client_ids]
            if on_worker
            else self.data.arrays_of("train", client_ids)
        )
        per_client = zip(examples, request.keys, stored, scalars, seeds)
        return [client_input(*values) for values in per_client]

    def trained_round(
        self,
        request: TrainRequest,
        new_state: ServerState,
        outputs: list,
        measurements: dict,
    ) -> TrainedRound:
        """The round's results as the loop keeps them: its real clusters' rows."""
        num_clusters = len(request.cluster_models)
        new_models = flat.stacked_to_matrix(new_state.cluster_models)[:num_clusters]
        new_optimizer_state = None
        if request.optimizer_state is not None:
            new_optimizer_state = {
                key: np.asarray(value)[:num_clusters] for key, value in new_state.optimizer.items()
            }
        aggregator = request.fed_round.signature.aggregator
        new_aggregator_state = state_after(aggregator, new_state, num_clusters)
        return TrainedRound(
            new_models, new_optimizer_state, outputs, measurements, new_aggregator_state
        )


def server_slot(
    aggregator: ClusterAggregator,
    request: Optional[AggregatorRound],
    num_clusters: int,
    capacity: int,
    round_initial: Callable[[], Mapping[str, np.ndarray]],
) -> tuple[Any, Optional[collections.OrderedDict]]:
    """The server state's `aggregator` entry of a round of `num_clusters` clusters and what
    its clients read of it (`client_params`, in the round's hyperparameters), its rows padded
    to the built round's `capacity` with the rows of its initial state (`round_initial()`, of
    `capacity` rows; a padding cluster's expected count is 0: not in use); a state that is
    None or does not fit the built round (other entries or row shapes: a factory's state
    for another update type) starts from that initial state; the aggregator's empty slot and
    None for one that takes no round inputs (the mean)."""
    if not aggregator.takes_round_inputs:
        return aggregator.initial_slot(capacity), None
    if request is None:
        raise ValueError(f"a round of the {aggregator.name} aggregator needs its state")
    if len(request.inputs["denominator"]) != num_clusters:
        raise ValueError(
            f"the round has {num_clusters} clusters, its {aggregator.name} aggregator's inputs "
            f"{len(request.inputs['denominator'])}: the algorithm's plan changed the number of "
            "clusters, which an aggregator other than the mean cannot follow; use the mean"
        )
    initial = round_initial()
    state = request.state
    if state is None or not fits(state, initial):
        state = {key: np.asarray(value)[:num_clusters] for key, value in initial.items()}
    state = {  # in the round's order, padded with its initial rows
        key: np.concatenate([np.asarray(state[key]), value[len(state[key]) : capacity]])
        for key, value in initial.items()
    }
    inputs = dict(request.inputs, denominator=padded(request.inputs["denominator"], capacity))
    inputs = aggregator.round_inputs(inputs["seed"], inputs["denominator"])
    return aggregator.server_slot(state, inputs), aggregator.client_params(state)


def fits(state: Mapping[str, Any], initial: Mapping[str, np.ndarray]) -> bool:
    """Whether `state` has `initial`'s entries, each of its rows' shape and dtype."""
    if set(state) != set(initial):
        return False
    return all(
        np.shape(value)[1:] == np.shape(initial[key])[1:]
        and np.asarray(value).dtype.kind == initial[key].dtype.kind
        for key, value in state.items()
    )


def state_after(
    aggregator: ClusterAggregator, server_state: ServerState, num_clusters: int
) -> Optional[dict[str, np.ndarray]]:
    """The aggregator's new state from a round's new server state, its real clusters' rows
    (None for one that takes no round inputs: the mean)."""
    if not aggregator.takes_round_inputs:
        return None
    return {
        key: plain_array(value)[:num_clusters]
        for key, value in server_state.aggregator["state"].items()
    }


def plain_array(value: Any) -> np.ndarray:
    """`value` as an array a checkpoint holds: TFF's strings (objects) as bytes."""
    array = np.asarray(value)
    return array.astype(bytes) if array.dtype == object else array
