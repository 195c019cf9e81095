"""Every client's accounted privacy events over a run: `PrivacyLedger`.

The ledger accounts each client over the rounds it was eligible for, in O(classes) a round
(clients of the same history share a class) and one int32 per client; a client's epsilon is
its class's events composed as dp_accounting's `RdpAccountant` composes them
(`loop.dp_events`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Union

import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import DpEvent

from tff_clustered.loop.dp_events import (
    ORDERS,
    Relation,
    epsilon_of_rdp,
    event_key,
    event_of_key,
    event_rdp,
    relation_of_key,
)


@dataclasses.dataclass(eq=False)
class PrivacyLedger:
    """Every client's accounted events. `client_class[i]` is the class of the client at index i
    of the run's client index; `classes[k]` maps each event's `event_key` to the rounds it was
    recorded for the clients of class k, in the order first recorded. A client's epsilon is its
    class's events composed, exactly as `RdpAccountant` composes `dp_event(k)`."""

    client_class: np.ndarray
    classes: list[dict[str, int]]

    def __post_init__(self) -> None:
        classes = np.array(self.client_class)  # the ledger's own copy, changed in place
        if classes.ndim != 1 or classes.dtype.kind not in "iu":
            raise ValueError("client_class must be a 1-D integer array (one class per client)")
        if len(classes) and not (0 <= classes.min() and classes.max() < len(self.classes)):
            raise ValueError(f"client_class names a class outside the {len(self.classes)}")
        for events in self.classes:
            if not all(isinstance(k, str) and type(n) is int and n > 0 for k, n in events.items()):
                raise ValueError("a class maps event keys to positive round counts")
        self.client_class = classes.astype(np.int32)
        self._sizes = np.bincount(self.client_class, minlength=len(self.classes))

    @classmethod
    def for_population(cls, population: int) -> PrivacyLedger:
        """A ledger of `population` clients with nothing recorded yet."""
        return cls(np.zeros(population, np.int32), [{}])

    def relations(self) -> set[Relation]:
        return {relation_of_key(key) for events in self.classes for key in events} - {None}

    @property
    def neighboring_relation(self) -> Relation:
        """The adjacency the ledger's epsilon is stated under."""
        return next(iter(self.relations()), Relation.ADD_OR_REMOVE_ONE)

    def record(self, eligible: Union[None, np.ndarray, Sequence[int]], event: DpEvent) -> None:
        """Adds one round's `event` to the clients it covers: `eligible` is a boolean mask over
        the population, their indices, or None for every client (O(classes); else the mask's
        or the indices' length, and the population's when a class splits)."""
        key = event_key(event)
        relation = relation_of_key(key)
        if relation is not None and self.relations() - {relation}:
            raise ValueError(f"a ledger accounts one adjacency; this event is {relation.name}")
        event_rdp(key)  # an event the accountant refuses fails here, before any change
        if eligible is None:
            targets = list(range(len(self.classes)))
        else:
            targets = self.split_off(self.eligible_indices(eligible))
        for k in targets:
            self.classes[k][key] = self.classes[k].get(key, 0) + 1
        if eligible is not None:  # a class may now have another's history
            self.merge_equal_classes()

    def eligible_indices(self, eligible: Union[np.ndarray, Sequence[int]]) -> np.ndarray:
        given = np.asarray(eligible)
        if given.size and given.dtype.kind not in "biu":
            raise ValueError(f"eligible clients are given by index or mask, not {given.dtype}")
        if given.dtype == bool and given.shape != (len(self.client_class),):
            raise ValueError(f"an eligibility mask of shape {given.shape}, not the population's")
        indices = np.flatnonzero(given) if given.dtype == bool else np.unique(given)
        if len(indices) and not (0 <= indices[0] and indices[-1] < len(self.client_class)):
            raise ValueError(f"eligible client indices outside [0, {len(self.client_class)})")
        return indices.astype(np.int64, copy=False)

    def split_off(self, members: np.ndarray) -> list[int]:
        """The classes to record a round for when `members` are its eligible clients: a class
        wholly among them as it is, one partly among them split, its eligible part a new
        class with the same history."""
        in_round = np.bincount(self.client_class[members], minlength=len(self.classes))
        partial = np.flatnonzero((in_round > 0) & (in_round < self._sizes))
        targets = np.flatnonzero((in_round > 0) & (in_round == self._sizes)).tolist()
        if len(partial):
            moved = np.arange(len(self.classes), dtype=np.int32)
            for k in partial.tolist():
                moved[k] = len(self.classes)
                targets.append(len(self.classes))
                self.classes.append(dict(self.classes[k]))
            self.client_class[members] = moved[self.client_class[members]]
            self._sizes = np.bincount(self.client_class, minlength=len(self.classes))
        return targets

    def merge_equal_classes(self) -> None:
        """One class per distinct history (clients eligible in other rounds but for the same
        events have the same epsilon), each with a client."""
        first: dict[tuple, int] = {}
        kept: list[dict[str, int]] = []  # each history as first recorded (its order of sums)
        remap = np.zeros(len(self.classes), np.int32)  # a class without clients: any
        for k, events in enumerate(self.classes):
            history = tuple(sorted(events.items()))
            if self._sizes[k] and history not in first:
                first[history] = len(kept)
                kept.append(events)
            remap[k] = first.get(history, 0)
        if len(kept) < len(self.classes):
            self.classes = kept
            self.client_class = remap[self.client_class]
            self._sizes = np.bincount(self.client_class, minlength=len(self.classes))

    def dp_event(self, k: int) -> DpEvent:
        """Class `k`'s history as one event: each recorded event self-composed its count."""
        events = self.classes[k].items()
        return dp_event.ComposedDpEvent(
            [dp_event.SelfComposedDpEvent(event_of_key(key), n) for key, n in events]
        )

    def class_rdp(self, k: int) -> np.ndarray:
        total = np.zeros(len(ORDERS), np.float64)
        for key, count in self.classes[k].items():
            total += count * event_rdp(key)  # the accountant's own sum, term for term
        return total

    def class_epsilons(self, delta: float) -> np.ndarray:
        return np.array(
            [epsilon_of_rdp(self.class_rdp(k), delta) for k in range(len(self.classes))]
        )

    def epsilon(self, delta: float) -> float:
        """The run's epsilon: the largest of its clients' (0 with nothing recorded)."""
        return float(self.class_epsilons(delta).max(initial=0.0))

    def epsilon_per_cluster(
        self,
        assignment: np.ndarray,
        num_clusters: int,
        delta: float,
        unassigned_in_every_cluster: bool = False,
    ) -> np.ndarray:
        """Each cluster's epsilon: the largest among the clients `assignment` (a cluster per
        client index, -1: none) puts in it now; NaN for a cluster without clients. Clients
        without a cluster count in every cluster when `unassigned_in_every_cluster` (any of
        them may join any cluster, as with a client that picks its cluster itself)."""
        assignment = np.asarray(assignment)
        if assignment.shape != self.client_class.shape or assignment.dtype.kind not in "iu":
            raise ValueError(f"assignment must be a cluster per client, not {assignment.shape}")
        if len(assignment) and not -1 <= assignment.min() <= assignment.max() < num_clusters:
            raise ValueError(f"assignment names clusters outside [-1, {num_clusters})")
        num_classes = len(self.classes)  # row 0: the clients without a cluster
        rows = (assignment.astype(np.int64) + 1) * num_classes + self.client_class
        present = np.bincount(rows, minlength=(num_clusters + 1) * num_classes) > 0
        unassigned, present = np.split(present.reshape(num_clusters + 1, num_classes), [1])
        if unassigned_in_every_cluster:
            present = present | unassigned
        epsilons = np.where(present, self.class_epsilons(delta), -np.inf).max(1, initial=-np.inf)
        return np.where(present.any(axis=1), epsilons, np.nan)
