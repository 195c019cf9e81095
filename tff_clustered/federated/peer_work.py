"""A decentralized peer's round as client work: the rows it received, mixed, then trained.

TFF has no client-to-client message, so peers are TFF clients and the server only routes:
its state is a mailbox holding every peer's published model (one row per peer, the end of
the previous round: synchronous snapshot semantics), and each round `federated_select`
hands each peer its own row and the rows of the N_com peers it pulls from (the round's
`Neighbours` distribution, `federated/distributions.py`). Everything a peer decides runs inside
its client computation: what it mixes from the rows it received (`Inbox`), with |D| weights,
and its local training (`train_mixed`); `PeerStep` is the decentralized baselines' whole round
(`algorithms/dfl.py`), UA-PDFL's and DisPFL's are in their algorithms' files.

What is not faithful (inherent to a simulation on a SERVER/CLIENTS platform): one process
holds every published model (the relay); rounds are lock-step; the relay ships whole models
where the protocol would send only g or one dropout model, so communication is reported from
the protocol's per-message count (each step's `values_received`), not from runtime traffic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.federated import client_work, local_training


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
