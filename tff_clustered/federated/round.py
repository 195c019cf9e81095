"""The cluster-indexed federated round, composed from swappable parts and built per signature.

Server state holds `num_clusters` models stacked along a leading cluster axis. A round follows
`tff.learning.templates` (distributor -> client work -> aggregator -> finalizer):

* distributor: `tff.federated_select` sends each client the **shared** variables of its own
  cluster (its key); the client joins them with the rest of its **own stored model** (a
  CLIENTS-placed input from the per-client store). A client work that reads its whole stored
  model (Ditto's personal model) gets all of it as well. Two options of the signature send
  more: `distribution="lowest_loss_cluster"` broadcasts every cluster's shared variables and
  the client trains the one of lowest loss on its data (IFCA), reporting its pick; `anchor`
  broadcasts an extra server model (some trainable tensors, held in the server state) that the
  client work reads as an anchor (FedAC's global embedding);
* client work: a `ClientWork` parameter, a pure TF function (`client_work.LocalSGD`,
  `client_work.DittoSGD`, ...). A client is sent its examples as arrays (any length) and
  builds its batches itself from the round's hyperparameters and its shuffle seed
  (`federated_data.ArrayBatches`, the stateless order of `federated_data.batch_order`,
  no tf.data pipeline per client: it cost 18 ms per client and call): the worker never
  deserializes a `tf.data` graph per client and round, which kept part of each one alive,
  and the training loop is a `tf.while_loop` that runs where the graph is placed (a GPU in the
  in-process execution), not inside tf.data's CPU-only runtime;
* aggregator: `ClusteredMeanFactory`, the weighted mean per cluster of the shared variables'
  updates (weights: examples processed, or 1 per client);
* finalizer: adds each cluster's mean update to its shared variables. A cluster no sampled
  client trained in gets a zero update and keeps its model bit for bit; non-shared variables
  of the server models are never touched.

Variables are the model's trainable tensors followed by its state tensors (BatchNorm moving
statistics); a state tensor is shared exactly when the trainable tensor that owns it (its BN
layer's gamma) is. Which variables are shared and how many clusters there are are per-round
data: `executions.RoundCache` builds one round per `RoundSignature` and reuses it whenever the
signature comes back (FedTSDP's moving boundary, CFL's growing cluster count).

`tff.learning.templates.compose_learning_process` cannot express this round: its `next` takes
only `(state, client_data)` and returns nothing per client, while we need cluster keys and
stored client variables in, and stored client variables and model updates out. So the parts
are composed by hand into `initialize` and a `next` that returns
`(state, client_outputs@CLIENTS, measurements@SERVER)`.

The parts are plain TF functions (`round_functions`) before any runtime wraps them: `tff_round`
makes them TFF computations, and `in_process.in_process_round` runs the same functions with
the same aggregation math as `tf.function`s inside this process (a GPU, when TensorFlow sees
one). Both give the same results for the same seeds.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.data.federated_data import ArrayBatches
from tff_clustered.federated import client_work
from tff_clustered.federated.clustered_mean import ClusteredMeanFactory, ClusterSums, cluster_mean
from tff_clustered.models.functional import FunctionalModel

to_type = tff.types.tensorflow_to_type  # TF specs -> TFF types (0.87's tff.to_type rejects them)
CLIENT_WEIGHTINGS = ("num_examples", "uniform")
# What the distributor sends each client: its own cluster's shared variables (chosen by the
# server), or every cluster's, the client joining the one of lowest loss on its data (IFCA), or
# the rows its keys name, its own first (decentralized peers: the server state is a mailbox of
# every peer's published model and only routes them; UA-PDFL).
DISTRIBUTIONS = ("own_cluster", "lowest_loss_cluster", "neighbours")


def sequence_type(element_spec: object) -> tff.SequenceType:
    return tff.SequenceType(to_type(element_spec))


def evaluation_batch_size(batch_size: int) -> int:
    """Batch size of a scoring pass (no gradients: larger batches, same sums)."""
    return max(int(batch_size), 64)


def round_hparams(
    learning_rate: float,
    batch_size: int,
    epochs: int = 1,
    *,
    num_clusters: float = np.inf,
    max_steps: int = -1,
    row_weights: Optional[Sequence[float]] = None,
    round_num: int = 0,
    total_rounds: int = 0,
) -> dict:
    """The SERVER-placed per-round hyperparameters `next` takes (broadcast to clients): the
    learning rate; how many of the built round's clusters are in use (a client that picks its
    cluster never picks a padding one); and how each client batches its arrays: `epochs`
    passes of `batch_size` (-1: without end), cut after `max_steps` minibatches (-1: no cut),
    the scoring pass's batch size, a weight per server row (the examples its peer holds,
    read by peers that receive rows; one 1 otherwise), and where the round stands in the run
    (`round_num` of `total_rounds`, 1-based; 0 of 0 outside a run), for client work with a
    schedule (DisPFL's mask annealing)."""
    return collections.OrderedDict(
        learning_rate=np.float32(learning_rate),
        num_clusters=np.float32(num_clusters),
        batch_size=np.int64(batch_size),
        epochs=np.int64(epochs),
        max_steps=np.int64(max_steps),
        eval_batch_size=np.int64(evaluation_batch_size(batch_size)),
        row_weights=np.asarray([1.0] if row_weights is None else row_weights, np.float32),
        round_num=np.int64(round_num),
        total_rounds=np.int64(total_rounds),
    )


def client_seed(shuffle: int, dropout: int) -> dict:
    """One client's seeds for a round: its batches' shuffle, and its stateless random ops'
    (dropout) `[dropout, 0]`."""
    return collections.OrderedDict(
        shuffle=np.int64(shuffle), dropout=np.array([dropout, 0], np.int32)
    )


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    """Shapes of a model's variables (trainable, then state) and which trainable tensor owns
    each state tensor."""

    trainable_shapes: tuple[tuple[int, ...], ...]
    state_shapes: tuple[tuple[int, ...], ...] = ()
    state_owner: tuple[int, ...] = ()

    @classmethod
    def of(cls, model: FunctionalModel) -> ModelLayout:
        return cls(model.trainable_shapes, model.state_shapes, model.state_owner)

    @property
    def num_trainable(self) -> int:
        return len(self.trainable_shapes)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return self.trainable_shapes + self.state_shapes

    @property
    def num_variables(self) -> int:
        return len(self.shapes)

    def variables_of(self, trainable: Sequence[int]) -> tuple[int, ...]:
        """Variable indices of trainable tensors `trainable` and of the state they own."""
        chosen = set(trainable)
        owned = [self.num_trainable + j for j, o in enumerate(self.state_owner) if o in chosen]
        return tuple(sorted(chosen)) + tuple(owned)

    def complement(self, variables: Sequence[int]) -> tuple[int, ...]:
        chosen = set(variables)
        return tuple(i for i in range(self.num_variables) if i not in chosen)


@dataclasses.dataclass(frozen=True)
class RoundSignature:
    """Everything a built round depends on besides the model; the cache key.

    `shared`: trainable tensor indices each client receives from its cluster (and whose updates
    are aggregated); the rest comes from its own stored model. `keep_client_models`: clients
    return their whole trained model to the store (stateful clients), not only the rest.
    `return_model_deltas`: clients also return the flattened update of all their variables
    (server-side clustering needs it). `distribution`: see `DISTRIBUTIONS`. `anchor`: trainable
    tensor indices of an extra model the server broadcasts to every client beside its cluster's
    (FedAC's global embedding); the client work reads it as `ClientInputs.anchor`.
    `num_neighbours`: with `distribution="neighbours"`, how many rows besides its own each
    client receives (its key holds its own row, then theirs); the work reads them stacked as
    `ClientInputs.inbox` and nothing is aggregated on the server.
    """

    num_clusters: int
    shared: tuple[int, ...]
    work: Any = client_work.LocalSGD()
    keep_client_models: bool = False
    return_model_deltas: bool = False
    client_weighting: str = "num_examples"
    distribution: str = "own_cluster"
    anchor: tuple[int, ...] = ()
    num_neighbours: int = 0

    def __post_init__(self) -> None:
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {self.num_clusters}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution}"
            )
        if self.num_neighbours < 0 or (self.num_neighbours and self.distribution != "neighbours"):
            raise ValueError("num_neighbours >= 1 goes with distribution='neighbours'")
        if self.client_weighting not in CLIENT_WEIGHTINGS:
            raise ValueError(
                f"client_weighting must be one of {CLIENT_WEIGHTINGS}, got {self.client_weighting}"
            )


