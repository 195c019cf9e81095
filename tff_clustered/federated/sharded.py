"""A TFF round whose clients are split over several TFF workers (`--workers=h1:p1,h2:p2`).

The round is the one `round.tff_round_parts` builds, cut where it can be merged: each worker
runs `partial_next` on a contiguous share of the clients (their training, and the per-cluster
weighted sums of their updates), the shares' sums are added in worker order, and `finalize`
turns the sums into the new cluster models (`cluster_mean`, then the finalizer). Client
outputs come back in client order. Evaluation splits the same way. Client work depends only on
the client's own inputs and seeds, so a run gives the one-worker results up to the order of
float additions in the sums (tests: within 1e-5).

TFF 0.87's `compile_to_mergeable_comp_form` would split a computation the same way, but its
`after_merge` part returns SERVER-placed values only, while a round also returns per-client
outputs (stored models, losses, the cluster a client picked), so the cut is written here.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow_federated as tff

from tff_clustered.federated.round import (
    FederatedRound,
    TffRoundParts,
)
from tff_clustered.federated.round_functions import example_count, python_server_state
from tff_clustered.federated.round_inputs import WorkerData, client_examples
from tff_clustered.runtime import context as runtime


def split_clients(sizes: Sequence[int], num_shards: int) -> list[slice]:
    """Contiguous client ranges, at most `num_shards` and none empty, with about equal sums of
    `sizes` (each client's examples: the work it brings)."""
    n = len(sizes)
    if n == 0:
        return []
    shards = min(num_shards, n)
    ends = np.cumsum(np.maximum(np.asarray(sizes, np.float64), 1.0))
    targets = ends[-1] * np.arange(1, shards) / shards
    cuts = np.searchsorted(ends, targets, side="left") + 1
    # keep every range non-empty: cut i lies in [i, n - shards + i]
    cuts = np.clip(cuts, np.arange(1, shards), np.arange(n - shards + 1, n))
    cuts = np.maximum.accumulate(np.maximum(cuts, np.arange(1, shards)))
    bounds = [0, *[int(c) for c in cuts], n]
    for i in range(1, len(bounds)):
        bounds[i] = max(bounds[i], bounds[i - 1] + 1)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@contextlib.contextmanager
def named_data_errors(worker_data: Optional[WorkerData]) -> Iterator[None]:
    """A worker's failed read of the clients' examples (`worker_data` given) as the one-line
    ValueError `worker_data.failure` names (a client that failed its checks, the file locked);
    any other error as it came."""
    try:
        yield
    except Exception as error:
        problem = None if worker_data is None else worker_data.failure(worker_message(error))
        if problem is None:
            raise
        raise ValueError(problem) from None


def worker_message(error: BaseException) -> str:
    """The worker's own message of `error` (gRPC's `details()`), else the error's text. gRPC
    gives the bytes it could not decode as UTF-8 undecoded: decoded here, bad bytes replaced."""
    details = getattr(error, "details", None)
    text = details() if callable(details) else str(error)
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


def _call_on(context: object, computation: Callable[..., Any], *args: object) -> Any:
    """`computation(*args)` run by `context` (its worker); context stacks are per thread."""
    with tff.framework.get_context_stack().install(context):
        return computation(*args)


def sharded_round(parts: TffRoundParts) -> FederatedRound:
    """The round of `parts`, split over the started runtime's workers when there are several
    (`runtime.worker_contexts()`, read at each call); on one worker it is `parts.next`."""
    fns = parts.functions
    has_anchor = bool(fns.signature.anchor)

    def run_shards(
        work: Callable[..., Any], sizes: Sequence[int], per_client: Sequence[Sequence[Any]]
    ) -> list[Any]:
        """`work(*shares)` on each worker, for its contiguous share of every per-client list
        (clients of `sizes` examples); results in worker order."""
        workers = runtime.worker_contexts()
        shards = split_clients(sizes, len(workers))
        with concurrent.futures.ThreadPoolExecutor(max(len(shards), 1)) as pool:
            futures = [
                pool.submit(_call_on, context, work, *(list(v[shard]) for v in per_client))
                for (_, context), shard in zip(workers, shards)
            ]
            return [future.result() for future in futures]

    def next_fn(state: dict, clients: Sequence[dict], hparams: dict) -> tuple:
        """`parts.next` with the same arguments and results."""
        with named_data_errors(parts.worker_data):
            return shared_next(state, clients, hparams)

    def shared_next(state: dict, clients: Sequence[dict], hparams: dict) -> tuple:
        workers = runtime.worker_contexts()
        if len(workers) <= 1 or len(clients) <= 1:
            return parts.next(state, clients, hparams)
        fns.aggregator.check_execution("tff", len(workers))  # a factory: one computation
        partial_next, finalize = parts.partial_next, parts.finalize  # built here, not per thread
        shares = run_shards(
            lambda share: partial_next(state, share, hparams),
            [client_examples(c["data"]) for c in clients],
            [list(clients)],
        )
        if not fns.aggregator.is_mean:
            return finalized_aggregate(state, shares, workers[0][1], finalize)
        total = [np.asarray(t, np.float32) for t in shares[0][0]]
        total_weight = np.asarray(shares[0][1], np.float32)
        outputs = list(shares[0][2])
        for share_total, share_weight, share_outputs in shares[1:]:
            total = [a + np.asarray(b, np.float32) for a, b in zip(total, share_total)]
            total_weight = total_weight + np.asarray(share_weight, np.float32)
            outputs.extend(share_outputs)
        models = tuple(state["cluster_models"])
        optimizer = state.get("optimizer")
        if parts.functions.routes_rows:  # a relay: the mailbox is the peers' to rewrite
            total_weight = np.zeros_like(total_weight)
        else:
            inputs = (models, tuple(total), total_weight)
            if optimizer is None:
                models = _call_on(workers[0][1], finalize, *inputs)
            else:
                finalized = _call_on(workers[0][1], finalize, *inputs, optimizer)
                models, optimizer = finalized["cluster_models"], finalized["optimizer"]
        new_state = python_server_state(models, state["anchor"] if has_anchor else None, optimizer)
        return new_state, outputs, collections.OrderedDict(cluster_weight=total_weight)

    def finalized_aggregate(
        state: dict, shares: list, context: object, finalize: Callable[..., Any]
    ) -> tuple:
        """The round of an aggregator other than the mean from the workers' shares
        (`partial_next`: sums, weights, statistics, outputs): their sums added in worker
        order, then its finalizer once on `context`'s worker (noise is added once, after the
        merge)."""
        merged = [
            [np.asarray(t, np.float32) for t in shares[0][0]],
            np.asarray(shares[0][1], np.float32),
            np.asarray(shares[0][2], np.float32),
        ]
        outputs = list(shares[0][3])
        for share_total, share_weight, share_stats, share_outputs in shares[1:]:
            merged[0] = [a + np.asarray(b, np.float32) for a, b in zip(merged[0], share_total)]
            merged[1] = merged[1] + np.asarray(share_weight, np.float32)
            merged[2] = merged[2] + np.asarray(share_stats, np.float32)
            outputs.extend(share_outputs)
        models = tuple(state["cluster_models"])
        inputs = [models, tuple(merged[0]), merged[1], merged[2], state["aggregator"]]
        if fns.has_optimizer:
            inputs.append(state["optimizer"])
        finalized = _call_on(context, finalize, *inputs)
        new_state = python_server_state(
            finalized["cluster_models"],
            state["anchor"] if has_anchor else None,
            finalized["optimizer"] if fns.has_optimizer else None,
            finalized["aggregator"],
        )
        return new_state, outputs, finalized["measurements"]

    def evaluate(cluster_models: tuple, clients: Sequence[dict], batch_size: int) -> list:
        """`parts.evaluate`, each worker scoring a share of the clients."""
        evaluate_clients = parts.evaluate  # built on first use, here rather than per thread
        if len(runtime.worker_contexts()) <= 1 or len(clients) <= 1:
            return evaluate_clients(cluster_models, clients, batch_size)
        shares = run_shards(
            lambda share: evaluate_clients(cluster_models, share, batch_size),
            [example_count(c["data"]) for c in clients],
            [list(clients)],
        )
        return [result for share in shares for result in share]

    return FederatedRound(
        initialize=parts.initialize,
        next=next_fn,
        evaluate=evaluate,
        signature=fns.signature,
        io=fns.io,
        layout=fns.layout,
    )
