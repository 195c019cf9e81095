"""Scoring the evaluated clients with each model kind: the round's row and the clients' rows.

Scoring the evaluated clients (every client, or the run's seeded `--eval_clients` sample)
with each model kind an algorithm has: the evaluation row of a round and each client's row
(clients.csv). Whole server models are scored pooled, one call per model (and chunk of
clients); a personal model that joins each client's stored tensors, client by client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tff_clustered.algorithms.base import Algorithm, RunInfo
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.federated.round import FederatedRound
from tff_clustered.loop.client_store import ClientStore
from tff_clustered.loop.phases import Stopwatch
from tff_clustered.loop.queries import ServerQueries
from tff_clustered.loop.round_calls import RoundCalls
from tff_clustered.loop.scoring_calls import ClientResults
from tff_clustered.loop.state import RunState
from tff_clustered.seeds import FINE_TUNE_SHUFFLE

FINE_TUNED = "finetuned"  # the evaluation-only model kind of `TrainingConfig.fine_tune_steps`


def global_model(cluster_models: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """One model for everyone: the only cluster's, or the mean of the cluster models weighted
    by how many clients each scores."""
    if len(cluster_models) == 1:
        return cluster_models[0]
    counts = np.bincount(clusters, minlength=len(cluster_models)).astype(np.float64)
    weights = (
        counts / counts.sum()
        if counts.sum()
        else np.full(len(cluster_models), 1 / len(cluster_models))
    )
    return (weights[:, None] * cluster_models.astype(np.float64)).sum(0).astype(np.float32)


def server_models(
    cluster_models: np.ndarray, kind: str, clusters: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The models of a server-side kind ("global" or "cluster") and each client's index."""
    if kind == "global":
        return global_model(cluster_models, clusters)[None, :], np.zeros(len(clusters), np.int32)
    return cluster_models, np.asarray(clusters, np.int32)


def pooled(results: ClientResults, suffix: str) -> dict[str, float]:
    """Pooled (test-example weighted) accuracy and loss, and the unweighted mean accuracy over
    the clients with examples (a client with one training example has no validation examples,
    `data/validation.py`), of per-client results; NaN without clients."""
    total = sum(r["num_examples"] for r in results.values())
    nan = float("nan")
    scored = [r for r in results.values() if r["num_examples"]]
    return {
        f"accuracy{suffix}": sum(r["num_correct"] for r in results.values()) / total
        if total
        else nan,
        f"loss{suffix}": sum(r["loss_sum"] for r in results.values()) / total if total else nan,
        f"client_accuracy_mean{suffix}": float(
            np.mean([r["num_correct"] / r["num_examples"] for r in scored])
        )
        if scored
        else nan,
    }


def round_row(
    state: RunState,
    kinds: Sequence[str],
    results: Mapping[str, ClientResults],
    assigned: Sequence[str],
    cluster_of: Mapping[str, int],
    assign_seconds: float,
) -> dict[str, Any]:
    """The round's evaluation row (`Evaluator.evaluate` names its columns): the first kind
    over the `assigned` clients, every kind over all evaluated, the clusters' sizes and
    accuracies."""
    main = results[kinds[0]]
    row: dict[str, Any] = pooled({c: main[c] for c in assigned}, "")
    row["num_eval_clients"] = len(assigned)
    row["eval_assign_seconds"] = assign_seconds
    for kind in kinds:
        row.update(pooled(results[kind], f"_{kind}"))
    row.update({f"cluster_size_{k}": int(n) for k, n in enumerate(state.cluster_sizes)})
    for k in sorted(set(cluster_of.values())):
        members = {c: r for c, r in main.items() if cluster_of[c] == k}
        row[f"cluster_accuracy_{k}"] = pooled(members, "")["accuracy"]
    return row