@dataclasses.dataclass(frozen=True)
class RoundIO:
    """Which variables travel where in a round of one signature."""

    shared: tuple[int, ...]  # from the cluster, aggregated
    store_in: tuple[int, ...]  # from the client's stored model
    store_out: tuple[int, ...]  # back into the client's stored model

    @classmethod
    def of(cls, layout: ModelLayout, signature: RoundSignature) -> RoundIO:
        shared = layout.variables_of(signature.shared)
        rest = layout.complement(shared)
        everything = tuple(range(layout.num_variables))
        store_in = everything if signature.work.reads_own_model else rest
        keep_all = signature.keep_client_models or signature.work.reads_own_model
        return cls(shared, store_in, everything if keep_all else rest)


@dataclasses.dataclass
class FederatedRound:
    """A built round of one signature: `initialize() -> state`, `next(state, datasets, keys,
    stored, client_scalars, seeds, hparams) -> (state, client_outputs, measurements)` and
    `evaluate(cluster_models, datasets, keys, stored, batch_size) -> client results`, whichever
    execution runs them (TFF computations, or `in_process.InProcessRound`)."""

    initialize: Callable[..., Any]
    next: Callable[..., Any]
    evaluate: Callable[..., Any]
    signature: RoundSignature
    io: RoundIO
    layout: ModelLayout


