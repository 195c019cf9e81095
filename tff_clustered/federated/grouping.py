"""Which clients of a round train together in one vectorised call (`client_groups`).

Same-size clients, and clients of similar sizes padded to a common one when the model's rows are
independent, planned by a fitted cost model (`client_groups`); and whether a run is long enough
to vectorise at all (`vectorises_for`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from tff_clustered.federated import batching

# The cost model `client_groups` plans with, in units of one client's training step in a
# vectorised call: a call costs CALL_COST plus, per loop step, STEP_COST (the loop's own ops,
# paid once for all the clients of the call) and 1 per client (its batched matmuls). Fitted
# on 2 cores (calls of 1-16 clients x 5-40 steps of batch 10): MCLR 784 -> 62 gives 78 and
# 2.8, the MLP 67 and 1.9, LeNet 5.3 and 0.3 (its clients' compute dwarfs the fixed costs).
# The small models' values are kept: for a larger model they overrate the fixed costs, so
# groups pad a little more than its optimum.
CALL_COST = 60.0
STEP_COST = 2.0
# Vectorising is paid for once, up front: pfor converts the client update when a built round
# first trains clients together, for savings of tenths of a second per round
# (`benchmark.py --benchmarks=unequal_clients`). A run of fewer rounds than this trains its
# clients one each (the same results within float tolerance): it would not earn the
# conversion back.
VECTORISE_MIN_ROUNDS = 30


def example_count(data: dict) -> int:
    """Examples in one client's arrays (the length of the first)."""
    return len(next(iter(data.values())))


def vectorises_for(rounds: int) -> bool:
    """Whether a run of `rounds` rounds (0: not known, taken as long) trains clients together."""
    return rounds == 0 or rounds >= VECTORISE_MIN_ROUNDS


def round_steps(sizes: Sequence[int], hparams: dict) -> np.ndarray:
    """Minibatches clients of `sizes` examples train on in a round: `batching.client_steps`,
    the rule their batches follow, run eagerly on the round's hyperparameters."""
    steps = batching.client_steps(
        np.asarray(sizes, np.int64), hparams["batch_size"], hparams["epochs"], hparams["max_steps"]
    )
    return np.asarray(steps, np.int64)


def client_groups(
    sizes: Sequence[int], hparams: dict, vectorise: bool = True, pad: bool = False
) -> list[list[int]]:
    """The clients (indices into `sizes`, their example counts) that train in one call each,
    in the order of their first client, each in client order.

    Without `vectorise` every client is a group of its own. Otherwise clients of the same size
    share a group; with `pad` (a model whose rows are independent, so that padded, masked
    clients train exactly as alone), clients of different sizes are grouped too: sorted by
    their training steps, cut into the contiguous runs that minimise the modelled time,
    the sum over groups of CALL_COST + (most steps in the group) x (STEP_COST + clients in
    it). One group pads every client to the longest (cheap when the steps are close); a group
    per size pays the loop's fixed cost once per group (cheap when sizes are few)."""
    n = len(sizes)
    if not vectorise:
        return [[i] for i in range(n)]
    by_size: dict[int, list[int]] = collections.defaultdict(list)
    for i, size in enumerate(sizes):
        by_size[size].append(i)
    if not pad or len(by_size) == 1:
        return list(by_size.values())
    # Dynamic programme over the distinct sizes, most steps first: best[j] is the least cost
    # of the first j sizes, a group being a run of sizes i .. j - 1 (steps[i] its most).
    steps_of = dict(zip(by_size, round_steps(list(by_size), hparams).tolist()))
    distinct = sorted(by_size, key=lambda size: -steps_of[size])
    steps = np.asarray([steps_of[size] for size in distinct], np.float64)
    counts = np.cumsum([0] + [len(by_size[size]) for size in distinct])
    best = np.zeros(len(distinct) + 1)
    start = np.zeros(len(distinct) + 1, np.int64)
    for j in range(1, len(distinct) + 1):
        costs = best[:j] + CALL_COST + steps[:j] * (STEP_COST + counts[j] - counts[:j])
        start[j] = int(np.argmin(costs))
        best[j] = costs[start[j]]
    groups, j = [], len(distinct)
    while j > 0:
        members = [i for size in distinct[start[j] : j] for i in by_size[size]]
        groups.append(sorted(members))
        j = int(start[j])
    return sorted(groups, key=lambda members: members[0])


def stacked_padded(datas: Sequence[dict], capacity: int) -> dict:
    """Clients' arrays stacked along a new leading client axis, each client's rows followed by
    zero rows up to `capacity` (never read unmasked): one array per name, written in place
    (no padded copy per client)."""
    first = datas[0]
    stacked = type(first)()
    for name in first:
        arrays = [np.asarray(data[name]) for data in datas]
        out = np.zeros((len(arrays), capacity, *arrays[0].shape[1:]), arrays[0].dtype)
        for row, array in enumerate(arrays):
            out[row, : len(array)] = array
        stacked[name] = out
    return stacked
