"""A noised round's differential privacy as a `dp_accounting` event, keyed and accounted in RDP.

A round's event is its unsampled noised round under its client sampling
(`loop.sampling`): `fixed` is accounted under replace-one adjacency (Wang, Balle and
Kasiviswanathan, AISTATS 2019, Theorem 27), `poisson` under add-or-remove-one adjacency
(DP-FedAvg: McMahan et al., ICLR 2018). Both compose in Renyi DP (Mironov, CSF 2017) as
dp_accounting's `RdpAccountant` does. An event is named by canonical JSON text (`event_key`),
and its RDP vector computed once per name (`event_rdp`).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

import attr
import dp_accounting as dpa
import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import DpEvent
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from tff_clustered.loop.sampling import check_sampling, inclusion_probability

Relation = dpa.NeighboringRelation
ORDERS = np.asarray(rdp.RdpAccountant().orders, np.float64)  # dp_accounting's default orders


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
