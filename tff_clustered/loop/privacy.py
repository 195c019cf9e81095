"""Which clients a round samples, and the differential privacy that sampling gives a noised
round: the draw, its `dp_accounting` event, a ledger of every client's events, and the noise
multiplier that meets a target epsilon.

Two samplings (`--client_sampling`, `describe_sampling`): `fixed`, exactly min(m, N) of the
round's N eligible clients without replacement, accounted under replace-one adjacency (Wang,
Balle and Kasiviswanathan, AISTATS 2019, Theorem 27); and `poisson`, each eligible client
independently with probability min(1, m/N), under add-or-remove-one adjacency (DP-FedAvg:
McMahan et al., ICLR 2018). Both compose in Renyi DP (Mironov, CSF 2017) as dp_accounting's
`RdpAccountant` does. The draw is a function of (seed, round) alone, as every run-time choice
is (`seeds`): amplification by sampling holds only if the seed is secret. `PrivacyLedger`
accounts each client over the rounds it was eligible for, in O(classes) a round (clients of
the same history share a class) and one int32 per client.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import attr
import dp_accounting as dpa
import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import DpEvent
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from tff_clustered.seeds import SAMPLING, derived_seed

SAMPLINGS = ("fixed", "poisson")
Relation = dpa.NeighboringRelation
ORDERS = np.asarray(rdp.RdpAccountant().orders, np.float64)  # dp_accounting's default orders


def check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise ValueError(f"client_sampling must be one of {SAMPLINGS}, got {sampling!r}")


def describe_sampling(sampling: str) -> str:
    """The sentence docs/privacy.md shows for `--client_sampling=sampling`."""
    check_sampling(sampling)
    if sampling == "fixed":
        return (
            "With --client_sampling=fixed (the default), each round draws exactly min(m, N) of "
            "the N clients eligible in that round, uniformly at random without replacement, so "
            "each eligible client is included with probability q = min(m, N)/N; neighbouring "
            "datasets replace one client's data, the clipped sum's sensitivity is 2C, and each "
            "round is accounted as SampledWithoutReplacementDpEvent(N, min(m, N), the round's "
            "event with its noise multipliers halved) under replace-one adjacency."
        )
    return (
        "With --client_sampling=poisson, each round includes each of the N clients eligible in "
        "that round independently with probability q = min(1, m/N), so the round's size is "
        "Binomial(N, q) and may be 0; neighbouring datasets add or remove one client, the "
        "clipped sum's sensitivity is C, and each round is accounted as "
        "PoissonSampledDpEvent(q, the round's event) under add-or-remove-one adjacency."
    )


def inclusion_probability(num_eligible: int, sample_size: int) -> float:
    """An eligible client's chance of being in a round, under either sampling: min(1, m/N)."""
    return min(1.0, sample_size / num_eligible)


def sampled_positions(
    sampling: str, num_eligible: int, sample_size: int, seed: int, round_num: int
) -> np.ndarray:
    """The positions, ascending, of round `round_num`'s clients among its `num_eligible`
    eligible ones, drawn from the run's `SAMPLING` stream: `sample_size` of them (all if
    fewer) without replacement, or each with probability min(1, sample_size/num_eligible)."""
    check_sampling(sampling)
    rng = np.random.default_rng(derived_seed(seed, SAMPLING, round_num))
    if sampling == "fixed":
        return np.sort(rng.choice(num_eligible, min(sample_size, num_eligible), replace=False))
    q = inclusion_probability(max(num_eligible, 1), sample_size)
    return np.flatnonzero(rng.random(num_eligible) < q)


# -- events ------------------------------------------------------------------------------------


def halved_noise(event: DpEvent) -> DpEvent:
    """`event` with every Gaussian noise multiplier halved: the same noise against a query of
    twice the sensitivity. Replace-one doubles each sensitivity of a noised round: the clipped
    sum moves by up to 2C instead of C, and adaptive clipping's count of clients under the
    clip (each adds b - 1/2 with b in {0, 1}) by 1 instead of 1/2. A composed event of
    multipliers z_i acts as one of (sum z_i^-2)^-1/2, so halving each halves that too."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([halved_noise(e) for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(halved_noise(event.event), event.count)
    raise ValueError(f"a round's event must be composed Gaussians, not {type(event).__name__}")


def sampling_event(sampling: str, eligible: int, sample_size: int, inner_event: DpEvent) -> DpEvent:
    """One round's event: `inner_event` (the unsampled noised round, noise multipliers against
    one client's add-or-remove sensitivity) under `sampling` of `sample_size` of `eligible`
    clients (module docstring)."""
    check_sampling(sampling)
    if eligible < 1 or sample_size < 1:
        raise ValueError(f"a round needs eligible, sample_size >= 1: {eligible}, {sample_size}")
    if sampling == "poisson":
        q = inclusion_probability(eligible, sample_size)
        return dp_event.PoissonSampledDpEvent(q, inner_event)
    size = min(int(sample_size), int(eligible))
    return dp_event.SampledWithoutReplacementDpEvent(int(eligible), size, halved_noise(inner_event))


def event_key(event: DpEvent) -> str:
    """`event` as canonical JSON text (its class and fields), the ledger's name for it."""

    def tree(value: Any) -> Any:
        if isinstance(value, DpEvent):
            fields = {f.name: tree(getattr(value, f.name)) for f in attr.fields(type(value))}
            return {"class": type(value).__name__, **fields}
        if isinstance(value, (list, tuple)):
            return [tree(v) for v in value]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"an event field of type {type(value).__name__} has no key")
        return int(value) if isinstance(value, (int, np.integer)) else float(value)

    return json.dumps(tree(event), sort_keys=True, separators=(",", ":"))


