"""The loop's scoring calls of built computations, in NumPy values.

Flat cluster models in, a round's `evaluate` per client (`ScoringCalls.score`), one model's
pooled scoring of many clients' examples (`score_pooled`, `pooled_sums`) and server-side
inference (`predict_probabilities`), NumPy results out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Callable, Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.data.federated_data import DataError, FederatedData
from tff_clustered.federated.executions import RoundCache
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_inputs import evaluation_batch_size, evaluation_input
from tff_clustered.federated.server_state import padded
from tff_clustered.federated.signature import ModelLayout, RoundSignature
from tff_clustered.loop.client_store import ClientStore
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.pooled import PooledRows, PooledSplit
from tff_clustered.loop.state import cluster_capacity

# Examples per batch when many clients' examples are scored pooled (`score_pooled`): no
# gradients, and per-example results do not depend on it.
POOLED_BATCH = 512
# The scored clients' examples of a split (every client's, or the `--eval_clients` sample's)
# are pooled once and kept where the scoring runs when they take at most this many bytes
# (`RoundCalls.pooled_rows`); larger, they are pooled per call, in chunks. TFF sends a value as
# one protocol buffer (at most 2 GB), and keeping a split costs its size again in this process
# and on the worker.
POOLED_SPLIT_MAX_BYTES = 512 * 2**20
# Examples pooled per call when a split is not kept (`RoundCalls.pooled_chunks`): a run of
# clients taking at most this many bytes (or one larger client), so memory stays bounded at any
# population.
POOLED_CHUNK_BYTES = 64 * 2**20
# Clients per call of the per-client scoring (`RoundCalls.score`): their examples and stored
# variables are what one call holds.
CLIENTS_PER_SCORE_CALL = 1000
ClientResults = dict[str, dict[str, float]]  # client id -> loss_sum, num_correct, num_examples


class ScoringCalls:
    """Scoring calls of the built computations for one run's data, model layout and training
    settings."""

    def __init__(
        self,
        data: FederatedData,
        layout: ModelLayout,
        rounds_cache: RoundCache,
        config: TrainingConfig,
    ) -> None:
        self.data, self.layout, self.rounds_cache, self.config = data, layout, rounds_cache, config
        # The clients every evaluation scores (`TrainingConfig.evaluation_sample`): their
        # examples are the ones pooled once and kept.
        self.scored_clients = config.evaluation_sample(data.client_ids)
        if not any(data.test_sizes[c] for c in self.scored_clients):
            sample = f" (the --eval_clients={config.eval_clients} sample)"
            raise DataError(
                f"none of the {len(self.scored_clients)} scored clients"
                f"{sample if config.eval_clients else ''} has a {data.evaluated_split} example, "
                "so no evaluation would score anything; "
                "score more clients (a larger --eval_clients, or 0: all) or give them more examples"
            )
        self.example_bytes = 4 * (int(np.prod(data.input_shape)) + 1)  # float32 x, int32 y
        self._predict: Optional[Callable] = None
        self._pooled_scores: dict[Optional[int], Callable] = {}
        self._pooled_splits: dict[str, Optional[PooledSplit]] = {}

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
        exact: bool = False,
    ) -> ClientResults:
        """Each client's results on its `split` arrays with `models[keys[i]]` (joined with its
        variables in `store` where the round reads them), in calls of at most
        `CLIENTS_PER_SCORE_CALL` clients; `exact` (decisions): by `evaluate_exactly`, each
        client's results bit for bit those of a call of its own, not vectorised in process."""
        store_in = fed_round.io.store_in
        if store_in and store is None:
            raise ValueError("this round joins each model with the client's stored variables")
        stacked = flat.matrix_to_stacked(
            padded(models, fed_round.signature.num_clusters), self.layout.shapes
        )
        batch_size = np.int64(evaluation_batch_size(self.config.batch_size))
        evaluate = (exact and fed_round.evaluate_exactly) or fed_round.evaluate
        results: ClientResults = {}
        for begin in range(0, max(len(client_ids), 1), CLIENTS_PER_SCORE_CALL):
            ids, call_keys = (v[begin : begin + CLIENTS_PER_SCORE_CALL] for v in (client_ids, keys))
            inputs = [
                evaluation_input(a, k, store.variables(c, store_in) if store_in else ())
                for c, a, k in zip(ids, self.data.arrays_of(split, ids), call_keys)
            ]
            scored = evaluate(stacked, inputs, batch_size)
            results.update({c: {k: float(v) for k, v in r.items()} for c, r in zip(ids, scored)})
        return results

    def row_head_start(self, fed_round: FederatedRound) -> Optional[int]:
        """Where the clients' own tensors of `fed_round` start when they are exactly a head the
        pooled scoring runs row by row (`FunctionalModel.row_head_starts`: Dense layers on top,
        FedPer's personal layers), the model's rows independent; None otherwise (the clients
        are scored by `score`, each with its joined model)."""
        store_in, model = tuple(fed_round.io.store_in), self.rounds_cache.model
        num_trainable = self.layout.num_trainable
        if not store_in or fed_round.signature.work.reads_own_model or not model.rows_independent:
            return None
        head = tuple(range(store_in[0], num_trainable))
        return store_in[0] if store_in == head and store_in[0] in model.row_head_starts else None

    def score_pooled(
        self,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        split: str = "test",
        heads: Optional[tuple[ClientStore, int]] = None,
    ) -> ClientResults:
        """The results `score` gives with whole models (nothing from the client store), in one
        call per model (and chunk, `pooled_chunks`): the `split` examples of every client that
        `models[k]` scores, summed per client inside the computation (`pooled_sums`). With
        `heads` (the client store, `row_head_start`), each client's own head from the store
        replaces the model's from that tensor on (`scoring.pooled_scores_fn`)."""
        keys = np.asarray(keys)
        results: ClientResults = {}
        for k in np.unique(keys):
            members = [client_ids[i] for i in np.flatnonzero(keys == k)]
            (sums,) = self.pooled_sums([models[k]], members, split, heads)
            for j, client in enumerate(members):
                results[client] = {
                    name: float(values[j])
                    for name, values in zip(("loss_sum", "num_correct", "num_examples"), sums)
                }
        return {c: results[c] for c in client_ids}

    def pooled_sums(
        self,
        models: Sequence[np.ndarray],
        client_ids: Sequence[str],
        split: str = "test",
        heads: Optional[tuple[ClientStore, int]] = None,
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """For each flat whole model: the per-client loss sums, correct predictions and
        examples of `client_ids` on their `split` examples (`score_arrays`), each chunk of
        clients (`pooled_chunks`) pooled once and scored by every model (with `heads`, each
        client's own head from the store: `score_pooled`)."""
        parts: list[list[tuple[np.ndarray, ...]]] = [[] for _ in models]
        for chunk in self.pooled_chunks(split, client_ids):
            pooled = self.pooled_rows(split, chunk)
            own = (
                None if heads is None else (self.stored_heads(heads[0], chunk, heads[1]), heads[1])
            )
            for model, scored in zip(models, parts):
                scored.append(self.score_arrays(model, pooled, len(chunk), own))
        return [
            (
                np.concatenate([p[0] for p in scored]),
                np.concatenate([p[1] for p in scored]),
                np.concatenate([p[2] for p in scored]),
            )
            for scored in parts
        ]

    def pooled_chunks(self, split: str, client_ids: Sequence[str]) -> list[Sequence[str]]:
        """`client_ids` as the runs of clients scored in one call each: all of them when their
        examples are kept (`pooled_rows`) or take at most `POOLED_CHUNK_BYTES`, else runs of
        at most that many bytes (a larger client alone), decided from the split's sizes."""
        kept = self._kept_split(split)
        if kept is not None and kept.holds(client_ids):
            return [client_ids]
        sizes = self.split_sizes(split)
        chunks: list[Sequence[str]] = []
        begin, size = 0, 0
        for i, c in enumerate(client_ids):
            n = sizes[c] * self.example_bytes
            if i > begin and size + n > POOLED_CHUNK_BYTES:
                chunks.append(client_ids[begin:i])
                begin, size = i, 0
            size += n
        chunks.append(client_ids[begin:])
        return chunks

    def pooled_rows(self, split: str, client_ids: Sequence[str]) -> PooledRows:
        """The `split` examples of `client_ids`, to score pooled. The scored clients'
        (`scored_clients`) examples of a split are pooled once, on the first call, and kept
        where the scoring runs (on TFF's worker: `RoundCache.pooled_examples`), so later calls
        of those clients send only row indices; other clients, or a split whose scored
        clients take more than `POOLED_SPLIT_MAX_BYTES`, are pooled on each call,
        `client_ids` only."""
        kept = self._kept_split(split)
        if kept is not None and kept.holds(client_ids):
            return kept.rows(client_ids)
        arrays = self.data.arrays_of(split, client_ids)
        x, y = (np.concatenate([a[name] for a in arrays]) for name in ("x", "y"))
        sizes = [len(a["y"]) for a in arrays]
        return PooledRows(
            (x, y),
            np.arange(len(y), dtype=np.int32),
            np.repeat(np.arange(len(arrays), dtype=np.int32), sizes),
        )

    def split_sizes(self, split: str) -> Mapping[str, int]:
        """Each client's number of `split` ("train" or "test") examples."""
        return self.data.train_sizes if split == "train" else self.data.test_sizes

    def _kept_split(self, split: str) -> Optional[PooledSplit]:
        if split not in self._pooled_splits:
            self._pooled_splits[split] = self._pool_split(split)
        return self._pooled_splits[split]

    def _pool_split(self, split: str) -> Optional[PooledSplit]:
        """The scored clients' examples of `split` pooled, or None when they take more than
        `POOLED_SPLIT_MAX_BYTES` (known from the split's sizes, no example read)."""
        ids = self.scored_clients
        split_sizes = self.split_sizes(split)
        sizes = [int(split_sizes[c]) for c in ids]
        if sum(sizes) * self.example_bytes > POOLED_SPLIT_MAX_BYTES:
            return None
        arrays = self.data.arrays_of(split, ids)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
        x, y = (np.concatenate([a[name] for a in arrays]) for name in ("x", "y"))
        return PooledSplit(
            self.rounds_cache.pooled_examples(x, y),
            dict(zip(ids, starts.tolist())),
            dict(zip(ids, sizes)),
        )

    def stored_heads(self, store: ClientStore, client_ids: Sequence[str], head_start: int) -> tuple:
        """The clients' own tensors from `head_start` to the last trainable one, from `store`,
        each stacked along a leading client axis (float32)."""
        indices = tuple(range(head_start, self.layout.num_trainable))
        own = [store.variables(c, indices) for c in client_ids]
        return tuple(np.stack(t).astype(np.float32, copy=False) for t in zip(*own))

    def score_arrays(
        self,
        model: np.ndarray,
        pooled: PooledRows,
        num_clients: int,
        heads: Optional[tuple[tuple, int]] = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-client loss sums, correct predictions and examples (float64, `num_clients` each)
        of one flat whole `model` on `pooled` rows (`scoring.pooled_scores_fn`); `heads`: the
        clients' stacked heads and the tensor they start at, which replace the model's."""
        if len(pooled.rows) == 0:  # none of the clients has an example of the split
            none = np.zeros(num_clients, np.float64)
            return none, none.copy(), none.copy()
        head_start = None if heads is None else heads[1]
        if head_start not in self._pooled_scores:
            self._pooled_scores[head_start] = self.rounds_cache.pooled_scores(head_start)
        split_at = self.layout.num_trainable
        variables = flat.unflatten(model, self.layout.shapes)
        sums = self._pooled_scores[head_start](
            tuple(variables[:split_at]),
            tuple(variables[split_at:]),
            *pooled.examples,
            pooled.rows,
            pooled.client,
            np.int32(num_clients),
            np.int64(max(evaluation_batch_size(self.config.batch_size), POOLED_BATCH)),
            *([] if heads is None else [heads[0]]),
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
