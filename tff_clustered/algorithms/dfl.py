"""Decentralized FL on TFF's SERVER/CLIENTS runtime, and the decentralized baselines of
UA-PDFL's comparison (Zhu, Fan, Xie, "UA-PDFL: A Personalized Approach for Decentralized
Federated Learning"): Local, FedAvg-DFL, FedPer-DFL and DFedAvgM.

TFF has no client-to-client message, so peers are TFF clients and the server only routes:
its state is a mailbox holding every peer's published model (one row per peer, the end of
the previous round: synchronous snapshot semantics), and each round `federated_select`
hands each peer its own row and the rows of the N_com peers it pulls from (the round's
"neighbours" distribution, `federated/round.py`). Everything a peer decides runs inside its
client computation (`PeerStep`): the fingerprints of the received models, the divergence,
the regime, the |D|-weighted mixing, the local training. Nothing is averaged on the server:
after the round the mailbox is the peers' new models.

What is not faithful (inherent to a simulation on a SERVER/CLIENTS platform): one process
holds every published model (the relay); rounds are lock-step; the relay ships whole models
where the protocol would send only g or one dropout model, so communication is reported from
the protocol's per-message count (`values_received`), not from runtime traffic. The queue
Q_i of each peer is drawn by the orchestration from the keyed stream (seed, round, peer), the
same draw a peer would make; a peer computes its neighbours' fingerprints I_j, I_j^Aux from
the rows it receives (the same numbers the neighbours would send: inference-mode outputs of
their published models).

Every peer takes part in every round: set --clients_per_round to the number of peers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Plan,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    check,
    layers_to_tensors,
)
from tff_clustered.federated import client_work
from tff_clustered.options import option
from tff_clustered.seeds import ALGORITHM, derived_seed

MIXINGS = ("uapdfl", "fedavg", "fedper", "local")
DIVERGENCES = ("skl", "js")
TOPOLOGIES = ("dynamic", "static")
# Regimes of a UA-PDFL peer (Alg. 2): whole model copied from one neighbour (client-wise
# dropout), head shared with the similar neighbours (partial), head kept (personal head).
DROPOUT, PARTIAL, PERSONAL_HEAD, NO_REGIME = 0, 1, 2, -1
REGIME_NAMES = {DROPOUT: "dropout", PARTIAL: "partial", PERSONAL_HEAD: "personal_head"}
PROBABILITY_FLOOR = 1e-10
UNIT_VALUE = 1.0  # every value of X_unit, the input the fingerprints are taken on (Eq. 4)


def divergence(p: tf.Tensor, q: tf.Tensor, kind: str = "skl") -> tf.Tensor:
    """UA-PDFL's Div (Eqs. 6-7) of distribution `p` [C] with each row of `q` [n, C]: the
    symmetrised KL 1/2 KL(p||q) + 1/2 KL(q||p) the paper writes (it calls it Jensen-Shannon),
    or the true Jensen-Shannon divergence (`kind="js"`). Probabilities clipped to [1e-10, 1]."""
    p = tf.clip_by_value(p, PROBABILITY_FLOOR, 1.0)[None, :]
    q = tf.clip_by_value(q, PROBABILITY_FLOOR, 1.0)

    def kl(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(a * tf.math.log(a / b), axis=-1)

    if kind == "skl":
        return 0.5 * kl(p, q) + 0.5 * kl(q, p)
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def received_rows(inbox_rows: Optional[tf.Tensor], rows: int) -> tf.Tensor:
    """Which routed rows a peer received: its own (first) and every neighbour row that is not
    a copy of its own (a queue shorter than the round's is padded with the peer's own row)."""
    if inbox_rows is None:
        return tf.ones([rows], tf.bool)
    return tf.concat([[True], tf.not_equal(inbox_rows[1:], inbox_rows[0])], axis=0)


def update_norm(start: Sequence[tf.Tensor], end: Sequence[tf.Tensor]) -> tf.Tensor:
    """||end - start|| over all tensors."""
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(b - a)) for a, b in zip(start, end)]))


def train_mixed(
    forward: client_work.ForwardFn,
    inputs: client_work.ClientInputs,
    mixed: Sequence[tf.Tensor],
    present: tf.Tensor,
    metrics: dict,
    momentum: float = 0.0,
    **train_options: object,
) -> client_work.ClientOutputs:
    """The end of every peer's round: local training from its mixed model (all variables,
    trainable first), kept and published; `metrics` plus the neighbours it received and its
    accumulated gradient norm ||w_trained - w_mixed|| / eta (`update_norm`)."""
    num_trainable = len(inputs.weights)
    start = tuple(mixed[:num_trainable])
    result = client_work.train_client(
        forward,
        start,
        inputs.dataset,
        inputs.learning_rate,
        momentum=momentum,
        state=tuple(mixed[num_trainable:]),
        seed=inputs.seed,
        **train_options,
    )
    return client_work.ClientOutputs.kept(
        result,
        {
            **metrics,
            "neighbours_received": tf.reduce_sum(tf.cast(present[1:], tf.int32)),
            "update_norm": update_norm(start, result.weights) / inputs.learning_rate,
        },
    )


def softmax_outputs(logits: tf.Tensor) -> tf.Tensor:
    """Class probabilities (a single logit: [1 - p, p])."""
    if logits.shape[-1] == 1:
        p = tf.sigmoid(logits)
        return tf.concat([1 - p, p], axis=-1)
    return tf.nn.softmax(logits)


@dataclasses.dataclass(frozen=True)
class PeerStep:
    """One peer's round (UA-PDFL Alg. 2 lines 5-20 and the adapted baselines): mix the rows it
    received (its own first) with |D| weights, then train locally.

    `mixing`: "uapdfl" (the regime decided by the divergence of the unit representations, Eq. 6,
    against `threshold`, or the peer's `client_scalar` when it is None: every Div <= th_I -> copy
    the whole model of one random neighbour;
    else g averaged over all, h over itself and the neighbours with Div < th_I), "fedavg"
    (whole model averaged over all), "fedper" (g averaged, h own), "local" (nothing mixed).
    `allow_dropout=False` never takes the dropout branch and `layerwise=False` averages the
    whole model instead of deciding h separately (the paper's Fig. 13 ablations). Trainable
    tensors from `head_start` on are h; BatchNorm statistics go with g (every head here is
    Dense layers), or stay the peer's own with `local_statistics` (FedBN-style). `aux_mu` > 0
    adds mu ||g(w; X_unit) - mean of the received I^Aux||^2 (Eq. 12, not halved, inference
    mode) to the local loss, for a peer that has neighbours. X_unit is one input of shape
    `input_shape` filled with `UNIT_VALUE` (Eq. 4)."""

    mixing: str
    head_start: int
    input_shape: tuple[int, ...]
    threshold: Optional[float] = 0.1  # None: each peer's `ClientInputs.client_scalar`
    aux_mu: float = 0.0
    momentum: float = 0.0
    divergence: str = "skl"
    allow_dropout: bool = True
    layerwise: bool = True
    local_statistics: bool = False

    def __post_init__(self) -> None:
        if self.mixing not in MIXINGS:
            raise ValueError(f"unknown mixing {self.mixing!r}; choose one of {', '.join(MIXINGS)}")

    @property
    def reads_own_model(self) -> bool:
        return False  # its own published model arrives as the first routed row

    @property
    def reads_features(self) -> bool:
        """UA-PDFL's fingerprints I^Aux and the alignment pull (Eqs. 4, 12) read g's output;
        the baselines' mixings read only the model's outputs."""
        return self.mixing == "uapdfl" or self.aux_mu > 0

    def __call__(
        self, forward: client_work.ForwardFn, inputs: client_work.ClientInputs
    ) -> client_work.ClientOutputs:
        if self.reads_features and inputs.features is None:
            raise ValueError("PeerStep needs the model's feature extractor (ClientInputs)")
        inbox, num_trainable = inputs.inbox, len(inputs.weights)
        rows = int(inbox[0].shape[0])
        n = rows - 1
        unit = tf.fill([1, *self.input_shape], tf.constant(UNIT_VALUE, tf.float32))

        def row(r: int) -> tuple[tuple, tuple]:
            return tuple(v[r] for v in inbox[:num_trainable]), tuple(
                v[r] for v in inbox[num_trainable:]
            )

        def fingerprints(weights: tuple, state: tuple) -> tuple[tf.Tensor, tf.Tensor]:
            logits, _ = forward(weights, state, unit, False, None)
            if not self.reads_features:
                return softmax_outputs(logits)[0], tf.zeros([0])
            aux = inputs.features(weights, state, unit, self.head_start)[0]
            return softmax_outputs(logits)[0], aux

        prints = [fingerprints(*row(r)) for r in range(rows)]
        unit_outputs = tf.stack([p for p, _ in prints])  # I, own first
        aux = tf.stack([a for _, a in prints])  # I^Aux
        div = divergence(unit_outputs[0], unit_outputs[1:], self.divergence)
        present = received_rows(inputs.inbox_rows, rows)
        sizes = tf.cast(inputs.inbox_weights, tf.float32) * tf.cast(present, tf.float32)
        own_only = tf.one_hot(0, rows)
        everyone = sizes / tf.reduce_sum(sizes)
        threshold = (
            tf.cast(inputs.client_scalar, tf.float32) if self.threshold is None else self.threshold
        )
        similar = tf.concat([[True], div < threshold], axis=0) & present
        regime = tf.constant(NO_REGIME)
        if self.mixing == "uapdfl" and n:
            dropout = (
                tf.reduce_all((div <= threshold) | ~present[1:])
                & tf.reduce_any(present[1:])
                & self.allow_dropout
            )
            pick = tf.random.stateless_uniform(
                [], tf.stack([inputs.seed[0], inputs.seed[1] + 7919]), 0, n, tf.int32
            )
            copy = tf.one_hot(pick + 1, rows)
            if self.layerwise:
                similar_sizes = sizes * tf.cast(similar, tf.float32)
                head = similar_sizes / tf.reduce_sum(similar_sizes)
            else:
                head = everyone
            g_weights = tf.where(dropout, copy, everyone)
            h_weights = tf.where(dropout, copy, head)
            regime = tf.where(
                dropout,
                DROPOUT,
                tf.where(tf.reduce_any(similar[1:]), PARTIAL, PERSONAL_HEAD),
            )
        elif self.mixing in ("fedavg", "uapdfl"):
            g_weights = h_weights = everyone
        elif self.mixing == "fedper":
            g_weights, h_weights = everyone, own_only
        else:
            g_weights = h_weights = own_only

        def row_weights(tensor: int) -> tf.Tensor:
            if tensor >= num_trainable:  # BatchNorm statistics: with g (heads are Dense)
                return own_only if self.local_statistics else g_weights
            return h_weights if tensor >= self.head_start else g_weights

        mixed = [tf.tensordot(row_weights(i), v, 1) for i, v in enumerate(inbox)]
        penalty = None
        if self.aux_mu and n and (self.mixing != "uapdfl" or self.layerwise):
            target = tf.stop_gradient(tf.reduce_mean(aux, axis=0))

            def penalty(weights: tuple, state: tuple) -> tf.Tensor:
                features = inputs.features(weights, state, unit, self.head_start)[0]
                return self.aux_mu * tf.reduce_sum(tf.square(features - target))

        values = self.values_received(
            inbox, num_trainable, regime, similar, present, unit_outputs, aux
        )
        metrics = {
            "regime": regime,
            "divergence": tf.where(present[1:], div, np.nan),  # none for a padding row
            "similar_neighbours": tf.reduce_sum(tf.cast(similar[1:], tf.int32)),
            "values_received": values,
        }
        return train_mixed(forward, inputs, mixed, present, metrics, self.momentum, penalty=penalty)

    def values_received(
        self,
        inbox: tuple,
        num_trainable: int,
        regime: tf.Tensor,
        similar: tf.Tensor,
        present: tf.Tensor,
        unit_outputs: tf.Tensor,
        aux: tf.Tensor,
    ) -> tf.Tensor:
        """Model values this peer receives by the protocol: UA-PDFL (its Sec. 3.5 two phases)
        N_com (C + d_aux + 1) fingerprint values, then the dropout neighbour's whole model, or
        every neighbour's g and the similar ones' h; FedAvg-DFL every neighbour's whole model;
        FedPer-DFL every neighbour's g; Local nothing. Padding rows are not received."""
        rows = int(inbox[0].shape[0]) - 1
        n = tf.reduce_sum(tf.cast(present[1:], tf.float32))

        def size(indices: Sequence[int]) -> int:
            return sum(int(np.prod(inbox[i].shape[1:])) for i in indices)

        heads = [i for i in range(num_trainable) if i >= self.head_start]
        whole, h = size(range(len(inbox))), size(heads)
        g = whole - h
        if self.mixing == "local" or not rows:
            return tf.constant(0.0)
        if self.mixing == "fedper":
            return n * g
        if self.mixing == "fedavg":
            return n * whole
        prints = n * (int(unit_outputs.shape[-1]) + int(aux.shape[-1]) + 1)
        similar_count = tf.reduce_sum(tf.cast(similar[1:], tf.float32))
        mixed = n * g + similar_count * h if self.layerwise else n * whole
        return prints + tf.where(regime == DROPOUT, float(whole), mixed)


class Decentralized(Algorithm):
    """The shared decentralized loop: every peer active every round, each pulling N_com rows
    chosen uniformly among the other peers (redrawn every round, or once: `--dfl_topology`);
    after the round the mailbox is the peers' new models. A subclass names its `mixing`."""

    distribution = "neighbours"
    keep_client_models = True
    model_kinds = ("personal",)
    mixing: ClassVar[str] = "fedavg"
    refused = {
        **Algorithm.refused,
        "num_clusters": "a decentralized algorithm has no clusters (peers pull --num_neighbours)",
    }

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_neighbours: int = option(5, "Decentralized: peers each peer pulls per round (N_com).")
        dfl_topology: str = option(
            "dynamic", "Decentralized: redraw the queues every round, or once.", TOPOLOGIES
        )
        dfl_head_layers: int = option(
            0,
            "Decentralized: top weighted layers forming the head h (the rest is g); 0: the "
            "fully connected layers after the last convolutional/BN layer (the top layer of a "
            "model of Dense layers only).",
        )
        dfl_local_statistics: bool = option(
            False,
            "Decentralized: keep each peer's BatchNorm moving statistics its own (FedBN-style) "
            "instead of mixing them with their layer's weights.",
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check(
            [
                (self.options.num_neighbours >= 0, "num_neighbours must be >= 0"),
                (self.options.dfl_head_layers >= 0, "dfl_head_layers must be >= 0"),
            ]
        )

    @property
    def num_neighbours(self) -> int:  # type: ignore[override]
        return int(self.options.num_neighbours)

    def head_start(self, run: RunInfo) -> int:
        """The first trainable tensor of the head h."""
        layers = self.options.dfl_head_layers or run.classifier_layers or 1
        if layers > len(run.layer_sizes):
            raise ValueError(
                f"{self.name}: --dfl_head_layers={layers} but the model has "
                f"{len(run.layer_sizes)} weighted layers; lower --dfl_head_layers"
            )
        return len(layers_to_tensors(run.layer_sizes, layers))  # g's tensors come first

    def peer_step(self, run: RunInfo, momentum: float) -> PeerStep:
        return PeerStep(
            self.mixing,
            self.head_start(run),
            run.input_shape,
            momentum=momentum,
            local_statistics=bool(self.options.dfl_local_statistics),
        )

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        step = self.peer_step(run, self.peer_momentum(momentum))
        if step.reads_features and not run.reads_features:
            raise ValueError(
                f"{self.name} compares and aligns the peers' auxiliary representations, the "
                "output of the feature extractor g on the unit input (Eqs. 4, 12), and this "
                "model gives no inner layer's output (it runs through TFF's functional model, "
                "as the LSTM does): use a model of Dense, convolution and pooling layers "
                "(e.g. --model=cnn)"
            )
        return step

    def peer_momentum(self, momentum: float) -> float:
        """The local momentum of the peers' SGD: the run's `--momentum`."""
        return float(momentum)

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Common initialisation (one seed): every mailbox row is the initial model."""
        peers = len(run.client_ids)
        if run.clients_per_round < peers:
            raise ValueError(
                f"{self.name}: every peer takes part in every round; set --clients_per_round "
                f"to the number of peers ({peers}), got {run.clients_per_round}"
            )
        if self.num_neighbours > peers - 1:
            raise ValueError(
                f"{self.name}: num_neighbours={self.num_neighbours} but a peer has only "
                f"{peers - 1} others; lower --num_neighbours"
            )
        return Decision(
            assignment={c: i for i, c in enumerate(run.client_ids)},
            cluster_models=np.repeat(run.initial_model[None, :], peers, axis=0),
            state=None,
        )

    def queues(self, run: RunInfo, round_num: int) -> np.ndarray:
        """Q_i for every peer (rows: peers in `run.client_ids` order), N_com distinct other
        peers drawn uniformly from the stream (seed, round, peer); round 0's for every round
        with a static topology."""
        peers, n = len(run.client_ids), self.num_neighbours
        r = round_num if self.options.dfl_topology == "dynamic" else 0
        rows = []
        for i in range(peers):
            rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, r, i))
            others = rng.choice(peers - 1, n, replace=False)
            rows.append(np.where(others >= i, others + 1, others))
        return np.array(rows, np.int32).reshape(peers, n)

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        index = {c: i for i, c in enumerate(run.client_ids)}
        rows = np.array([index[c] for c in client_ids], np.int32)
        return Plan(rows, neighbours=self.queues(run, view.round_num + 1)[rows])

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        """The mailbox becomes the peers' new models; the round's regimes, divergences and
        received values are logged."""
        mailbox = queries.client_models(list(run.client_ids))
        metrics = round_log(result.client_metrics)
        return Decision(cluster_models=mailbox, metrics=metrics)


def round_log(client_metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per-round log of the peers' reports (those they make): how many peers took each regime,
    quantiles of the divergences, the mean number of neighbours received, the mean number of
    mask entries a peer changed (DisPFL), and the values received in all
    (`floats_communicated`)."""
    log: dict[str, float] = {}
    if "regime" in client_metrics:
        regimes = np.asarray(client_metrics["regime"])
        for code, name in REGIME_NAMES.items():
            log[f"peers_{name}"] = float(np.sum(regimes == code))
    if "divergence" in client_metrics:
        div = np.asarray(client_metrics["divergence"], np.float64).ravel()
        div = div[np.isfinite(div)]
        for q in (0, 25, 50, 75, 100):
            log[f"divergence_p{q}"] = float(np.percentile(div, q)) if div.size else float("nan")
    if "neighbours_received" in client_metrics:
        log["neighbours_mean"] = float(np.mean(client_metrics["neighbours_received"]))
    if "mask_changes" in client_metrics:
        log["mask_changes_mean"] = float(np.mean(client_metrics["mask_changes"]))
    if "values_received" in client_metrics:
        log["floats_communicated"] = float(np.sum(client_metrics["values_received"]))
    return log


class LocalDFL(Decentralized):
    """Local training only, in the decentralized loop (UA-PDFL's "Local" column)."""

    name = "local_dfl"
    mixing = "local"
    paper = "baseline of UA-PDFL: each peer trains alone"


class FedAvgDFL(Decentralized):
    """Each peer averages the whole models of itself and its neighbours, then trains.

    FedAvg made decentralized as UA-PDFL's comparison does ("each client its own server"):
    w_i <- the |D|-weighted mean of the whole models of {i} and Q_i, then local SGD."""

    name = "fedavg_dfl"
    mixing = "fedavg"
    paper = "McMahan et al. 2017, decentralized as in UA-PDFL's comparison"


class FedPerDFL(Decentralized):
    """FedPer made decentralized: g averaged over {i} and Q_i (|D| weights), h kept local."""

    name = "fedper_dfl"
    mixing = "fedper"
    paper = "Arivazhagan et al. 2019, decentralized as in UA-PDFL's comparison"


class DFedAvgM(Decentralized):
    """Neighbour averaging, then local SGD with heavy-ball momentum.

    DFedAvgM (Sun, Li, Wang, "Decentralized Federated Averaging", TPAMI 2023): neighbour
    averaging then local SGD with heavy-ball momentum (`--dfedavgm_momentum`, used instead of
    --momentum). Its mixing here is UA-PDFL's adaptation (|D| weights over {i} and Q_i), not
    the paper's doubly stochastic matrix; UA-PDFL runs it with twice the local iterations and
    half the rounds (set --local_epochs and --rounds)."""

    name = "dfedavgm"
    mixing = "fedavg"
    paper = "Sun et al., Decentralized Federated Averaging, TPAMI 2023"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        dfedavgm_momentum: float = option(0.9, "DFedAvgM: local heavy-ball momentum.")

    def peer_momentum(self, momentum: float) -> float:
        return float(self.options.dfedavgm_momentum)
