"""The round run by TensorFlow inside the training process: the GPU path.

TFF's pip runtime (`worker_binary`) runs on CPU only. This execution takes the very functions
the TFF round is built from (`round.RoundFunctions`: the distributor's select function, the
client work, the finalizer, the client evaluation) and the same per-cluster mean
(`clustered_mean.add_to_cluster`, `clustered_mean.cluster_mean`), and runs them as
graphs in this process, so that their ops land on whatever device TensorFlow picks: the
first GPU when it sees one. The round is the TFF round's, step for step:

1. distributor: each client gets `select_shared(cluster_models, key)` (what
   `federated_select` hands it, as a tuple rather than a one-element dataset), or every
   cluster's shared variables when it picks its own cluster;
2. client work: `client_update`; the clients holding the same number of examples together,
   vectorised along a client axis (`tf.vectorized_map`: one call, batched matmuls) when the
   model is small (`VECTORISE_MAX_OPS`), and clients of similar sizes padded to a common one
   with masked batches when its rows are independent (`client_groups`), the others one
   each, several at a time (threads; one per core);
3. aggregator: each client's weighted update is added into its cluster's row, in client order;
4. finalizer: `apply_cluster_updates(cluster_models, cluster_mean(sums, weights))`.

Each function is traced once into a graph and run by a session (`GraphFunction`), as TFF's
TensorFlow executor runs its computations.

Inputs and outputs have the TFF round's structure (lists over clients, OrderedDicts), so the
orchestration cannot tell the two apart; only float summation order differs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from tff_clustered.federated.clustered_mean import add_to_cluster, cluster_mean
from tff_clustered.federated.round import (
    FederatedRound,
)
from tff_clustered.federated.round_functions import (
    RoundFunctions,
    check_client_inputs,
    example_count,
    python_server_state,
)
from tff_clustered.federated.scoring import (
    pooled_scores_fn,
    pooled_scores_specs,
    predict_probabilities_fn,
    predict_probabilities_specs,
)
from tff_clustered.models.functional import FunctionalModel


def placed_on(device: Optional[str]) -> contextlib.AbstractContextManager:
    """Ops created inside go to `device` (e.g. "/GPU:1"); None leaves TensorFlow's choice."""
    return tf.device(device) if device else contextlib.nullcontext()


def check_device(device: Optional[str]) -> None:
    """A named device must be one TensorFlow sees: soft placement (needed for the dataset ops,
    which have CPU kernels only) would otherwise move everything to the CPU in silence."""
    if not device:
        return
    seen = [d.name for d in tf.config.list_logical_devices()]
    wanted = tf.DeviceSpec.from_string(device)
    for name in seen:
        spec = tf.DeviceSpec.from_string(name)
        if spec.device_type == (wanted.device_type or "").upper() and spec.device_index == (
            wanted.device_index or 0
        ):
            return
    raise ValueError(
        f"device {device!r} is not one TensorFlow sees ({', '.join(seen)}); name one of them, "
        "or leave --device out (TensorFlow's choice). For a GPU see docs/gpu.md."
    )


VECTORISE_MAX_OPS = 2_000  # ops of one client's training graph (see in_process_round)


def graph_op_types(graph: tf.Graph) -> list[str]:
    """The type of every op in `graph`, those of the functions it calls (its library)
    included."""
    graph_def = graph.as_graph_def()
    return [n.op for n in graph_def.node] + [
        n.op for f in graph_def.library.function for n in f.node_def
    ]


def vectorisable(graph: tf.Graph) -> bool:
    """Whether converting one client's training graph `graph` with pfor pays and works: at most
    `VECTORISE_MAX_OPS` ops, and no gradient of a loop inside the model (an LSTM's loop over
    time keeps its steps in TensorLists, whose gradient pfor cannot convert)."""
    ops = graph_op_types(graph)
    return len(ops) <= VECTORISE_MAX_OPS and "EmptyTensorList" not in ops


