"""CriticalFL made decentralized: peers pull more neighbours in a critical learning period.

CriticalFL made decentralized, as UA-PDFL's comparison runs it (Yan, Wang, Li, "CriticalFL:
A Critical Learning Periods Augmented Client Selection Framework for Efficient Federated
Learning", KDD 2023): FedAvg-DFL whose peers each vary how many neighbours they pull from,
more during a detected critical learning period (CLP), fewer otherwise.

CriticalFL detects CLPs on the server from the federated gradient norm (FGN), the norm of the
round's aggregated accumulated gradient, and grows the number of selected clients while the
FGN rises by more than a threshold. UA-PDFL's authors give no decentralized rule; this is ours,
the loosest reproduction in that comparison. Each peer i, at the end of round t:

  G_i(t) = ||w_i after training - w_i after mixing|| / eta     (its accumulated gradient norm:
                                                               the FGN a peer can see locally)
  critical  iff  t = 1  or  (G_i(t) - G_i(t-1)) / G_i(t-1) >= delta
  n_i(t+1) = min(max(ceil(n_i(t) * beta), 1), N_com)    if critical
           = max(floor(n_i(t) / beta), n_min)   otherwise

(delta: --criticalfl_threshold, beta: --criticalfl_factor, n_min: --criticalfl_min_neighbours),
starting from n_i(1) = N_com (--num_neighbours: training starts in a critical period). Each
round peer i mixes its model with the first n_i of its N_com uniformly drawn neighbours
(|D|-weighted, as FedAvg-DFL) and trains. The peers report G_i; the rule runs in the
orchestration between rounds, on each peer's behalf, with per-peer numbers only (its n_i,
G_i(t) and G_i(t-1): what the peer itself would keep and decide on). A shorter queue is padded
with the peer's own row, which the peer does not count (`peer_work.received_rows`). Logged per
round: `neighbours_mean` and `criticalfl_critical_peers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.algorithms.base import (
    Decision,
    Plan,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    check,
)
from tff_clustered.algorithms.dfl import Decentralized
from tff_clustered.options import option


@dataclasses.dataclass(frozen=True)
class CriticalState:
    """Per peer (in `run.client_ids` order): neighbours to pull next round, and the last
    round's accumulated gradient norm (NaN before the first round)."""

    contacts: np.ndarray
    last_norms: np.ndarray


def next_contacts(
    contacts: np.ndarray,
    norms: np.ndarray,
    last_norms: np.ndarray,
    *,
    threshold: float,
    factor: float,
    most: int,
    fewest: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The rule of the module docstring for every peer at once: (next contacts, critical)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = (norms - last_norms) / last_norms
    critical = np.isnan(last_norms) | (rise >= threshold)
    grown = np.minimum(np.maximum(np.ceil(contacts * factor), 1), most)
    shrunk = np.maximum(np.floor(contacts / factor), fewest)
    return np.where(critical, grown, shrunk).astype(np.int64), critical


class CriticalFLDFL(Decentralized):
    """FedAvg-DFL whose peers pull from more neighbours while their gradient norm rises.

    Per-peer neighbour counts from the rule of the module docstring."""

    name = "criticalfl_dfl"
    paper = "Yan et al., CriticalFL, KDD 2023, decentralized as in UA-PDFL's comparison"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        criticalfl_threshold: float = option(
            0.01, "CriticalFL-DFL delta: the relative rise of the gradient norm that is critical."
        )
        criticalfl_factor: float = option(
            2.0, "CriticalFL-DFL beta: neighbours multiplied (critical) or divided (not) by it."
        )
        criticalfl_min_neighbours: int = option(
            1, "CriticalFL-DFL: the fewest neighbours a peer pulls from."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        options = self.options
        check(
            [
                (options.criticalfl_factor > 1, "criticalfl_factor must be > 1"),
                (
                    0 <= options.criticalfl_min_neighbours <= options.num_neighbours,
                    "criticalfl_min_neighbours must be in [0, num_neighbours]",
                ),
            ]
        )

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        peers = len(run.client_ids)
        state = CriticalState(np.full(peers, self.num_neighbours, np.int64), np.full(peers, np.nan))
        return dataclasses.replace(super().init(run, queries), state=state)

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        """Each peer's first n_i drawn neighbours; the rest of its queue is its own row."""
        plan = super().plan(run, view, client_ids, queries)
        rows = np.asarray(plan.clusters)
        contacts = view.state.contacts[rows]
        slots = np.arange(self.num_neighbours)[None, :]
        padded = np.where(slots < contacts[:, None], plan.neighbours, rows[:, None])
        return dataclasses.replace(plan, neighbours=padded.astype(np.int32))

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        decision = super().after_round(run, view, result, queries)
        state: CriticalState = view.state
        rows = np.asarray(result.clusters, np.int64)  # each peer's mailbox row is its own
        norms = np.asarray(result.client_metrics["update_norm"], np.float64)
        options = self.options
        contacts, critical = next_contacts(
            state.contacts[rows],
            norms,
            state.last_norms[rows],
            threshold=float(options.criticalfl_threshold),
            factor=float(options.criticalfl_factor),
            most=self.num_neighbours,
            fewest=int(options.criticalfl_min_neighbours),
        )
        new_contacts, new_norms = state.contacts.copy(), state.last_norms.copy()
        new_contacts[rows], new_norms[rows] = contacts, norms
        metrics = {**decision.metrics, "criticalfl_critical_peers": float(np.sum(critical))}
        return dataclasses.replace(
            decision, state=CriticalState(new_contacts, new_norms), metrics=metrics
        )
