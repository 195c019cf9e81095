"""Python orchestration between TFF rounds: sampling, per-client state, evaluation, metrics.

Every random choice is a pure function of `(seed, round, client)`, so a run resumed from a
checkpoint ends exactly where an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import Algorithm
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.clustered_process import build_clustered_process, round_hparams
from tff_clustered.models.keras_models import ModelSpec, initial_weights
from tff_clustered.models.split import ResolvedSplit

LR_SCHEDULES = ("constant", "exponential", "cosine")
# Independent random streams derived from the run seed.
SAMPLING, SHUFFLE, PRETRAIN_SHUFFLE, ALGORITHM = 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    rounds: int = 30
    clients_per_round: int = 10
    local_epochs: int = 1
    batch_size: int = 10
    learning_rate: float = 0.05
    lr_schedule: str = "constant"
    lr_decay: float = 0.98  # per round, for the exponential schedule
    momentum: float = 0.0
    seed: int = 0
    eval_every: int = 1

    def __post_init__(self) -> None:
        checks = [
            (self.rounds >= 1, "rounds must be >= 1"),
            (self.clients_per_round >= 1, "clients_per_round must be >= 1"),
            (self.local_epochs >= 1, "local_epochs must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (
                self.learning_rate > 0 and math.isfinite(self.learning_rate),
                "learning_rate must be > 0",
            ),
            (self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}"),
            (0 < self.lr_decay <= 1, "lr_decay must be in (0, 1]"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.seed >= 0, "seed must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def learning_rate_at(self, round_num: int) -> float:
        """Learning rate of round `round_num` (1-based)."""
        t = round_num - 1
        if self.lr_schedule == "exponential":
            return self.learning_rate * self.lr_decay**t
        if self.lr_schedule == "cosine":
            return self.learning_rate * 0.5 * (1 + math.cos(math.pi * t / self.rounds))
        return self.learning_rate


def derived_seed(*parts: int) -> int:
    """A 31-bit seed that is a fixed function of its integer parts."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


@dataclasses.dataclass
class RunState:
    """Everything a checkpoint must hold to continue a run."""

    round_num: int = 0
    server_state: Any = None
    personal: dict[str, tuple[np.ndarray, ...]] = dataclasses.field(default_factory=dict)
    assignment: dict[str, int] = dataclasses.field(default_factory=dict)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    algorithm_state: dict[str, Any] = dataclasses.field(default_factory=dict)