class GraphFunction:
    """`fn` traced once into its own graph from `specs` and run by a session.

    TFF's Keras functional models only trace inside a graph (they refuse an eager outer
    context, which a `tf.function` called eagerly has), as inside a TFF computation: this runs
    the functions the way TFF's own TensorFlow executor does, as graphs, in this process. Ops go
    to `device` or to TensorFlow's choice (a GPU when it sees one); ops with CPU kernels only
    (tf.data) stay on the CPU."""

    def __init__(self, fn: Callable[..., Any], specs: Sequence[Any], device: Optional[str]):
        self.graph = tf.Graph()
        with self.graph.as_default(), placed_on(device):
            self.inputs = tf.nest.map_structure(
                lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), tuple(specs)
            )
            self.outputs = fn(*self.inputs)
        self.placeholders = tf.nest.flatten(self.inputs)
        logical_cpus = len(tf.config.list_logical_devices("CPU"))
        config = tf.compat.v1.ConfigProto(
            allow_soft_placement=True,
            log_device_placement=context.context().log_device_placement,
            device_count={"CPU": max(logical_cpus, 1)},
        )
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        # A session optimizes its graph on the first run (35 s for the Sent140 LSTM's client
        # work); calls from other threads wait for it rather than each optimizing it again.
        self._first_run = threading.Lock()
        self._ran = False

    def __call__(self, *args: Any) -> Any:
        tf.nest.assert_same_structure(self.inputs, tuple(args), check_types=False)
        feed = dict(zip(self.placeholders, tf.nest.flatten(tuple(args))))
        with contextlib.nullcontext() if self._ran else self._first_run:
            outputs = self.session.run(self.outputs, feed_dict=feed)
            self._ran = True
        return outputs


def in_process_predict(
    model: FunctionalModel, input_spec: dict, device: Optional[str] = None
) -> Callable[..., np.ndarray]:
    """`round.predict_probabilities_fn`, run in this process."""
    check_device(device)
    return GraphFunction(
        predict_probabilities_fn(model), predict_probabilities_specs(model, input_spec), device
    )


def in_process_pooled_scores(
    model: FunctionalModel, input_spec: dict, device: Optional[str] = None
) -> Callable[..., tuple]:
    """`round.pooled_scores_fn`, run in this process."""
    check_device(device)
    return GraphFunction(pooled_scores_fn(model), pooled_scores_specs(model, input_spec), device)


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
# first trains clients together, in about 4 s for the 16-unit MLP on these machines (2 cores),
# and 7 s for the padded form, for savings of tenths of a second per round (0.27 s per round
# of 100 clients of unequal sizes: `benchmark.py --benchmarks=unequal_clients`). A run of fewer
# rounds than this trains its clients one each (the same results within float tolerance): it
# would not earn the conversion back.
VECTORISE_MIN_ROUNDS = 30


def vectorises_for(rounds: int) -> bool:
    """Whether a run of `rounds` rounds (0: not known, taken as long) trains clients together."""
    return rounds == 0 or rounds >= VECTORISE_MIN_ROUNDS


