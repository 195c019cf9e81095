"""The values a built round takes at each call: hyperparameters, client seeds and inputs.

As NumPy structures: the SERVER-placed hyperparameters of a round (`round_hparams`), one
client's seeds (`ClientSeed`) and its input to `next` (`ClientInput`) or to `evaluate`
(`EvaluationInput`).

The client's values are NamedTuples, which TFF carries as named structs: the TF functions read
their fields by name. The hyperparameters are a mapping whose entries depend on the round's
aggregator (its clients' parameters only for one that `takes_round_inputs`)."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Optional, Protocol

import numpy as np


class WorkerData(Protocol):
    """Where a worker reads a client's examples itself (`worker_reader.WorkerReader`): a round
    built with one takes each client's `reference(client_id, num_examples)` as its input's
    `data` (of `reference_spec`) and turns it into the client's arrays with `read` (TF ops)
    before the client work. `mean_values` and `held_here` (`worker_reader.WorkerReader`) are
    what `executions.reads_on_worker` decides by; `local_only`: only a worker on this machine
    can read them (`client_files.ClientFiles`, files in this process's temporary folder)."""

    mean_values: float
    held_here: bool
    local_only: bool

    @property
    def reference_spec(self) -> dict: ...

    def reference(self, client_id: str, num_examples: int) -> dict: ...

    def read(self, reference: Any) -> dict: ...

    def failure(self, message: str) -> Optional[str]: ...


def client_examples(data: dict) -> int:
    """Examples of one client's input `data`: its arrays' length, or the number a reference
    (`WorkerData.reference`) lists."""
    if "num_examples" in data:
        return int(data["num_examples"])
    return len(next(iter(data.values())))


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
    aggregator_params: Optional[Mapping[str, Any]] = None,
) -> dict:
    """The SERVER-placed per-round hyperparameters `next` takes (broadcast to clients): the
    learning rate; how many of the built round's clusters are in use (a client that picks its
    cluster never picks a padding one); and how each client batches its arrays: `epochs`
    passes of `batch_size` (-1: without end), cut after `max_steps` minibatches (-1: no cut),
    the scoring pass's batch size, a weight per server row (the examples its peer holds,
    read by peers that receive rows; one 1 otherwise), and where the round stands in the run
    (`round_num` of `total_rounds`, 1-based; 0 of 0 outside a run), for client work with a
    schedule (DisPFL's mask annealing); and for a round whose aggregator is not the mean,
    what its clients read of the aggregator's state (`ClusterAggregator.client_params`, e.g.
    each cluster's clip norm)."""
    hparams = collections.OrderedDict(
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
    if aggregator_params is not None:
        hparams["aggregator"] = collections.OrderedDict(aggregator_params)
    return hparams


class ClientSeed(NamedTuple):
    """One client's seeds for a round: its batches' `shuffle` (int64), and its stateless random
    ops' (dropout) `dropout` (int32[2])."""

    shuffle: Any
    dropout: Any


class ClientInput(NamedTuple):
    """One client's input to a round's `next` (one CLIENTS-placed value): its examples as
    arrays (`data`, any length; it batches them itself as the round's hyperparameters say), or
    the reference a round that reads them on the worker takes (`WorkerData`); its `key` (its
    cluster, ignored when clients pick theirs; or its own row then its neighbours'); its
    `stored` variables that the round reads (`RoundIO.store_in`); the `scalar` its algorithm's
    plan sets for the round (FedProx/FeSEM: a factor of the proximal strength, 1.0 by default;
    UA-PDFL: th_I) and its `seed` (`ClientSeed`)."""

    data: Any
    key: Any
    stored: tuple
    scalar: Any
    seed: ClientSeed


class EvaluationInput(NamedTuple):
    """One client's input to a round's `evaluate` (one CLIENTS-placed value): its examples to
    score, its key (the cluster whose model it is scored with) and its stored variables that
    the round joins with that model (`RoundIO.store_in`)."""

    data: Any
    key: Any
    stored: tuple


def client_seed(shuffle: int, dropout: int) -> ClientSeed:
    """One client's seeds for a round: its batches' shuffle, and its stateless random ops'
    (dropout) `[dropout, 0]`."""
    return ClientSeed(np.int64(shuffle), np.array([dropout, 0], np.int32))


def client_input(
    data: dict, key: Any, stored: Sequence[Any], scalar: float, seed: ClientSeed
) -> ClientInput:
    """One client's `ClientInput`, its values as the round takes them."""
    key = np.atleast_1d(np.asarray(key, np.int32))
    return ClientInput(data, key, tuple(stored), np.float32(scalar), seed)


def evaluation_input(data: dict, key: Any, stored: Sequence[Any]) -> EvaluationInput:
    """One client's `EvaluationInput`, its values as the round takes them."""
    return EvaluationInput(data, np.atleast_1d(np.asarray(key, np.int32)), tuple(stored))


def round_clients(
    datasets: Sequence[dict],
    keys: Sequence[Any],
    stored: Sequence[Sequence[Any]],
    scalars: Sequence[float],
    seeds: Sequence[ClientSeed],
) -> list[ClientInput]:
    """`client_input` of every client from lists of one entry per client each."""
    lengths = {len(values) for values in (datasets, keys, stored, scalars, seeds)}
    if len(lengths) > 1:
        raise ValueError(f"per-client inputs of different lengths: {sorted(lengths)}")
    return [client_input(*values) for values in zip(datasets, keys, stored, scalars, seeds)]