class Experiment:
    """One algorithm on one dataset and model, round by round."""

    def __init__(
        self,
        data: FederatedData,
        model: ModelSpec,
        algorithm: Algorithm,
        config: TrainingConfig,
        track_discrepancy: bool = False,
    ) -> None:
        """`track_discrepancy` adds FedGroup's Eq. 4 discrepancy to each round's metrics (it
        needs every client's model update back on the server)."""
        if config.clients_per_round > len(data.client_ids):
            raise ValueError(
                f"clients_per_round={config.clients_per_round} exceeds the "
                f"{len(data.client_ids)} clients of {data.name}; lower it"
            )
        self.data, self.model, self.algorithm, self.config = data, model, algorithm, config
        self.initial_weights = initial_weights(model, derived_seed(config.seed, 0))
        self.split = ResolvedSplit.of(model.build(), algorithm.split)
        self.track_discrepancy = track_discrepancy and not self.split.personal
        self.process = build_clustered_process(
            model,
            self.split,
            algorithm.num_clusters,
            self.initial_weights,
            prox_mu=algorithm.prox_mu,
            momentum=config.momentum,
            return_model_deltas=algorithm.needs_model_deltas or self.track_discrepancy,
            client_weighting=algorithm.client_weighting,
        )
        self._pretrain_process = None
        self.base_parameters = sum(
            int(np.prod(self.process.weight_shapes[i])) for i in self.split.base
        )
        self._initial_personal = self.process.personal_part(self.initial_weights)
        self.state = RunState()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Initial server state and the algorithm's setup (round 0)."""
        self.state = RunState(server_state=self.process.initialize())
        self.algorithm.setup(self)

    def restore(self, state: RunState) -> None:
        self.state = state
        self.algorithm.load_state_dict(state.algorithm_state)

    def snapshot(self) -> RunState:
        self.state.algorithm_state = self.algorithm.state_dict()
        return self.state

    def rounds(self) -> Iterator[dict[str, Any]]:
        """Runs the remaining rounds (evaluating round 0 first on a fresh run), one row each."""
        if self.state.round_num == 0 and not self.state.history:
            row = {"round": 0, **self.evaluate()}
            self.state.history.append(row)
            yield row
        while self.state.round_num < self.config.rounds:
            round_num = self.state.round_num + 1
            started = time.perf_counter()
            row = {"round": round_num, **self.train_round(round_num)}
            if round_num % self.config.eval_every == 0 or round_num == self.config.rounds:
                row.update(self.evaluate())
            row["round_seconds"] = time.perf_counter() - started
            self.state.round_num = round_num
            self.state.history.append(row)
            yield row

    # -- one round ---------------------------------------------------------------------------
    def sample_clients(self, round_num: int) -> list[str]:
        """`clients_per_round` of the eligible clients (all of them if fewer)."""
        ids = self.algorithm.eligible_clients(self, round_num)
        rng = np.random.default_rng(derived_seed(self.config.seed, SAMPLING, round_num))
        count = min(self.config.clients_per_round, len(ids))
        chosen = np.sort(rng.choice(len(ids), count, replace=False))
        return [ids[i] for i in chosen]

    def personal_weights(self, client_id: str) -> tuple[np.ndarray, ...]:
        return self.state.personal.get(client_id, self._initial_personal)

    def train_datasets(
        self, round_num: int, client_ids: Sequence[str], epochs: int, stream: int = SHUFFLE
    ) -> list:
        index = {cid: i for i, cid in enumerate(self.data.client_ids)}
        return [
            self.data.batched(
                "train",
                cid,
                self.config.batch_size,
                epochs,
                shuffle_seed=derived_seed(self.config.seed, stream, round_num, index[cid]),
            )
            for cid in client_ids
        ]

    def run_clients(
        self,
        round_num: int,
        client_ids: Sequence[str],
        clusters: np.ndarray,
        epochs: int,
        learning_rate: float,
        server_state: Any = None,
    ) -> tuple[Any, list[dict], dict]:
        """One call of the federated `next` on `client_ids` in `clusters`; returns
        `(new_server_state, client_outputs, measurements)` and changes nothing here."""
        return self.process.next(
            self.state.server_state if server_state is None else server_state,
            self.train_datasets(round_num, client_ids, epochs),
            [np.array([k], np.int32) for k in clusters],
            [self.personal_weights(c) for c in client_ids],
            [np.float32(s) for s in self.algorithm.prox_scales(self, client_ids)],
            round_hparams(learning_rate),
        )

    def train_round(self, round_num: int) -> dict[str, Any]:
        client_ids = self.sample_clients(round_num)
        clusters = self.algorithm.assign(self, round_num, client_ids)
        learning_rate = self.config.learning_rate_at(round_num)
        before = self.cluster_models_matrix() if self.track_discrepancy else None
        server_state, outputs, _ = self.run_clients(
            round_num, client_ids, clusters, self.config.local_epochs, learning_rate
        )
        self.state.server_state = server_state
        if self.split.personal:
            for cid, out in zip(client_ids, outputs):
                self.state.personal[cid] = tuple(np.asarray(t) for t in out["personal"])
        self.algorithm.after_round(self, round_num, client_ids, outputs)
        num_examples = sum(float(o["num_examples"]) for o in outputs)
        row: dict[str, Any] = {
            "learning_rate": learning_rate,
            "train_loss": sum(float(o["loss_sum"]) for o in outputs) / max(num_examples, 1.0),
            "num_sampled": len(client_ids),
            "floats_communicated": self.algorithm.floats_per_round(
                len(client_ids), self.base_parameters
            ),
        }
        if before is not None:
            row["discrepancy"] = self.discrepancy(before, clusters, outputs)
        sampled = np.bincount(clusters, minlength=self.algorithm.num_clusters)
        row.update({f"sampled_cluster_{k}": int(n) for k, n in enumerate(sampled)})
        return row

    def discrepancy(
        self, before: np.ndarray, clusters: np.ndarray, outputs: Sequence[dict]
    ) -> float:
        """FedGroup Eq. 4: mean over participants of ||w_i - w^(g(i))||_2, the client's trained
        model against its cluster's model after aggregation."""
        after = self.cluster_models_matrix()
        gaps = [
            np.linalg.norm(before[k] + np.asarray(o["model_delta"]) - after[k])
            for k, o in zip(clusters, outputs)
        ]
        return float(np.mean(gaps))

    # -- helpers for server-side algorithm steps ---------------------------------------------
    def cluster_models_matrix(self) -> np.ndarray:
        """The server's cluster models as a (num_clusters, d) matrix of flat vectors."""
        return flat.stacked_to_matrix(self.state.server_state["cluster_models"])

    def set_cluster_models_matrix(self, matrix: np.ndarray) -> None:
        state = dict(self.state.server_state)
        state["cluster_models"] = flat.matrix_to_stacked(matrix, self.process.weight_shapes)
        self.state.server_state = type(self.state.server_state)(state)

    def initial_flat(self) -> np.ndarray:
        return flat.flatten(self.initial_weights)

    def pretrain_updates(
        self, client_ids: Sequence[str], epochs: int, round_num: int = 0, chunk: int = 100
    ) -> np.ndarray:
        """Flattened updates of plain local SGD from the initial model w0 (no proximal term;
        FedGroup's ClientPretrain, spec A.3/A.14-#21), one row per client."""
        if self._pretrain_process is None:
            self._pretrain_process = build_clustered_process(
                self.model,
                ResolvedSplit(self.split.num_tensors, ()),
                1,
                self.initial_weights,
                return_model_deltas=True,
            )
        process = self._pretrain_process
        state = process.initialize()
        rows = []
        for start in range(0, len(client_ids), chunk):
            ids = list(client_ids[start : start + chunk])
            _, outputs, _ = process.next(
                state,
                self.train_datasets(round_num, ids, epochs, stream=PRETRAIN_SHUFFLE),
                [np.array([0], np.int32)] * len(ids),
                [()] * len(ids),
                [np.float32(1.0)] * len(ids),
                round_hparams(self.config.learning_rate),
            )
            rows += [np.asarray(o["model_delta"], np.float32) for o in outputs]
        return np.stack(rows) if rows else np.zeros((0, len(self.initial_flat())), np.float32)

    def client_losses(self, client_ids: Sequence[str]) -> np.ndarray:
        """Mean training loss of every cluster model on each client (IFCA), (clients, K)."""
        losses = np.zeros((len(client_ids), self.algorithm.num_clusters))
        datasets = [
            self.data.batched("train", c, max(self.config.batch_size, 64)) for c in client_ids
        ]
        personal = [self.personal_weights(c) for c in client_ids]
        for k in range(self.algorithm.num_clusters):
            results = self.process.evaluate(
                self.state.server_state["cluster_models"],
                datasets,
                [np.array([k], np.int32)] * len(client_ids),
                personal,
            )
            losses[:, k] = [r["loss_sum"] / r["num_examples"] for r in results]
        return losses

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, client_ids: Optional[Sequence[str]] = None) -> dict[str, Any]:
        """Pooled test accuracy/loss of each client's own model (cluster base + personal),
        over clients with an assignment; also the mean per-client accuracy."""
        if client_ids is None:
            client_ids = [c for c in self.data.client_ids if self.state.assignment.get(c, -1) >= 0]
        per_client = self.evaluate_clients(client_ids)
        correct = sum(r["num_correct"] for r in per_client.values())
        total = sum(r["num_examples"] for r in per_client.values())
        loss = sum(r["loss_sum"] for r in per_client.values())
        sizes = np.bincount(
            [
                self.state.assignment[c]
                for c in self.data.client_ids
                if self.state.assignment.get(c, -1) >= 0
            ],
            minlength=self.algorithm.num_clusters,
        )
        row: dict[str, Any] = {
            "accuracy": correct / total if total else float("nan"),
            "loss": loss / total if total else float("nan"),
            "client_accuracy_mean": float(
                np.mean([r["num_correct"] / r["num_examples"] for r in per_client.values()])
            )
            if per_client
            else float("nan"),
            "num_eval_clients": len(per_client),
        }
        row.update({f"cluster_size_{k}": int(n) for k, n in enumerate(sizes)})
        return row

    def evaluate_clients(self, client_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        if not client_ids:
            return {}
        results = self.process.evaluate(
            self.state.server_state["cluster_models"],
            [self.data.batched("test", c, max(self.config.batch_size, 64)) for c in client_ids],
            [np.array([self.state.assignment[c]], np.int32) for c in client_ids],
            [self.personal_weights(c) for c in client_ids],
        )
        return {c: {k: float(v) for k, v in r.items()} for c, r in zip(client_ids, results)}
