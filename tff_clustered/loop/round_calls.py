"""The loop's calls of built computations, in NumPy values: flat cluster models in, stacked
variables to a round's `next` (`RoundCalls.train`, one `TrainRequest`) or `evaluate`
(`RoundCalls.score`), to the pooled scoring and the inference computations, NumPy results out.
It changes nothing of the run: what to store and apply is the caller's (`round_step.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable, NamedTuple, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.client_store import ClientStore
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_functions import python_server_state
from tff_clustered.federated.round_inputs import (
    client_input,
    client_seed,
    evaluation_batch_size,
    evaluation_input,
    round_hparams,
)
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.state import cluster_capacity, padded
from tff_clustered.seeds import DROPOUT, SHUFFLE, derived_seed

# Examples per batch when many clients' examples are scored pooled (`score_pooled`): no
# gradients, and per-example results do not depend on it.
POOLED_BATCH = 512
# A split whose examples take at most this many bytes is pooled whole once and kept where the
# scoring runs (`RoundCalls.pooled_rows`); a larger one is pooled per call, its clients only.
# TFF sends a value as one protocol buffer (at most 2 GB), and keeping a split costs its size
# again in this process and on the worker.
POOLED_SPLIT_MAX_BYTES = 512 * 2**20
ClientResults = dict[str, dict[str, float]]  # client id -> loss_sum, num_correct, num_examples


class TrainedRound(NamedTuple):
    """What one call of a round's `next` returns: the new cluster models (flat, the real ones),
    the server optimizer's new state (None without one), each client's outputs and the
    round's measurements (`cluster_weight`)."""

    cluster_models: np.ndarray
    optimizer_state: Optional[dict[str, np.ndarray]]
    outputs: list[dict]
    measurements: dict


class PooledRows(NamedTuple):
    """Examples to score pooled (`pooled_scores_fn`): pooled arrays `(x, y)` (or their
    references on the worker), the rows of them scored, and each row's client (its index in
    the clients asked for)."""

    examples: tuple
    rows: np.ndarray
    client: np.ndarray


@dataclasses.dataclass(frozen=True)
class PooledSplit:
    """Every client's examples of a split in one pair of arrays (`examples()` gives them where
    the scoring runs), and where each client's rows start and how many it has."""

    examples: Callable[[], tuple]
    start: dict[str, int]
    size: dict[str, int]

    def rows(self, client_ids: Sequence[str]) -> PooledRows:
        sizes = [self.size[c] for c in client_ids]
        rows = [
            np.arange(self.start[c], self.start[c] + n, dtype=np.int32)
            for c, n in zip(client_ids, sizes)
        ]
        return PooledRows(
            self.examples(),
            np.concatenate(rows) if rows else np.zeros(0, np.int32),
            np.repeat(np.arange(len(sizes), dtype=np.int32), sizes),
        )


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """How the clients of one call train: `epochs` passes over their data, or `steps`
    minibatches when given, at `learning_rate`, shuffled from seed stream `stream`."""

    epochs: int
    learning_rate: float
    steps: Optional[int] = None
    stream: int = SHUFFLE


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """One call of a built round's `next`: `client_ids` of round `round_num`, client i starting
    from the rows `keys[i]` of the flat `cluster_models` and training as `training` says, with
    `client_scalars[i]` for its work (1.0 each when None); `anchor` (flat) for a round that
    sends one, `row_weights` for one that routes rows, `optimizer_state` (one row per cluster)
    for one whose finalizer keeps a state."""

    fed_round: FederatedRound
    round_num: int
    client_ids: Sequence[str]
    keys: np.ndarray
    cluster_models: np.ndarray
    training: LocalTraining
    client_scalars: Optional[Sequence[float]] = None
    anchor: Optional[np.ndarray] = None
    row_weights: Optional[np.ndarray] = None
    optimizer_state: Optional[dict[str, np.ndarray]] = None


