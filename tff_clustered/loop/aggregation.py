"""The loop's side of a round's aggregator: its state, round inputs and metric columns.

The loop's side of a round's aggregator (`federated.cluster_aggregators`): what a round of
an aggregator that `takes_round_inputs` takes besides the models (its state, a noise seed, each
cluster's expected number of clients), what comes back, and the round's metric columns.

The expected counts are what a private mean divides by (McMahan et al., ICLR 2018: a fixed
denominator, never the realised count, which one client changes). They are computed from the
assignment at the start of the round, before the algorithm's plan (which may depend on the
sampled clients): E_k = m_t * n_k / N_t for the N_t eligible clients of which n_k are assigned
to cluster k, m_t = min(clients per round, N_t) of them sampled; the eligible clients with no
cluster yet (IFCA before its first pick, FedGroup's newcomers) are spread evenly over the
clusters. A cluster of E_k = 0 is not in use: it gets no noise and does not step.
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from tff_clustered.algorithms.base import Algorithm
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.executions import execution_class
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.state import RunState
from tff_clustered.options import flag_name
from tff_clustered.runtime import context as runtime
from tff_clustered.seeds import DP_NOISE, derived_key


@dataclasses.dataclass(frozen=True)
class AggregatorRound:
    """What one round of an aggregator that `takes_round_inputs` takes: its `state` and the
    round's `inputs` (`ClusterAggregator.round_inputs`), one row per real cluster; `state`
    None: the built round's initial state (a `tff.aggregators` factory's, which depends on
    the update's type)."""

    state: Optional[Mapping[str, np.ndarray]]
    inputs: Mapping[str, np.ndarray]


def check_aggregator(algorithm: Algorithm, aggregator: ClusterAggregator) -> None:
    """Refuses an aggregator `algorithm`'s rounds cannot use (as its options set them): any
    but the mean for decentralized peers (no server aggregates) and for an algorithm that is
    not `models_from_aggregate` (it reads individual clients' models or updates beside the
    aggregate: no privacy would hold, and its clients would still send those whole, so a
    robust, compressed or secure aggregate would neither bound, shrink nor hide them)."""
    if not aggregator.voided_by_individual_updates:
        return
    if algorithm.distribution.decentralized:
        raise ValueError(
            f"{algorithm.name} is decentralized: no server aggregates its peers' updates, so "
            f"--aggregator={aggregator.name} has nothing to aggregate; leave --aggregator unset"
        )
    if algorithm.models_from_aggregate:
        return
    mode = algorithm.private_mode
    own_mode = f"{mode} (its models then come from the aggregate), " if mode else ""
    voided = (
        "no privacy would hold"
        if aggregator.private
        else "they would still be sent whole beside the aggregate, which the "
        f"{aggregator.name} aggregator would neither bound, shrink nor hide"
    )
    raise ValueError(
        f"--aggregator={aggregator.name}: {algorithm.name} reads individual clients' models "
        "or updates to set its cluster models, outside the per-cluster aggregate, so "
        f"{voided}; use --aggregator=mean, {own_mode}or an algorithm whose models come from "
        "the aggregate only (fedavg, fedper, ifca, fedgroup, ...)"
    )


def check_cold_start_settings(algorithm: Algorithm, config: AggregatorConfig) -> None:
    """Refuses an aggregator's cold-start setting (its `cold_start_settings`, e.g. DP's
    `cold_start_release`) changed from its default for an algorithm without a cold start
    that reads clients' updates (FedAvg, IFCA): it would do nothing. (The command line refuses
    the flags themselves, for every column of a table: `cli.run_flags`.)"""
    if algorithm.cold_start_updates:
        return
    fields = {f.name: f for f in dataclasses.fields(config.kind.options_type())}
    for name in config.kind.cold_start_settings:
        value = getattr(config.options, name)
        if value != fields[name].default:
            raise ValueError(
                f"{algorithm.name} has no cold start that reads clients' updates, so the "
                f"{config.name} aggregator's {name}={value!r} (--{flag_name(fields[name])}) "
                f"would do nothing; leave it at its default ({fields[name].default!r})"
            )


