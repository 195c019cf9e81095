"""Server-side computations on whole models, outside a round: inference and pooled scoring.

Server-side computations on whole models, outside a round: inference of many models at once
(`predict_probabilities_fn`) and one model scored on many clients' pooled examples
(`pooled_scores_fn`), each as a plain TF function and as a TFF computation."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Callable, Optional

import tensorflow as tf

from tff_clustered.federated import local_training
from tff_clustered.federated.batching import ArrayBatches
from tff_clustered.federated.signature import ModelLayout
from tff_clustered.models.functional import FunctionalModel


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


def pooled_scores_fn(
    model: FunctionalModel, head_start: Optional[int] = None
) -> Callable[..., tuple[tf.Tensor, ...]]:
    """`(weights, state, x, y, rows, client, num_clients, batch_size) -> (loss_sum,
    num_correct, num_examples)`: one whole model scored, in inference mode, on the examples
    `rows` of the pooled arrays `x`, `y` (many clients' examples in one array; `client[i]` is
    the index of the client of example `rows[i]`), in ordered batches of `batch_size`. Each
    output is (num_clients,) float32 and holds, per client, the sums that
    `local_training.evaluate_client` gives on that client's own arrays (equal up to the order of
    float additions). One call scores every client of a model, where the per-client `evaluate`
    makes one call per client; `x` and `y` may hold every client of a split and stay on the
    worker between calls (`resident.WorkerArrays`), so a call sends only the row indices.

    With `head_start` (one of `model.row_head_starts`), a last argument `heads` holds each
    client's own head (trainable tensors `head_start` on, stacked along a leading client axis):
    the model's layers below the head run once on the batch's rows with `weights`, and each
    row's head with its client's (`model.row_heads`): FedPer's personal models, one call."""
    sums = pooled_sums_fn(model, head_start)
    if head_start is not None:
        return sums  # TFF traces a function's own parameters: none with a default

    def score(
        weights: tuple,
        state: tuple,
        x: tf.Tensor,
        y: tf.Tensor,
        rows: tf.Tensor,
        client: tf.Tensor,
        num_clients: tf.Tensor,
        batch_size: tf.Tensor,
    ) -> tuple[tf.Tensor, ...]:
        return sums(weights, state, x, y, rows, client, num_clients, batch_size, ())

    return score


def pooled_sums_fn(
    model: FunctionalModel, head_start: Optional[int]
) -> Callable[..., tuple[tf.Tensor, ...]]:
    """`pooled_scores_fn`'s sums, taking the clients' heads last (`()` without `head_start`)."""

    def logits_of(weights: tuple, state: tuple, x: tf.Tensor, heads: list) -> tf.Tensor:
        if head_start is None:
            return model.apply(weights, state, x, False, None)[0]
        features = model.features(weights, state, x, head_start)
        return model.row_heads(heads, features, head_start)

    def sums(
        weights: tuple,
        state: tuple,
        x: tf.Tensor,
        y: tf.Tensor,
        rows: tf.Tensor,
        client: tf.Tensor,
        num_clients: tf.Tensor,
        batch_size: tf.Tensor,
        heads: tuple,
    ) -> tuple[tf.Tensor, ...]:
        def step(totals: tuple, batch: dict) -> tuple:
            owner = batch["client"]
            own_heads = [tf.gather(h, owner) for h in heads]
            logits = logits_of(weights, state, tf.gather(x, batch["rows"]), own_heads)
            labels = tf.gather(y, batch["rows"])
            correct = tf.cast(tf.equal(local_training.predicted_labels(logits), labels), tf.float32)
            per_example = (
                local_training.example_losses(logits, labels),
                correct,
                tf.ones_like(correct),
            )
            return tuple(
                total + tf.math.unsorted_segment_sum(value, owner, num_clients)
                for total, value in zip(totals, per_example)
            )

        zeros = tf.zeros([num_clients], tf.float32)
        scored = collections.OrderedDict(rows=rows, client=client)
        return ArrayBatches(scored, batch_size).reduce((zeros, zeros, zeros), step)

    return sums


def pooled_examples_specs(input_spec: dict) -> tuple[tf.TensorSpec, tf.TensorSpec]:
    """The pooled arrays `pooled_scores_fn` scores rows of: x and y of any number of
    examples."""
    return (
        tf.TensorSpec([None, *input_spec["x"].shape[1:]], input_spec["x"].dtype),
        tf.TensorSpec([None], input_spec["y"].dtype),
    )


def pooled_scores_specs(
    model: FunctionalModel, input_spec: dict, head_start: Optional[int] = None
) -> tuple:
    """`pooled_scores_fn`'s argument specs; with `head_start`, the clients' stacked heads last."""
    layout = ModelLayout.of(model)
    heads = () if head_start is None else layout.trainable_shapes[head_start:]
    return (
        tuple(tf.TensorSpec(s, tf.float32) for s in layout.trainable_shapes),
        tuple(tf.TensorSpec(s, tf.float32) for s in layout.state_shapes),
        *pooled_examples_specs(input_spec),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.int64),
        *([tuple(tf.TensorSpec([None, *s], tf.float32) for s in heads)] if heads else []),
    )