def check_client_inputs(*per_client: Sequence[Any]) -> None:
    """`next`'s per-client arguments must hold one entry per client each."""
    lengths = {len(values) for values in per_client}
    if len(lengths) > 1:
        raise ValueError(f"per-client inputs of different lengths: {sorted(lengths)}")


def example_count(data: dict) -> int:
    """Examples in one client's arrays (the length of the first)."""
    return len(next(iter(data.values())))


def python_server_state(
    cluster_models: Sequence[Any], anchor: Optional[Sequence[Any]]
) -> collections.OrderedDict:
    """The round's server state as the TFF round returns it, for executions that build it in
    Python: cluster models, the anchor when the round has one, the aggregator's (empty) state."""
    state = collections.OrderedDict(cluster_models=tuple(cluster_models))
    if anchor is not None:
        state["anchor"] = tuple(anchor)
    state["aggregator"] = ()
    return state


@dataclasses.dataclass(frozen=True)
class RoundFunctions:
    """The TF functions of one signature's round and the specs of what they take, before any
    execution wraps them. The TFF round makes them `tff.tensorflow.computation`s placed by
    federated operators; the in-process round runs the very same functions as `tf.function`s.

    * `select_shared(cluster_models, key)`: the selection a client of cluster `key` is sent,
      `(key, *its shared variables)` (federated_select's select function);
    * `every_cluster_shared(cluster_models)`: what a client that picks its cluster is sent;
    * `client_update(distributed, stored, data, key, client_scalar, seed, hparams, anchor)`: one
      client's work -> `(shared_delta, cluster_weight, outputs)`; `distributed` is a dataset of
      the one selection, or every cluster's shared variables;
    * `padded_client_update(..., anchor, size)`: the same for a client holding the first
      `size` rows of `data` (padded arrays, masked batches: `ArrayBatches`; exact for a
      `rows_independent` model), None for all of them;
    * `apply_cluster_updates(cluster_models, mean_deltas)`: the finalizer;
    * `client_evaluate(selected, stored, data, batch_size)`: one client's scores.
    The aggregation between them is `clustered_mean`'s `add_to_cluster` and `cluster_mean`.
    """

    signature: RoundSignature
    io: RoundIO
    layout: ModelLayout
    cluster_models_spec: tuple
    shared_spec: tuple
    store_in_spec: tuple
    anchor_spec: tuple
    data_spec: dict
    key_spec: tf.TensorSpec
    seed_spec: dict
    hparams_spec: dict
    initial_cluster_models: tuple
    initial_anchor: tuple
    select_shared: Callable[..., tuple]
    every_cluster_shared: Callable[..., tuple]
    client_update: Callable[..., tuple]
    padded_client_update: Callable[..., tuple]
    apply_cluster_updates: Callable[..., tuple]
    client_evaluate: Callable[..., dict]
    rows_independent: bool = False  # the model's `rows_independent`: padded clients are exact

    @property
    def num_clusters(self) -> int:
        return self.signature.num_clusters

    @property
    def picks_cluster(self) -> bool:
        return self.signature.distribution == "lowest_loss_cluster"

    @property
    def routes_rows(self) -> bool:
        return self.signature.distribution == "neighbours"

    @property
    def selection_spec(self) -> tuple:
        return (tf.TensorSpec([], tf.int32), *self.shared_spec)

    def stacked_shared_spec(self) -> tuple:
        k = self.num_clusters
        return tuple(tf.TensorSpec([k, *s.shape], s.dtype) for s in self.shared_spec)