def client_steps(size: int, hparams: dict) -> int:
    """Minibatches a client of `size` examples trains on in a round (`batch_order`)."""
    batch_size = int(hparams["batch_size"])
    epochs, max_steps = int(hparams["epochs"]), int(hparams["max_steps"])
    per_epoch = -(-size // batch_size)
    steps = epochs * per_epoch if epochs >= 0 else max_steps
    if max_steps >= 0:
        steps = min(steps, max_steps)
    return max(steps, 0) if per_epoch > 0 else 0


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
    distinct = sorted(by_size, key=lambda size: -client_steps(size, hparams))
    steps = np.asarray([client_steps(size, hparams) for size in distinct], np.float64)
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


def in_process_round(
    fns: RoundFunctions,
    device: Optional[str] = None,
    parallel_clients: int = 0,
    vectorise: bool = True,
    pad_unequal_clients: bool = True,
) -> FederatedRound:
    """`fns` run in this process, on `device` when one is named (else TensorFlow's choice).
    `vectorise`: the clients of a round that hold the same number of examples train together,
    `client_update` vectorised along a client axis (`tf.vectorized_map`: batched matmuls, one
    call), when one client's training graph has at most `VECTORISE_MAX_OPS` ops, and with
    `pad_unequal_clients` clients of different sizes too, padded and masked, when the model's
    rows are independent (`client_groups`); otherwise, and for a client left in a group of its
    own, `parallel_clients` clients at a time (0: one per CPU core)."""
    parallel_clients = parallel_clients or os.cpu_count() or 1
    check_device(device)
    k = fns.num_clusters
    has_anchor = bool(fns.signature.anchor)
    sums_spec = fns.stacked_shared_spec()
    weight_spec = tf.TensorSpec([k], tf.float32)

    def train_client(
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        key: tf.Tensor,
        stored: tuple,
        client_scalar: tf.Tensor,
        seed: dict,
        hparams: dict,
        size: Optional[tf.Tensor] = None,
    ) -> tuple:
        """Distributor and client work for one client (`size`: see `train_padded_clients`)."""
        return fns.padded_client_update(
            fns.distributor.handed(cluster_models, key),
            stored,
            data,
            key,
            client_scalar,
            seed,
            hparams,
            anchor,
            size,
        )

    def train_clients(
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        keys: tf.Tensor,
        stored: tuple,
        client_scalars: tf.Tensor,
        seeds: dict,
        hparams: dict,
    ) -> tuple:
        """`train_client` for clients stacked along a leading axis (same example count).
        Ops without a vectorised form (the stateless shuffle's seeding) loop per client."""

        def one(client: tuple) -> tuple:
            return train_client(cluster_models, anchor, *client, hparams)

        return tf.vectorized_map(
            one, (data, keys, stored, client_scalars, seeds), fallback_to_while_loop=True
        )

    def train_padded_clients(
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        keys: tf.Tensor,
        stored: tuple,
        client_scalars: tf.Tensor,
        seeds: dict,
        sizes: tf.Tensor,
        hparams: dict,
    ) -> tuple:
        """`train_clients` for clients of different sizes: each client's arrays padded to the
        largest, and its batches masked to its own `sizes` rows (`ArrayBatches`)."""

        def one(client: tuple) -> tuple:
            data, key, own, scale, seed, size = client
            return train_client(cluster_models, anchor, data, key, own, scale, seed, hparams, size)

        return tf.vectorized_map(
            one, (data, keys, stored, client_scalars, seeds, sizes), fallback_to_while_loop=True
        )

    def accumulate_stacked(
        sums: tuple, total_weight: tf.Tensor, shared_deltas: tuple, cluster_weights: tf.Tensor
    ) -> tuple:
        """`accumulate` over stacked clients, one after another in their order."""

        def body(i: tf.Tensor, sums: tuple, total_weight: tf.Tensor) -> tuple:
            delta = tuple(d[i] for d in shared_deltas)
            return (i + 1, *accumulate(sums, total_weight, delta, cluster_weights[i]))

        count = tf.shape(cluster_weights)[0]
        _, sums, total_weight = tf.while_loop(
            lambda i, *_: i < count, body, (tf.constant(0), tuple(sums), total_weight)
        )
        return sums, total_weight

    def accumulate(
        sums: tuple, total_weight: tf.Tensor, shared_delta: tuple, cluster_weight: tf.Tensor
    ) -> tuple:
        """The aggregator's accumulate: one client's update into the per-cluster sums."""
        return add_to_cluster(sums, shared_delta, cluster_weight), total_weight + cluster_weight

    def finalize(cluster_models: tuple, sums: tuple, total_weight: tf.Tensor) -> tuple:
        return fns.apply_cluster_updates(cluster_models, cluster_mean(sums, total_weight))

    def evaluate_client(
        cluster_models: tuple, data: dict, key: tf.Tensor, stored: tuple, batch_size: tf.Tensor
    ) -> dict:
        return fns.client_evaluate(
            fns.distributor.select_shared(cluster_models, key[0]), stored, data, batch_size
        )

    train_client_graph = GraphFunction(
        train_client,
        [
            fns.cluster_models_spec,
            fns.anchor_spec,
            fns.data_spec,
            fns.key_spec,
            fns.store_in_spec,
            tf.TensorSpec([], tf.float32),
            fns.seed_spec,
            fns.hparams_spec,
        ],
        device,
    )

    def stacked(spec: Any) -> Any:
        return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape], t.dtype), spec)

    # Vectorising converts the client's training graph with pfor once per built round, at
    # 12-25 ms per op of it on these machines: 4-6 s for the small models, which it pays back
    # in a few rounds (batched matmuls instead of one small op per client), but 98 s for
    # ResNet18 (3,929 ops) and 230 s for the unrolled Sent140 LSTM, whose clients' compute
    # dominates anyway. So only clients' graphs up to `VECTORISE_MAX_OPS` are vectorised (and
    # none with a loop inside the model: `vectorisable`), and the vectorised graph is traced
    # when a round first has same-size clients to train.
    vectorise = vectorise and vectorisable(train_client_graph.graph)

    @functools.cache
    def train_clients_graph(padded: bool = False) -> GraphFunction:
        """`train_clients`, or `train_padded_clients` (which also takes the clients' sizes)."""
        sizes = [tf.TensorSpec([None], tf.int64)] if padded else []
        return GraphFunction(
            train_padded_clients if padded else train_clients,
            [
                fns.cluster_models_spec,
                fns.anchor_spec,
                stacked(fns.data_spec),
                stacked(fns.key_spec),
                stacked(fns.store_in_spec),
                tf.TensorSpec([None], tf.float32),
                stacked(fns.seed_spec),
                *sizes,
                fns.hparams_spec,
            ],
            device,
        )

    @functools.cache
    def accumulate_stacked_graph() -> GraphFunction:
        return GraphFunction(
            accumulate_stacked,
            [sums_spec, weight_spec, stacked(fns.shared_spec), stacked(weight_spec)],
            device,
        )

    accumulate_graph = GraphFunction(
        accumulate, [sums_spec, weight_spec, fns.shared_spec, weight_spec], device
    )
    finalize_graph = GraphFunction(
        finalize, [fns.cluster_models_spec, sums_spec, weight_spec], device
    )
    evaluate_client_graph = GraphFunction(
        evaluate_client,
        [
            fns.cluster_models_spec,
            fns.data_spec,
            fns.key_spec,
            fns.store_in_spec,
            tf.TensorSpec([], tf.int64),
        ],
        device,
    )

    def server_state(cluster_models: tuple, anchor: tuple) -> collections.OrderedDict:
        return python_server_state(cluster_models, anchor if has_anchor else None)

    def initialize() -> collections.OrderedDict:
        return server_state(fns.initial_cluster_models, fns.initial_anchor)

    def next_fn(
        state: dict,
        datasets: Sequence[dict],
        keys: Sequence[np.ndarray],
        stored: Sequence[tuple],
        client_scalars: Sequence[float],
        seeds: Sequence[dict],
        hparams: dict,
    ) -> tuple:
        """The TFF round's `next`, with the same arguments and results."""
        check_client_inputs(datasets, keys, stored, client_scalars, seeds)
        models = tuple(state["cluster_models"])
        anchor = tuple(state["anchor"]) if has_anchor else ()
        sums = tuple(np.zeros(s.shape, np.float32) for s in sums_spec)
        total_weight = np.zeros([k], np.float32)
        outputs: list = [None] * len(datasets)
        clients = list(zip(datasets, keys, stored, client_scalars, seeds))

        # Clients train together, vectorised: those holding the same number of examples, and
        # for a model whose rows are independent, those of similar sizes padded to the
        # largest (`client_groups`); the rest one by one, concurrently (a session runs calls
        # from several threads).
        sizes = [example_count(data) for data in datasets]
        groups = client_groups(
            sizes,
            hparams,
            vectorise=vectorise,
            pad=pad_unequal_clients and fns.rows_independent,
        )
        singles = [members[0] for members in groups if len(members) == 1]

        def work(i: int) -> tuple:
            data, key, own, scale, seed = clients[i]
            return train_client_graph(models, anchor, data, key, tuple(own), scale, seed, hparams)

        with concurrent.futures.ThreadPoolExecutor(parallel_clients) as pool:
            done = dict(zip(singles, pool.map(work, singles)))
        # Updates are added in client order within each group, groups in the order of their
        # first client, so the sums do not depend on which finished first.
        for members in groups:
            if len(members) == 1:
                shared_delta, cluster_weight, out = done[members[0]]
                if not fns.routes_rows:
                    sums, total_weight = accumulate_graph(
                        sums, total_weight, shared_delta, cluster_weight
                    )
                outputs[members[0]] = out
                continue
            group_sizes = [sizes[i] for i in members]
            capacity = max(group_sizes)
            key, own, scale, seed = (
                tf.nest.map_structure(lambda *values: np.stack(values), *field)
                for field in zip(*(clients[i][1:] for i in members))
            )
            data = stacked_padded([clients[i][0] for i in members], capacity)
            own = tuple(own)
            if min(group_sizes) == capacity:
                shared_deltas, cluster_weights, out = train_clients_graph()(
                    models, anchor, data, key, own, scale, seed, hparams
                )
            else:
                shared_deltas, cluster_weights, out = train_clients_graph(padded=True)(
                    models,
                    anchor,
                    data,
                    key,
                    own,
                    scale,
                    seed,
                    np.asarray(group_sizes, np.int64),
                    hparams,
                )
            if not fns.routes_rows:
                sums, total_weight = accumulate_stacked_graph()(
                    sums, total_weight, shared_deltas, cluster_weights
                )
            for row, i in enumerate(members):
                outputs[i] = tf.nest.map_structure(lambda a, row=row: a[row], out)
        # A relay (routed rows) sums nothing: the mailbox is the peers' to rewrite.
        new_models = models if fns.routes_rows else finalize_graph(models, sums, total_weight)
        measurements = collections.OrderedDict(cluster_weight=total_weight)
        return server_state(new_models, anchor), outputs, measurements

    def evaluate(
        cluster_models: tuple,
        datasets: Sequence[dict],
        keys: Sequence[np.ndarray],
        stored: Sequence[tuple],
        batch_size: int,
    ) -> list:
        """The TFF round's `evaluate`: each client's scores with its cluster's model."""
        models = tuple(cluster_models)

        def score(client: tuple) -> dict:
            data, key, own = client
            return evaluate_client_graph(models, data, key, tuple(own), np.int64(batch_size))

        with concurrent.futures.ThreadPoolExecutor(parallel_clients) as pool:
            return list(pool.map(score, zip(datasets, keys, stored)))

    return FederatedRound(
        initialize=initialize,
        next=next_fn,
        evaluate=evaluate,
        signature=fns.signature,
        io=fns.io,
        layout=fns.layout,
    )
