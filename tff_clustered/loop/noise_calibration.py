"""The noise multiplier whose rounds reach a target epsilon (`calibrated_noise_multiplier`).

The calibration is dp_accounting's (`calibrate_dp_mechanism`) over an accountant that computes
each event's RDP vector once (`CachedRdpAccountant`, `loop.dp_events.event_rdp`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Callable, Optional

import dp_accounting as dpa
import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import DpEvent

from tff_clustered.loop.dp_events import (
    ORDERS,
    Relation,
    epsilon_of_rdp,
    event_key,
    event_rdp,
    relation_of_key,
    sampling_event,
)


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


def epsilon_of(event: DpEvent, delta: float) -> float:
    """The epsilon at `delta` of `event` (a round's, or rounds composed), as the ledger
    accounts it, under the adjacency the event needs (add-or-remove where any holds)."""
    relation = relation_of_key(event_key(event)) or Relation.ADD_OR_REMOVE_ONE
    return CachedRdpAccountant(relation).compose(event).get_epsilon(delta)


def calibrated_noise_multiplier(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling: str,
    population: int,
    sample_size: int,
    round_event: Callable[[float], DpEvent] = dp_event.GaussianDpEvent,
    tol: float = 1e-4,
    prior_event: Optional[DpEvent] = None,
    early_populations: Sequence[int] = (),
) -> float:
    """The noise multiplier z (within `tol` above the least) whose `rounds` rounds, each
    `round_event(z)` under `sampling` of `sample_size` of `population` clients, reach
    `target_epsilon` at `delta` without passing it (`dp_accounting.calibrate_dp_mechanism`),
    composed after `prior_event` when given (a private cold start's release). The first rounds
    may sample from fewer clients, `early_populations` (one per round: FedGroup's before its
    late newcomers join), at a higher rate each. A round of adaptive clipping (value and count
    noise composed) calibrates the same z as a Gaussian round of that combined multiplier, the
    default."""
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError(f"target_epsilon must be > 0 and rounds >= 1: {target_epsilon}, {rounds}")
    early = list(early_populations[:rounds])
    runs = [(n, len(list(same))) for n, same in itertools.groupby(early)]
    runs.append((population, rounds - len(early)))

    def run_event(z: float) -> DpEvent:
        rounds = rounds_event(round_event(z), sampling, sample_size, runs)
        return rounds if prior_event is None else dp_event.ComposedDpEvent([prior_event, rounds])

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


def rounds_event(
    event: DpEvent, sampling: str, sample_size: int, runs: Sequence[tuple[int, int]]
) -> DpEvent:
    """Rounds of `event` composed in order: for each `(population, count)` of `runs`, `count`
    rounds under `sampling` of `sample_size` (at most all) of `population` clients."""
    events = [
        dp_event.SelfComposedDpEvent(
            sampling_event(sampling, population, min(sample_size, population), event), count
        )
        for population, count in runs
        if count
    ]
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)


def release_event(noise_multiplier: float, replace_one: bool) -> DpEvent:
    """One Gaussian release of each client's own clipped update (`loop.update_release`), noise
    `noise_multiplier` times the clip: sensitivity the clip under add-or-remove, twice it under
    replace-one (the multiplier halved, as `dp_events.halved_noise` halves a round's)."""
    return dp_event.GaussianDpEvent(noise_multiplier / 2 if replace_one else noise_multiplier)


def release_noise_multiplier(
    epsilon: float, delta: float, replace_one: bool, tol: float = 1e-4
) -> float:
    """The least noise multiplier (within `tol` above it) whose one release
    (`release_event`) costs at most `epsilon` at `delta`."""
    if not epsilon > 0:
        raise ValueError(f"a release's epsilon must be > 0, got {epsilon}")
    low, high = 1e-3, 1.0
    while epsilon_of(release_event(high, replace_one), delta) > epsilon:
        low, high = high, 2 * high
    return float(
        dpa.calibrate_dp_mechanism(
            lambda: CachedRdpAccountant(Relation.ADD_OR_REMOVE_ONE),
            lambda z: release_event(z, replace_one),
            epsilon,
            delta,
            bracket_interval=dpa.ExplicitBracketInterval(low, high),
            tol=tol,
        )
    )
