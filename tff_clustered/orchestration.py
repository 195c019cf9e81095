"""The generic training loop: samples clients, asks the algorithm, runs the federated round,
keeps the per-client store, evaluates, and answers the algorithm's queries.

It knows no paper by name: everything an algorithm decides comes back as a `Decision`
(`algorithms/base.py`) and is applied here. Every random choice is a pure function of
`(seed, stream, round, client)`, so a run resumed from a checkpoint ends exactly where an
uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import (
    UNCHANGED,
    Algorithm,
    Decision,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
)
from tff_clustered.client_store import ClientStore
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated import client_work
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import (
    FederatedRound,
    ModelLayout,
    RoundIO,
    RoundSignature,
    client_seed,
    evaluation_batch_size,
    round_hparams,
)
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.models.functional import functional_model
from tff_clustered.models.keras_models import ModelSpec, initial_weights
from tff_clustered.models.split import classifier_layers, trainable_layer_sizes
from tff_clustered.seeds import (
    DROPOUT,
    FINE_TUNE_SHUFFLE,
    PRETRAIN_SHUFFLE,
    SAMPLING,
    SHUFFLE,
    derived_seed,
)

LR_SCHEDULES = ("constant", "exponential", "cosine")
# A function of the run, the server after a round and the round's result -> extra metrics.
RoundMetric = Callable[[RunInfo, ServerView, RoundResult], dict]


# Examples per batch when many clients' examples are scored pooled (`score_pooled`): no
# gradients, and per-example results do not depend on it.
POOLED_BATCH = 512
FINE_TUNED = "finetuned"  # the evaluation-only model kind of `TrainingConfig.fine_tune_steps`


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    rounds: int = 30
    clients_per_round: int = 10
    local_epochs: int = 1
    # > 0: each sampled client takes this many minibatch steps per round instead of
    # `local_epochs` passes (its batches reshuffled whenever its data runs out).
    local_steps: int = 0
    batch_size: int = 10
    learning_rate: float = 0.05
    lr_schedule: str = "constant"
    lr_decay: float = 0.98  # per round, for the exponential schedule
    momentum: float = 0.0
    seed: int = 0
    eval_every: int = 1
    # > 0: also score each client after this many minibatches of plain local SGD on its
    # training data from its global/cluster model (the "finetuned" model kind).
    fine_tune_steps: int = 0
    # A client whose update has NaN or infinity is left out of the round; more than this
    # fraction of a round's clients doing so stops the run (the learning rate is too high).
    max_diverged_fraction: float = 0.25
    # What the server does with each cluster's mean update (`federated.server_optimizers`):
    # add it (FedAvg), or an optimizer step with it as the negative gradient (FedAvgM, FedAdam).
    server_optimizer: ServerOptimizer = ServerOptimizer()

    def __post_init__(self) -> None:
        checks = [
            (self.rounds >= 1, "rounds must be >= 1"),
            (self.clients_per_round >= 1, "clients_per_round must be >= 1"),
            (self.local_epochs >= 1, "local_epochs must be >= 1"),
            (self.local_steps >= 0, "local_steps must be >= 0 (0: --local_epochs passes)"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (
                self.learning_rate > 0 and math.isfinite(self.learning_rate),
                "learning_rate must be > 0",
            ),
            (self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}"),
            (0 < self.lr_decay <= 1, "lr_decay must be in (0, 1]"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.fine_tune_steps >= 0, "fine_tune_steps must be >= 0 (0: no fine-tuned kind)"),
            (self.seed >= 0, "seed must be >= 0"),
            (0 <= self.max_diverged_fraction <= 1, "max_diverged_fraction must be in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def learning_rate_at(self, round_num: int) -> float:
        """Learning rate of round `round_num` (1-based): eta_0 * decay^(r-1) when exponential."""
        t = round_num - 1
        if self.lr_schedule == "exponential":
            return self.learning_rate * self.lr_decay**t
        if self.lr_schedule == "cosine":
            return self.learning_rate * 0.5 * (1 + math.cos(math.pi * t / self.rounds))
        return self.learning_rate


@dataclasses.dataclass
class RunState:
    """Everything a checkpoint must hold to continue a run."""

    round_num: int = 0
    cluster_models: Optional[np.ndarray] = None  # (num_clusters, D) flat models
    assignment: dict[str, int] = dataclasses.field(default_factory=dict)
    shared: tuple[int, ...] = ()
    anchor: Optional[np.ndarray] = None  # (D,) flat anchor model, when the algorithm has one
    algorithm_state: Any = None
    client_models: dict[str, tuple[np.ndarray, ...]] = dataclasses.field(default_factory=dict)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    similarity: Optional[Similarity] = None  # the latest matrix a clustering step used
    # The server optimizer's state, stacked per cluster (None: none kept, FedAvg's finalizer).
    server_optimizer_state: Optional[dict[str, np.ndarray]] = None


def cluster_capacity(num_clusters: int) -> int:
    """Clusters a built round holds for `num_clusters`: up to 4 exactly, then the next multiple
    of 4. Extra clusters stay empty (an empty cluster is left bit for bit), so a cluster count
    that changes every round (FedTSDP, CFL) reuses a few built rounds instead of tracing one per
    count, while the padding (models sent to and from the worker) stays small."""
    return num_clusters if num_clusters <= 4 else -(-num_clusters // 4) * 4


def padded(cluster_models: np.ndarray, capacity: int) -> np.ndarray:
    extra = capacity - len(cluster_models)
    if extra <= 0:
        return cluster_models
    return np.concatenate([cluster_models, np.zeros((extra, cluster_models.shape[1]), np.float32)])


class DivergenceError(ValueError):
    """Training produced NaN or infinite values."""


def check_finite(
    cluster_models: np.ndarray,
    round_num: int,
    step: str,
    clusters: np.ndarray,
    client_ids: Sequence[str],
) -> None:
    """Stops the run when a cluster model has NaN or infinite values, naming the round, the
    clusters and the clients that trained in them."""
    bad = np.flatnonzero(~np.isfinite(cluster_models).all(axis=1))
    if not len(bad):
        return
    members = [c for c, k in zip(client_ids, clusters) if k in set(bad.tolist())]
    raise DivergenceError(
        f"round {round_num}: cluster model(s) {', '.join(map(str, bad))} became non-finite "
        f"after {step} (clients: {', '.join(members) or 'none this round'}); lower "
        "--learning_rate (the last checkpoint is kept)"
    )


@dataclasses.dataclass(frozen=True)
class LoopQueries:
    """The `Queries` an algorithm is given: the loop's five read-only computations
    (`algorithms.base.Queries`) and nothing else of the loop, so that a decision cannot reach
    into the run's state."""

    local_updates: Callable[..., np.ndarray]
    cluster_losses: Callable[..., np.ndarray]
    client_models: Callable[..., np.ndarray]
    predict_probabilities: Callable[..., np.ndarray]
    initial_model: Callable[..., np.ndarray]


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
    ) -> None:
        """`round_metrics` add metrics to each round's row (they get the clients' updates).
        `execution`: "tff" runs rounds on the TFF runtime, "in_process" runs the same TF
        functions in this process (on `device`, else TensorFlow's choice: a GPU if it sees
        one); results are the same within float tolerance."""
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
        keras_model = model.build()
        self.functional = functional_model(keras_model, model.input_spec())
        self.layout = ModelLayout.of(self.functional)
        self.initial_variables = tuple(
            initial_weights(model, derived_seed(config.seed, 0))
            + list(self.functional.initial_state)
        )
        self.rounds_cache = RoundCache(
            self.functional,
            model.input_spec(),
            self.initial_variables,
            execution,
            device,
            rounds=config.rounds,
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
        self.client_index = {cid: i for i, cid in enumerate(data.client_ids)}
        self.work = algorithm.client_work(config.momentum, self.run)
        self.anchor_tensors = tuple(algorithm.anchor_tensors(self.run))
        self.return_model_deltas = algorithm.needs_model_deltas or bool(self.round_metrics)
        self.state = RunState()
        self.store = ClientStore(self.initial_variables)
        self.queries = LoopQueries(
            self.local_updates,
            self.cluster_losses,
            self.client_models,
            self.predict_probabilities,
            self.initial_model,
        )
        self._predict: Optional[Callable] = None
        self._pooled_scores: Optional[Callable] = None
        # Per-client results of the last evaluation, one dict per client (for clients.csv).
        self.client_rows: list[dict[str, Any]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """The algorithm's initial decision (round 0) on top of the default state."""
        self.state = RunState(
            cluster_models=self.run.initial_model[None, :].copy(),
            shared=tuple(self.algorithm.initial_shared(self.run)),
            anchor=self.run.initial_model.copy() if self.anchor_tensors else None,
        )
        self.store = ClientStore(self.initial_variables)
        self.apply(self.algorithm.init(self.run, self.queries))

    def restore(self, state: RunState) -> None:
        self.state = state
        self.store = ClientStore(self.initial_variables, dict(state.client_models))

    def snapshot(self) -> RunState:
        self.state.client_models = self.store.models
        return self.state

    def view(self) -> ServerView:
        return ServerView(
            round_num=self.state.round_num,
            cluster_models=self.state.cluster_models,
            assignment=dict(self.state.assignment),
            shared=self.state.shared,
            state=self.state.algorithm_state,
            anchor=self.state.anchor,
        )

    def apply(self, decision: Decision) -> None:
        """Applies an algorithm's decision to the run's state."""
        self.state.assignment.update({c: int(k) for c, k in decision.assignment.items()})
        if decision.cluster_models is not None:
            models = np.asarray(decision.cluster_models, np.float32)
            if models.ndim != 2 or models.shape[1] != self.run.initial_model.size:
                raise ValueError(f"{self.algorithm.name}: cluster models of shape {models.shape}")
            self.state.cluster_models = models
        if decision.shared is not None:
            self.state.shared = tuple(int(i) for i in decision.shared)
        if decision.anchor is not None:
            anchor = np.asarray(decision.anchor, np.float32)
            if anchor.shape != self.run.initial_model.shape or not self.anchor_tensors:
                raise ValueError(
                    f"{self.algorithm.name}: anchor of shape {anchor.shape} (the model has "
                    f"{self.run.initial_model.size} values; anchor tensors "
                    f"{self.anchor_tensors or 'none declared'})"
                )
            self.state.anchor = anchor
        if decision.state is not UNCHANGED:
            self.state.algorithm_state = decision.state
        if decision.similarity is not None:
            self.state.similarity = decision.similarity

    @property
    def num_clusters(self) -> int:
        return len(self.state.cluster_models)

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
        )

    def current_round(self) -> FederatedRound:
        return self.rounds_cache.get(self.signature())

    def sample_clients(self, round_num: int) -> list[str]:
        """`clients_per_round` of the eligible clients (all of them if fewer)."""
        view = dataclasses.replace(self.view(), round_num=round_num - 1)
        ids = list(self.algorithm.eligible(self.run, view))
        rng = np.random.default_rng(derived_seed(self.config.seed, SAMPLING, round_num))
        count = min(self.config.clients_per_round, len(ids))
        chosen = np.sort(rng.choice(len(ids), count, replace=False))
        return [ids[i] for i in chosen]

    def client_seeds(
        self, round_num: int, client_ids: Sequence[str], stream: int = SHUFFLE
    ) -> list[dict]:
        """Each client's seeds of a round: its batches' shuffle (from seed stream `stream`)
        and its dropout."""
        index = self.client_index
        return [
            client_seed(
                derived_seed(self.config.seed, stream, round_num, index[c]),
                derived_seed(self.config.seed, DROPOUT, round_num, index[c]),
            )
            for c in client_ids
        ]

    def run_clients(
        self,
        fed_round: FederatedRound,
        cluster_models: np.ndarray,
        round_num: int,
        client_ids: Sequence[str],
        clusters: Sequence[int],
        epochs: int,
        learning_rate: float,
        client_scalars: Optional[Sequence[float]] = None,
        stream: int = SHUFFLE,
        stored: bool = True,
        steps: Optional[int] = None,
    ) -> tuple[np.ndarray, list[dict], dict]:
        """One call of the federated `next`; returns `(new_cluster_models, client_outputs,
        measurements)` and changes nothing here."""
        shapes = self.layout.shapes
        signature = fed_round.signature
        server_state: dict[str, Any] = {
            "cluster_models": flat.matrix_to_stacked(
                padded(cluster_models, signature.num_clusters), shapes
            )
        }
        if signature.anchor:
            anchor = flat.unflatten(self.state.anchor, shapes)
            server_state["anchor"] = tuple(anchor[i] for i in signature.anchor)
        server_state["aggregator"] = ()
        scales = [1.0] * len(client_ids) if client_scalars is None else client_scalars
        store_in = fed_round.io.store_in
        hparams = round_hparams(
            learning_rate,
            self.config.batch_size,
            -1 if steps is not None else epochs,
            num_clusters=len(cluster_models),
            max_steps=-1 if steps is None else steps,
            row_weights=self.row_examples(signature.num_clusters)
            if signature.distribution == "neighbours"
            else None,
            round_num=round_num,
            total_rounds=self.config.rounds,
        )
        new_state, outputs, measurements = fed_round.next(
            server_state,
            [self.data.arrays("train", c) for c in client_ids],
            [np.atleast_1d(np.asarray(k, np.int32)) for k in clusters],
            [self.store.variables(c, store_in) if stored else () for c in client_ids],
            [np.float32(s) for s in scales],
            self.client_seeds(round_num, client_ids, stream),
            hparams,
        )
        new_models = flat.stacked_to_matrix(new_state["cluster_models"])[: len(cluster_models)]
        return new_models, outputs, measurements

    def row_examples(self, num_rows: int) -> np.ndarray:
        """Training examples held by the clients assigned to each server row (cluster)."""
        assigned = [
            (k, self.data.train_sizes[c]) for c, k in self.state.assignment.items() if k >= 0
        ]
        rows = np.array([k for k, _ in assigned], np.int64)
        sizes = np.array([n for _, n in assigned], np.float64)
        return np.bincount(rows, weights=sizes, minlength=num_rows)[:num_rows].astype(np.float32)

    def train_round(self, round_num: int) -> dict[str, Any]:
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
        deltas = self.return_model_deltas
        fed_round = self.current_round()
        before = self.state.cluster_models
        keys: Any = clusters
        if plan.neighbours is not None:  # each peer's own row, then the rows routed to it
            keys = np.concatenate([clusters[:, None], np.asarray(plan.neighbours)], axis=1)
        after, outputs, measurements = self.run_clients(
            fed_round,
            before,
            round_num,
            client_ids,
            keys,
            self.config.local_epochs,
            learning_rate,
            plan.client_scalars,
            steps=self.config.local_steps or None,
        )
        train_seconds = time.perf_counter() - planned
        if picks:
            clusters = np.array([int(o["cluster"]) for o in outputs], np.int32)
        # Diverged clients were left out of the aggregate; they are left out of the store and
        # of what the algorithm sees too.
        finite = np.array([bool(o["finite"]) for o in outputs])
        dropped = [c for c, ok in zip(client_ids, finite) if not ok]
        if not finite.any() or len(dropped) > self.config.max_diverged_fraction * len(finite):
            raise DivergenceError(
                f"round {round_num}: the updates of {len(dropped)} of {len(finite)} sampled "
                f"clients have NaN or infinite values ({', '.join(dropped)}); learning rate "
                f"{learning_rate:g} is too high for this model and data: lower --learning_rate "
                "(or raise --max_diverged_fraction to leave such clients out and go on); the "
                "last checkpoint is kept"
            )
        kept = [i for i, ok in enumerate(finite) if ok]
        outputs = [outputs[i] for i in kept]
        client_ids, clusters = [client_ids[i] for i in kept], clusters[kept]
        after, self.state.server_optimizer_state = self.server_optimizer.step(
            self.state.server_optimizer_state,
            before,
            after,
            np.asarray(measurements["cluster_weight"])[: len(before)] > 0,
            self.run.num_trainable_values,
        )
        check_finite(after, round_num, "aggregation", clusters, client_ids)
        self.state.cluster_models = after
        for cid, out in zip(client_ids, outputs):
            self.store.update(cid, fed_round.io.store_out, out["stored"])
        result = RoundResult(
            round_num=round_num,
            client_ids=tuple(client_ids),
            clusters=clusters.astype(np.int32),
            num_examples=np.array([float(o["num_examples"]) for o in outputs]),
            loss_sums=np.array([float(o["loss_sum"]) for o in outputs]),
            model_deltas=np.stack([np.asarray(o["model_delta"]) for o in outputs])
            if deltas
            else None,
            cluster_models_before=before,
            client_metrics={
                name: np.stack([np.asarray(o["metrics"][name]) for o in outputs])
                for name in (outputs[0].get("metrics", {}) if outputs else {})
            },
        )
        after_round = time.perf_counter()
        decision = self.algorithm.after_round(self.run, self.view(), result, self.queries)
        self.apply(decision)
        server_seconds = (planned - started) + (time.perf_counter() - after_round)
        check_finite(
            self.state.cluster_models, round_num, self.algorithm.name, clusters, result.client_ids
        )
        num_examples = result.num_examples.sum()

        def values(tensors: Sequence[int]) -> int:
            return sum(int(np.prod(self.layout.trainable_shapes[i])) for i in tensors)

        row: dict[str, Any] = {
            "learning_rate": learning_rate,
            "train_loss": float(result.loss_sums.sum() / max(num_examples, 1.0)),
            "num_sampled": len(finite),
            "dropped_clients": len(dropped),
            # where the round's time went: the clients' training (the federated round), and
            # the algorithm's own server-side work before and after it (clustering, cold starts
            # and the queries they make); evaluation and checkpoints have their own columns
            "train_seconds": train_seconds,
            "server_seconds": server_seconds,
            "floats_communicated": self.algorithm.values_sent_per_round(
                len(finite),
                values(fed_round.signature.shared),
                len(before),
                values(fed_round.signature.anchor),
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

    # -- queries an algorithm may ask (`algorithms.base.Queries`) ----------------------------
    def local_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int = 0,
        steps: Optional[int] = None,
        chunk: int = 100,
        stream: int = PRETRAIN_SHUFFLE,
    ) -> np.ndarray:
        """Flat updates of plain local SGD (no proximal term, no momentum) from flat model
        `start`, one row per client (FedGroup's ClientPretrain): `epochs` passes over each
        client's data, or `steps` minibatches when given; shuffled from seed stream `stream`."""
        fed_round = self.rounds_cache.get(
            RoundSignature(
                num_clusters=1,
                shared=tuple(range(self.layout.num_trainable)),
                work=client_work.LocalSGD(),
                return_model_deltas=True,
            )
        )
        rows = []
        for begin in range(0, len(client_ids), chunk):
            ids = list(client_ids[begin : begin + chunk])
            _, outputs, _ = self.run_clients(
                fed_round,
                np.asarray(start, np.float32)[None, :],
                round_num,
                ids,
                [0] * len(ids),
                epochs,
                self.config.learning_rate,
                stream=stream,
                stored=False,
                steps=steps,
            )
            diverged = [c for c, o in zip(ids, outputs) if not bool(o["finite"])]
            if diverged:
                raise DivergenceError(
                    f"local training from the given model diverged (NaN or infinity) for "
                    f"clients {', '.join(diverged)}; lower --learning_rate"
                )
            rows += [np.asarray(o["model_delta"], np.float32) for o in outputs]
        width = self.run.initial_model.size
        return np.stack(rows) if rows else np.zeros((0, width), np.float32)

    def cluster_losses(self, cluster_models: np.ndarray, client_ids: Sequence[str]) -> np.ndarray:
        """Mean training loss of every cluster model on each client, (clients, clusters)."""
        signature = dataclasses.replace(
            self.signature(), num_clusters=cluster_capacity(len(cluster_models))
        )
        losses = np.zeros((len(client_ids), len(cluster_models)))
        if RoundIO.of(self.layout, signature).store_in:  # stored tensors complete each model
            fed_round = self.rounds_cache.get(signature)
            for k in range(len(cluster_models)):
                keys = np.full(len(client_ids), k, np.int32)
                results = self.score(fed_round, cluster_models, keys, client_ids, "train")
                losses[:, k] = [
                    results[c]["loss_sum"] / max(results[c]["num_examples"], 1.0)
                    for c in client_ids
                ]
            return losses
        pooled = self.pooled_arrays("train", client_ids)  # pooled once, scored by every model
        for k, model in enumerate(cluster_models):
            loss_sum, _, num_examples = self.score_arrays(model, pooled, len(client_ids))
            losses[:, k] = loss_sum / np.maximum(num_examples, 1.0)
        return losses

    def client_models(self, client_ids: Sequence[str]) -> np.ndarray:
        return self.store.flat(client_ids, self.run.initial_model.size)

    def initial_model(self, seed: int) -> np.ndarray:
        return flat.flatten(initial_weights(self.model, seed) + list(self.functional.initial_state))

    def predict_probabilities(self, models: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Server-side inference (inference mode) of each flat model on `x`, in one call."""
        if self._predict is None:
            self._predict = self.rounds_cache.predict_probabilities()
        split = self.layout.num_trainable
        stacked = flat.matrix_to_stacked(models, self.layout.shapes)
        out = self._predict(stacked[:split], stacked[split:], np.asarray(x, np.float32))
        return np.asarray(out, np.float64)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, round_num: Optional[int] = None) -> dict[str, Any]:
        """Scores every client with each model kind the algorithm has (`model_kinds`), a client
        not assigned yet with the cluster the algorithm's own rule gives it. Columns:

        * `accuracy_KIND`, `loss_KIND` (pooled over all clients' test examples) and
          `client_accuracy_mean_KIND` (unweighted mean over clients);
        * `accuracy`, `loss`, `client_accuracy_mean`, `num_eval_clients`: the paper's figure,
          the first kind over the clients with an assignment only;
        * `cluster_size_k` (assigned clients) and `cluster_accuracy_k` (first kind, pooled over
          the clients scored with cluster k).

        Each client's results go to `client_rows` (for clients.csv)."""
        everyone = list(self.data.client_ids)
        assigned = [c for c in everyone if self.state.assignment.get(c, -1) >= 0]
        clusters = self.algorithm.evaluation_clusters(self.run, self.view(), everyone, self.queries)
        cluster_of = dict(zip(everyone, (int(k) for k in clusters)))
        kinds = self.algorithm.model_kinds
        results: dict[str, dict[str, dict[str, float]]] = {}
        for kind in kinds:
            if kind == "global" and "cluster" in results and self.num_clusters == 1:
                results[kind] = results["cluster"]  # the one cluster model is the global model
            else:
                results[kind] = self.evaluate_kind(kind, everyone, clusters)
        tunable = [k for k in kinds if k != "personal"]
        if self.config.fine_tune_steps and tunable:
            results[FINE_TUNED] = self.evaluate_fine_tuned(
                tunable[0],
                everyone,
                clusters,
                self.state.round_num if round_num is None else round_num,
            )
            kinds = (*kinds, FINE_TUNED)
        main = results[kinds[0]]
        row: dict[str, Any] = pooled({c: main[c] for c in assigned}, "")
        row["num_eval_clients"] = len(assigned)
        for kind in kinds:
            row.update(pooled(results[kind], f"_{kind}"))
        sizes = np.bincount(
            [self.state.assignment[c] for c in assigned], minlength=self.num_clusters
        )
        row.update({f"cluster_size_{k}": int(n) for k, n in enumerate(sizes)})
        for k in sorted(set(cluster_of.values())):
            members = {c: r for c, r in main.items() if cluster_of[c] == k}
            row[f"cluster_accuracy_{k}"] = pooled(members, "")["accuracy"]
        self.client_rows = []
        for c in everyone:
            client_row: dict[str, Any] = {
                "round": self.state.round_num if round_num is None else round_num,
                "client": c,
                "cluster": cluster_of[c],
                "assigned": int(c in self.state.assignment and self.state.assignment[c] >= 0),
                "train_examples": self.data.train_sizes[c],
                "test_examples": int(main[c]["num_examples"]),
            }
            for kind in kinds:
                r = results[kind][c]
                n = max(r["num_examples"], 1.0)
                client_row[f"accuracy_{kind}"] = r["num_correct"] / n
                client_row[f"loss_{kind}"] = r["loss_sum"] / n
            self.client_rows.append(client_row)
        return row

    def global_model(self, clusters: np.ndarray) -> np.ndarray:
        """One model for everyone: the only cluster's, or the mean of the cluster models
        weighted by how many clients each scores."""
        models = self.state.cluster_models
        if len(models) == 1:
            return models[0]
        counts = np.bincount(clusters, minlength=len(models)).astype(np.float64)
        weights = counts / counts.sum() if counts.sum() else np.full(len(models), 1 / len(models))
        return (weights[:, None] * models.astype(np.float64)).sum(0).astype(np.float32)

    def server_models(self, kind: str, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The models of a server-side kind ("global" or "cluster") and each client's index."""
        if kind == "global":
            return self.global_model(clusters)[None, :], np.zeros(len(clusters), np.int32)
        return self.state.cluster_models, np.asarray(clusters, np.int32)

    def evaluate_kind(
        self, kind: str, client_ids: Sequence[str], clusters: np.ndarray
    ) -> dict[str, dict[str, float]]:
        """Per-client test results of one model kind (`algorithms.base.MODEL_KINDS`): whole
        server models pooled (`score_pooled`), a personal model that joins each client's stored
        tensors client by client (`score`)."""
        models, keys = self.server_models("cluster" if kind == "personal" else kind, clusters)
        fed_round = self.current_round()
        joins_store = bool(fed_round.io.store_in) or self.work.reads_own_model
        own_rows = fed_round.signature.distribution == "neighbours"  # a peer's row is its model
        if kind == "personal" and joins_store and not own_rows:
            return self.score(fed_round, models, keys, client_ids)
        return self.score_pooled(models, keys, client_ids)

    def score(
        self,
        fed_round: FederatedRound,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        split: str = "test",
    ) -> dict[str, dict[str, float]]:
        """Each client's results on its `split` arrays with `models[keys[i]]` (joined with its
        stored tensors where the round reads them), one client at a time."""
        capacity = fed_round.signature.num_clusters
        results = fed_round.evaluate(
            flat.matrix_to_stacked(padded(models, capacity), self.layout.shapes),
            [self.data.arrays(split, c) for c in client_ids],
            [np.array([k], np.int32) for k in keys],
            [self.store.variables(c, fed_round.io.store_in) for c in client_ids],
            np.int64(evaluation_batch_size(self.config.batch_size)),
        )
        return {c: {k: float(v) for k, v in r.items()} for c, r in zip(client_ids, results)}

    def score_pooled(
        self,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        split: str = "test",
    ) -> dict[str, dict[str, float]]:
        """The results `score` gives with whole models (nothing from the client store), in one
        call per model: the `split` examples of every client that `models[k]` scores pooled into
        one array (`pooled_arrays`), summed per client inside the computation
        (`score_arrays`)."""
        keys = np.asarray(keys)
        results: dict[str, dict[str, float]] = {}
        for k in np.unique(keys):
            members = [client_ids[i] for i in np.flatnonzero(keys == k)]
            sums = self.score_arrays(models[k], self.pooled_arrays(split, members), len(members))
            for j, client in enumerate(members):
                results[client] = {
                    name: float(values[j])
                    for name, values in zip(("loss_sum", "num_correct", "num_examples"), sums)
                }
        return {c: results[c] for c in client_ids}

    def pooled_arrays(
        self, split: str, client_ids: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The `split` examples of `client_ids` in one array: (x, y, the index in `client_ids`
        of each example's client)."""
        arrays = [self.data.arrays(split, c) for c in client_ids]
        sizes = [len(a["y"]) for a in arrays]
        return (
            np.concatenate([a["x"] for a in arrays]),
            np.concatenate([a["y"] for a in arrays]),
            np.repeat(np.arange(len(arrays), dtype=np.int32), sizes),
        )

    def score_arrays(
        self, model: np.ndarray, pooled: tuple[np.ndarray, ...], num_clients: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-client loss sums, correct predictions and examples (float64, `num_clients` each)
        of one flat whole `model` on `pooled_arrays` (`round.pooled_scores_fn`)."""
        if self._pooled_scores is None:
            self._pooled_scores = self.rounds_cache.pooled_scores()
        split_at = self.layout.num_trainable
        variables = flat.unflatten(model, self.layout.shapes)
        sums = self._pooled_scores(
            tuple(variables[:split_at]),
            tuple(variables[split_at:]),
            *pooled,
            np.int32(num_clients),
            np.int64(max(evaluation_batch_size(self.config.batch_size), POOLED_BATCH)),
        )
        loss_sum, num_correct, num_examples = (np.asarray(v, np.float64) for v in sums)
        return loss_sum, num_correct, num_examples

    def whole_model_round(self, num_models: int) -> FederatedRound:
        """A round whose models are whole server models, nothing taken from the client store
        (for scoring them)."""
        return self.rounds_cache.get(
            RoundSignature(cluster_capacity(num_models), tuple(range(self.layout.num_trainable)))
        )

    def evaluate_fine_tuned(
        self,
        kind: str,
        client_ids: Sequence[str],
        clusters: np.ndarray,
        round_num: int,
        chunk: int = 8,
    ) -> dict[str, dict[str, float]]:
        """The "finetuned" kind: each client's model of `kind` after `fine_tune_steps`
        minibatches of plain local SGD on its own training data, scored on its test data.
        Nothing is kept: the run's models are unchanged."""
        models, keys = self.server_models(kind, clusters)
        tuned = np.empty((len(client_ids), models.shape[1]), np.float32)
        for k in np.unique(keys):
            members = np.flatnonzero(keys == k)
            tuned[members] = models[k][None, :] + self.local_updates(
                [client_ids[i] for i in members],
                models[k],
                1,
                round_num,
                steps=self.config.fine_tune_steps,
                stream=FINE_TUNE_SHUFFLE,
            )
        fed_round = self.whole_model_round(chunk)  # one round for every chunk, the last padded
        results: dict[str, dict[str, float]] = {}
        for begin in range(0, len(client_ids), chunk):
            ids = list(client_ids[begin : begin + chunk])
            results.update(
                self.score(fed_round, tuned[begin : begin + chunk], np.arange(len(ids)), ids)
            )
        return results


def pooled(results: dict[str, dict[str, float]], suffix: str) -> dict[str, float]:
    """Pooled (test-example weighted) accuracy and loss, and the unweighted mean accuracy over
    clients, of per-client results; NaN without clients."""
    total = sum(r["num_examples"] for r in results.values())
    nan = float("nan")
    return {
        f"accuracy{suffix}": sum(r["num_correct"] for r in results.values()) / total
        if total
        else nan,
        f"loss{suffix}": sum(r["loss_sum"] for r in results.values()) / total if total else nan,
        f"client_accuracy_mean{suffix}": float(
            np.mean([r["num_correct"] / max(r["num_examples"], 1.0) for r in results.values()])
        )
        if results
        else nan,
    }
