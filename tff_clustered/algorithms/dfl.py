"""Decentralized FL on TFF's SERVER/CLIENTS runtime, and the decentralized baselines of
UA-PDFL's comparison (Zhu, Fan, Xie, "UA-PDFL: A Personalized Approach for Decentralized
Federated Learning"): Local, FedAvg-DFL, FedPer-DFL and DFedAvgM.

TFF has no client-to-client message, so peers are TFF clients and the server only routes:
its state is a mailbox holding every peer's published model (one row per peer, the end of
the previous round: synchronous snapshot semantics), and each round `federated_select`
hands each peer its own row and the rows of the N_com peers it pulls from (the round's
`Neighbours` distribution, `federated/distributions.py`). Everything a peer decides runs inside its
client computation (the baselines' `PeerStep`; UA-PDFL's and DisPFL's in their files): what
it mixes from the rows it received (`Inbox`), with |D| weights, and its local training.
Nothing is averaged on the server: after the round the mailbox is the peers' new models.

What is not faithful (inherent to a simulation on a SERVER/CLIENTS platform): one process
holds every published model (the relay); rounds are lock-step; the relay ships whole models
where the protocol would send only g or one dropout model, so communication is reported from
the protocol's per-message count (each step's `values_received`), not from runtime traffic.
The queue Q_i of each peer is drawn by the orchestration from the keyed stream (seed, round,
peer), the same draw a peer would make.

Every peer takes part in every round: set --clients_per_round to the number of peers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

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
    per_seed_text,
)
from tff_clustered.federated import client_work, local_training
from tff_clustered.federated.distributions import Neighbours
from tff_clustered.options import option
from tff_clustered.seeds import ALGORITHM, derived_seed

TOPOLOGIES = ("dynamic", "static")


def received_rows(row_ids: Optional[tf.Tensor], rows: int) -> tf.Tensor:
    """Which routed rows a peer received: its own (first) and every neighbour row that is not
    a copy of its own (a queue shorter than the round's is padded with the peer's own row)."""
    if row_ids is None:
        return tf.ones([rows], tf.bool)
    return tf.concat([[True], tf.not_equal(row_ids[1:], row_ids[0])], axis=0)


def update_norm(start: Sequence[tf.Tensor], end: Sequence[tf.Tensor]) -> tf.Tensor:
    """||end - start|| over all tensors."""
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(b - a)) for a, b in zip(start, end)]))


def train_mixed(
    forward: local_training.ForwardFn,
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
    result = local_training.train_client(
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


@dataclasses.dataclass(frozen=True)
class Inbox:
    """What a peer received this round: the routed rows of every variable (its own published
    model first, then its queue's; trainable variables first), which rows are real (a queue
    padded with its own row receives that row once), and the |D| weights to mix them with."""

    rows: tuple[tf.Tensor, ...]  # per variable: [rows, *shape]
    num_trainable: int
    present: tf.Tensor  # [rows] bool
    sizes: tf.Tensor  # [rows] float32: |D| of each received row, 0 for a padding row

    @classmethod
    def of(cls, inputs: client_work.ClientInputs) -> Inbox:
        routed = inputs.routed
        rows = int(routed.rows[0].shape[0])
        present = received_rows(routed.row_ids, rows)
        sizes = tf.cast(routed.weights, tf.float32) * tf.cast(present, tf.float32)
        return cls(tuple(routed.rows), len(inputs.weights), present, sizes)

    @property
    def num_rows(self) -> int:
        return int(self.rows[0].shape[0])

    @property
    def own_only(self) -> tf.Tensor:
        """Row weights that keep the peer's own model."""
        return tf.one_hot(0, self.num_rows)

    @property
    def everyone(self) -> tf.Tensor:
        """Row weights of the |D|-weighted mean over {i} and Q_i."""
        return self.sizes / tf.reduce_sum(self.sizes)

    @property
    def neighbours_received(self) -> tf.Tensor:
        """|Q_i| as received (float32; padding rows not counted)."""
        return tf.reduce_sum(tf.cast(self.present[1:], tf.float32))

    def model(self, row: int) -> tuple[tuple[tf.Tensor, ...], tuple[tf.Tensor, ...]]:
        """Row `row`'s (trainable, state) tensors."""
        return tuple(v[row] for v in self.rows[: self.num_trainable]), tuple(
            v[row] for v in self.rows[self.num_trainable :]
        )

    def mixed(
        self,
        base_weights: tf.Tensor,
        head_weights: tf.Tensor,
        head_start: int,
        local_statistics: bool,
    ) -> list[tf.Tensor]:
        """Every variable as its rows' weighted sum: g's tensors (before `head_start`) with
        `base_weights`, h's with `head_weights`; BatchNorm statistics go with g (every head
        here is Dense layers), or stay the peer's own with `local_statistics`."""

        def row_weights(tensor: int) -> tf.Tensor:
            if tensor >= self.num_trainable:
                return self.own_only if local_statistics else base_weights
            return head_weights if tensor >= head_start else base_weights

        return [tf.tensordot(row_weights(i), v, 1) for i, v in enumerate(self.rows)]

    def model_sizes(self, head_start: int) -> tuple[int, int]:
        """Values in one row's whole model and in its head h."""

        def size(indices: Sequence[int]) -> int:
            return sum(int(np.prod(self.rows[i].shape[1:])) for i in indices)

        return size(range(len(self.rows))), size(range(head_start, self.num_trainable))