def checked_aggregator(
    config: TrainingConfig, algorithm: Algorithm, round_metrics: bool, execution: str = "tff"
) -> ClusterAggregator:
    """The run's aggregator, refused where the algorithm cannot use it
    (`check_aggregator`), where `execution` (and the started runtime's workers) cannot run it
    (`executions.Execution.check_aggregator`) or where round metrics would read each client's
    update, which an aggregator that does not pass updates through keeps inside its
    per-cluster sums."""
    aggregator = config.aggregator.build()
    check_aggregator(algorithm, aggregator)
    execution_class(execution).check_aggregator(aggregator, len(runtime.worker_contexts()))
    if round_metrics and aggregator.voided_by_individual_updates:
        raise ValueError(
            f"round metrics read each client's own update, which the {aggregator.name} "
            "aggregator keeps inside its per-cluster sums; drop round_metrics or use the mean"
        )
    return aggregator


def aggregator_round(
    aggregator: ClusterAggregator,
    state: RunState,
    config: TrainingConfig,
    round_num: int,
    eligible: Sequence[str],
) -> Optional[AggregatorRound]:
    """Round `round_num`'s aggregator state (`state`'s, or the initial one when the number
    of clusters changed) and inputs (`round_inputs`, from `state`'s assignment and the
    `eligible` clients), None for one that takes none (the mean)."""
    if not aggregator.takes_round_inputs:
        return None
    inputs = round_inputs(
        aggregator,
        config.seed,
        round_num,
        state.assignment,
        eligible,
        config.clients_per_round,
        state.num_clusters,
    )
    return AggregatorRound(
        aggregator.state_or_initial(state.aggregator_state, state.num_clusters), inputs
    )


def expected_counts(
    assignment: Mapping[str, int],
    eligible: Sequence[str],
    clients_per_round: int,
    num_clusters: int,
) -> np.ndarray:
    """Each cluster's expected number of sampled clients in a round that samples
    `min(clients_per_round, len(eligible))` of the `eligible` clients uniformly (see the
    module docstring; unassigned clients spread evenly over the `num_clusters` clusters)."""
    population = len(eligible)
    if population == 0 or num_clusters == 0:
        return np.zeros(num_clusters, np.float64)
    clusters = np.fromiter((assignment.get(c, -1) for c in eligible), np.int64, population)
    assigned = clusters[(clusters >= 0) & (clusters < num_clusters)]
    counts = np.bincount(assigned, minlength=num_clusters).astype(np.float64)
    counts += (population - len(assigned)) / num_clusters
    return min(clients_per_round, population) * counts / population


def round_inputs(
    aggregator: ClusterAggregator,
    seed: int,
    round_num: int,
    assignment: Mapping[str, int],
    eligible: Sequence[str],
    clients_per_round: int,
    num_clusters: int,
) -> collections.OrderedDict:
    """The round's inputs: its noise key (`noise_key`) and the expected counts."""
    counts = expected_counts(assignment, eligible, clients_per_round, num_clusters)
    return aggregator.round_inputs(noise_key(aggregator, seed, round_num), counts)


def noise_key(aggregator: ClusterAggregator, seed: int, round_num: int) -> np.ndarray:
    """The round's 128-bit noise key (int64[2]): for an aggregator of `secure_noise`, fresh bits
    of the operating system's CSPRNG (`secrets`), passed to the round and never written
    (checkpoints keep the aggregator's state, not its inputs), so no one can recompute the
    noise; otherwise a function of the run's seed, of any width, and the round (stream
    `DP_NOISE`), so a resumed run draws what an uninterrupted one would."""
    if aggregator.secure_noise:
        return np.frombuffer(secrets.token_bytes(16), np.int64).copy()
    return np.array(derived_key(seed, DP_NOISE, round_num), np.int64)
