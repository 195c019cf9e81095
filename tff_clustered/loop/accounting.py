"""A private run's privacy account, from what its aggregator declares.

After every round of an aggregator that adds noise (its `round_event`, e.g.
`federated.cluster_dp.ClusterDP`'s), the round's event (its noise, as the run's client sampling
amplifies it: `loop.dp_events.sampling_event`) is recorded for the clients that were eligible,
and every cluster's epsilon at the run's delta is read off the ledger (`PrivacyLedger`: a
cluster's epsilon is the largest of the clients assigned to it). A target epsilon stops the run
before the round that would pass it, and, when no noise multiplier is given, sets the noise
multiplier whose rounds reach it (`noise_calibration.calibrated_noise_multiplier`); the delta
and the target are the aggregator's settings' (`privacy_budget`).

An algorithm whose start reads clients' own pre-training updates (what its `Releases`'
`cold_start` names: FedGroup's cold start and newcomers, FeSEM's K-means) reads them through
the private cold start's Gaussian mechanism (`loop.update_release`), and returns them in its
decision (`Decision.released`): each client that sent one is charged that release's event
(`noise_calibration.release_event`), unsampled, when the decision is applied. Its noise
multiplier, unless given, is the least whose one release costs `cold_start_share` of the
run's epsilon (the target, else the rounds' own epsilon at the given noise multiplier), and
a calibrated noise multiplier is then the least whose rounds, after that release, reach the
target.

Every in-use cluster's sum is noised in every round, and a client adds into one cluster's sum
only, so one round is one Gaussian mechanism on the stack of cluster sums, whichever cluster a
client lands in: the clusters share the round's event, and their epsilons differ only where
their clients' eligibility differed (FedGroup's late newcomers, FedAC's warm-up blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import DpEvent

from tff_clustered.algorithms.base import ReleasedUpdates, Releases, RunInfo
from tff_clustered.federated.cluster_aggregators import ClusterAggregator, PrivacyBudget
from tff_clustered.loop.client_store import holds_trained_models
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.dp_events import sampling_event
from tff_clustered.loop.noise_calibration import (
    calibrated_noise_multiplier,
    epsilon_of,
    release_event,
    release_noise_multiplier,
)
from tff_clustered.loop.privacy_ledger import PrivacyLedger
from tff_clustered.loop.sampling import describe_sampling
from tff_clustered.loop.state import RunState
from tff_clustered.loop.update_release import UpdateRelease

# What a private run's epsilon covers, and what no run's covers, whatever its algorithm (an
# algorithm's own releases are its `Releases`): each item "what: detail" (stdout names the what).
COVERED_MODELS = (
    "the cluster models: every round's clipped per-cluster sums plus Gaussian noise (an empty "
    "Poisson round's noise alone), the aggregator's state (adaptive clips) and what the server "
    "computes from them alone"
)
LOOP_RELEASES = (
    "exact training metrics: train_loss, num_sampled, dropped_clients and sampled_cluster_k of "
    "metrics.csv, from the sampled clients' own training",
    "evaluation: the accuracies and losses of metrics.csv and clients.csv, each client's from "
    "its own data",
    "the sample: which clients each round samples, drawn from --seed, which the run folder "
    "records (epsilon's amplification by sampling assumes it secret)",
    "the clients' data sizes and labels: each client's train_examples and test_examples in "
    "clients.csv and its examples per label in labels.png and TensorBoard's labels image, "
    "counted from its own data",
)
# summary.json's `privacy.device_side` of a run whose client store holds a model a client
# trained: state a deployment keeps on the device, which this simulation writes.
CLIENT_MODELS = (
    "each client's own model: the model or personal layers a trained client keeps (FedPer's "
    "head, Ditto's personal model, ...), trained on its own data without noise; a deployment "
    "keeps it on the device and releases none of it, this simulation keeps it in the client "
    "store (checkpoint.npz, or the store's file beside it)"
)
SEEDED_NOISE = (
    "the noise: seeded (--dp_noise=seeded), recomputable from --seed, so nothing is private "
    "against whoever holds the run folder; --dp_noise=secure for a model to release"
)


def private_cold_start(aggregator: ClusterAggregator) -> bool:
    """Whether the run's cold start reads clients' updates through a Gaussian mechanism of its
    own, accounted in the ledger (the aggregator's `cold_start_mechanism`, where it has one)."""
    return aggregator.cold_start_mechanism() is not None


def coverage(aggregator: ClusterAggregator, releases: Releases) -> dict[str, list[str]]:
    """summary.json's `covers` and `not_covered` of a private run of `aggregator` whose algorithm
    sends `releases` beside the aggregate: its cold start's reads are covered when the cold start
    is private, the rest of its releases and the loop's (`LOOP_RELEASES`) never, and the noise
    only when it is secure."""
    cold_start = list(releases.cold_start)
    private_start = private_cold_start(aggregator)
    covers = [COVERED_MODELS, *(cold_start if private_start else [])]
    not_covered = [*([] if private_start else cold_start), *releases.outside, *LOOP_RELEASES]
    if not aggregator.secure_noise:
        not_covered.append(SEEDED_NOISE)
    return {"covers": covers, "not_covered": not_covered}


def privacy_line(privacy: Mapping[str, Any]) -> str:
    """The line a private run ends with: its epsilon at its delta, its noise, and what its
    epsilon does not cover (each item's what; the details in summary.json)."""
    uncovered = "; ".join(item.split(":")[0] for item in privacy["not_covered"])
    device_side = "; ".join(item.split(":")[0] for item in privacy.get("device_side", ()))
    noise = f", {privacy['noise']} noise" if "noise" in privacy else ""
    kept = f"; kept on the devices, not released: {device_side}" if device_side else ""
    return (
        f"privacy: epsilon {privacy['epsilon']:.4g} at delta {privacy['delta']:g}{noise}; not "
        f"covered (summary.json's privacy.not_covered): {uncovered}{kept}"
    )


def account_for(
    aggregator: ClusterAggregator,
    config: TrainingConfig,
    client_index: Mapping[str, int],
    cold_start: bool = False,
) -> Optional[PrivacyAccount]:
    """The run's privacy account: None unless its aggregator adds noise (`round_event`; DP's
    clipping only, a noise multiplier of 0, adds none) and declares its budget. `cold_start`:
    the algorithm's start reads clients' own updates (`Algorithm.cold_start_updates`)."""
    if aggregator.round_event() is None or config.aggregator.privacy_budget() is None:
        return None
    return PrivacyAccount(aggregator, config, client_index, cold_start)


def cold_start_noise(
    config: TrainingConfig, budget: PrivacyBudget, population: int
) -> Optional[float]:
    """The private cold start's noise multiplier: the one given, else the least whose one
    release costs `cold_start_share` of the run's epsilon (its target, else its rounds' at the
    given noise multiplier, every client eligible); None: no private cold start (read raw, or
    a run without noise)."""
    if not budget.cold_start_share > 0:
        return None
    if budget.cold_start_noise_multiplier is not None:
        return budget.cold_start_noise_multiplier
    epsilon = budget.target_epsilon
    if not epsilon > 0:
        inner = config.aggregator.build().round_event()
        if inner is None:  # clipping only: no guarantee to share
            return None
        sample = min(config.clients_per_round, population)
        event = sampling_event(config.client_sampling, population, sample, inner)
        epsilon = epsilon_of(dp_event.SelfComposedDpEvent(event, config.rounds), budget.delta)
    replace_one = config.client_sampling == "fixed"
    return release_noise_multiplier(budget.cold_start_share * epsilon, budget.delta, replace_one)


def calibrated(
    config: TrainingConfig,
    population: int,
    cold_start: bool = False,
    early: Sequence[int] = (),
) -> tuple[TrainingConfig, Optional[float]]:
    """`config` with a private aggregator's noise multiplier set from its target epsilon when
    none is given: the least whose `rounds` rounds reach the target at the run's delta, every
    client eligible but in the first rounds, which sample from `early` clients each where
    fewer are eligible (after the private cold start's release, when `cold_start`: the
    algorithm reads clients' own updates at its start, whose noise multiplier is set here
    too); and that multiplier (None: nothing calibrated). A noise multiplier given is refused
    where round 1 passes the target."""
    settings = config.aggregator
    budget = settings.privacy_budget()
    if budget is None:
        return config, None
    z_cold = cold_start_noise(config, budget, population) if cold_start else None
    prior = None
    if z_cold is not None:
        settings = settings.with_cold_start_noise_multiplier(z_cold)
        config = dataclasses.replace(config, aggregator=settings)
        prior = release_event(z_cold, config.client_sampling == "fixed")
        check_cold_start_fits(prior, budget, z_cold)
    if not budget.calibrate:
        refuse_target_below_one_round(config, population, prior, early)
        return config, None

    # A round of adaptive clipping (TFF's split of the noise) costs exactly a Gaussian round of
    # the noise multiplier z, calibrated as one; the split is checked when z is set.
    z = calibrated_noise_multiplier(
        budget.target_epsilon,
        budget.delta,
        config.rounds,
        config.client_sampling,
        population,
        min(config.clients_per_round, population),
        prior_event=prior,
        early_populations=early,
    )
    chosen = settings.with_noise_multiplier(z)
    return dataclasses.replace(config, aggregator=chosen), z


def refuse_target_below_one_round(
    config: TrainingConfig,
    population: int,
    prior: Optional[DpEvent] = None,
    early: Sequence[int] = (),
) -> None:
    """Refuses a target epsilon that the first round alone passes (on its eligible clients:
    all `population`, or `early[0]` where the first rounds have fewer; after `prior`, the
    private cold start's release, when there is one): the run would stop before it and train
    nothing. The message names that epsilon and the noise multipliers that fit."""
    budget = config.aggregator.privacy_budget()
    event = config.aggregator.build().round_event()
    if budget is None or not budget.target_epsilon > 0 or event is None or population < 1:
        return
    eligible = early[0] if early else population
    sampling, sample = config.client_sampling, min(config.clients_per_round, eligible)
    first = sampling_event(sampling, eligible, sample, event)
    if prior is not None:
        first = dp_event.ComposedDpEvent([prior, first])
    one_round = epsilon_of(first, budget.delta)
    if one_round <= budget.target_epsilon:
        return
    target, delta, rounds = budget.target_epsilon, budget.delta, config.rounds
    fits_one, fits_all = (
        calibrated_noise_multiplier(
            target,
            delta,
            n,
            sampling,
            population,
            min(config.clients_per_round, population),
            prior_event=prior,
            early_populations=early,
        )
        for n in (1, rounds)
    )
    z = config.aggregator.options.noise_multiplier
    costs = "the cold start and one round cost" if prior is not None else "one round costs"
    raise ValueError(
        f"--target_epsilon={target:g} is below one round's epsilon: with "
        f"--dp_noise_multiplier={z:g} and --client_sampling={sampling} ({sample} of the "
        f"{eligible} clients eligible in round 1), {costs} epsilon {one_round:.4g} at "
        f"delta {delta:g}, so the run would stop before round 1 and train nothing; give "
        f"--dp_noise_multiplier of "
        f"at least {fits_one:.4g} (one round fits) or {fits_all:.4g} (all {rounds} rounds fit; "
        f"leave it unset and the target sets it), or a --target_epsilon above {one_round:.4g}"
    )


def check_cold_start_fits(release: Any, budget: PrivacyBudget, z_cold: float) -> None:
    """Refuses a private cold start whose one release alone reaches the target epsilon."""
    target = budget.target_epsilon
    if not target > 0:
        return
    cost = epsilon_of(release, budget.delta)
    if cost >= target:
        raise ValueError(
            f"the private cold start alone costs epsilon {cost:.4g} (noise multiplier "
            f"{z_cold:g}), at least --target_epsilon={target:g}: raise "
            "--dp_cold_start_noise_multiplier, or leave it unset to spend "
            "--dp_cold_start_share of the target on it"
        )


class PrivacyAccount:
    """The run's account of a private aggregator `aggregator` under `config`'s sampling, delta
    and target epsilon (its settings' `privacy_budget`), over the clients of `client_index`
    (client id -> its position)."""

    def __init__(
        self,
        aggregator: ClusterAggregator,
        config: TrainingConfig,
        client_index: Mapping[str, int],
        cold_start: bool = False,
    ) -> None:
        self.aggregator, self.config, self.client_index = aggregator, config, client_index
        self.cold_start = cold_start
        budget = config.aggregator.privacy_budget()
        assert budget is not None  # `account_for` makes an account only then
        self.delta = budget.delta
        self.target_epsilon = budget.target_epsilon

    def new_ledger(self) -> PrivacyLedger:
        return PrivacyLedger.for_population(len(self.client_index))

    def update_release(self) -> Optional[UpdateRelease]:
        """The mechanism the algorithm's cold start reads clients' own updates through (None:
        raw, or an algorithm without one)."""
        mechanism = self.aggregator.cold_start_mechanism()
        if not self.cold_start or mechanism is None:
            return None
        clip, noise_multiplier = mechanism
        return UpdateRelease(clip, noise_multiplier, self.config.seed, self.aggregator.secure_noise)

    def record_released(self, ledger: PrivacyLedger, released: Sequence[ReleasedUpdates]) -> None:
        """Charges each client that sent a noised update its release's event (a raw one, read
        outside the guarantee, is not accounted: the run says so)."""
        replace_one = self.config.client_sampling == "fixed"
        for updates in released:
            if updates.noise_multiplier is None or not updates.client_ids:
                continue
            ids = updates.client_ids
            positions = np.fromiter((self.client_index[c] for c in ids), np.int64, len(ids))
            ledger.record(positions, release_event(updates.noise_multiplier, replace_one))

    def round_event(self, num_eligible: int) -> Any:
        """One round's event: the aggregator's noise, sampled from `num_eligible` clients."""
        return sampling_event(
            self.config.client_sampling,
            num_eligible,
            min(self.config.clients_per_round, num_eligible),
            self.aggregator.round_event(),
        )

    def eligible_positions(self, eligible: Sequence[str], everyone: Sequence[str]) -> Any:
        """The ledger's `eligible` argument: None when every client is (`everyone` itself, or
        as many), else their positions."""
        if eligible is everyone or len(eligible) == len(everyone):
            return None
        return np.fromiter((self.client_index[c] for c in eligible), np.int64, len(eligible))

    def passes_target(self, state: RunState, eligible: Sequence[str], run: RunInfo) -> bool:
        """Whether the next round, `eligible` sampled from, would take some client's epsilon
        past the target (never without a target)."""
        ledger = state.privacy
        if ledger is None or not self.target_epsilon > 0 or not len(eligible):
            return False
        trial = PrivacyLedger(ledger.client_class, [dict(c) for c in ledger.classes])
        positions = self.eligible_positions(eligible, run.client_ids)
        trial.record(positions, self.round_event(len(eligible)))
        return trial.epsilon(self.delta) > self.target_epsilon

    def record(
        self, ledger: PrivacyLedger, eligible: Sequence[str], everyone: Sequence[str]
    ) -> None:
        """Records a round whose clients were sampled from `eligible`."""
        if len(eligible):
            ledger.record(
                self.eligible_positions(eligible, everyone), self.round_event(len(eligible))
            )

    def record_round(
        self, state: RunState, eligible: Sequence[str], everyone: Sequence[str]
    ) -> dict[str, float]:
        """Records the round just run (its clients sampled from `eligible`) in `state`'s
        ledger; the round's epsilon columns."""
        assert state.privacy is not None
        self.record(state.privacy, eligible, everyone)
        return self.columns(
            state.privacy, state.assignment, state.cluster_sizes, state.num_clusters
        )

    def columns(
        self,
        ledger: PrivacyLedger,
        assignment: Mapping[str, int],
        sizes: np.ndarray,
        num_clusters: int,
    ) -> dict[str, float]:
        """The round's `epsilon` (the largest client's) and `epsilon_cluster_k` (the largest of
        cluster k's clients, a client without a cluster counting in every cluster, as one that
        picks its cluster in the round may join any; NaN for a cluster no client can be in;
        `sizes`: the clients per cluster). One class of clients (the usual case: every client
        always eligible) gives every cluster the run's epsilon without reading the assignment."""
        epsilon = ledger.epsilon(self.delta)
        if len(ledger.classes) == 1:  # a client without a cluster counts in every cluster
            unassigned = len(self.client_index) > int(sizes.sum())
            per_cluster = np.where((sizes[:num_clusters] > 0) | unassigned, epsilon, np.nan)
        else:
            clusters = np.full(len(self.client_index), -1, np.int64)
            for client, k in assignment.items():
                clusters[self.client_index[client]] = k
            per_cluster = ledger.epsilon_per_cluster(
                clusters, num_clusters, self.delta, unassigned_in_every_cluster=True
            )
        row = {"epsilon": epsilon}
        row.update({f"epsilon_cluster_{k}": float(e) for k, e in enumerate(per_cluster)})
        return row

    def summary(
        self,
        ledger: PrivacyLedger,
        stopped_at_target: bool,
        releases: Releases,
        client_models: bool = False,
    ) -> dict[str, Any]:
        """summary.json's `privacy` block (`releases`: what the algorithm sends beside the
        aggregate, stated in `covers` and `not_covered`; `client_models`: the run's client
        store holds models clients trained, stated in `device_side`)."""
        return {
            "epsilon": ledger.epsilon(self.delta),
            "delta": self.delta,
            "target_epsilon": self.target_epsilon or None,
            "stopped_at_target_epsilon": stopped_at_target,
            **self.aggregator.privacy_record(),
            "sampling": describe_sampling(self.config.client_sampling),
            "accountant": "Renyi DP (dp-accounting's RdpAccountant)",
            "neighboring_relation": ledger.neighboring_relation.name,
            "client_weighting": "uniform" if self.aggregator.uniform_weights else "algorithm's",
            **coverage(self.aggregator, releases),
            "device_side": [CLIENT_MODELS] if client_models else [],
            **self.cold_start_record(),
        }

    def cold_start_record(self) -> dict[str, Any]:
        """summary.json's `cold_start` entry for an algorithm whose start reads clients' own
        updates: private (its mechanism) or raw (outside epsilon)."""
        if not self.cold_start:
            return {}
        release = self.update_release()
        if release is None:
            return {"cold_start": {"release": "raw", "covered_by_epsilon": False}}
        record = {"release": "private", "covered_by_epsilon": True}
        record.update(clip=release.clip, noise_multiplier=release.noise_multiplier)
        return {"cold_start": record}


def privacy_summary(
    account: Optional[PrivacyAccount],
    state: RunState,
    stopped_at_target: bool,
    releases: Releases,
) -> Optional[dict[str, Any]]:
    """summary.json's `privacy` block of a run with `account` (None: not a private run) whose
    algorithm sends `releases` beside the aggregate."""
    if account is None or state.privacy is None:
        return None
    trained = holds_trained_models(state.client_models)
    return account.summary(state.privacy, stopped_at_target, releases, trained)