@dataclasses.dataclass(frozen=True)
class PeerStep:
    """One peer's round in the decentralized baselines (UA-PDFL's comparison): mix the rows
    it received with |D| weights, then train locally. `mix_base`: g (the trainable tensors
    before `head_start`) is the mean over {i} and Q_i, else its own; `mix_head`: likewise h.
    FedAvg-DFL mixes both, FedPer-DFL g only, Local neither. BatchNorm statistics go with g,
    or stay the peer's own with `local_statistics` (FedBN-style)."""

    head_start: int
    mix_base: bool = True
    mix_head: bool = True
    momentum: float = 0.0
    local_statistics: bool = False
    reads_own_model: ClassVar[bool] = False  # its own published model is the first row
    reads_features: ClassVar[bool] = False  # the mixing reads no inner layer's output

    def __call__(
        self, forward: local_training.ForwardFn, inputs: client_work.ClientInputs
    ) -> client_work.ClientOutputs:
        inbox = Inbox.of(inputs)
        base = inbox.everyone if self.mix_base else inbox.own_only
        head = inbox.everyone if self.mix_head else inbox.own_only
        mixed = inbox.mixed(base, head, self.head_start, self.local_statistics)
        # Values received by the protocol: each neighbour's g and/or h (padding rows are none).
        whole, h = inbox.model_sizes(self.head_start)
        per_neighbour = (whole - h if self.mix_base else 0) + (h if self.mix_head else 0)
        metrics = {"values_received": inbox.neighbours_received * float(per_neighbour)}
        return train_mixed(forward, inputs, mixed, inbox.present, metrics, self.momentum)