def event_of_key(key: str) -> DpEvent:
    """The event `event_key` named; only dp_accounting's event classes are made."""

    def build(tree: Any) -> Any:
        if isinstance(tree, list):
            return [build(v) for v in tree]
        if not isinstance(tree, dict):
            return tree
        cls = getattr(dp_event, str(tree.get("class")), None)
        if not (isinstance(cls, type) and issubclass(cls, DpEvent)):
            raise ValueError(f"{tree.get('class')!r} is not a dp_accounting event")
        return cls(**{k: build(v) for k, v in tree.items() if k != "class"})

    return build(json.loads(key))


@functools.lru_cache(maxsize=1024)
def relation_of_key(key: str) -> Optional[Relation]:
    """The adjacency the event named `key` is accounted under (None: unsampled, either)."""
    if '"class":"SampledWithoutReplacementDpEvent"' in key:
        return Relation.REPLACE_ONE
    return Relation.ADD_OR_REMOVE_ONE if '"class":"PoissonSampledDpEvent"' in key else None


@functools.lru_cache(maxsize=1024)
def event_rdp(key: str) -> np.ndarray:
    """The RDP at `ORDERS` of the event named `key`, by `RdpAccountant` (cached: a fixed-size
    sampling event takes about half a second)."""
    relation = relation_of_key(key) or Relation.REPLACE_ONE
    accountant = rdp.RdpAccountant(neighboring_relation=relation)
    # Huge noise: logs of 0 (numpy warns, rightly computed), RDP rounded below 0 (to -3e-12).
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        vector = np.array(accountant.compose(event_of_key(key)).rdp, np.float64)
    if not vector.min() > -1e-9:  # NaN, or more than rounding
        raise ValueError(f"the privacy accountant cannot account {key}: RDP {vector.min()}")
    vector = np.maximum(vector, 0.0)
    vector.setflags(write=False)
    return vector


def epsilon_of_rdp(rdp_vector: np.ndarray, delta: float) -> float:
    """dp_accounting's conversion of an RDP vector at `ORDERS` to epsilon at `delta`."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        return float(rdp.compute_epsilon(ORDERS, rdp_vector, delta)[0])


# -- the ledger --------------------------------------------------------------------------------


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


# -- calibration -------------------------------------------------------------------------------


class CachedRdpAccountant(dpa.PrivacyAccountant):
    """`RdpAccountant`'s accounting, each event's RDP vector computed once (`event_rdp`): the
    same epsilon, without recomputing an event seen before."""

    def __init__(self, neighboring_relation: Relation) -> None:
        super().__init__(neighboring_relation)
        self.rdp = np.zeros(len(ORDERS), np.float64)

    def _maybe_compose(self, event: DpEvent, count: int, do_compose: bool) -> Any:
        if isinstance(event, dp_event.SelfComposedDpEvent):  # as RdpAccountant: count x RDP
            return self._maybe_compose(event.event, event.count * count, do_compose)
        key = event_key(event)
        if relation_of_key(key) not in (None, self.neighboring_relation):
            return self.CompositionErrorDetails(event, "an event of the other adjacency")
        if do_compose:
            self.rdp = self.rdp + count * event_rdp(key)
        return None

    def get_epsilon(self, target_delta: float) -> float:
        return epsilon_of_rdp(self.rdp, target_delta)


def calibrated_noise_multiplier(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: str,
    population: int,
    sample_size: int,
    round_event: Callable[[float], DpEvent] = dp_event.GaussianDpEvent,
    tol: float = 1e-4,
) -> float:
    """The noise multiplier z (within `tol` above the least) whose `rounds` rounds, each
    `round_event(z)` under `sampling` of `sample_size` of `population` clients, reach
    `target_epsilon` at `delta` without passing it (`dp_accounting.calibrate_dp_mechanism`).
    A round of adaptive clipping (value and count noise composed) calibrates the same z as a
    Gaussian round of that combined multiplier, the default."""
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError(f"target_epsilon must be > 0 and rounds >= 1: {target_epsilon}, {rounds}")

    def run_event(z: float) -> DpEvent:
        event = sampling_event(sampling, population, sample_size, round_event(z))
        return dp_event.SelfComposedDpEvent(event, rounds)

    relation = relation_of_key(event_key(run_event(1.0))) or Relation.ADD_OR_REMOVE_ONE

    def gap(z: float) -> float:
        accountant = CachedRdpAccountant(relation).compose(run_event(z))
        return accountant.get_epsilon(delta) - target_epsilon

    low, high = 0.5, 1.0  # bracket z by doubling or halving: epsilon falls as z grows
    for _ in range(40):
        if gap(high) > 0:
            low, high = high, 2 * high
        elif gap(low) <= 0:
            low, high = low / 2, low
        else:
            break
    else:
        raise ValueError(f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta}")
    return float(
        dpa.calibrate_dp_mechanism(
            lambda: CachedRdpAccountant(relation),
            run_event,
            target_epsilon,
            delta,
            bracket_interval=dpa.ExplicitBracketInterval(low, high),
            tol=tol,
        )
    )
