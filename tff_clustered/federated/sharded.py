"""A TFF round whose clients are split over several TFF workers (`--workers=h1:p1,h2:p2`).

The round is `round.ComposedRound`, its parts run by `ShardedExecution`: each worker runs
`partial_next` (`tff_execution.TffRoundParts`) on a contiguous share of the clients (their
training, and the per-cluster sums of their results), the shares' sums are added in worker
order, and `finalize` turns the sums into the new slots (the aggregator's server side, then
the finalizer). Client outputs come back in client order. Evaluation splits the same way.
Client work depends only on the client's own inputs and seeds, so a run gives the one-worker
results up to the order of float additions in the sums (tests: within 1e-5).

TFF 0.87's `compile_to_mergeable_comp_form` would split a computation the same way, but its
`after_merge` part returns SERVER-placed values only, while a round also returns per-client
outputs (stored models, losses, the cluster a client picked), so the cut is written here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from tff_clustered.federated.client_values import client_values
from tff_clustered.federated.grouping import example_count
from tff_clustered.federated.round import ComposedRound, FederatedRound
from tff_clustered.federated.round_inputs import ClientInput, WorkerData, client_examples
from tff_clustered.federated.server_state import (
    ClientSums,
    Finalized,
    ServerState,
    after_round,
    merged_sums,
    nothing_aggregated,
)
from tff_clustered.federated.tff_execution import TffRoundParts
from tff_clustered.frameworks import tff
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


class TrainedShares(NamedTuple):
    """The workers' `ClientSums` of their shares (in worker order) and every client's outputs
    (in client order)."""

    sums: list[ClientSums]
    outputs: list


class ShardedExecution:
    """How `round.ComposedRound` runs over the started runtime's workers
    (`runtime.worker_contexts()`, read at each call): each worker runs `parts.partial_next` on
    a contiguous share of the clients, the shares' sums are merged in worker order
    (`server_state.merged_sums`) and `parts.finalize` runs once, on the first worker (an
    aggregator's noise is added once, after the merge)."""

    def __init__(self, parts: TffRoundParts) -> None:
        self.parts = parts

    def train_clients(
        self, state: ServerState, clients: Sequence[ClientInput], hparams: dict
    ) -> TrainedShares:
        """Each worker's `ClientSums` of its share, in worker order, and the clients'
        outputs."""
        partial_next = self.parts.partial_next  # built here, not per thread
        shares = run_shards(
            functools.partial(share_next, partial_next, state, hparams),
            [client_examples(c.data) for c in clients],
            [list(clients)],
        )
        outputs = [output for _, share_outputs in shares for output in share_outputs]
        return TrainedShares([ClientSums(*sums) for sums, _ in shares], outputs)

    def aggregate(self, state: ServerState, trained: TrainedShares) -> Finalized:
        """The shares' sums merged (of no share, a round of no client: zero sums), then
        `parts.finalize` on the first worker."""
        finalize = self.parts.finalize  # built here, not per thread
        sums = merged_sums(trained.sums) if trained.sums else self.parts.functions.zero_sums()
        workers = runtime.worker_contexts()
        first_worker = workers[0][1] if workers else tff.framework.get_context_stack().current
        models = tuple(state.cluster_models)
        finalized = _call_on(
            first_worker, finalize, models, sums, state.optimizer, state.aggregator
        )
        return Finalized(*finalized)

    def after_round(self, state: ServerState, finalized: Finalized) -> ServerState:
        return after_round(state, finalized)

    def nothing_aggregated(self) -> Any:
        return nothing_aggregated(self.parts.functions.num_clusters)


def share_next(
    partial_next: Callable[..., Any], state: ServerState, hparams: dict, share: list
) -> Any:
    """`partial_next` of one worker's share of the clients."""
    return partial_next(state, client_values(share, partial_next, 1), hparams)


def share_evaluate(
    evaluate: Callable[..., Any], cluster_models: tuple, batch_size: int, share: list
) -> Any:
    """`evaluate` of one worker's share of the clients."""
    return evaluate(cluster_models, client_values(share, evaluate, 1), batch_size)


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


@dataclasses.dataclass(frozen=True)
class ShardedRound:
    """The round of `parts`, split over the started runtime's workers when there are several;
    on one worker (or for one client) it is `parts.next`."""

    parts: TffRoundParts

    def next(self, state: ServerState, clients: Sequence[ClientInput], hparams: dict) -> tuple:
        """`parts.next` with the same arguments and results: traced as one computation when
        one worker runs it, else (and for a round of no client, which TFF cannot carry as a
        federated value) composed over the workers' shares (`ShardedExecution`)."""
        with named_data_errors(self.parts.worker_data):
            workers = runtime.worker_contexts()
            if clients and (len(workers) <= 1 or len(clients) == 1):
                next_round = self.parts.next
                return next_round(state, client_values(clients, next_round, 1), hparams)
            self.parts.functions.aggregator.check_workers(len(workers))
            execution = ShardedExecution(self.parts)
            return ComposedRound(execution, self.parts.functions.routes_rows).next(
                state, clients, hparams
            )

    def evaluate(self, cluster_models: tuple, clients: Sequence[dict], batch_size: int) -> list:
        """`parts.evaluate`, each worker scoring a share of the clients."""
        evaluate_clients = self.parts.evaluate  # built on first use, here rather than per thread
        if len(runtime.worker_contexts()) <= 1 or len(clients) <= 1:
            values = client_values(clients, evaluate_clients, 1)
            return evaluate_clients(cluster_models, values, batch_size)
        shares = run_shards(
            functools.partial(share_evaluate, evaluate_clients, cluster_models, batch_size),
            [example_count(c.data) for c in clients],
            [list(clients)],
        )
        return [result for share in shares for result in share]


def sharded_round(parts: TffRoundParts) -> FederatedRound:
    """The round of `parts`, split over the started runtime's workers when there are several
    (`ShardedRound`)."""
    fns, sharded = parts.functions, ShardedRound(parts)
    return FederatedRound(
        initialize=parts.initialize,
        next=sharded.next,
        evaluate=sharded.evaluate,
        signature=fns.signature,
        io=fns.io,
        layout=fns.layout,
    )