class Decentralized(Algorithm):
    """The shared decentralized loop: every peer active every round, each pulling N_com rows
    chosen uniformly among the other peers (redrawn every round, or once: `--dfl_topology`);
    after the round the mailbox is the peers' new models. A subclass says which part of the
    model its peers mix (`mixes_base`, `mixes_head`) or gives its own `client_work`."""

    distribution = Neighbours()  # each instance: Neighbours(num_neighbours)
    keep_client_models = True
    model_kinds = ("personal",)
    mixes_base: ClassVar[bool] = True  # g averaged over {i} and Q_i
    mixes_head: ClassVar[bool] = True  # h averaged over {i} and Q_i
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
        self.distribution = Neighbours(self.num_neighbours)

    @property
    def num_neighbours(self) -> int:
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

    def peer_step(self, run: RunInfo, momentum: float) -> client_work.ClientWork:
        """A peer's whole round, as client work (`PeerStep` for the baselines)."""
        return PeerStep(
            self.head_start(run),
            mix_base=self.mixes_base,
            mix_head=self.mixes_head,
            momentum=momentum,
            local_statistics=bool(self.options.dfl_local_statistics),
        )

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        step = self.peer_step(run, self.peer_momentum(momentum))
        if step.reads_features and not run.reads_features:
            raise ValueError(
                f"{self.name} compares and aligns the peers' auxiliary representations, the "
                "output of the feature extractor g on the unit input (Eqs. 4, 12), and this "
                "model gives no inner layer's output (it runs through TFF's functional model): "
                "use a model of the layers the functional interpreter runs (Dense, convolution, "
                "pooling, BatchNorm, Embedding, LSTM; e.g. --model=cnn)"
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
        """The mailbox becomes the peers' new models; the round's reports are logged
        (`round_log`)."""
        mailbox = queries.client_models(list(run.client_ids))
        return Decision(cluster_models=mailbox, metrics=self.round_log(result.client_metrics))

    def round_log(self, client_metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Per-round log of the peers' reports: the mean number of neighbours received and
        the values received in all (`floats_communicated`); a subclass adds its own."""
        return {
            "neighbours_mean": float(np.mean(client_metrics["neighbours_received"])),
            "floats_communicated": float(np.sum(client_metrics["values_received"])),
        }

    @classmethod
    def run_figures(cls, trained: Sequence[Mapping[str, Any]]) -> dict[str, Optional[float]]:
        """The mean number of neighbours a peer mixed per round."""
        counts = [r["neighbours_mean"] for r in trained if "neighbours_mean" in r]
        return {"neighbours_mean": float(np.mean(counts)) if counts else None}

    @classmethod
    def figures_text(cls, runs: Sequence[Mapping[str, Any]]) -> list[str]:
        return per_seed_text(runs, "neighbours_mean", "neighbours", "{:.1f}")


class LocalDFL(Decentralized):
    """Local training only, in the decentralized loop (UA-PDFL's "Local" column)."""

    name = "local_dfl"
    mixes_base = mixes_head = False
    paper = "baseline of UA-PDFL: each peer trains alone"


class FedAvgDFL(Decentralized):
    """Each peer averages the whole models of itself and its neighbours, then trains.

    FedAvg made decentralized as UA-PDFL's comparison does ("each client its own server"):
    w_i <- the |D|-weighted mean of the whole models of {i} and Q_i, then local SGD."""

    name = "fedavg_dfl"
    paper = "McMahan et al. 2017, decentralized as in UA-PDFL's comparison"


class FedPerDFL(Decentralized):
    """FedPer made decentralized: g averaged over {i} and Q_i (|D| weights), h kept local."""

    name = "fedper_dfl"
    mixes_head = False
    paper = "Arivazhagan et al. 2019, decentralized as in UA-PDFL's comparison"


class DFedAvgM(Decentralized):
    """Neighbour averaging, then local SGD with heavy-ball momentum.

    DFedAvgM (Sun, Li, Wang, "Decentralized Federated Averaging", TPAMI 2023): neighbour
    averaging then local SGD with heavy-ball momentum (`--dfedavgm_momentum`, used instead of
    --momentum). Its mixing here is UA-PDFL's adaptation (|D| weights over {i} and Q_i), not
    the paper's doubly stochastic matrix; UA-PDFL runs it with twice the local iterations and
    half the rounds (set --local_epochs and --rounds)."""

    name = "dfedavgm"
    paper = "Sun et al., Decentralized Federated Averaging, TPAMI 2023"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        dfedavgm_momentum: float = option(0.9, "DFedAvgM: local heavy-ball momentum.")

    def peer_momentum(self, momentum: float) -> float:
        return float(self.options.dfedavgm_momentum)
