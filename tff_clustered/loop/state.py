"""A run's state and the pure functions that read or change it.

A run's state and the pure functions that read or change it: what a checkpoint holds, an
algorithm's `Decision` applied to it, the `ServerView` an algorithm reads, and the divergence
policy (a non-finite model stops the run, naming the round, clusters and clients)."""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.algorithms.base import UNCHANGED, Decision, ServerView, Similarity
from tff_clustered.loop.client_store import ClientModels
from tff_clustered.loop.privacy_ledger import PrivacyLedger


@dataclasses.dataclass
class RunState:
    """Everything a checkpoint must hold to continue a run. Its assignment changes through
    `assign` only, which keeps the clients assigned to each cluster counted (`cluster_sizes`:
    derived, not a field, so a checkpoint does not hold it; counted again when a state is made
    or loaded)."""

    round_num: int = 0
    cluster_models: Optional[np.ndarray] = None  # (num_clusters, D) flat models
    assignment: dict[str, int] = dataclasses.field(default_factory=dict)
    shared: tuple[int, ...] = ()
    anchor: Optional[np.ndarray] = None  # (D,) flat anchor model, when the algorithm has one
    algorithm_state: Any = None
    # The memory store's models by client, or the disk store's index of its file's rows.
    client_models: ClientModels = dataclasses.field(default_factory=dict)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    similarity: Optional[Similarity] = None  # the latest matrix a clustering step used
    # The server optimizer's state, stacked per cluster (None: none kept, FedAvg's finalizer).
    server_optimizer_state: Optional[dict[str, np.ndarray]] = None
    # The aggregator's state, one row per cluster (None: none kept, the mean's; a private
    # aggregator's clip norms).
    aggregator_state: Optional[dict[str, np.ndarray]] = None
    # A private aggregator's account of every client's privacy loss (`loop.accounting`).
    privacy: Optional[PrivacyLedger] = None

    def __post_init__(self) -> None:
        self._counts = cluster_counts(self.assignment.values(), len(self.assignment))

    @property
    def num_clusters(self) -> int:
        return 0 if self.cluster_models is None else len(self.cluster_models)

    @property
    def cluster_sizes(self) -> np.ndarray:
        """Assigned clients per cluster, as `np.bincount(..., minlength=num_clusters)` counts
        the assignment's clusters (unassigned, -1, left out), without reading every client."""
        clusters = np.fromiter(self._counts, np.int64, len(self._counts))
        counts = np.fromiter(self._counts.values(), np.int64, len(self._counts))
        held = clusters[counts > 0]
        sizes = np.zeros(max(self.num_clusters, held.max(initial=-1) + 1), np.int64)
        sizes[held] = counts[counts > 0]
        return sizes

    def assign(self, clusters: Mapping[str, int]) -> Mapping[str, int]:
        """Sets the clients' clusters (-1: unassigned) and counts the change; returns the
        clusters they had before (-1: none). A run's first assignment of a population holds no
        earlier cluster to read (`Unassigned`), and clusters given as ints are not copied
        before they are set."""
        if self.assignment:
            held = self.assignment.get
            before: Mapping[str, int] = dict(
                zip(clusters, map(held, clusters, itertools.repeat(-1)))
            )
            for k, n in cluster_counts(before.values(), len(before)).items():
                self._counts[k] -= n
        else:
            before = Unassigned(clusters)
        if set(map(type, clusters.values())) != {int}:
            clusters = dict(zip(clusters, map(int, clusters.values())))
        self.assignment.update(clusters)
        for k, n in cluster_counts(clusters.values(), len(clusters)).items():
            self._counts[k] = self._counts.get(k, 0) + n
        return before

    def view(self) -> ServerView:
        """What an algorithm reads of the state: read-only, the assignment a view of the run's
        (no copy of every client's cluster per call: a population may hold millions)."""
        return ServerView(
            round_num=self.round_num,
            cluster_models=self.cluster_models,
            assignment=types.MappingProxyType(self.assignment),
            shared=self.shared,
            state=self.algorithm_state,
            anchor=self.anchor,
        )

    def assigned(self, client_ids: Sequence[str]) -> list[str]:
        """The clients of `client_ids` with a cluster."""
        return [c for c in client_ids if self.assignment.get(c, -1) >= 0]


class Unassigned(Mapping[str, int]):
    """Clients none of whom had a cluster: -1 for each, without a dict of them."""

    def __init__(self, clients: Mapping[str, Any]) -> None:
        self.clients = clients

    def __getitem__(self, client: str) -> int:
        if client not in self.clients:
            raise KeyError(client)
        return -1

    def __iter__(self) -> Iterator[str]:
        return iter(self.clients)

    def __len__(self) -> int:
        return len(self.clients)


def cluster_counts(clusters: Iterable[int], count: int) -> dict[int, int]:
    """Clients per cluster among `count` clients' `clusters` (-1, unassigned, left out); a
    TypeError for a cluster that is not a whole number (a damaged checkpoint's)."""
    try:
        held = np.fromiter(clusters, np.int64, count)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"a client's cluster is not a cluster number: {e}") from None
    sizes = np.bincount(held[held >= 0])
    found = np.flatnonzero(sizes)
    return dict(zip(found.tolist(), sizes[found].tolist()))


def apply_decision(
    state: RunState, decision: Decision, algorithm: str, anchor_tensors: Sequence[int]
) -> Mapping[str, int]:
    """Applies `algorithm`'s decision to `state`: assignments, cluster models (checked against
    the model's size), the split, the anchor (only where the algorithm declares anchor tensors),
    its own state and the similarity it clustered on. Returns the clusters the clients it
    assigned had before (-1: none), so that moves are counted without scanning every client."""
    model_size = state.cluster_models.shape[1]
    before = state.assign(decision.assignment)
    if decision.cluster_models is not None:
        models = np.asarray(decision.cluster_models, np.float32)
        if models.ndim != 2 or models.shape[1] != model_size:
            raise ValueError(f"{algorithm}: cluster models of shape {models.shape}")
        state.cluster_models = models
    if decision.shared is not None:
        state.shared = tuple(int(i) for i in decision.shared)
    if decision.anchor is not None:
        anchor = np.asarray(decision.anchor, np.float32)
        if anchor.shape != (model_size,) or not anchor_tensors:
            raise ValueError(
                f"{algorithm}: anchor of shape {anchor.shape} (the model has {model_size} "
                f"values; anchor tensors {tuple(anchor_tensors) or 'none declared'})"
            )
        state.anchor = anchor
    if decision.state is not UNCHANGED:
        state.algorithm_state = decision.state
    if decision.similarity is not None:
        state.similarity = decision.similarity
    return before


def cluster_capacity(num_clusters: int) -> int:
    """Clusters a built round holds for `num_clusters`: up to 4 exactly, then the next multiple
    of 4. Extra clusters stay empty (an empty cluster is left bit for bit), so a cluster count
    that changes every round (FedTSDP, CFL) reuses a few built rounds instead of tracing one per
    count, while the padding (models sent to and from the worker) stays small."""
    return num_clusters if num_clusters <= 4 else -(-num_clusters // 4) * 4


def clients_moved(assignment: Mapping[str, int], *befores: Mapping[str, int]) -> int:
    """Clients the round's decisions assigned (`befores`: each decision's earlier clusters of
    the clients it assigned, in the order applied) now in another cluster than at the round's
    start; a client assigned for the first time, or unassigned, has not moved."""
    start: dict[str, int] = {}
    for before in reversed(befores):  # the earliest decision's value is the round's start
        start.update(before)
    return sum(1 for c, k in start.items() if k >= 0 and 0 <= assignment[c] != k)