def round_functions(
    model: FunctionalModel,
    input_spec: dict,
    signature: RoundSignature,
    initial_variables: Sequence[np.ndarray],
) -> RoundFunctions:
    """The round's TF functions for one model and signature (see `RoundFunctions`)."""
    layout = ModelLayout.of(model)
    io = RoundIO.of(layout, signature)
    shapes = layout.shapes
    if [tuple(np.shape(v)) for v in initial_variables] != list(shapes):
        raise ValueError("initial variables do not match the model's variable shapes")
    k = signature.num_clusters
    num_trainable = layout.num_trainable
    work = signature.work
    picks_cluster = signature.distribution == "lowest_loss_cluster"
    routes_rows = signature.distribution == "neighbours"
    num_rows = 1 + signature.num_neighbours

    def specs(indices: Sequence[int], lead: tuple[int, ...] = ()) -> tuple[tf.TensorSpec, ...]:
        return tuple(tf.TensorSpec([*lead, *shapes[i]], tf.float32) for i in indices)

    def forward(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple]:
        return model.apply(weights, state, x, training, seed)

    shared_spec = specs(io.shared)
    features = model.features

    def join(
        selected: Sequence[tf.Tensor], stored: Sequence[tf.Tensor]
    ) -> tuple[tuple, tuple, tuple, tuple]:
        """(weights, state) of the start model, and (weights, state) of the whole own model
        when the work reads it."""
        variables: list = [None] * len(shapes)
        own: list = [None] * len(shapes)
        for i, t in zip(io.store_in, stored):
            variables[i] = t
            own[i] = t
        for i, t in zip(io.shared, selected):
            variables[i] = t
        if not work.reads_own_model:
            own = []
        return (
            tuple(variables[:num_trainable]),
            tuple(variables[num_trainable:]),
            tuple(own[:num_trainable]),
            tuple(own[num_trainable:]),
        )

    def select_shared(cluster_models: tuple, key: tf.Tensor) -> tuple:
        # The key leads the selection so that it is never an empty structure (TF datasets
        # cannot hold one), which purely local models (nothing shared) would give.
        return (key, *(tf.gather(cluster_models[i], key) for i in io.shared))

    def every_cluster_shared(cluster_models: tuple) -> tuple:
        return tuple(cluster_models[i] for i in io.shared)

    def stacked_rows(selected: Any) -> tuple:
        """Every selected row, stacked per variable (`num_rows` first): from a dataset of the
        selections (what `federated_select` hands a client) or from `select_shared` given
        every key at once (the in-process round)."""
        if isinstance(selected, tuple):
            return selected[1:]
        initial = (
            tf.zeros([num_rows], tf.int32),
            *(tf.zeros([num_rows, *s.shape]) for s in shared_spec),
        )
        batched = selected.batch(num_rows, drop_remainder=True)
        return batched.reduce(initial, lambda _, x: x)[1:]

    def first_element(selected: Any) -> tuple:
        """The shared variables of a selection: a dataset of one (what `federated_select`
        hands a client), or the selection itself (the in-process round)."""
        if isinstance(selected, tuple):
            return selected[1:]
        initial = (tf.constant(0), *(tf.zeros(s.shape) for s in shared_spec))
        return selected.reduce(initial, lambda _, x: x)[1:]

    def lowest_loss_cluster(
        every_shared: tuple, stored: tuple, dataset: tf.data.Dataset, num_clusters: tf.Tensor
    ) -> tf.Tensor:
        """IFCA's cluster estimate (Ghosh et al., Alg. 2): the in-use cluster whose model has
        the lowest mean loss on `dataset` (ties: the lowest index)."""
        losses = []
        for j in range(k):
            weights, state, _, _ = join(tuple(t[j] for t in every_shared), stored)
            scores = client_work.evaluate_client(forward, weights, dataset, state)
            loss = scores.loss_sum / tf.maximum(scores.num_examples, 1.0)
            losses.append(tf.where(float(j) < num_clusters, loss, np.inf))
        return tf.argmin(tf.stack(losses), output_type=tf.int32)

    def client_update(
        distributed: object,
        stored: tuple,
        data: object,
        key: tf.Tensor,
        client_scalar: tf.Tensor,
        seed: dict,
        hparams: dict,
        anchor: tuple,
    ) -> tuple:
        return padded_client_update(
            distributed, stored, data, key, client_scalar, seed, hparams, anchor, None
        )

    def padded_client_update(
        distributed: object,
        stored: tuple,
        data: object,
        key: tf.Tensor,
        client_scalar: tf.Tensor,
        seed: dict,
        hparams: dict,
        anchor: tuple,
        size: Optional[tf.Tensor],
    ) -> tuple:
        dataset = ArrayBatches(
            data,
            hparams["batch_size"],
            hparams["epochs"],
            seed["shuffle"],
            hparams["max_steps"],
            size=size,
        )
        routed: dict = {}  # what a decentralized peer reads besides its own model
        if routes_rows:  # its own published model first, then its neighbours'
            inbox = stacked_rows(distributed)
            selected = tuple(t[0] for t in inbox)
            routed = dict(
                inbox=inbox,
                inbox_weights=tf.gather(hparams["row_weights"], key),
                inbox_rows=key,
                features=features,
            )
            cluster = key[0]
        elif picks_cluster:  # scored on one ordered pass over its training data
            cluster = lowest_loss_cluster(
                distributed,
                stored,
                ArrayBatches(data, hparams["eval_batch_size"], size=size),
                hparams["num_clusters"],
            )
            selected = tuple(tf.gather(t, cluster) for t in distributed)
        else:
            cluster = key[0]
            selected = first_element(distributed)
        weights, state, own_weights, own_state = join(selected, stored)
        result = work(
            forward,
            client_work.ClientInputs(
                weights,
                state,
                own_weights,
                own_state,
                dataset,
                hparams["learning_rate"],
                client_scalar,
                seed["dropout"],
                tuple(anchor),
                signature.anchor,
                round_num=hparams["round_num"],
                total_rounds=hparams["total_rounds"],
                **routed,
            ),
        )
        start = weights + state
        trained = tuple(result.weights) + tuple(result.state)
        kept = tuple(result.own_weights) + tuple(result.own_state)
        # A diverged client (NaN or infinity anywhere in what it trained) must not poison its
        # cluster: its update counts as zero with zero weight, and it reports `finite=False`.
        finite = tf.reduce_all(
            [tf.math.is_finite(result.loss_sum)]
            + [tf.reduce_all(tf.math.is_finite(t)) for t in trained + kept]
        )
        shared_delta = tuple(
            tf.where(finite, trained[i] - start[i], tf.zeros_like(start[i])) for i in io.shared
        )
        weight = result.num_examples if signature.client_weighting == "num_examples" else 1.0
        cluster_weight = tf.one_hot(cluster, k, dtype=tf.float32) * weight
        cluster_weight *= tf.cast(finite, tf.float32)
        outputs = collections.OrderedDict(
            stored=tuple(kept[i] for i in io.store_out),
            num_examples=result.num_examples,
            loss_sum=result.loss_sum,
            cluster=cluster,
            finite=finite,
        )
        if result.metrics:
            outputs["metrics"] = result.metrics
        if signature.return_model_deltas:
            outputs["model_delta"] = client_work.flatten([t - s for t, s in zip(trained, start)])
        return shared_delta, cluster_weight, outputs

    def apply_cluster_updates(cluster_models: tuple, mean_deltas: tuple) -> tuple:
        updated = list(cluster_models)
        for i, delta in zip(io.shared, mean_deltas):
            updated[i] = cluster_models[i] + delta
        return tuple(updated)

    def client_evaluate(
        selected: tf.data.Dataset, stored: tuple, data: object, batch_size: tf.Tensor
    ) -> dict:
        weights, state, own_weights, own_state = join(first_element(selected), stored)
        if work.reads_own_model:  # the client's own (personal) model is what it uses
            weights, state = own_weights, own_state
        dataset = ArrayBatches(data, batch_size)
        return client_work.evaluate_client(forward, weights, dataset, state)._asdict()

    return RoundFunctions(
        signature=signature,
        io=io,
        layout=layout,
        cluster_models_spec=specs(range(len(shapes)), (k,)),
        shared_spec=shared_spec,
        store_in_spec=specs(io.store_in),
        anchor_spec=specs(signature.anchor),
        data_spec=collections.OrderedDict(
            (name, tf.TensorSpec([None, *spec.shape[1:]], spec.dtype))
            for name, spec in input_spec.items()
        ),
        key_spec=tf.TensorSpec([1 + signature.num_neighbours], tf.int32),
        seed_spec=collections.OrderedDict(
            (name, tf.TensorSpec(np.shape(v), tf.as_dtype(v.dtype)))
            for name, v in client_seed(0, 0).items()
        ),
        hparams_spec=collections.OrderedDict(
            (name, tf.TensorSpec([None] * np.ndim(v), tf.as_dtype(v.dtype)))
            for name, v in round_hparams(0, 1).items()
        ),
        initial_cluster_models=tuple(
            np.repeat(np.asarray(v, np.float32)[None], k, axis=0) for v in initial_variables
        ),
        initial_anchor=tuple(
            np.asarray(initial_variables[i], np.float32) for i in signature.anchor
        ),
        select_shared=select_shared,
        every_cluster_shared=every_cluster_shared,
        client_update=client_update,
        padded_client_update=padded_client_update,
        apply_cluster_updates=apply_cluster_updates,
        client_evaluate=client_evaluate,
        rows_independent=model.rows_independent,
    )


