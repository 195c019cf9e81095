"""The round run by TensorFlow inside the training process: the GPU path.

TFF's pip runtime (`worker_binary`) runs on CPU only. `InProcessExecution` runs the parts of
`round.ComposedRound` (`round_functions.RoundFunctions`: the distributor, the client work, the
per-cluster sums `clustered_mean.add_to_cluster`, the finalizer) as graphs in this process,
so that their ops land on whatever device TensorFlow picks: the first GPU when it sees one.
What it decides is only how they run:

* client work: each client gets what its distributor is `handed` (every cluster's shared
  variables, or its key's rows, as a tuple rather than a dataset); the clients holding the
  same number of examples train together, vectorised along a client axis
  (`tf.vectorized_map`: one call, batched matmuls) when the model is small
  (`VECTORISE_MAX_OPS`), and clients of similar sizes padded to a common one with masked
  batches when its rows are independent (`client_groups`), the others one each; the groups
  and single clients several at a time (threads; one per core);
* aggregator: each client's result added into its cluster's rows, in client order;
* finalizer: `RoundFunctions.finalize` once, on the sums.

`evaluate` scores each client with its key's cluster row joined with its own stored
variables (`in_process_scoring.py`); `evaluate_exactly` (decisions) scores each client alone.
Each function is traced once into a graph and run by a session (`GraphFunction`), as TFF's
TensorFlow executor runs its computations. Inputs and outputs have the TFF round's structure,
so the loop cannot tell the two apart; only float summation order differs.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import graphs
from tff_clustered.federated.clustered_mean import add_to_cluster
from tff_clustered.federated.graphs import check_device
from tff_clustered.federated.grouping import client_groups, example_count, stacked_padded
from tff_clustered.federated.in_process_scoring import ClientScoring
from tff_clustered.federated.round import ComposedRound, FederatedRound
from tff_clustered.federated.round_functions import RoundFunctions
from tff_clustered.federated.round_inputs import ClientInput
from tff_clustered.federated.server_state import (
    ClientResult,
    ClientSums,
    Finalized,
    ServerState,
    after_round,
    nothing_aggregated,
)


def stacked(spec: Any) -> Any:
    """`spec` with a leading client axis of any length."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape], t.dtype), spec)


class TrainedGroups(NamedTuple):
    """The clients' results as the in-process round trains them: each group's members and
    their results (one row each), and every client's outputs in client order."""

    groups: list[list[int]]
    results: list[ClientResult]
    outputs: list


def client_outputs(groups: list[list[int]], results: list[ClientResult]) -> list:
    """Each client's outputs, in client order, from its group's rows."""
    outputs: list = [None] * sum(len(members) for members in groups)
    for members, result in zip(groups, results):
        for row, i in enumerate(members):
            outputs[i] = tf.nest.map_structure(lambda a, row=row: a[row], result.outputs)
    return outputs


