"""How the in-process round scores its clients (its `evaluate`), three ways, same counts.

Each client is scored with its key's cluster row joined with its own stored variables:

* alone: each client a call of its own of one client's graph, `parallel_clients` at a time
  (threads): what TFF's runtime does, and the reference the other two are held to;
* looped: the call's clients in one call (or a few, `LOOPED_CALL_BYTES`), a loop over them
  (`tf.map_fn`) whose body is one client's graph run on that client's own rows: the scores of
  `alone` bit for bit (`tests/test_in_process_evaluation.py`) without a session call per client;
  its graph costs what alone's does to build (a trace and the session's first run);
* vectorised: the clients grouped as training groups them (`grouping.client_groups`: the same
  size, or padded and masked when the model's rows are independent), each group one
  `tf.vectorized_map` call (batched ops): the cheapest per client, but pfor first converts the
  graph, seconds once per built round, and its loss sums may differ from `alone` in the last
  bits (batched kernels, other summation orders).

`evaluate` loops, and vectorises a call only when that call's own saving clearly exceeds the
conversion (`vectorising_pays`), whatever earlier calls built, so that a call's scores depend on
that call alone. `evaluate_exactly` (decisions: an argmin over losses must not turn on
rounding) scores each client alone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import graphs
from tff_clustered.federated.grouping import client_groups, example_count, stacked_padded
from tff_clustered.federated.round_functions import RoundFunctions

# Vectorising's cost model, per op of one client's evaluation graph (`graphs.graph_op_types`),
# measured on 2 shared cores by `python binaries/benchmark.py --benchmarks=scoring_ways` (FedPer's
# model of the population benchmark, 183 ops, 1,000 clients of 10 examples; the figures are in
# docs/changelog.md, "Measurements behind the code's constants"):
# * LOOPED_SECONDS_PER_OP: a client's ops run one by one in the loop, per op, less the same
#   client's share of a vectorised call: what vectorising saves per client and op;
# * CONVERSION_SECONDS_PER_OP: pfor's conversion of the vectorised graph and its first run.
LOOPED_SECONDS_PER_OP = 9.0e-7
CONVERSION_SECONDS_PER_OP = 1.2e-2
# Vectorising is taken when its saving on the call is at least this many times its cost.
CLEAR_MARGIN = 2.0
# Examples a looped call holds (a run of clients taking at most this many bytes, or one larger
# client): concatenated, they are a copy of the call's examples.
LOOPED_CALL_BYTES = 64 * 2**20
WAYS = ("alone", "looped", "vectorised")


def vectorising_pays(grouped: int, ops: int, conversions: int) -> bool:
    """Whether vectorising `grouped` clients (those that share a group) clearly saves more than
    converting `conversions` vectorised graphs (one per padding) of a client graph of `ops` ops
    costs, against looping over them."""
    saved = grouped * ops * LOOPED_SECONDS_PER_OP
    return saved > CLEAR_MARGIN * conversions * ops * CONVERSION_SECONDS_PER_OP


def byte_runs(sizes: Sequence[int], bytes_per_example: int, most: int) -> list[range]:
    """Consecutive runs of clients of `sizes` examples, each taking at most `most` bytes (or
    one larger client)."""
    runs, begin, taken = [], 0, 0
    for i, n in enumerate(sizes):
        if i > begin and taken + n * bytes_per_example > most:
            runs.append(range(begin, i))
            begin, taken = i, 0
        taken += n * bytes_per_example
    return runs + [range(begin, len(sizes))] if len(sizes) else runs


def stacked_spec(spec: Any) -> Any:
    """`spec` with a leading client axis."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape], t.dtype), spec)


def stacked_values(values: Sequence[Sequence[np.ndarray]]) -> tuple:
    """Clients' tuples of arrays stacked, field by field, along a new leading client axis."""
    return tuple(np.stack(field) for field in zip(*values))


