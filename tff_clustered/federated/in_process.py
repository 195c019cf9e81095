"""The round run by TensorFlow inside the training process: the GPU path.

TFF's pip runtime (`worker_binary`) runs on CPU only. This execution takes the very functions
the TFF round is built from (`round.RoundFunctions`: the distributor's select function, the
client work, the finalizer, the client evaluation) and the same per-cluster mean
(`clustered_mean.add_to_cluster`, `clustered_mean.cluster_mean`), and runs them as
graphs in this process, so that their ops land on whatever device TensorFlow picks: the
first GPU when it sees one. The round is the TFF round's, step for step:

1. distributor: each client gets what its distributor is `handed` (`distributors.py`): every
   cluster's shared variables (the TFF round broadcasts them), or `select_shared(cluster_models,
   key)` (what `federated_select` hands a peer, as a tuple rather than a dataset);
2. client work: `client_update`; the clients holding the same number of examples together,
   vectorised along a client axis (`tf.vectorized_map`: one call, batched matmuls) when the
   model is small (`VECTORISE_MAX_OPS`), and clients of similar sizes padded to a common one
   with masked batches when its rows are independent (`client_groups`), the others one
   each; the groups and single clients several at a time (threads; one per core);
3. aggregator: each client's weighted update is added into its cluster's row, in client order
   (and its statistics row, for an aggregator other than the mean);
4. finalizer: `finalize_sums(cluster_models, sums, weights, optimizer_state)` (the mean
   update added, then the server optimizer's step), or `finalizers.finalize_aggregate` for
   an aggregator other than the mean.

`evaluate` scores each client with its key's cluster row joined with its own stored
variables: the call's clients in one looped call (each alone's scores, bit for bit), or
vectorised as step 2 groups clients when that clearly pays for the call
(`in_process_scoring.py`); `evaluate_exactly` (decisions) scores each client alone.

Each function is traced once into a graph and run by a session (`GraphFunction`), as TFF's
TensorFlow executor runs its computations.

Inputs and outputs have the TFF round's structure (lists over clients, OrderedDicts), so the
orchestration cannot tell the two apart; only float summation order differs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import finalizers, graphs
from tff_clustered.federated.clustered_mean import add_to_cluster
from tff_clustered.federated.graphs import check_device
from tff_clustered.federated.grouping import client_groups, stacked_padded
from tff_clustered.federated.in_process_scoring import ClientScoring
from tff_clustered.federated.round import FederatedRound
from tff_clustered.federated.round_functions import (
    RoundFunctions,
    example_count,
    python_server_state,
)


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
    own, `parallel_clients` clients at a time (0: one per CPU core). Scoring
    (`in_process_scoring.ClientScoring`) vectorises by its own rule, whatever `vectorise` says,
    and pads with `pad_unequal_clients`."""
    parallel_clients = parallel_clients or os.cpu_count() or 1
    check_device(device)
    k = fns.num_clusters
    has_anchor = bool(fns.signature.anchor)
    sums_spec = fns.stacked_shared_spec()
    weight_spec = tf.TensorSpec([k], tf.float32)
    # An aggregator other than the mean: its clients' statistics summed beside their updates,
    # its finalizer (`finalizers.finalize_aggregate`), its slot of the server state.
    is_mean = fns.aggregator.is_mean
    stats_spec = () if is_mean else (finalizers.stats_spec(fns),)

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
        """Distributor and client work for one client (`size`: see `train_stacked`)."""
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

    def train_stacked(
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        keys: tf.Tensor,
        stored: tuple,
        client_scalars: tf.Tensor,
        seeds: dict,
        hparams: dict,
        sizes: Optional[tf.Tensor] = None,
    ) -> tuple:
        """`train_client` for clients stacked along a leading axis, vectorised. With `sizes`,
        each client's arrays are padded to the largest and its batches masked to its own
        `sizes` rows (`ArrayBatches`); without, they all hold the same number of examples. Ops
        without a vectorised form (the stateless shuffle's seeding) loop per client."""
        per_client = (data, keys, stored, client_scalars, seeds)

        def one(client: tuple) -> tuple:
            return train_client(cluster_models, anchor, *client[:5], hparams, *client[5:])

        padding = () if sizes is None else (sizes,)
        return tf.vectorized_map(one, per_client + padding, fallback_to_while_loop=True)

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

    def accumulate_stacked_with_stats(
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        shared_deltas: tuple,
        cluster_weights: tf.Tensor,
        client_stats: tf.Tensor,
    ) -> tuple:
        """`accumulate_stacked`, and the clients' statistics rows summed."""
        sums, total_weight = accumulate_stacked(sums, total_weight, shared_deltas, cluster_weights)
        return sums, total_weight, stats + tf.reduce_sum(client_stats, axis=0)

    def accumulate(
        sums: tuple, total_weight: tf.Tensor, shared_delta: tuple, cluster_weight: tf.Tensor
    ) -> tuple:
        """The aggregator's accumulate: one client's update into the per-cluster sums."""
        return add_to_cluster(sums, shared_delta, cluster_weight), total_weight + cluster_weight

    train_client_graph = graphs.GraphFunction(
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

    # Vectorising converts the client's training graph with pfor once per built round, at a
    # cost that grows with the graph's ops: the small models pay it back in a few rounds
    # (batched matmuls instead of one small op per client), ResNet18 and the unrolled Sent140
    # LSTM never do, their clients' compute dominating anyway (docs/changelog.md, "Measurements
    # behind the code's constants"). So only clients' graphs up to `VECTORISE_MAX_OPS` are
    # vectorised (and none with a loop inside the model: `vectorisable`), and the vectorised
    # graph is traced when a round first has same-size clients to train.
    vectorise = vectorise and graphs.vectorisable(train_client_graph.graph)

    @functools.cache
    def train_stacked_graph(padded: bool = False) -> graphs.GraphFunction:
        """`train_stacked`, taking the clients' sizes last when `padded`."""
        sizes = [tf.TensorSpec([None], tf.int64)] if padded else []
        specs = [
            fns.cluster_models_spec,
            fns.anchor_spec,
            stacked(fns.data_spec),
            stacked(fns.key_spec),
            stacked(fns.store_in_spec),
            tf.TensorSpec([None], tf.float32),
            stacked(fns.seed_spec),
            fns.hparams_spec,
            *sizes,
        ]
        return graphs.GraphFunction(train_stacked, specs, device)

    @functools.cache
    def accumulate_stacked_graph() -> graphs.GraphFunction:
        if not is_mean:
            return graphs.GraphFunction(
                accumulate_stacked_with_stats,
                [
                    sums_spec,
                    weight_spec,
                    *stats_spec,
                    stacked(fns.shared_spec),
                    stacked(weight_spec),
                    *map(stacked, stats_spec),
                ],
                device,
            )
        return graphs.GraphFunction(
            accumulate_stacked,
            [sums_spec, weight_spec, stacked(fns.shared_spec), stacked(weight_spec)],
            device,
        )

    if is_mean:
        finalize_graph = graphs.GraphFunction(
            fns.finalize_sums,
            [fns.cluster_models_spec, sums_spec, weight_spec, fns.optimizer_state_spec],
            device,
        )
    else:
        finalize_graph = graphs.GraphFunction(
            functools.partial(finalizers.finalize_aggregate, fns),
            [
                fns.cluster_models_spec,
                sums_spec,
                weight_spec,
                *stats_spec,
                fns.optimizer_state_spec,
                finalizers.slot_spec(fns),
            ],
            device,
        )
    scoring = ClientScoring(fns, device, parallel_clients, pad_unequal_clients)

    def server_state(
        cluster_models: tuple, anchor: tuple, optimizer: dict, aggregator: Any = ()
    ) -> collections.OrderedDict:
        return python_server_state(
            cluster_models,
            anchor if has_anchor else None,
            optimizer if fns.has_optimizer else None,
            aggregator,
        )

    def initialize() -> collections.OrderedDict:
        return server_state(
            fns.initial_cluster_models,
            fns.initial_anchor,
            fns.initial_optimizer_state,
            () if is_mean else fns.aggregator.initial_slot(k),
        )

    def next_fn(state: dict, client_inputs: Sequence[dict], hparams: dict) -> tuple:
        """The TFF round's `next`, with the same arguments and results."""
        fields = ("data", "key", "stored", "scalar", "seed")
        clients = [tuple(c[name] for name in fields) for c in client_inputs]
        models = tuple(state["cluster_models"])
        anchor = tuple(state["anchor"]) if has_anchor else ()
        sums = tuple(np.zeros(s.shape, np.float32) for s in sums_spec)
        total_weight = np.zeros([k], np.float32)
        stats = tuple(np.zeros(s.shape, np.float32) for s in stats_spec)  # none for the mean
        outputs: list = [None] * len(clients)

        # Clients train together, vectorised: those holding the same number of examples, and
        # for a model whose rows are independent, those of similar sizes padded to the
        # largest (`client_groups`); the rest one by one, concurrently (a session runs calls
        # from several threads).
        sizes = [example_count(client[0]) for client in clients]
        groups = client_groups(
            sizes,
            hparams,
            vectorise=vectorise,
            pad=pad_unequal_clients and fns.rows_independent,
        )

        def train_group(members: list[int]) -> tuple:
            """The group's (shared deltas, cluster weights, outputs), one row per member."""
            if len(members) == 1:
                data, key, own, scale, seed = clients[members[0]]
                trained = train_client_graph(
                    models, anchor, data, key, tuple(own), scale, seed, hparams
                )
                return tf.nest.map_structure(lambda a: np.asarray(a)[None], trained)
            group_sizes = [sizes[i] for i in members]
            capacity = max(group_sizes)
            key, own, scale, seed = (
                tf.nest.map_structure(lambda *values: np.stack(values), *field)
                for field in zip(*(clients[i][1:] for i in members))
            )
            data = stacked_padded([clients[i][0] for i in members], capacity)
            padded = min(group_sizes) < capacity
            sizes_in = [np.asarray(group_sizes, np.int64)] if padded else []
            return train_stacked_graph(padded)(
                models, anchor, data, key, tuple(own), scale, seed, hparams, *sizes_in
            )

        for members in groups:  # built here, not by two threads at once (pfor takes seconds)
            if len(members) > 1:
                train_stacked_graph(min(sizes[i] for i in members) < max(sizes[i] for i in members))
        # Groups train concurrently (a session runs calls from several threads); their
        # updates are added in client order within each group, groups in the order of their
        # first client, so the sums do not depend on which finished first.
        with concurrent.futures.ThreadPoolExecutor(parallel_clients) as pool:
            trained = list(pool.map(train_group, groups))
        for members, (shared_deltas, cluster_weights, out, *client_stats) in zip(groups, trained):
            if not fns.routes_rows:
                sums, total_weight, *stats = accumulate_stacked_graph()(
                    sums, total_weight, *stats, shared_deltas, cluster_weights, *client_stats
                )
            for row, i in enumerate(members):
                outputs[i] = tf.nest.map_structure(lambda a, row=row: a[row], out)
        # A relay (routed rows) sums nothing: the mailbox is the peers' to rewrite.
        optimizer = state.get("optimizer", {})
        if not is_mean:
            finalized = finalize_graph(
                models, sums, total_weight, *stats, optimizer, state["aggregator"]
            )
            new_state = server_state(
                finalized["cluster_models"],
                anchor,
                finalized.get("optimizer", {}),
                finalized["aggregator"],
            )
            return new_state, outputs, finalized["measurements"]
        if not fns.routes_rows:
            models, optimizer = finalize_graph(models, sums, total_weight, optimizer)
        measurements = collections.OrderedDict(cluster_weight=total_weight)
        return server_state(models, anchor, optimizer), outputs, measurements

    return FederatedRound(
        initialize=initialize,
        next=next_fn,
        evaluate=scoring.evaluate,
        evaluate_exactly=scoring.evaluate_exactly,
        signature=fns.signature,
        io=fns.io,
        layout=fns.layout,
    )
