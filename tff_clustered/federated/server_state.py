"""The typed values passed between the round's parts: server state, client results, sums.

The server state's named slots, one client's result, the per-cluster client sums (mergeable
over any split of the clients) and the finalizer's result.

Each is a NamedTuple, a container TFF carries as a named struct (a computation's parameters and
results keep the type), so the TFF round, the sharded one and the in-process one take and
return the same values. An absent slot is an explicit empty value (`()` for a round that sends
no anchor, `{}` for a finalizer without a server optimizer, `()` for the mean's aggregator),
never a missing key.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np


class ServerState(NamedTuple):
    """What the server keeps between rounds: `cluster_models` (one tensor per model variable,
    `[K, ...]`, the clusters along the first axis), `anchor` (the trainable tensors of the extra
    model the round broadcasts, FedAC's global embedding; `()` without one), `optimizer` (the
    server optimizer's state, `[K, ...]` per entry; `{}` for FedAvg's "add the mean") and
    `aggregator` (its slot, `ClusterAggregator.initial_slot`; `()` for the mean)."""

    cluster_models: tuple
    anchor: tuple = ()
    optimizer: Mapping[str, Any] = collections.OrderedDict()
    aggregator: Any = ()


class ClientResult(NamedTuple):
    """One client's result of the client work, after the aggregator's client side: its
    preprocessed shared update (`delta`), its weight in each cluster's sum (`[K]`, non-zero at
    its cluster only), its `outputs` (stored variables, loss, cluster, ...; they go back to the
    loop) and its statistics row for the aggregator in its cluster's row (`[K, stats_width]`)."""

    delta: tuple
    cluster_weight: Any
    outputs: Mapping[str, Any]
    stats: Any


class ClientSums(NamedTuple):
    """The per-cluster sums of some clients' results: `sums` (one `[K, ...]` tensor per shared
    variable: the weighted updates), `total_weight` (`[K]`) and `stats` (`[K, stats_width]`).
    Sums of disjoint sets of clients add up to the sums of their union (`merged_sums`)."""

    sums: tuple
    total_weight: Any
    stats: Any


def merged_sums(shares: Sequence[ClientSums]) -> ClientSums:
    """The sums of `shares` added in their order, as float32 arrays."""
    first = shares[0]
    sums = [np.asarray(t, np.float32) for t in first.sums]
    total_weight = np.asarray(first.total_weight, np.float32)
    stats = np.asarray(first.stats, np.float32)
    for share in shares[1:]:
        sums = [a + np.asarray(b, np.float32) for a, b in zip(sums, share.sums)]
        total_weight = total_weight + np.asarray(share.total_weight, np.float32)
        stats = stats + np.asarray(share.stats, np.float32)
    return ClientSums(tuple(sums), total_weight, stats)


class Finalized(NamedTuple):
    """The finalizer's result: the new `cluster_models`, the server `optimizer`'s and the
    `aggregator`'s new slots, and the round's `measurements` (each `[K]`; `cluster_weight`, the
    realised total weights, first)."""

    cluster_models: tuple
    optimizer: Mapping[str, Any]
    aggregator: Any
    measurements: Mapping[str, Any]


def padded(rows: np.ndarray, capacity: int) -> np.ndarray:
    """`rows` (cluster models, or an entry of the server optimizer's state, one row per
    cluster) followed by zero rows up to `capacity` (a built round's clusters: extra ones stay
    empty)."""
    rows = np.asarray(rows)
    extra = capacity - len(rows)
    if extra <= 0:
        return rows
    return np.concatenate([rows, np.zeros((extra, *rows.shape[1:]), rows.dtype)])


def nothing_aggregated(num_clusters: int) -> collections.OrderedDict:
    """The measurements of a round that aggregates nothing (a relay: the peers' mailbox)."""
    return collections.OrderedDict(cluster_weight=np.zeros([num_clusters], np.float32))


def after_round(state: ServerState, finalized: Finalized) -> ServerState:
    """`state` with the finalizer's slots (the anchor is the loop's to change)."""
    return state._replace(
        cluster_models=tuple(finalized.cluster_models),
        optimizer=finalized.optimizer,
        aggregator=finalized.aggregator,
    )