def build_round(
    model: FunctionalModel,
    input_spec: dict,
    signature: RoundSignature,
    initial_variables: Sequence[np.ndarray],
) -> FederatedRound:
    """Builds `initialize`/`next` and `evaluate` as TFF computations for one model and
    signature.

    `initial_variables` (one model's trainable tensors then its state) initialise every cluster
    in `initialize`; the orchestration passes its own server state to `next`.
    """
    return tff_round(round_functions(model, input_spec, signature, initial_variables))


@dataclasses.dataclass(frozen=True)
class TffRoundParts:
    """The round's TFF computations. `next` is the whole round on one worker; `partial_next`
    (same arguments) stops after the clients' work and returns, besides the client outputs,
    the per-cluster weighted sums of their updates and the per-cluster total weight (both
    SERVER-placed), and `finalize(cluster_models, sums, total_weight) -> cluster_models` turns
    sums, added up over any split of the clients, into the new cluster models. `next` equals
    `partial_next` followed by `finalize` (`sharded.py` runs them on several workers)."""

    initialize: tff.Computation
    next: tff.Computation
    partial_next: tff.Computation
    finalize: tff.Computation
    evaluate: tff.Computation
    functions: RoundFunctions

    def as_round(self) -> FederatedRound:
        fns = self.functions
        return FederatedRound(
            initialize=self.initialize,
            next=self.next,
            evaluate=self.evaluate,
            signature=fns.signature,
            io=fns.io,
            layout=fns.layout,
        )


