"""The generic training loop, round by round: sample, plan, run the round, decide, evaluate.

Each round samples clients, asks the algorithm for a plan, runs the federated round, applies
the algorithm's decision, then evaluates, and is written as one row.

It knows no paper by name: everything an algorithm decides comes back as a `Decision`
(`algorithms/base.py`) and is applied to the run's state (`loop/state.py`). Its parts are their
own modules under `loop/`: the settings (`config`), the state and the divergence policy
(`state`), one training round as a step (`round_step`) through the calls of built computations
(`round_calls`), the `Queries` an algorithm is given (`queries`) and the evaluation
(`evaluation`). Every random choice is a pure function of
`(seed, stream, round, client)`, so a run resumed from a checkpoint ends exactly where an
uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    RoundResult,
    RunInfo,
    ServerView,
)
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.loop import accounting, aggregation
from tff_clustered.loop.aggregation import AggregatorRound
from tff_clustered.loop.client_store import ClientModels, ClientStore, open_store, store_kind
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.divergence import check_finite
from tff_clustered.loop.evaluation import Evaluator
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.phases import Stopwatch
from tff_clustered.loop.queries import ServerQueries
from tff_clustered.loop.round_calls import RoundCalls
from tff_clustered.loop.round_step import RoundOutcome, RoundStep, empty_round_row
from tff_clustered.loop.sampling import sampled_positions
from tff_clustered.loop.state import (
    RunState,
    apply_decision,
    clients_moved,
    cluster_capacity,
)
from tff_clustered.loop.training_call import LocalTraining, TrainRequest
from tff_clustered.loop.training_row import training_row
from tff_clustered.models.functional import functional_model
from tff_clustered.models.keras_models import ModelSpec, initial_weights
from tff_clustered.models.split import classifier_layers, trainable_layer_sizes
from tff_clustered.runtime.context import RuntimeConfig
from tff_clustered.seeds import derived_seed

# A function of the run, the server after a round and the round's result -> extra metrics.
RoundMetric = Callable[[RunInfo, ServerView, RoundResult], dict]


def read_only(mapping: Mapping[str, int]) -> Mapping[str, int]:
    """`mapping` as the algorithms may read it: a dict behind a read-only view, another mapping
    (a population's compact counts) as it is, not copied per client."""
    return types.MappingProxyType(mapping) if isinstance(mapping, dict) else mapping


class Experiment:
    """One algorithm on one dataset and model, round by round."""

    def __init__(
        self,
        data: FederatedData,
        model: ModelSpec,
        algorithm: Algorithm,
        config: TrainingConfig,
        round_metrics: Sequence[RoundMetric] = (),
        execution: Optional[RunExecution] = None,
    ) -> None:
        """`round_metrics` add metrics to each round's row (they get the clients' updates).
        `execution` (`loop.execution.RunExecution`; default: TFF's runtime on one local worker,
        a timer of its own, the client store chosen by the population's size): its runtime
        "tff" runs rounds on the TFF runtime, "in_process" runs the same TF functions in this
        process (on its `device`, else TensorFlow's choice: a GPU if it sees one); results are
        the same within float tolerance. Its timer gets the algorithm's cold start (`start`)
        and the time building rounds. Its client store is where the clients' own models live
        (memory, disk, or auto by the population's size), the disk store's file in its
        `store_folder`; results are the same either way."""
        execution = RunExecution() if execution is None else execution
        if config.clients_per_round > data.num_clients:
            raise ValueError(
                f"clients_per_round={config.clients_per_round} exceeds the "
                f"{data.num_clients} clients of {data.name}; lower it"
            )
        self.server_optimizer = algorithm.server_optimizer(config.server_optimizer)
        algorithm.distribution.check_server_optimizer(algorithm.name, self.server_optimizer)
        config, _ = accounting.calibrated(  # --target_epsilon's z, the cold start's
            config,
            data.num_clients,
            algorithm.cold_start_updates,
            algorithm.early_eligible(data.num_clients),
        )
        self.data, self.model, self.algorithm, self.config = data, model, algorithm, config
        self.round_metrics = tuple(round_metrics)
        self.timer = execution.timer
        self.choose_aggregator(execution.runtime.execution)
        keras_model = model.build()
        rounds_cache = self.build_model(keras_model, execution.runtime)
        self.run = self.run_info(keras_model)
        self.work = algorithm.client_work(config.momentum, self.run)
        self.anchor_tensors = tuple(algorithm.anchor_tensors(self.run))
        self.calls = RoundCalls(data, self.layout, rounds_cache, config)
        self.round_step = RoundStep(
            self.calls,
            algorithm.distribution,
            config.max_diverged_fraction,
            algorithm.needs_model_deltas or bool(self.round_metrics),
            self.aggregator.divergence_hint(),
        )
        self.evaluator = Evaluator(data, algorithm, self.run, self.calls, config.fine_tune_steps)
        self.state = RunState()
        self.open_client_store(execution)
        # Per-client results of the last evaluation, one dict per client (for clients.csv).
        self.client_rows: list[dict[str, Any]] = []

    # -- building ----------------------------------------------------------------------------
    def choose_aggregator(self, execution: str) -> None:
        """The round's aggregator (checked against the algorithm and `execution`), a private
        run's account and how the clients' updates are weighted."""
        metrics = bool(self.round_metrics)
        self.aggregator = aggregation.checked_aggregator(
            self.config, self.algorithm, metrics, execution
        )
        self.account = accounting.account_for(
            self.aggregator, self.config, self.data.client_index, self.algorithm.cold_start_updates
        )
        # How the algorithm's cold start reads clients' own updates (None: raw).
        self.update_release = self.account.update_release() if self.account else None
        self.stopped_at_target = False  # the next round would pass --target_epsilon
        self.client_weighting = (  # a private mean counts every client once
            "uniform" if self.aggregator.uniform_weights else self.algorithm.client_weighting
        )

    def build_model(self, keras_model: Any, runtime: RuntimeConfig) -> RoundCache:
        """The model as a functional model, its layout and initial variables, and the cache of
        its built rounds on `runtime` (their building timed as `tracing`)."""
        model, config = self.model, self.config
        self.functional = functional_model(keras_model, model.input_spec())
        self.layout = ModelLayout.of(self.functional)
        self.initial_variables = tuple(
            initial_weights(model, derived_seed(config.seed, 0))
            + list(self.functional.initial_state)
        )
        return RoundCache(
            self.functional,
            model.input_spec(),
            self.initial_variables,
            runtime.execution,
            runtime.device,
            rounds=config.rounds,
            on_build=lambda seconds: self.timer.add("tracing", seconds),
        )

    def run_info(self, keras_model: Any) -> RunInfo:
        """What the algorithm is told of the run: its clients, seed, model's shapes and sizes."""
        data, config = self.data, self.config
        tensor_sizes = tuple(int(np.prod(s)) for s in self.layout.trainable_shapes)
        return RunInfo(
            client_ids=tuple(data.client_ids),
            train_sizes=read_only(data.train_sizes),
            seed=config.seed,
            clients_per_round=config.clients_per_round,
            layer_sizes=tuple(trainable_layer_sizes(keras_model)),
            classifier_layers=classifier_layers(keras_model),
            tensor_sizes=tensor_sizes,
            trainable_shapes=tuple(tuple(int(d) for d in s) for s in self.layout.trainable_shapes),
            num_trainable_values=sum(tensor_sizes),
            initial_model=flat.flatten(self.initial_variables),
            public_x=data.public_x,
            input_shape=tuple(int(d) for d in self.model.input_spec()["x"].shape[1:]),
            total_rounds=config.rounds,
            reads_features=self.functional.features is not None,
        )

    def open_client_store(self, execution: RunExecution) -> None:
        """The store of the clients' own models `execution` chooses, every client initial."""
        size = len(flat.flatten(self.initial_variables))
        self.store_kind = store_kind(execution.client_store, self.data.num_clients, size)
        self.store_folder = execution.store_folder
        self.store = self.new_store()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """The algorithm's initial decision (round 0) on top of the default state, timed as the
        `cold_start` phase (pre-training, initial clustering: whatever its `init` does)."""
        self.state = RunState(
            cluster_models=self.run.initial_model[None, :].copy(),
            shared=tuple(self.algorithm.initial_shared(self.run)),
            anchor=self.run.initial_model.copy() if self.anchor_tensors else None,
            privacy=self.account.new_ledger() if self.account else None,
        )
        self.store = self.new_store()
        with self.timer.phase("cold_start"):
            self.apply(self.algorithm.init(self.run, self.queries))

    def restore(self, state: RunState) -> None:
        """Continues from a checkpoint's `state` (its client models in this run's store)."""
        self.state = state
        self.store = self.new_store(state.client_models)

    def snapshot(self) -> RunState:
        """The state for a checkpoint, to be written before the next round: the disk store's
        rows are made durable, and the rows it names stay untouched until the next snapshot."""
        self.state.client_models = self.store.record()
        return self.state

    def new_store(self, saved: Optional[ClientModels] = None) -> ClientStore:
        """The run's client store holding `saved` (a checkpoint's; None: every client initial)."""
        index, folder = self.calls.client_index, self.store_folder
        return open_store(self.store_kind, self.initial_variables, index, folder, saved)

    def view(self) -> ServerView:
        return self.state.view()

    @property
    def queries(self) -> ServerQueries:
        """What the algorithm may ask of the run as it stands now."""
        return ServerQueries(
            self.calls,
            self.store,
            self.signature(),
            self.model,
            self.functional.initial_state,
            self.update_release,
        )

    def apply(self, decision: Decision) -> Mapping[str, int]:
        """Applies an algorithm's decision to the run's state (a private run's ledger charged
        for the clients' updates it read: `Decision.released`); returns the earlier clusters of
        the clients it assigned."""
        before = apply_decision(self.state, decision, self.algorithm.name, self.anchor_tensors)
        if self.account is not None and self.state.privacy is not None:
            self.account.record_released(self.state.privacy, decision.released)
        return before

    @property
    def num_clusters(self) -> int:
        return self.state.num_clusters

    def rounds(self) -> Iterator[dict[str, Any]]:
        """Runs the remaining rounds (evaluating round 0 first on a fresh run, unless
        `eval_at_start` is off), one row each."""
        if self.state.round_num == 0 and not self.state.history and self.config.eval_at_start:
            row = {"round": 0, **self.evaluate(round_num=0)}
            self.state.history.append(row)
            yield row
        self.passes_target(1)  # after each round, `passes_target(2)` asks of the next one
        while self.state.round_num < self.config.rounds and not self.stopped_at_target:
            round_num = self.state.round_num + 1
            started = time.perf_counter()
            row = {"round": round_num, **self.train_round(round_num)}
            trained = time.perf_counter()
            last = round_num == self.config.rounds or self.passes_target(2)
            if round_num % self.config.eval_every == 0 or last:
                row.update(self.evaluate(round_num=round_num))
            row["eval_seconds"] = time.perf_counter() - trained
            row["round_seconds"] = time.perf_counter() - started
            self.state.round_num = round_num
            self.state.history.append(row)
            yield row

    def passes_target(self, ahead: int) -> bool:
        """Would round `state.round_num + ahead` pass --target_epsilon? (It stops the run.)"""
        if self.account is not None:
            eligible = self.eligible_clients(self.state.round_num + ahead)
            self.stopped_at_target = self.account.passes_target(self.state, eligible, self.run)
        return self.stopped_at_target

    def evaluate(self, round_num: Optional[int] = None) -> dict[str, Any]:
        """The evaluation row (`loop.evaluation.Evaluator.evaluate`); each client's row goes to
        `client_rows` (for clients.csv)."""
        row, self.client_rows = self.evaluator.evaluate(
            self.state,
            self.store,
            self.current_round(),
            self.queries,
            self.state.round_num if round_num is None else round_num,
        )
        return row

    # -- one round ---------------------------------------------------------------------------
    def signature(self) -> RoundSignature:
        """The round the run needs now (its cluster count and split are per-round data)."""
        return RoundSignature(
            num_clusters=cluster_capacity(self.num_clusters),
            shared=self.state.shared,
            work=self.work,
            keep_client_models=self.algorithm.keep_client_models,
            return_model_deltas=self.round_step.with_deltas,
            client_weighting=self.client_weighting,
            distribution=self.algorithm.distribution,
            anchor=self.anchor_tensors,
            server_optimizer=self.server_optimizer,
            aggregator=self.aggregator,
        )

    def current_round(self) -> FederatedRound:
        return self.calls.rounds_cache.get(self.signature())

    def sample_clients(self, round_num: int, eligible: Optional[Sequence[str]] = None) -> list[str]:
        """The round's clients among the eligible ones, as `config.client_sampling` draws them
        (`loop.sampling.sampled_positions`): `clients_per_round` of them (all if fewer), or each
        with probability clients_per_round / eligible."""
        ids = self.eligible_clients(round_num) if eligible is None else eligible
        config = self.config
        chosen = sampled_positions(
            config.client_sampling, len(ids), config.clients_per_round, config.seed, round_num
        )
        return [ids[i] for i in chosen]

    def eligible_clients(self, round_num: int) -> Sequence[str]:
        """The clients round `round_num` samples from (indexed as they are: no copy)."""
        view = dataclasses.replace(self.view(), round_num=round_num - 1)
        ids = self.algorithm.eligible(self.run, view)
        return ids if isinstance(ids, Sequence) else list(ids)

    def train_round(self, round_num: int) -> dict[str, Any]:
        """Sample, plan, run the federated round (the server optimizer's step included),
        decide, record: one row."""
        eligible = self.eligible_clients(round_num)
        client_ids = self.sample_clients(round_num, eligible)
        if not client_ids:  # possible with Poisson sampling: nothing trains
            return self.accounted(self.empty_round(round_num, eligible), eligible)
        aggregator = aggregation.aggregator_round(  # from the assignment before the plan
            self.aggregator, self.state, self.config, round_num, eligible
        )
        with Stopwatch() as planning:
            plan = self.algorithm.plan(self.run, self.view(), client_ids, self.queries)
            before = self.apply(plan.decision)
        request, outcome = self.federated_round(round_num, client_ids, plan, aggregator)
        models = outcome.cluster_models
        with Stopwatch() as deciding:
            result = outcome.result
            decision = self.algorithm.after_round(self.run, self.view(), result, self.queries)
            after = self.apply(decision)
        check_finite(
            models,
            round_num,
            self.algorithm.name,
            result.clusters,
            result.client_ids,
            self.aggregator.divergence_hint(),
        )
        server_seconds = planning.seconds + deciding.seconds
        moved = clients_moved(self.state.assignment, before, after)
        row = self.training_row(request, outcome, decision, server_seconds, moved)
        return self.accounted(row, eligible)

    def empty_round(self, round_num: int, eligible: Sequence[str]) -> dict[str, Any]:
        """The row of a round that sampled no client. The algorithm is not asked; a private run
        still releases its mechanism's output on the empty sums (each cluster in use moves by
        noise alone, its server optimizer steps), as its accounting assumes: unchanged models
        would tell that no client was sampled (docs/privacy.md)."""
        row = empty_round_row(self.config.learning_rate_at(round_num), self.num_clusters)
        if self.account is None:
            return row
        aggregator = aggregation.aggregator_round(
            self.aggregator, self.state, self.config, round_num, eligible
        )
        _, outcome = self.federated_round(round_num, [], Plan(clusters=None), aggregator)
        row.update(self.aggregator.measurement_columns(outcome.measurements, self.num_clusters))
        return row

    def federated_round(
        self,
        round_num: int,
        client_ids: Sequence[str],
        plan: Plan,
        aggregator: Optional[AggregatorRound],
    ) -> tuple[TrainRequest, RoundOutcome]:
        """Runs the round's federated computation for `client_ids` (none: the aggregator's
        server side alone) and keeps its models, optimizer and aggregator state."""
        request = self.train_request(round_num, client_ids, plan, aggregator)
        outcome = self.round_step.run(request, self.store)
        self.state.cluster_models = outcome.cluster_models
        self.state.server_optimizer_state = outcome.optimizer_state
        self.state.aggregator_state = outcome.aggregator_state
        return request, outcome

    def accounted(self, row: dict[str, Any], eligible: Sequence[str]) -> dict[str, Any]:
        """`row` with the round recorded in a private run's account (its epsilon columns)."""
        if self.account is not None:
            row.update(self.account.record_round(self.state, eligible, self.run.client_ids))
        return row

    def train_request(
        self,
        round_num: int,
        client_ids: Sequence[str],
        plan: Plan,
        aggregator: Optional[AggregatorRound] = None,
    ) -> TrainRequest:
        """The round's call for the sampled clients as the plan sends them."""
        fed_round = self.current_round()
        distribution = self.algorithm.distribution
        num_rows = fed_round.signature.num_clusters
        return TrainRequest(
            fed_round=fed_round,
            round_num=round_num,
            client_ids=client_ids,
            keys=distribution.keys(
                self.algorithm.name, len(client_ids), plan.clusters, plan.neighbours
            )
            if client_ids
            else np.zeros(0, np.int32),  # a round of no client: its aggregator's output alone
            cluster_models=self.state.cluster_models,
            training=LocalTraining(
                self.config.local_epochs,
                self.config.learning_rate_at(round_num),
                self.config.local_steps or None,
            ),
            client_scalars=plan.client_scalars,
            anchor=self.state.anchor,
            row_weights=distribution.row_weights(
                self.state.assignment, self.run.train_sizes, num_rows
            ),
            optimizer_state=self.server_optimizer.state_or_initial(
                self.state.server_optimizer_state,
                self.num_clusters,
                self.run.num_trainable_values,
            ),
            aggregator=aggregator,
        )

    def training_row(
        self,
        request: TrainRequest,
        outcome: RoundOutcome,
        decision: Decision,
        server_seconds: float,
        clients_changed_cluster: int,
    ) -> dict[str, Any]:
        """The round's row (`loop.training_row`), with the round metrics' columns."""
        metric_rows = [
            metric(self.run, self.view(), outcome.result) for metric in self.round_metrics
        ]
        return training_row(
            self.algorithm,
            self.aggregator,
            self.run.tensor_sizes,
            request,
            outcome,
            decision,
            metric_rows,
            server_seconds,
            clients_changed_cluster,
        )
