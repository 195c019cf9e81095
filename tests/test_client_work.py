"""Client work alone (no TFF): local SGD against a NumPy reference."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from reference import mclr_sgd

from tff_clustered.federated import local_training


def mclr_predict(weights: tuple, x: tf.Tensor, training: bool) -> tf.Tensor:
    return tf.matmul(x, weights[0]) + weights[1]


mclr_forward = local_training.stateless(mclr_predict)


def make_batches(rng: np.random.Generator, n: int, batch: int) -> list:
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int32)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]


def as_dataset(batches: list) -> tf.data.Dataset:
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(
        len(batches[0][1])
    )


@pytest.mark.parametrize("mu, momentum", [(0.0, 0.0), (0.5, 0.0), (0.0, 0.9), (0.3, 0.5)])
def test_train_client_matches_numpy_sgd(mu: float, momentum: float) -> None:
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    batches = make_batches(rng, 23, 4)  # last batch partial (3 examples), kept
    result = tf.function(local_training.train_client, autograph=False)(
        mclr_forward,
        (tf.constant(w), tf.constant(b)),
        as_dataset(batches),
        tf.constant(0.1),
        momentum,
        pulls=[local_training.Pull(mu, (tf.constant(w), tf.constant(b)))],
    )
    ref_w, ref_b = mclr_sgd(w, b, batches, 0.1, mu, momentum)
    np.testing.assert_allclose(result.weights[0].numpy(), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.weights[1].numpy(), ref_b, rtol=1e-5, atol=1e-6)
    assert float(result.num_examples) == 23.0


def test_prox_term_pulls_towards_the_start() -> None:
    rng = np.random.default_rng(1)
    w, b = rng.normal(size=(5, 3)).astype(np.float32), np.zeros(3, np.float32)
    ds = as_dataset(make_batches(rng, 40, 5))
    train = tf.function(local_training.train_client, autograph=False)
    drift = []
    for mu in (0.0, 5.0):
        start = (tf.constant(w), tf.constant(b))
        r = train(mclr_forward, start, ds, tf.constant(0.1), pulls=[local_training.Pull(mu, start)])
        drift.append(np.linalg.norm(r.weights[0].numpy() - w))
    assert drift[1] < 0.5 * drift[0]


def test_pulls_on_some_tensors_match_numpy() -> None:
    """A FedProx pull on everything plus an anchor pull on the kernel only (FedAC's two)."""
    rng = np.random.default_rng(2)
    w, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    target = rng.normal(size=(5, 3)).astype(np.float32)
    batches = make_batches(rng, 20, 4)
    start = (tf.constant(w), tf.constant(b))
    result = tf.function(local_training.train_client, autograph=False)(
        mclr_forward,
        start,
        as_dataset(batches),
        tf.constant(0.1),
        0.5,
        pulls=[
            local_training.Pull(0.3, start),
            local_training.Pull(2.0, (tf.constant(target),), (0,)),
        ],
    )
    ref_w, ref_b = mclr_sgd(w, b, batches, 0.1, 0.3, 0.5, kernel_pull=(2.0, target))
    np.testing.assert_allclose(result.weights[0].numpy(), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.weights[1].numpy(), ref_b, rtol=1e-5, atol=1e-6)
    unpulled = mclr_sgd(w, b, batches, 0.1, 0.3, 0.5)
    assert np.linalg.norm(ref_w - target) < np.linalg.norm(unpulled[0] - target) - 0.1


def test_evaluate_client_counts_correct_predictions() -> None:
    x = np.eye(3, dtype=np.float32)
    w = np.eye(3, dtype=np.float32) * 5
    ds = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=np.array([0, 1, 0], np.int32))
    ).batch(2)
    r = local_training.evaluate_client(mclr_forward, (tf.constant(w), tf.zeros(3)), ds)
    assert float(r.num_correct) == 2.0 and float(r.num_examples) == 3.0