def tff_round(fns: RoundFunctions) -> FederatedRound:
    """The round's functions composed as TFF computations (see the module docstring)."""
    return tff_round_parts(fns).as_round()


def tff_round_parts(fns: RoundFunctions) -> TffRoundParts:
    """The TFF computations of the round (`TffRoundParts`)."""
    signature, k = fns.signature, fns.num_clusters
    has_anchor = bool(signature.anchor)
    data_type = to_type(fns.data_spec)
    cluster_models_type = to_type(fns.cluster_models_spec)
    store_in_type = to_type(fns.store_in_spec)
    select_shared = tff.tensorflow.computation(cluster_models_type, tff.TensorType(np.int32))(
        fns.select_shared
    )
    every_cluster_shared = tff.tensorflow.computation(cluster_models_type)(fns.every_cluster_shared)
    selection_type = sequence_type(fns.selection_spec)
    stacked_shared_type = to_type(fns.stacked_shared_spec())
    distributed_type = stacked_shared_type if fns.picks_cluster else selection_type

    client_types = [
        distributed_type,
        store_in_type,
        data_type,
        to_type(fns.key_spec),
        tff.TensorType(np.float32),
        to_type(fns.seed_spec),
        to_type(fns.hparams_spec),
    ]
    # TFF computations take no default arguments: the anchor is a parameter only when sent.
    if has_anchor:
        client_types.append(to_type(fns.anchor_spec))
        client_update = tff.tensorflow.computation(*client_types)(fns.client_update)
    else:
        client_update = tff.tensorflow.computation(*client_types)(
            lambda distributed, stored, data, key, client_scalar, seed, hparams: fns.client_update(
                distributed, stored, data, key, client_scalar, seed, hparams, ()
            )
        )

    aggregator = ClusteredMeanFactory(k).create(
        to_type(fns.shared_spec), tff.TensorType(np.float32, [k])
    )
    apply_cluster_updates = tff.tensorflow.computation(cluster_models_type, stacked_shared_type)(
        fns.apply_cluster_updates
    )

    def server_state(cluster_models: object, anchor: object, aggregator_state: object) -> object:
        parts = collections.OrderedDict(cluster_models=cluster_models)
        if has_anchor:
            parts["anchor"] = anchor
        parts["aggregator"] = aggregator_state
        return tff.federated_zip(parts)

    @tff.federated_computation()
    def initialize() -> object:
        return server_state(
            tff.federated_value(fns.initial_cluster_models, tff.SERVER),
            tff.federated_value(fns.initial_anchor, tff.SERVER) if has_anchor else None,
            aggregator.initialize(),
        )

    state_type = initialize.type_signature.result

    def clients(spec: object) -> tff.FederatedType:
        return tff.FederatedType(to_type(spec), tff.CLIENTS)

    def distribute(cluster_models: object, keys: object) -> object:
        return tff.federated_select(
            keys, tff.federated_value(k, tff.SERVER), cluster_models, select_shared
        )

    next_parameter_types = (
        state_type,
        tff.FederatedType(data_type, tff.CLIENTS),
        clients(fns.key_spec),
        clients(fns.store_in_spec),
        tff.FederatedType(np.float32, tff.CLIENTS),
        clients(fns.seed_spec),
        tff.FederatedType(to_type(fns.hparams_spec), tff.SERVER),
    )

    def train_clients(
        state: object,
        datasets: object,
        keys: object,
        stored: object,
        client_scalars: object,
        seeds: object,
        hparams: object,
    ) -> tuple[object, object, object]:
        """Distributor and client work: `(shared_delta, cluster_weight, outputs)@CLIENTS`.
        `datasets`: each client's training examples as arrays (any length), batched by the
        client as `hparams` say; `keys`: each client's cluster (ignored when clients pick);
        `client_scalars`: one number per client that its algorithm's plan sets for the round
        (FedProx/FeSEM: a factor of the proximal strength, 1.0 by default; UA-PDFL: th_I);
        `seeds`: per-client seeds of its shuffle and its random ops (`client_seed`)."""
        if fns.picks_cluster:
            distributed = tff.federated_broadcast(
                tff.federated_map(every_cluster_shared, state.cluster_models)
            )
        else:
            distributed = distribute(state.cluster_models, keys)
        client_args = [
            distributed,
            stored,
            datasets,
            keys,
            client_scalars,
            seeds,
            tff.federated_broadcast(hparams),
        ]
        if has_anchor:
            client_args.append(tff.federated_broadcast(state.anchor))
        return tff.federated_map(client_update, tuple(client_args))

    def after_client_work(finish: Callable[..., Any]) -> tff.Computation:
        """A computation with `next`'s parameters: distributor and client work
        (`train_clients`), then `finish(state, shared_delta, cluster_weight, outputs)`."""

        @tff.federated_computation(*next_parameter_types)
        def computation(
            state: object,
            datasets: object,
            keys: object,
            stored: object,
            client_scalars: object,
            seeds: object,
            hparams: object,
        ) -> object:
            return finish(
                state, *train_clients(state, datasets, keys, stored, client_scalars, seeds, hparams)
            )

        return computation

    def aggregate_and_apply(
        state: object, shared_delta: object, cluster_weight: object, outputs: object
    ) -> object:
        """Aggregator and finalizer: the whole round."""
        if fns.routes_rows:  # a relay: the mailbox is the peers' to rewrite, nothing is summed
            nothing = collections.OrderedDict(cluster_weight=np.zeros([k], np.float32))
            return state, outputs, tff.federated_value(nothing, tff.SERVER)
        aggregate = aggregator.next(state.aggregator, shared_delta, cluster_weight)
        new_models = tff.federated_map(
            apply_cluster_updates, (state.cluster_models, aggregate.result)
        )
        new_state = server_state(new_models, state.anchor if has_anchor else None, aggregate.state)
        return new_state, outputs, aggregate.measurements

    cluster_sums = ClusterSums(to_type(fns.shared_spec), k)

    def sums_only(
        state: object, shared_delta: object, cluster_weight: object, outputs: object
    ) -> object:
        """A share of the clients, up to their per-cluster sums (merged by `sharded.py`)."""
        total, total_weight = cluster_sums(shared_delta, cluster_weight)
        return total, total_weight, outputs

    next_fn = after_client_work(aggregate_and_apply)
    partial_next = after_client_work(sums_only)

    @tff.tensorflow.computation(
        cluster_models_type, cluster_sums.stacked_type, cluster_sums.weight_type
    )
    def finalize(cluster_models: object, total: object, total_weight: object) -> object:
        return fns.apply_cluster_updates(cluster_models, cluster_mean(total, total_weight))

    # Evaluation: the same distributor, then each client's joined model on its data.
    batch_size_type = tff.TensorType(np.int64)
    client_evaluate = tff.tensorflow.computation(
        selection_type, store_in_type, data_type, batch_size_type
    )(fns.client_evaluate)

    @tff.federated_computation(
        tff.FederatedType(cluster_models_type, tff.SERVER),
        tff.FederatedType(data_type, tff.CLIENTS),
        clients(fns.key_spec),
        clients(fns.store_in_spec),
        tff.FederatedType(batch_size_type, tff.SERVER),
    )
    def evaluate(
        cluster_models: object, datasets: object, keys: object, stored: object, batch_size: object
    ) -> object:
        """Each client's test arrays scored in ordered batches of `batch_size`."""
        selected = distribute(cluster_models, keys)
        return tff.federated_map(
            client_evaluate, (selected, stored, datasets, tff.federated_broadcast(batch_size))
        )

    return TffRoundParts(
        initialize=initialize,
        next=next_fn,
        partial_next=partial_next,
        finalize=finalize,
        evaluate=evaluate,
        functions=fns,
    )


