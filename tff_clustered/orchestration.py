"""The generic training loop: sample clients, ask the algorithm for a plan, run the federated
round, apply the algorithm's decision, then evaluate. Round by round, each as one row.

It knows no paper by name: everything an algorithm decides comes back as a `Decision`
(`algorithms/base.py`) and is applied to the run's state (`loop/state.py`). Its parts are their
own modules under `loop/`: the settings (`config`), the state and the divergence policy
(`state`), the adapter to a built round (`client_runner`), the `Queries` an algorithm is given
(`queries`) and the evaluation (`evaluation`). Every random choice is a pure function of
`(seed, stream, round, client)`, so a run resumed from a checkpoint ends exactly where an
uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import Algorithm, Decision, RoundResult, RunInfo, ServerView
from tff_clustered.client_store import ClientStore
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.loop.client_runner import ClientRunner, LocalTraining, round_result
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.evaluation import Evaluator
from tff_clustered.loop.queries import ServerQueries
from tff_clustered.loop.state import (
    RunState,
    apply_decision,
    check_diverged_clients,
    check_finite,
    cluster_capacity,
    row_examples,
)
from tff_clustered.models.functional import functional_model
from tff_clustered.models.keras_models import ModelSpec, initial_weights
from tff_clustered.models.split import classifier_layers, trainable_layer_sizes
from tff_clustered.phases import PhaseTimer, Stopwatch
from tff_clustered.seeds import SAMPLING, derived_seed

# A function of the run, the server after a round and the round's result -> extra metrics.
RoundMetric = Callable[[RunInfo, ServerView, RoundResult], dict]


class TimedRoundCache(RoundCache):
    """A `RoundCache` whose builds (tracing a round's TF functions, making TFF's computations)
    are timed as the `tracing` part of `timer`; a round already built costs a lookup."""

    def __init__(self, *args: Any, timer: PhaseTimer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timer = timer

    def get(self, signature: RoundSignature) -> FederatedRound:
        builds = self.builds
        with Stopwatch() as watch:
            built = super().get(signature)
        if self.builds != builds:
            self.timer.add("tracing", watch.seconds)
        return built


class Experiment:
    """One algorithm on one dataset and model, round by round."""

    def __init__(
        self,
        data: FederatedData,
        model: ModelSpec,
        algorithm: Algorithm,
        config: TrainingConfig,
        round_metrics: Sequence[RoundMetric] = (),
        execution: str = "tff",
        device: Optional[str] = None,
        timer: Optional[PhaseTimer] = None,
    ) -> None:
        """`round_metrics` add metrics to each round's row (they get the clients' updates).
        `execution`: "tff" runs rounds on the TFF runtime, "in_process" runs the same TF
        functions in this process (on `device`, else TensorFlow's choice: a GPU if it sees
        one); results are the same within float tolerance. `timer` gets the algorithm's cold
        start (`start`) and the time building rounds (default: a timer of its own)."""
        if config.clients_per_round > len(data.client_ids):
            raise ValueError(
                f"clients_per_round={config.clients_per_round} exceeds the "
                f"{len(data.client_ids)} clients of {data.name}; lower it"
            )
        self.server_optimizer = algorithm.server_optimizer(config.server_optimizer)
        if algorithm.distribution == "neighbours" and not self.server_optimizer.is_identity:
            raise ValueError(
                f"{algorithm.name} is decentralized: no server aggregates its peers' updates, so "
                f"--server_optimizer={self.server_optimizer.name} has nothing to step; leave "
                "--server_optimizer and --server_learning_rate unset"
            )
        self.data, self.model, self.algorithm, self.config = data, model, algorithm, config
        self.round_metrics = tuple(round_metrics)
        self.timer = PhaseTimer() if timer is None else timer
        keras_model = model.build()
        self.functional = functional_model(keras_model, model.input_spec())
        self.layout = ModelLayout.of(self.functional)
        self.initial_variables = tuple(
            initial_weights(model, derived_seed(config.seed, 0))
            + list(self.functional.initial_state)
        )
        rounds_cache = TimedRoundCache(
            self.functional,
            model.input_spec(),
            self.initial_variables,
            execution,
            device,
            rounds=config.rounds,
            timer=self.timer,
        )
        tensor_sizes = tuple(int(np.prod(s)) for s in self.layout.trainable_shapes)
        self.run = RunInfo(
            client_ids=tuple(data.client_ids),
            train_sizes=dict(data.train_sizes),
            seed=config.seed,
            clients_per_round=config.clients_per_round,
            layer_sizes=tuple(trainable_layer_sizes(keras_model)),
            classifier_layers=classifier_layers(keras_model),
            tensor_sizes=tensor_sizes,
            trainable_shapes=tuple(tuple(int(d) for d in s) for s in self.layout.trainable_shapes),
            num_trainable_values=sum(tensor_sizes),
            initial_model=flat.flatten(self.initial_variables),
            public_x=data.public_x,
            input_shape=tuple(int(d) for d in model.input_spec()["x"].shape[1:]),
            total_rounds=config.rounds,
            reads_features=self.functional.features is not None,
        )
        self.work = algorithm.client_work(config.momentum, self.run)
        self.anchor_tensors = tuple(algorithm.anchor_tensors(self.run))
        self.return_model_deltas = algorithm.needs_model_deltas or bool(self.round_metrics)
        self.runner = ClientRunner(data, self.layout, rounds_cache, config)
        self.evaluator = Evaluator(data, algorithm, self.run, self.runner, config.fine_tune_steps)
        self.state = RunState()
        self.store = ClientStore(self.initial_variables)
        # Per-client results of the last evaluation, one dict per client (for clients.csv).
        self.client_rows: list[dict[str, Any]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """The algorithm's initial decision (round 0) on top of the default state, timed as the
        `cold_start` phase (pre-training, initial clustering: whatever its `init` does)."""
        self.state = RunState(
            cluster_models=self.run.initial_model[None, :].copy(),
            shared=tuple(self.algorithm.initial_shared(self.run)),
            anchor=self.run.initial_model.copy() if self.anchor_tensors else None,
        )
        self.store = ClientStore(self.initial_variables)
        with self.timer.phase("cold_start"):
            self.apply(self.algorithm.init(self.run, self.queries))

    def restore(self, state: RunState) -> None:
        self.state = state
        self.store = ClientStore(self.initial_variables, dict(state.client_models))

    def snapshot(self) -> RunState:
        self.state.client_models = self.store.models
        return self.state

    def view(self) -> ServerView:
        return self.state.view()

    @property
    def queries(self) -> ServerQueries:
        """What the algorithm may ask of the run as it stands now."""
        return ServerQueries(
            self.runner, self.store, self.signature(), self.model, self.functional.initial_state
        )

    def apply(self, decision: Decision) -> None:
        """Applies an algorithm's decision to the run's state."""
        apply_decision(self.state, decision, self.algorithm.name, self.anchor_tensors)

    @property
    def num_clusters(self) -> int:
        return self.state.num_clusters

    def rounds(self) -> Iterator[dict[str, Any]]:
        """Runs the remaining rounds (evaluating round 0 first on a fresh run), one row each."""
        if self.state.round_num == 0 and not self.state.history:
            row = {"round": 0, **self.evaluate(round_num=0)}
            self.state.history.append(row)
            yield row
        while self.state.round_num < self.config.rounds:
            round_num = self.state.round_num + 1
            started = time.perf_counter()
            row = {"round": round_num, **self.train_round(round_num)}
            trained = time.perf_counter()
            if round_num % self.config.eval_every == 0 or round_num == self.config.rounds:
                row.update(self.evaluate(round_num=round_num))
            row["eval_seconds"] = time.perf_counter() - trained
            row["round_seconds"] = time.perf_counter() - started
            self.state.round_num = round_num
            self.state.history.append(row)
            yield row

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
            return_model_deltas=self.return_model_deltas,
            client_weighting=self.algorithm.client_weighting,
            distribution=self.algorithm.distribution,
            anchor=self.anchor_tensors,
            num_neighbours=self.algorithm.num_neighbours,
            server_optimizer=self.server_optimizer,
        )

    def current_round(self) -> FederatedRound:
        return self.runner.rounds_cache.get(self.signature())

    def sample_clients(self, round_num: int) -> list[str]:
        """`clients_per_round` of the eligible clients (all of them if fewer)."""
        view = dataclasses.replace(self.view(), round_num=round_num - 1)
        ids = list(self.algorithm.eligible(self.run, view))
        rng = np.random.default_rng(derived_seed(self.config.seed, SAMPLING, round_num))
        count = min(self.config.clients_per_round, len(ids))
        chosen = np.sort(rng.choice(len(ids), count, replace=False))
        return [ids[i] for i in chosen]

    def train_round(self, round_num: int) -> dict[str, Any]:
        """Sample, plan, train and aggregate (the federated round, the server optimizer's step
        included), decide: one row."""
        assignment_before = dict(self.state.assignment)
        client_ids = self.sample_clients(round_num)
        started = time.perf_counter()
        plan = self.algorithm.plan(self.run, self.view(), client_ids, self.queries)
        self.apply(plan.decision)
        planned = time.perf_counter()
        picks = self.algorithm.distribution == "lowest_loss_cluster"
        if (plan.clusters is None) != picks:
            raise ValueError(
                f"{self.algorithm.name}: a plan gives clusters exactly when clients do not "
                "pick their own"
            )
        clusters = np.zeros(len(client_ids), np.int32) if picks else np.asarray(plan.clusters)
        learning_rate = self.config.learning_rate_at(round_num)
        fed_round = self.current_round()
        row_weights = None  # a routed row is weighted by the examples its peer holds
        if fed_round.signature.distribution == "neighbours":
            rows = fed_round.signature.num_clusters
            row_weights = row_examples(self.state.assignment, self.run.train_sizes, rows)
        before = self.state.cluster_models
        keys: Any = clusters
        if plan.neighbours is not None:  # each peer's own row, then the rows routed to it
            keys = np.concatenate([clusters[:, None], np.asarray(plan.neighbours)], axis=1)
        optimizer_state = self.server_optimizer.state_or_initial(
            self.state.server_optimizer_state, len(before), self.run.num_trainable_values
        )
        trained_round = self.runner.train(
            fed_round,
            before,
            round_num,
            client_ids,
            keys,
            LocalTraining(self.config.local_epochs, learning_rate, self.config.local_steps or None),
            self.store,
            plan.client_scalars,
            self.state.anchor,
            row_weights,
            optimizer_state,
        )
        after, outputs = trained_round.cluster_models, trained_round.outputs
        train_seconds = time.perf_counter() - planned
        if picks:
            clusters = np.array([int(o["cluster"]) for o in outputs], np.int32)
        # Diverged clients were left out of the aggregate; they are left out of the store and
        # of what the algorithm sees too.
        finite = np.array([bool(o["finite"]) for o in outputs])
        kept = check_diverged_clients(
            finite, client_ids, round_num, learning_rate, self.config.max_diverged_fraction
        )
        outputs = [outputs[i] for i in kept]
        client_ids, clusters = [client_ids[i] for i in kept], clusters[kept]
        self.state.server_optimizer_state = trained_round.optimizer_state
        check_finite(after, round_num, "aggregation", clusters, client_ids)
        self.state.cluster_models = after
        for cid, out in zip(client_ids, outputs):
            self.store.update(cid, fed_round.io.store_out, out["stored"])
        result = round_result(
            round_num, client_ids, clusters, outputs, before, self.return_model_deltas
        )
        after_round = time.perf_counter()
        decision = self.algorithm.after_round(self.run, self.view(), result, self.queries)
        self.apply(decision)
        server_seconds = (planned - started) + (time.perf_counter() - after_round)
        check_finite(
            self.state.cluster_models, round_num, self.algorithm.name, clusters, result.client_ids
        )
        num_examples = result.num_examples.sum()
        row: dict[str, Any] = {
            "learning_rate": learning_rate,
            "train_loss": float(result.loss_sums.sum() / max(num_examples, 1.0)),
            "num_sampled": len(finite),
            "dropped_clients": len(finite) - len(kept),
            # where the round's time went: the clients' training (the federated round), and
            # the algorithm's own server-side work before and after it (clustering, cold starts
            # and the queries they make); evaluation and checkpoints have their own columns
            "train_seconds": train_seconds,
            "server_seconds": server_seconds,
            "floats_communicated": self.algorithm.values_sent_per_round(
                len(finite),
                self.values_of(fed_round.signature.shared),
                len(before),
                self.values_of(fed_round.signature.anchor),
            ),
        }
        for metric in self.round_metrics:
            row.update(metric(self.run, self.view(), result))
        row.update(decision.metrics)
        row["clients_changed_cluster"] = sum(
            1
            for c, k in self.state.assignment.items()
            if assignment_before.get(c, -1) >= 0 and k >= 0 and k != assignment_before[c]
        )
        sampled = np.bincount(clusters, minlength=len(before))
        row.update({f"sampled_cluster_{k}": int(n) for k, n in enumerate(sampled)})
        return row

    def values_of(self, tensors: Sequence[int]) -> int:
        """Values in trainable tensors `tensors`."""
        return sum(self.run.tensor_sizes[i] for i in tensors)