class InProcessExecution:
    """How `round.ComposedRound` runs in this process (see the module docstring): on `device`
    when one is named; `vectorise` and `pad_unequal_clients` as `in_process_round` says;
    `parallel_clients` groups at a time."""

    def __init__(
        self,
        fns: RoundFunctions,
        device: Optional[str],
        parallel_clients: int,
        vectorise: bool,
        pad_unequal_clients: bool,
    ) -> None:
        self.fns, self.device, self.parallel_clients = fns, device, parallel_clients
        self.pad = pad_unequal_clients and fns.rows_independent
        self.train_client_graph = graphs.GraphFunction(
            self.train_client,
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
        # Vectorising converts the client's training graph with pfor once per built round, at
        # a cost that grows with the graph's ops: the small models pay it back in a few rounds
        # (batched matmuls instead of one small op per client), ResNet18 and the unrolled
        # Sent140 LSTM never do, their clients' compute dominating anyway (docs/changelog.md,
        # "Measurements behind the code's constants"). So only clients' graphs up to
        # `VECTORISE_MAX_OPS` are vectorised (and none with a loop inside the model:
        # `vectorisable`), and the vectorised graph is traced when a round first has
        # same-size clients to train.
        self.vectorise = vectorise and graphs.vectorisable(self.train_client_graph.graph)
        self.stacked_graphs: dict[bool, graphs.GraphFunction] = {}
        self.finalize_graph = graphs.GraphFunction(
            fns.finalize,
            [fns.cluster_models_spec, *fns.sums_spec, fns.optimizer_state_spec, fns.slot_spec],
            device,
        )

    def train_client(
        self,
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        key: tf.Tensor,
        stored: tuple,
        client_scalar: tf.Tensor,
        seed: dict,
        hparams: dict,
        size: Optional[tf.Tensor] = None,
    ) -> ClientResult:
        """Distributor and client work for one client (`size`: see `train_stacked`)."""
        handed = self.fns.distributor.handed(cluster_models, key)
        return self.fns.client_update(
            handed, stored, data, key, client_scalar, seed, hparams, anchor, size
        )

    def train_stacked(
        self,
        cluster_models: tuple,
        anchor: tuple,
        data: dict,
        keys: tf.Tensor,
        stored: tuple,
        client_scalars: tf.Tensor,
        seeds: dict,
        hparams: dict,
        sizes: Optional[tf.Tensor] = None,
    ) -> ClientResult:
        """`train_client` for clients stacked along a leading axis, vectorised. With `sizes`,
        each client's arrays are padded to the largest and its batches masked to its own
        `sizes` rows (`ArrayBatches`); without, they all hold the same number of examples. Ops
        without a vectorised form (the stateless shuffle's seeding) loop per client."""
        per_client = (data, keys, stored, client_scalars, seeds)
        padding = () if sizes is None else (sizes,)
        one = functools.partial(self.train_one_of_stacked, cluster_models, anchor, hparams)
        return tf.vectorized_map(one, per_client + padding, fallback_to_while_loop=True)

    def train_one_of_stacked(
        self, cluster_models: tuple, anchor: tuple, hparams: dict, client: tuple
    ) -> ClientResult:
        return self.train_client(cluster_models, anchor, *client[:5], hparams, *client[5:])

    def train_stacked_graph(self, padded: bool = False) -> graphs.GraphFunction:
        """`train_stacked`, taking the clients' sizes last when `padded` (built once each)."""
        if padded in self.stacked_graphs:
            return self.stacked_graphs[padded]
        fns = self.fns
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
        built = graphs.GraphFunction(self.train_stacked, specs, self.device)
        self.stacked_graphs[padded] = built
        return built

    @functools.cached_property
    def accumulate_graph(self) -> graphs.GraphFunction:
        """`accumulate_stacked` as a graph."""
        fns = self.fns
        sums_spec = fns.sums_spec
        client_spec = (stacked(fns.shared_spec), stacked(fns.weight_spec), stacked(fns.stats_spec))
        return graphs.GraphFunction(accumulate_stacked, [sums_spec, *client_spec], self.device)

    def initialize(self) -> ServerState:
        return self.fns.initial_state()

    def train_clients(
        self, state: ServerState, client_inputs: Sequence[ClientInput], hparams: dict
    ) -> TrainedGroups:
        """Each group of clients (`client_groups`) with its members' results, one row each.
        Clients train together, vectorised: those holding the same number of examples, and for
        a model whose rows are independent, those of similar sizes padded to the largest; the
        rest one by one; groups concurrently (a session runs calls from several threads)."""
        clients = [tuple(c) for c in client_inputs]
        sizes = [example_count(client[0]) for client in clients]
        groups = client_groups(sizes, hparams, vectorise=self.vectorise, pad=self.pad)
        for members in groups:  # built here, not by two threads at once (pfor takes seconds)
            if len(members) > 1:
                self.train_stacked_graph(padded_group(sizes, members))
        train = functools.partial(self.train_group, state, clients, sizes, hparams)
        with concurrent.futures.ThreadPoolExecutor(self.parallel_clients) as pool:
            results = list(pool.map(train, groups))
        return TrainedGroups(groups, results, client_outputs(groups, results))

    def train_group(
        self,
        state: ServerState,
        clients: list[tuple],
        sizes: list[int],
        hparams: dict,
        members: list[int],
    ) -> ClientResult:
        """The group's results, one row per member."""
        models, anchor = tuple(state.cluster_models), tuple(state.anchor)
        if len(members) == 1:
            data, key, own, scale, seed = clients[members[0]]
            trained = self.train_client_graph(
                models, anchor, data, key, tuple(own), scale, seed, hparams
            )
            return tf.nest.map_structure(lambda a: np.asarray(a)[None], trained)
        capacity = max(sizes[i] for i in members)
        key, own, scale, seed = (
            tf.nest.map_structure(lambda *values: np.stack(values), *field)
            for field in zip(*(clients[i][1:] for i in members))
        )
        data = stacked_padded([clients[i][0] for i in members], capacity)
        padded = padded_group(sizes, members)
        sizes_in = [np.asarray([sizes[i] for i in members], np.int64)] if padded else []
        return self.train_stacked_graph(padded)(
            models, anchor, data, key, tuple(own), scale, seed, hparams, *sizes_in
        )

    def aggregate(self, state: ServerState, trained: TrainedGroups) -> Finalized:
        """The groups' results added into the per-cluster sums, in client order within each
        group and groups in the order of their first client (so the sums do not depend on
        which finished first), then the finalizer."""
        sums = self.fns.zero_sums()
        for result in trained.results:
            sums = self.accumulate_graph(sums, result.delta, result.cluster_weight, result.stats)
        models = tuple(state.cluster_models)
        return self.finalize_graph(models, *sums, state.optimizer, state.aggregator)

    def after_round(self, state: ServerState, finalized: Finalized) -> ServerState:
        return after_round(state, finalized)

    def nothing_aggregated(self) -> Any:
        return nothing_aggregated(self.fns.num_clusters)


def padded_group(sizes: Sequence[int], members: Sequence[int]) -> bool:
    """Whether a group's members hold different numbers of examples (padded to the largest)."""
    return min(sizes[i] for i in members) < max(sizes[i] for i in members)


def accumulate_stacked(
    sums: ClientSums, shared_deltas: tuple, cluster_weights: tf.Tensor, client_stats: tf.Tensor
) -> ClientSums:
    """Stacked clients' results added into `sums`, one after another in their order (each
    update into its cluster's row: `add_to_cluster`); their statistics rows summed."""

    def body(i: tf.Tensor, total: tuple, total_weight: tf.Tensor) -> tuple:
        delta = tuple(d[i] for d in shared_deltas)
        weight = cluster_weights[i]
        return i + 1, add_to_cluster(total, delta, weight), total_weight + weight

    count = tf.shape(cluster_weights)[0]
    _, total, total_weight = tf.while_loop(
        lambda i, *_: i < count, body, (tf.constant(0), tuple(sums.sums), sums.total_weight)
    )
    return ClientSums(total, total_weight, sums.stats + tf.reduce_sum(client_stats, axis=0))


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
    execution = InProcessExecution(fns, device, parallel_clients, vectorise, pad_unequal_clients)
    scoring = ClientScoring(fns, device, parallel_clients, pad_unequal_clients)
    return FederatedRound(
        initialize=execution.initialize,
        next=ComposedRound(execution, fns.routes_rows).next,
        evaluate=scoring.evaluate,
        evaluate_exactly=scoring.evaluate_exactly,
        signature=fns.signature,
        io=fns.io,
        layout=fns.layout,
    )