def predict_probabilities_fn(model: FunctionalModel) -> Callable[..., tf.Tensor]:
    """`(weights, state, x) -> probabilities`, many models at once: every variable stacked
    along a leading model axis, in inference mode (softmax, or [1 - p, p] for a single-logit
    model). Output: (models, len(x), classes)."""

    def predict(weights: tuple, state: tuple, x: tf.Tensor) -> tf.Tensor:
        def one(variables: tuple) -> tf.Tensor:
            w, s = variables[: len(weights)], variables[len(weights) :]
            logits, _ = model.apply(w, s, x, False, None)
            if logits.shape[-1] == 1:
                p = tf.sigmoid(logits)
                return tf.concat([1 - p, p], axis=-1)
            return tf.nn.softmax(logits)

        return tf.map_fn(one, tuple(weights) + tuple(state), fn_output_signature=tf.float32)

    return predict


def predict_probabilities_specs(model: FunctionalModel, input_spec: dict) -> tuple:
    layout = ModelLayout.of(model)

    def stacked(shapes: Sequence[tuple[int, ...]]) -> tuple[tf.TensorSpec, ...]:
        return tuple(tf.TensorSpec([None, *s], tf.float32) for s in shapes)

    return (
        stacked(layout.trainable_shapes),
        stacked(layout.state_shapes),
        tf.TensorSpec(input_spec["x"].shape, tf.float32),
    )


