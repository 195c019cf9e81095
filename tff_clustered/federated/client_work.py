"""Client work as pure TensorFlow functions: weights and a dataset in, new weights out.

They know nothing about TFF placements, so they can be tested alone (FedJAX style); the
federated computations in `clustered_process.py` wrap them with `tff.tensorflow.computation`.
`predict` is `(trainable_weights, x, training) -> logits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, NamedTuple

import tensorflow as tf

Weights = Sequence[tf.Tensor]
PredictFn = Callable[[Weights, tf.Tensor, bool], tf.Tensor]


class TrainResult(NamedTuple):
    weights: tuple[tf.Tensor, ...]
    num_examples: tf.Tensor  # float32: examples processed over all local epochs
    loss_sum: tf.Tensor  # float32: sum over processed examples of the training loss


class EvalResult(NamedTuple):
    loss_sum: tf.Tensor
    num_correct: tf.Tensor
    num_examples: tf.Tensor


def batch_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of a batch (spec A.3: no weight decay): softmax over classes, or
    sigmoid for a single-logit binary model (the Sent140 LSTM, spec A.12)."""
    if logits.shape[-1] == 1:
        return tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=logits[:, 0]
            )
        )
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )


def predicted_labels(logits: tf.Tensor) -> tf.Tensor:
    """argmax over classes; a single logit predicts class 1 iff it is > 0."""
    if logits.shape[-1] == 1:
        return tf.cast(logits[:, 0] > 0, tf.int32)
    return tf.argmax(logits, axis=-1, output_type=tf.int32)


def train_client(
    predict: PredictFn,
    weights: Weights,
    dataset: tf.data.Dataset,
    learning_rate: tf.Tensor,
    prox_mu: float = 0.0,
    momentum: float = 0.0,
    prox_scale: tf.Tensor = 1.0,
) -> TrainResult:
    """Local minibatch SGD over every batch of `dataset` (its epochs already repeated).

    Step (spec A.3): g = grad mean-loss(b; w) + mu (w - w_start)  [FedProx Eq. 3 term];
    v = momentum v + g; w = w - lr v. `prox_mu` and `momentum` are Python numbers: a zero
    term is left out of the graph, so mu = 0 runs exactly FedAvg's plain SGD step.
    `prox_scale` multiplies mu for this client (FeSEM's size-dependent mu_i, spec B.4).
    """
    anchor = tuple(tf.identity(w) for w in weights)
    start = (
        tuple(tf.identity(w) for w in weights),
        tuple(tf.zeros_like(w) for w in weights) if momentum else (),
        tf.constant(0.0),
        tf.constant(0.0),
    )

    def step(state: tuple, batch: dict) -> tuple:
        current, velocity, num_examples, loss_sum = state
        with tf.GradientTape() as tape:
            tape.watch(current)
            loss = batch_loss(predict(current, batch["x"], True), batch["y"])
        direction = tape.gradient(loss, current)
        if prox_mu:
            strength = prox_mu * prox_scale
            direction = tuple(g + strength * (w - a) for g, w, a in zip(direction, current, anchor))
        if momentum:
            velocity = tuple(momentum * v + g for v, g in zip(velocity, direction))
            direction = velocity
        current = tuple(w - learning_rate * d for w, d in zip(current, direction))
        batch_size = tf.cast(tf.shape(batch["y"])[0], tf.float32)
        return current, velocity, num_examples + batch_size, loss_sum + loss * batch_size

    final, _, num_examples, loss_sum = dataset.reduce(start, step)
    return TrainResult(final, num_examples, loss_sum)


def evaluate_client(predict: PredictFn, weights: Weights, dataset: tf.data.Dataset) -> EvalResult:
    """Summed loss, correct predictions and example count of `weights` on `dataset`."""

    def step(state: EvalResult, batch: dict) -> EvalResult:
        logits = predict(weights, batch["x"], False)
        labels = batch["y"]
        batch_size = tf.cast(tf.shape(labels)[0], tf.float32)
        correct = tf.reduce_sum(tf.cast(tf.equal(predicted_labels(logits), labels), tf.float32))
        return EvalResult(
            state.loss_sum + batch_loss(logits, labels) * batch_size,
            state.num_correct + correct,
            state.num_examples + batch_size,
        )

    zero = tf.constant(0.0)
    return dataset.reduce(EvalResult(zero, zero, zero), step)


def flatten(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Concatenate tensors into one vector, in the given (canonical) order."""
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)
