"""Shared pieces of the decentralized-peer tests: a hand-built peer of a linear model, the
run helper, and the identical-data federation."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
from conftest import mlp_experiment
from sklearn.datasets import load_digits

from tff_clustered.data.federated_data import FederatedData, from_arrays
from tff_clustered.federated import client_work
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.orchestration import Experiment


def run_mlp(
    algorithm: str, data: FederatedData, config: TrainingConfig, **options: object
) -> Experiment:
    """`algorithm` with `options` run to the end on `data` with a 16-unit MLP."""
    exp = mlp_experiment(algorithm, data, config, **options)
    list(exp.rounds())
    return exp


def linear(
    weights: tuple, state: tuple, x: tf.Tensor, training: bool, seed: object = None
) -> tuple[tf.Tensor, tuple]:
    """The forward pass of a 1-input, 2-class linear model: kernel (1, 2), bias (2,)."""
    return tf.matmul(x, weights[0]) + weights[1], tuple(state)


def peer_inputs(
    rows: list[list[float]],
    sizes: list[float],
    inbox_rows: Optional[list[int]] = None,
    round_num: int = 1,
    total_rounds: int = 10,
) -> client_work.ClientInputs:
    """A peer of the `linear` model with no training examples (what it returns is what it
    mixed): each row is [kernel, kernel, bias, bias], row 0 its own model; its g is the kernel
    (tensor 0) and h the bias (tensor 1); `inbox_rows` the server rows they are."""
    kernels = tf.constant([[r[:2]] for r in rows])  # (R, 1, 2)
    biases = tf.constant([r[2:] for r in rows])  # (R, 2)
    dataset = tf.data.Dataset.from_tensors({"x": tf.zeros([1, 1]), "y": tf.constant([0])})
    return client_work.ClientInputs(
        (kernels[0], biases[0]), (), (), (), dataset.take(0), tf.constant(0.1),
        tf.constant(1.0), tf.constant([3, 0]),
        routed=client_work.RoutedRows(
            (kernels, biases), tf.constant(sizes),
            None if inbox_rows is None else tf.constant(inbox_rows),
            lambda w, s, x, head: x * w[0][0],
        ),
        round_num=tf.constant(round_num, tf.int64),
        total_rounds=tf.constant(total_rounds, tf.int64),
    )  # fmt: skip


def identical_data(peers: int, train_examples: int = 300) -> FederatedData:
    """`peers` peers holding the same digits (`train_examples` to train, 100 to test)."""
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:train_examples], order[train_examples : train_examples + 100]
    return from_arrays(
        "identical",
        {f"p{i:02d}": (x[train], y[train]) for i in range(peers)},
        {f"p{i:02d}": (x[test], y[test]) for i in range(peers)},
        10,
    )