class Evaluator:
    """Evaluates one run's models; reads the state it is given, changes nothing."""

    def __init__(
        self,
        data: FederatedData,
        algorithm: Algorithm,
        run: RunInfo,
        calls: RoundCalls,
        fine_tune_steps: int = 0,
    ) -> None:
        self.data, self.algorithm, self.run, self.calls = data, algorithm, run, calls
        self.fine_tune_steps = fine_tune_steps

    def evaluate(
        self,
        state: RunState,
        store: ClientStore,
        fed_round: FederatedRound,
        queries: ServerQueries,
        round_num: int,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Scores the evaluated clients (`RoundCalls.scored_clients`: every client, or the
        run's `eval_clients` sample, the same in every round) with each model kind the algorithm
        has (`model_kinds`), a client not assigned yet with the cluster the algorithm's own rule
        gives it. Returns the round's row and each evaluated client's row. Row columns:

        * `accuracy_KIND`, `loss_KIND` (pooled over the evaluated clients' test examples) and
          `client_accuracy_mean_KIND` (unweighted mean over them);
        * `accuracy`, `loss`, `client_accuracy_mean`, `num_eval_clients`: the paper's figure,
          the first kind over the evaluated clients with an assignment only;
        * `cluster_size_k` (assigned clients of the whole population) and
          `cluster_accuracy_k` (first kind, pooled over the evaluated clients scored with
          cluster k);
        * `eval_assign_seconds`: the part of the evaluation spent giving the evaluated clients
          their clusters (`Algorithm.evaluation_clusters`: for FedGroup with a lazy cold start,
          pre-training every evaluated client not assigned yet, Eq. 9)."""
        evaluated = list(self.calls.scored_clients)
        assigned = state.assigned(evaluated)
        with Stopwatch() as assigning:
            clusters = self.algorithm.evaluation_clusters(
                self.run, state.view(), evaluated, queries
            )
        cluster_of = dict(zip(evaluated, (int(k) for k in clusters)))
        kinds = self.algorithm.model_kinds
        results: dict[str, ClientResults] = {}
        for kind in kinds:
            if kind == "global" and "cluster" in results and state.num_clusters == 1:
                results[kind] = results["cluster"]  # the one cluster model is the global model
            else:
                models, keys = server_models(
                    state.cluster_models, "cluster" if kind == "personal" else kind, clusters
                )
                results[kind] = self.score_kind(kind, models, keys, evaluated, store, fed_round)
        tunable = [k for k in kinds if k != "personal"]
        if self.fine_tune_steps and tunable:
            models, keys = server_models(state.cluster_models, tunable[0], clusters)
            results[FINE_TUNED] = self.fine_tuned(models, keys, evaluated, queries, round_num)
            kinds = (*kinds, FINE_TUNED)
        row = round_row(state, kinds, results, assigned, cluster_of, assigning.seconds)
        if self.data.evaluated_split != "test":  # `--split=validation`: not test figures
            row["split"] = self.data.evaluated_split
        return row, self.client_rows(state, kinds, results, evaluated, cluster_of, round_num)

    def client_rows(
        self,
        state: RunState,
        kinds: Sequence[str],
        results: Mapping[str, ClientResults],
        evaluated: Sequence[str],
        cluster_of: Mapping[str, int],
        round_num: int,
    ) -> list[dict[str, Any]]:
        """Each evaluated client's row: its cluster, sizes, and accuracy and loss with each
        model kind."""
        main = results[kinds[0]]
        client_rows = []
        for c in evaluated:
            client_row: dict[str, Any] = {
                "round": round_num,
                "client": c,
                "cluster": cluster_of[c],
                "assigned": int(state.assignment.get(c, -1) >= 0),
                "train_examples": self.data.train_sizes[c],
                "test_examples": int(main[c]["num_examples"]),
            }
            for kind in kinds:
                r = results[kind][c]
                n = max(r["num_examples"], 1.0)
                client_row[f"accuracy_{kind}"] = r["num_correct"] / n
                client_row[f"loss_{kind}"] = r["loss_sum"] / n
            client_rows.append(client_row)
        return client_rows

    def score_kind(
        self,
        kind: str,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        store: ClientStore,
        fed_round: FederatedRound,
    ) -> ClientResults:
        """Per-client test results of one model kind (`algorithms.base.MODEL_KINDS`) given its
        `server_models`: whole models pooled; a personal model that joins each client's stored
        tensors pooled too when those are a head of Dense layers (FedPer's: the layers below
        scored once for every client's examples, each client's head on its own rows,
        `ScoringCalls.row_head_start`), else client by client (a decentralized peer's row is
        already its whole model)."""
        joins_store = bool(fed_round.io.store_in) or fed_round.signature.work.reads_own_model
        whole_rows = fed_round.signature.distribution.rows_are_whole_models
        if kind == "personal" and joins_store and not whole_rows:
            head_start = self.calls.row_head_start(fed_round)
            if head_start is None:
                return self.calls.score(fed_round, models, keys, client_ids, store)
            return self.calls.score_pooled(models, keys, client_ids, heads=(store, head_start))
        return self.calls.score_pooled(models, keys, client_ids)

    def fine_tuned(
        self,
        models: np.ndarray,
        keys: np.ndarray,
        client_ids: Sequence[str],
        queries: ServerQueries,
        round_num: int,
        chunk: int = 8,
    ) -> ClientResults:
        """The "finetuned" kind: client i's model `models[keys[i]]` after `fine_tune_steps`
        minibatches of plain local SGD on its own training data, scored on its test data.
        Nothing is kept: the run's models are unchanged."""
        tuned = np.empty((len(client_ids), models.shape[1]), np.float32)
        for k in np.unique(keys):
            members = np.flatnonzero(keys == k)
            tuned[members] = models[k][None, :] + queries.local_updates(
                [client_ids[i] for i in members],
                models[k],
                1,
                round_num,
                steps=self.fine_tune_steps,
                stream=FINE_TUNE_SHUFFLE,
            )
        fed_round = self.calls.whole_model_round(chunk)  # one round for every chunk
        results: ClientResults = {}
        for begin in range(0, len(client_ids), chunk):
            ids = list(client_ids[begin : begin + chunk])
            scores = self.calls.score(
                fed_round, tuned[begin : begin + chunk], np.arange(len(ids)), ids
            )
            results.update(scores)
        return results