def build_predict_probabilities(model: FunctionalModel, input_spec: dict) -> tff.Computation:
    """Server-side inference (`predict_probabilities_fn`) as one TFF computation."""
    types = [to_type(s) for s in predict_probabilities_specs(model, input_spec)]
    return tff.tensorflow.computation(*types)(predict_probabilities_fn(model))


def pooled_scores_fn(model: FunctionalModel) -> Callable[..., tuple[tf.Tensor, ...]]:
    """`(weights, state, x, y, client, num_clients, batch_size) -> (loss_sum, num_correct,
    num_examples)`: one whole model scored, in inference mode, on the examples of many clients
    pooled into one array (`client[i]` is the index of example i's client), in ordered batches
    of `batch_size`. Each output is (num_clients,) float32 and holds, per client, the sums that
    `client_work.evaluate_client` gives on that client's own arrays (equal up to the order of
    float additions). One call scores every client of a model, where the per-client
    `evaluate` makes one call per client."""

    def score(
        weights: tuple,
        state: tuple,
        x: tf.Tensor,
        y: tf.Tensor,
        client: tf.Tensor,
        num_clients: tf.Tensor,
        batch_size: tf.Tensor,
    ) -> tuple[tf.Tensor, ...]:
        def step(totals: tuple, batch: dict) -> tuple:
            logits, _ = model.apply(weights, state, batch["x"], False, None)
            labels, owner = batch["y"], batch["client"]
            correct = tf.cast(tf.equal(client_work.predicted_labels(logits), labels), tf.float32)
            per_example = (
                client_work.example_losses(logits, labels),
                correct,
                tf.ones_like(correct),
            )
            return tuple(
                total + tf.math.unsorted_segment_sum(value, owner, num_clients)
                for total, value in zip(totals, per_example)
            )

        zeros = tf.zeros([num_clients], tf.float32)
        pooled = collections.OrderedDict(x=x, y=y, client=client)
        return ArrayBatches(pooled, batch_size).reduce((zeros, zeros, zeros), step)

    return score


def pooled_scores_specs(model: FunctionalModel, input_spec: dict) -> tuple:
    layout = ModelLayout.of(model)
    return (
        tuple(tf.TensorSpec(s, tf.float32) for s in layout.trainable_shapes),
        tuple(tf.TensorSpec(s, tf.float32) for s in layout.state_shapes),
        tf.TensorSpec([None, *input_spec["x"].shape[1:]], input_spec["x"].dtype),
        tf.TensorSpec([None], input_spec["y"].dtype),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.int64),
    )


def build_pooled_scores(model: FunctionalModel, input_spec: dict) -> tff.Computation:
    """`pooled_scores_fn` as one TFF computation."""
    types = [to_type(s) for s in pooled_scores_specs(model, input_spec)]
    return tff.tensorflow.computation(*types)(pooled_scores_fn(model))
