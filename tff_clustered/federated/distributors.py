"""The TF side of a round's distribution: what each client receives and starts from.

The TF side of a round's distribution: what the server sends each client, and what the
client makes of it before its work starts (the shared variables it starts from, the cluster its
update counts in, and what else its work reads). One class per way of distributing, made by the
signature's `Distribution` (`distributions.py`):

* `OwnClusterDistributor`: the server picks; the client trains the shared variables of the
  cluster its key names (FedAvg, FedGroup, FeSEM, ...). Every cluster's are broadcast and the
  client takes its key's row, unless `tff.federated_select`, sending each client its own, costs
  less (`OwnClusterDistributor.sends_every_cluster`: many clusters of a large model). What a
  deployment would send each client, its own cluster's model, is what the algorithms report as
  communication (`values_sent_per_round`);
* `LowestLossDistributor`: every cluster's shared variables are broadcast and the client joins
  the one of lowest loss on its training data (IFCA, Ghosh et al. 2020, Alg. 2), reporting its
  pick;
* `NearestCentreDistributor`: every cluster's shared variables are broadcast; the client trains
  from its key's row, then joins the row nearest its trained model and sends its update
  against that row (FeSEM's E-step, Long et al. 2023, Eq. 8, on the client), reporting its
  pick;
* `NeighboursDistributor`: the server state is a mailbox of every peer's published model; a
  client is sent the rows its key names, its own first, and reads the others as its inbox
  (decentralized peers: DisPFL, UA-PDFL). The server only routes: nothing is aggregated
  (`relays`).

Each is a pure TF function of the selection, called inside the client's computation on every
execution (the TFF round, in process, sharded).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated.batching import ArrayBatches
from tff_clustered.federated.client_work import RoutedRows


@dataclasses.dataclass(frozen=True)
class Received:
    """What a client starts from: the shared variables it joins with its stored ones, the
    cluster (server row) its update counts in, and, for a decentralized peer, the rows routed
    to it (`ClientInputs.routed`)."""

    selected: tuple
    cluster: tf.Tensor
    routed: Optional[RoutedRows] = None


@dataclasses.dataclass(frozen=True)
class ClientSide:
    """One client's inputs as its distributor reads them: `selection` is what the server sent
    (a dataset of selections from `federated_select`, or the selection itself in process; every
    cluster's shared variables stacked when `sends_every_cluster`), `data` its arrays, `key` its
    key, `size` its real rows when its arrays are padded (None: all)."""

    selection: Any
    stored: tuple
    data: dict
    key: tf.Tensor
    hparams: dict
    size: Optional[tf.Tensor] = None


# What sending a client its model costs on TFF's runtime, in ms and ms per MB sent, as measured
# by `benchmark.py --benchmarks=tff_client_costs` on 2 cores: `tff.federated_select`
# builds a dataset per client; a broadcast is a reference on the worker, but each client's
# computation gets a copy. `OwnClusterDistributor` takes the cheaper of the two.
SELECT_MS, SELECT_MS_PER_MB = 3.0, 1.4
BROADCAST_MS, BROADCAST_MS_PER_MB = 0.3, 0.1

# (shared variables, stored variables, batches) -> the mean loss of the joined model on them.
MeanLoss = Callable[[tuple, tuple, Any], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class Distributor:
    """Base: the server side (`select_shared`, `every_cluster_shared`: the variables
    `shared` of the cluster models) and a selection read as rows of them (`shared_spec`)."""

    shared: tuple[int, ...]
    shared_spec: tuple
    sends_every_cluster: ClassVar[bool] = False  # broadcast every cluster (else select by key)
    relays: ClassVar[bool] = False  # nothing aggregated: the rows are the peers' to rewrite

    def select_shared(self, cluster_models: tuple, key: tf.Tensor) -> tuple:
        """What a client of cluster `key` is sent (federated_select's select function). The key
        leads the selection so that it is never an empty structure (TF datasets cannot hold
        one), which purely local models (nothing shared) would give."""
        return (key, *(tf.gather(cluster_models[i], key) for i in self.shared))

    def every_cluster_shared(self, cluster_models: tuple) -> tuple:
        """What a client that picks its cluster is sent: every cluster's shared variables."""
        return tuple(cluster_models[i] for i in self.shared)

    def rows(self, selection: Any, num_rows: int = 1) -> tuple:
        """The selected rows' shared variables, stacked per variable (`num_rows` first): from
        a dataset of selections, or from `select_shared` given every key at once (in
        process). A selection leads with its key (`select_shared`), dropped here."""
        if isinstance(selection, tuple):
            return selection[1:]
        initial = (
            tf.zeros([num_rows], tf.int32),
            *(tf.zeros([num_rows, *s.shape]) for s in self.shared_spec),
        )
        batched = selection.batch(num_rows, drop_remainder=True)
        return batched.reduce(initial, lambda _, x: x)[1:]

    def first_row(self, selection: Any) -> tuple:
        """The shared variables of a selection of one row."""
        if isinstance(selection, tuple):
            return selection[1:]
        initial = (tf.constant(0), *(tf.zeros(s.shape) for s in self.shared_spec))
        return selection.reduce(initial, lambda _, x: x)[1:]

    def handed(self, cluster_models: tuple, key: tf.Tensor) -> Any:
        """What a client of `key` is handed, computed directly (in process), where the TFF
        round broadcasts `every_cluster_shared` or places `select_shared` by
        `federated_select`."""
        if self.sends_every_cluster:
            return self.every_cluster_shared(cluster_models)
        return self.select_shared(cluster_models, key[0])

    def receive(self, client: ClientSide) -> Received:
        raise NotImplementedError

    def settle(self, client: ClientSide, received: Received, trained: tuple) -> Received:
        """After the client's work: the cluster its update counts in and the shared variables
        the update is taken against, from what it `received` and its `trained` shared
        variables (in `shared`'s order). By default what it received: its start."""
        return received

    def same_for_every_client(self, num_clusters: int) -> bool:
        """Whether every client of a round of `num_clusters` cluster models is sent the same
        selection (`select_shared` with key 0). Where the TFF round selects by key (the
        per-client evaluation, or clusters too large to broadcast), it then broadcasts that
        selection, which costs less than `tff.federated_select`'s dataset per client
        (`SELECT_MS`, `BROADCAST_MS`)."""
        return False


@dataclasses.dataclass(frozen=True)
class OwnClusterDistributor(Distributor):
    """`num_clusters`: the cluster models of the built round."""

    num_clusters: int = 1

    @property
    def sends_every_cluster(self) -> bool:  # type: ignore[override]
        """Whether the TFF round broadcasts every cluster's shared variables (the client taking
        its key's row) rather than selecting each client's by `tff.federated_select`: when the
        broadcast's copy of all `num_clusters` costs no more than a select of one (the
        measured costs above). By these constants that holds up to 83 clusters of the MLP's
        407 KB, and up to 15 of a 24 MB model."""
        megabytes = sum(int(np.prod(s.shape)) * s.dtype.size for s in self.shared_spec) / 2**20
        broadcast = BROADCAST_MS + BROADCAST_MS_PER_MB * self.num_clusters * megabytes
        return broadcast <= SELECT_MS + SELECT_MS_PER_MB * megabytes

    def same_for_every_client(self, num_clusters: int) -> bool:
        return num_clusters == 1  # the one cluster's model

    def receive(self, client: ClientSide) -> Received:
        """The row of the cluster the client's key names."""
        cluster = client.key[0]
        if self.sends_every_cluster:
            return Received(tuple(tf.gather(t, cluster) for t in client.selection), cluster)
        return Received(self.first_row(client.selection), cluster)


def least_in_use(every: tuple, scores: list, hparams: dict) -> Received:
    """The row of `every` (each shared variable stacked by cluster) of least score among the
    clusters in use (`hparams["num_clusters"]`: the padding ones are never picked; ties: the
    lowest index), as what the client's update counts in."""
    in_use = [
        tf.where(float(j) < hparams["num_clusters"], score, np.inf)
        for j, score in enumerate(scores)
    ]
    cluster = tf.argmin(tf.stack(in_use), output_type=tf.int32)
    return Received(tuple(tf.gather(t, cluster) for t in every), cluster)


@dataclasses.dataclass(frozen=True)
class LowestLossDistributor(Distributor):
    """`num_clusters` clusters in the built round (the padding ones never picked: the round's
    `hparams["num_clusters"]` says how many are in use); `mean_loss` scores a joined model."""

    num_clusters: int = 1
    mean_loss: Optional[MeanLoss] = None
    sends_every_cluster: ClassVar[bool] = True

    def receive(self, client: ClientSide) -> Received:
        """IFCA's cluster estimate: the in-use cluster whose model has the lowest mean loss on
        one ordered pass over the client's training data (ties: the lowest index)."""
        every = client.selection
        batches = ArrayBatches(client.data, client.hparams["eval_batch_size"], size=client.size)
        losses = [
            self.mean_loss(tuple(t[j] for t in every), client.stored, batches)
            for j in range(self.num_clusters)
        ]
        return least_in_use(every, losses, client.hparams)


@dataclasses.dataclass(frozen=True)
class NearestCentreDistributor(Distributor):
    """`num_clusters` clusters in the built round (the padding ones never picked: the round's
    `hparams["num_clusters"]` says how many are in use); `trainable`: how many of `shared`
    are trainable (the distance's variables: they lead `shared`)."""

    num_clusters: int = 1
    trainable: int = 0
    sends_every_cluster: ClassVar[bool] = True

    def receive(self, client: ClientSide) -> Received:
        """The row of the cluster the client's key names: the centre it trains from."""
        cluster = client.key[0]
        return Received(tuple(tf.gather(t, cluster) for t in client.selection), cluster)

    def settle(self, client: ClientSide, received: Received, trained: tuple) -> Received:
        """FeSEM's E-step (Long et al. 2023, Eq. 8) on the client: the in-use row at least
        squared L2 distance from the trained model over the trainable shared values (ties: the
        lowest index); the update is then taken against that row."""
        every = client.selection
        distances = [
            sum(
                (tf.reduce_sum(tf.square(trained[i] - every[i][j])) for i in range(self.trainable)),
                tf.constant(0.0),
            )
            for j in range(self.num_clusters)
        ]
        return least_in_use(every, distances, client.hparams)


@dataclasses.dataclass(frozen=True)
class NeighboursDistributor(Distributor):
    """`num_rows`: the client's own row and its neighbours'; `features`: the model's feature
    extractor, for work that compares models on inputs (UA-PDFL's I^Aux)."""

    num_rows: int = 1
    features: Any = None
    relays: ClassVar[bool] = True

    def handed(self, cluster_models: tuple, key: tf.Tensor) -> Any:
        return self.select_shared(cluster_models, key)  # every row the key names

    def receive(self, client: ClientSide) -> Received:
        rows = self.rows(client.selection, self.num_rows)
        weights = tf.gather(client.hparams["row_weights"], client.key)
        routed = RoutedRows(rows, weights, client.key, self.features)
        return Received(tuple(t[0] for t in rows), client.key[0], routed)