class RoundCalls:
    """Calls the built computations of one run's data, model layout and training settings."""

    def __init__(
        self,
        data: FederatedData,
        layout: ModelLayout,
        rounds_cache: RoundCache,
        config: TrainingConfig,
    ) -> None:
        self.data, self.layout, self.rounds_cache, self.config = data, layout, rounds_cache, config
        self.client_index = {cid: i for i, cid in enumerate(data.client_ids)}
        self._predict: Optional[Callable] = None
        self._pooled_scores: Optional[Callable] = None
        self._pooled_splits: dict[str, Optional[PooledSplit]] = {}

    def seeds(self, round_num: int, client_ids: Sequence[str], stream: int = SHUFFLE) -> list:
        """Each client's seeds of a round: its batches' shuffle (from seed stream `stream`)
        and its dropout."""
        seed, index = self.config.seed, self.client_index
        return [
            client_seed(
                derived_seed(seed, stream, round_num, index[c]),
                derived_seed(seed, DROPOUT, round_num, index[c]),
            )
            for c in client_ids
        ]

    def train(self, request: TrainRequest, store: Optional[ClientStore] = None) -> TrainedRound:
        """One call of the request's round `next`, each client joined with its variables in
        `store` (none without one)."""
        fed_round, shapes = request.fed_round, self.layout.shapes
        signature = fed_round.signature
        capacity = signature.num_clusters
        anchor = None
        if signature.anchor:
            whole = flat.unflatten(request.anchor, shapes)
            anchor = tuple(whole[i] for i in signature.anchor)
        optimizer = None
        if request.optimizer_state is not None:
            optimizer = {k: padded(v, capacity) for k, v in request.optimizer_state.items()}
        server_state = python_server_state(
            flat.matrix_to_stacked(padded(request.cluster_models, capacity), shapes),
            anchor,
            optimizer,
        )
        client_ids, training = request.client_ids, request.training
        scalars = request.client_scalars
        scalars = [1.0] * len(client_ids) if scalars is None else scalars
        if not len(request.keys) == len(scalars) == len(client_ids):
            raise ValueError(
                f"{len(client_ids)} clients with {len(request.keys)} keys and {len(scalars)} "
                "scalars"
            )
        store_in = fed_round.io.store_in
        num_clusters = len(request.cluster_models)
        hparams = round_hparams(
            training.learning_rate,
            self.config.batch_size,
            -1 if training.steps is not None else training.epochs,
            num_clusters=num_clusters,
            max_steps=-1 if training.steps is None else training.steps,
            row_weights=request.row_weights,
            round_num=request.round_num,
            total_rounds=self.config.rounds,
        )
        seeds = self.seeds(request.round_num, client_ids, training.stream)
        clients = [
            client_input(
                self.data.arrays("train", c),
                key,
                store.variables(c, store_in) if store else (),
                scalar,
                seed,
            )
            for c, key, scalar, seed in zip(client_ids, request.keys, scalars, seeds)
        ]
        new_state, outputs, measurements = fed_round.next(server_state, clients, hparams)
        new_models = flat.stacked_to_matrix(new_state["cluster_models"])[:num_clusters]
        new_optimizer_state = None
        if optimizer is not None:
            new_optimizer_state = {
                key: np.asarray(value)[:num_clusters]
                for key, value in new_state["optimizer"].items()
            }
        return TrainedRound(new_models, new_optimizer_state, outputs, measurements)

    def whole_model_round(self, num_models: int) -> FederatedRound:
        """A round whose models are whole server models, nothing taken from the client store
        (for scoring them)."""
        return self.rounds_cache.get(
            RoundSignature(cluster_capacity(num_models), tuple(range(self.layout.num_trainable)))
        )

    def score(
        self,
        fed_round: FederatedRound,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        store: Optional[ClientStore] = None,
        split: str = "test",
    ) -> ClientResults:
        """Each client's results on its `split` arrays with `models[keys[i]]` (joined with its
        variables in `store` where the round reads them), one client at a time."""
        store_in = fed_round.io.store_in
        if store_in and store is None:
            raise ValueError("this round joins each model with the client's stored variables")
        results = fed_round.evaluate(
            flat.matrix_to_stacked(
                padded(models, fed_round.signature.num_clusters), self.layout.shapes
            ),
            [
                evaluation_input(
                    self.data.arrays(split, c), k, store.variables(c, store_in) if store_in else ()
                )
                for c, k in zip(client_ids, keys)
            ],
            np.int64(evaluation_batch_size(self.config.batch_size)),
        )
        return {c: {k: float(v) for k, v in r.items()} for c, r in zip(client_ids, results)}

    def score_pooled(
        self,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        split: str = "test",
    ) -> ClientResults:
        """The results `score` gives with whole models (nothing from the client store), in one
        call per model: the `split` examples of every client that `models[k]` scores
        (`pooled_rows`), summed per client inside the computation (`score_arrays`)."""
        keys = np.asarray(keys)
        results: ClientResults = {}
        for k in np.unique(keys):
            members = [client_ids[i] for i in np.flatnonzero(keys == k)]
            sums = self.score_arrays(models[k], self.pooled_rows(split, members), len(members))
            for j, client in enumerate(members):
                results[client] = {
                    name: float(values[j])
                    for name, values in zip(("loss_sum", "num_correct", "num_examples"), sums)
                }
        return {c: results[c] for c in client_ids}

    def pooled_rows(self, split: str, client_ids: Sequence[str]) -> PooledRows:
        """The `split` examples of `client_ids`, to score pooled. Every client of the split is
        pooled once, on the first call, and kept where the scoring runs (on TFF's worker:
        `RoundCache.pooled_examples`), so later calls send only row indices; a split over
        `POOLED_SPLIT_MAX_BYTES` is pooled on each call instead, `client_ids` only."""
        if split not in self._pooled_splits:
            self._pooled_splits[split] = self._pool_split(split)
        whole = self._pooled_splits[split]
        if whole is not None:
            return whole.rows(client_ids)
        arrays = [self.data.arrays(split, c) for c in client_ids]
        x, y = (np.concatenate([a[name] for a in arrays]) for name in ("x", "y"))
        sizes = [len(a["y"]) for a in arrays]
        return PooledRows(
            (x, y),
            np.arange(len(y), dtype=np.int32),
            np.repeat(np.arange(len(arrays), dtype=np.int32), sizes),
        )

    def _pool_split(self, split: str) -> Optional[PooledSplit]:
        ids = self.data.client_ids
        arrays = [self.data.arrays(split, c) for c in ids]
        if sum(a["x"].nbytes + a["y"].nbytes for a in arrays) > POOLED_SPLIT_MAX_BYTES:
            return None
        sizes = [len(a["y"]) for a in arrays]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
        x, y = (np.concatenate([a[name] for a in arrays]) for name in ("x", "y"))
        return PooledSplit(
            self.rounds_cache.pooled_examples(x, y),
            dict(zip(ids, starts.tolist())),
            dict(zip(ids, sizes)),
        )

    def score_arrays(
        self, model: np.ndarray, pooled: PooledRows, num_clients: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-client loss sums, correct predictions and examples (float64, `num_clients` each)
        of one flat whole `model` on `pooled` rows (`scoring.pooled_scores_fn`)."""
        if self._pooled_scores is None:
            self._pooled_scores = self.rounds_cache.pooled_scores()
        split_at = self.layout.num_trainable
        variables = flat.unflatten(model, self.layout.shapes)
        sums = self._pooled_scores(
            tuple(variables[:split_at]),
            tuple(variables[split_at:]),
            *pooled.examples,
            pooled.rows,
            pooled.client,
            np.int32(num_clients),
            np.int64(max(evaluation_batch_size(self.config.batch_size), POOLED_BATCH)),
        )
        loss_sum, num_correct, num_examples = (np.asarray(v, np.float64) for v in sums)
        return loss_sum, num_correct, num_examples

    def predict_probabilities(self, models: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Server-side inference (inference mode) of each flat model on `x`, in one call."""
        if self._predict is None:
            self._predict = self.rounds_cache.predict_probabilities()
        split = self.layout.num_trainable
        stacked = flat.matrix_to_stacked(models, self.layout.shapes)
        out = self._predict(stacked[:split], stacked[split:], np.asarray(x, np.float32))
        return np.asarray(out, np.float64)