class ClientScoring:
    """The in-process round's `evaluate` and `evaluate_exactly` for `fns` (see the module
    docstring), run on `device`, `parallel_clients` calls at a time."""

    def __init__(
        self,
        fns: RoundFunctions,
        device: Optional[str],
        parallel_clients: int,
        pad_unequal_clients: bool = True,
    ) -> None:
        self.fns, self.device, self.parallel_clients = fns, device, parallel_clients
        self.pad = pad_unequal_clients and fns.rows_independent
        self.client_graph = graphs.GraphFunction(
            self.evaluate_client,
            [
                fns.cluster_models_spec,
                fns.data_spec,
                fns.key_spec,
                fns.store_in_spec,
                tf.TensorSpec([], tf.int64),
            ],
            device,
        )
        self.ops = len(graphs.graph_op_types(self.client_graph.graph))
        self.vectorisable = graphs.vectorisable(self.client_graph.graph)
        self._stacked_graphs: dict[bool, graphs.GraphFunction] = {}

    def evaluate_client(
        self,
        cluster_models: tuple,
        data: dict,
        key: tf.Tensor,
        stored: tuple,
        batch_size: tf.Tensor,
        size: Optional[tf.Tensor] = None,
    ) -> dict:
        """One client's scores with its key's cluster row joined with its stored variables
        (`size`: the client holds the first `size` rows of padded arrays)."""
        selected = self.fns.distributor.select_shared(cluster_models, key[0])
        return self.fns.client_evaluate(selected, stored, data, batch_size, size)

    def evaluate_looped(
        self,
        cluster_models: tuple,
        rows: dict,
        starts: tf.Tensor,
        sizes: tf.Tensor,
        keys: tf.Tensor,
        stored: tuple,
        batch_size: tf.Tensor,
    ) -> dict:
        """`evaluate_client` for each client of the call, in a loop: client i's examples are
        `rows[starts[i] : starts[i] + sizes[i]]`, so that its ops see exactly its own arrays."""
        outputs = self.client_graph.outputs

        @tf.autograph.experimental.do_not_convert  # the model's code runs as written
        def one(client: tuple) -> dict:
            start, size, key, own = client
            data = tf.nest.map_structure(lambda a: a[start : start + size], rows)
            return self.evaluate_client(cluster_models, data, key, own, batch_size)

        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), outputs)
        return tf.map_fn(
            one,
            (starts, sizes, keys, stored),
            fn_output_signature=signature,
            parallel_iterations=self.parallel_clients,
        )

    def evaluate_stacked(
        self,
        cluster_models: tuple,
        data: dict,
        keys: tf.Tensor,
        stored: tuple,
        batch_size: tf.Tensor,
        sizes: Optional[tf.Tensor] = None,
    ) -> dict:
        """`evaluate_client` for clients stacked along a leading axis, vectorised; with `sizes`,
        their arrays padded to the largest and their batches masked to their own rows."""

        @tf.autograph.experimental.do_not_convert
        def one(client: tuple) -> dict:
            return self.evaluate_client(cluster_models, *client[:3], batch_size, *client[3:])

        padding = () if sizes is None else (sizes,)
        return tf.vectorized_map(one, (data, keys, stored) + padding, fallback_to_while_loop=True)

    @functools.cached_property
    def looped_graph(self) -> graphs.GraphFunction:
        fns = self.fns
        specs = [
            fns.cluster_models_spec,
            fns.data_spec,
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None], tf.int64),
            stacked_spec(fns.key_spec),
            stacked_spec(fns.store_in_spec),
            tf.TensorSpec([], tf.int64),
        ]
        return graphs.GraphFunction(self.evaluate_looped, specs, self.device)

    def stacked_graph(self, padded: bool) -> graphs.GraphFunction:
        """`evaluate_stacked`, taking the clients' sizes last when `padded`; built on first
        use."""
        if padded in self._stacked_graphs:
            return self._stacked_graphs[padded]
        fns = self.fns
        sizes = [tf.TensorSpec([None], tf.int64)] if padded else []
        specs = [
            fns.cluster_models_spec,
            stacked_spec(fns.data_spec),
            stacked_spec(fns.key_spec),
            stacked_spec(fns.store_in_spec),
            tf.TensorSpec([], tf.int64),
            *sizes,
        ]
        graph = graphs.GraphFunction(self.evaluate_stacked, specs, self.device)
        return self._stacked_graphs.setdefault(padded, graph)

    def groups(self, clients: Sequence[dict], batch_size: int) -> list[list[int]]:
        """The vectorised way's groups of `clients` (indices), as training groups clients for
        one pass of ordered batches of `batch_size` (`client_groups`)."""
        sizes = [example_count(c.data) for c in clients]
        one_pass = {"batch_size": batch_size, "epochs": 1, "max_steps": -1}
        return client_groups(sizes, one_pass, vectorise=True, pad=self.pad)

    def evaluate(
        self, cluster_models: tuple, clients: Sequence[dict], batch_size: int, exact: bool = False
    ) -> list:
        """The TFF round's `evaluate`: each client's scores with its cluster's model, the call's
        clients looped over, or vectorised when that pays for this call (module docstring);
        with `exact`, each alone."""
        models = tuple(cluster_models)
        if exact:
            return self.score("alone", models, clients, batch_size)
        if self.vectorisable:
            groups = self.groups(clients, batch_size)
            together = [g for g in groups if len(g) > 1]
            sizes = [example_count(c.data) for c in clients]
            paddings = {min(sizes[i] for i in g) < max(sizes[i] for i in g) for g in together}
            if vectorising_pays(sum(map(len, together)), self.ops, len(paddings)):
                return self.vectorised(models, clients, batch_size, groups)
        return self.score("looped", models, clients, batch_size)

    def evaluate_exactly(
        self, cluster_models: tuple, clients: Sequence[dict], batch_size: int
    ) -> list:
        """`evaluate` with each client scored alone: its scores those of a call of its own, bit
        for bit, whatever else the call holds (for decisions)."""
        return self.evaluate(cluster_models, clients, batch_size, exact=True)

    def score(self, way: str, models: tuple, clients: Sequence[dict], batch_size: int) -> list:
        """The clients' scores, one per client, computed `way` (`WAYS`); the vectorised way
        groups them as `groups` plans."""
        if way not in WAYS:
            raise ValueError(f"way must be one of {WAYS}, got {way!r}")
        if way == "vectorised":
            return self.vectorised(models, clients, batch_size, self.groups(clients, batch_size))
        if way == "looped" and clients:
            return self.looped(models, clients, batch_size)

        def alone(client: dict) -> dict:
            data, key, own = client.data, client.key, tuple(client.stored)
            return self.client_graph(models, data, key, own, batch_size)

        with concurrent.futures.ThreadPoolExecutor(self.parallel_clients) as pool:
            return list(pool.map(alone, clients))

    def looped(self, models: tuple, clients: Sequence[dict], batch_size: int) -> list:
        """The clients' scores, each run of them taking at most `LOOPED_CALL_BYTES` of
        examples in one looped call."""
        datas = [c.data for c in clients]
        sizes = [example_count(d) for d in datas]
        example_bytes = sum(
            np.asarray(a).dtype.itemsize * int(np.prod(np.shape(a)[1:])) for a in datas[0].values()
        )
        scores: list = []
        for run in byte_runs(sizes, example_bytes, LOOPED_CALL_BYTES):
            rows = type(datas[0])(
                (name, np.concatenate([datas[i][name] for i in run])) for name in datas[0]
            )
            counts = np.asarray([sizes[i] for i in run], np.int64)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            keys = np.stack([clients[i].key for i in run])
            own = stacked_values([clients[i].stored for i in run])
            scored = self.looped_graph(models, rows, starts, counts, keys, own, batch_size)
            scores += [
                collections.OrderedDict((k, v[j]) for k, v in scored.items())
                for j in range(len(run))
            ]
        return scores

    def vectorised(
        self, models: tuple, clients: Sequence[dict], batch_size: int, groups: list[list[int]]
    ) -> list:
        """The clients' scores, each group of `groups` (indices into `clients`) in one
        vectorised call, the clients in groups of their own looped over."""
        sizes = [example_count(c.data) for c in clients]

        def padded(members: list[int]) -> bool:
            return min(sizes[i] for i in members) < max(sizes[i] for i in members)

        together = [g for g in groups if len(g) > 1]
        for members in together:  # built here, not by two threads at once (pfor takes seconds)
            self.stacked_graph(padded(members))

        def score_group(members: list[int]) -> list[dict]:
            group_sizes = [sizes[i] for i in members]
            keys = np.stack([clients[i].key for i in members])
            own = stacked_values([clients[i].stored for i in members])
            data = stacked_padded([clients[i].data for i in members], max(group_sizes))
            sizes_in = [np.asarray(group_sizes, np.int64)] if padded(members) else []
            graph = self.stacked_graph(padded(members))
            scored = graph(models, data, keys, own, batch_size, *sizes_in)
            return [
                collections.OrderedDict((k, v[row]) for k, v in scored.items())
                for row in range(len(members))
            ]

        scores: list = [None] * len(clients)
        with concurrent.futures.ThreadPoolExecutor(self.parallel_clients) as pool:
            for members, scored in zip(together, pool.map(score_group, together)):
                for i, client_scores in zip(members, scored):
                    scores[i] = client_scores
        left = [g[0] for g in groups if len(g) == 1]
        looped = self.score("looped", models, [clients[i] for i in left], batch_size)
        for i, client_scores in zip(left, looped):
            scores[i] = client_scores
        return scores
