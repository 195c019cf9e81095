"""`round_floors`: one FedAvg round against two plain-TensorFlow floors.

`round_floors`: one FedAvg round on TFF's runtime and in process (`--execution=in_process`)
against two plain-TensorFlow floors of the same local training: the clients one after another,
one `tf.function` each, and all clients vectorised along a client axis."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tff_clustered.cli.benchmarks.common import (
    FLAGS,
    Benchmark,
    Setup,
    alternate,
    our_round_fn,
    seconds_row,
)


def dense_stack_forward(weights: list, x: tf.Tensor) -> tf.Tensor:
    """The MLP / MCLR of this benchmark as plain TF: (kernel, bias) pairs, ReLU between; with
    a leading client axis on everything, the matmuls are batched."""
    for i in range(0, len(weights), 2):
        x = tf.matmul(x, weights[i]) + tf.expand_dims(weights[i + 1], -2)
        if i + 2 < len(weights):
            x = tf.nn.relu(x)
    return x


def stacked_batches(clients: list) -> tuple[np.ndarray, np.ndarray]:
    """Every client's epochs of batches in one fixed order: x (clients, steps, batch, d),
    y (clients, steps, batch). The floors' data needs no shuffling: the order costs nothing."""
    per_epoch = FLAGS.examples_per_client // FLAGS.batch_size
    used = per_epoch * FLAGS.batch_size
    x = np.stack([c["x"][:used] for c in clients]).reshape(
        len(clients), per_epoch, FLAGS.batch_size, -1
    )
    y = np.stack([c["y"][:used] for c in clients]).reshape(len(clients), per_epoch, -1)
    return np.tile(x, (1, FLAGS.local_epochs, 1, 1)), np.tile(y, (1, FLAGS.local_epochs, 1))


def floor_round_fns(w0: list, clients: list) -> dict[str, Callable[[], None]]:
    """The same local training in plain TensorFlow, no TFF and no framework: `sequential`, one
    `tf.function` per client (traced once) with the clients run one after another, then the
    mean; `vectorised`, every client at once along a leading client axis (batched matmuls) in
    one `tf.function`. What a round could cost on this machine."""
    x, y = stacked_batches(clients)
    lr = FLAGS.learning_rate
    weights = [tf.constant(w) for w in w0]

    def sgd(start: list, xs: tf.Tensor, ys: tf.Tensor) -> list:
        def step(i: tf.Tensor, current: list) -> tuple:
            with tf.GradientTape() as tape:
                tape.watch(current)
                logits = dense_stack_forward(current, xs[..., i, :, :])
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(ys[..., i, :], logits)
                loss = tf.reduce_sum(tf.reduce_mean(losses, axis=-1))  # per-client means
            grads = tape.gradient(loss, current)
            return i + 1, [w - lr * g for w, g in zip(current, grads)]

        steps = xs.shape[-3]
        _, trained = tf.while_loop(lambda i, _: i < steps, step, (tf.constant(0), start))
        return trained

    @tf.function
    def one_client(xs: tf.Tensor, ys: tf.Tensor) -> list:
        return sgd(weights, xs, ys)

    @tf.function
    def all_clients(xs: tf.Tensor, ys: tf.Tensor) -> list:
        stacked = [tf.repeat(w[None], len(clients), axis=0) for w in weights]
        trained = sgd(stacked, xs, ys)
        return [tf.reduce_mean(t, axis=0) for t in trained]

    xs = [tf.constant(x[i]) for i in range(len(clients))]
    ys = [tf.constant(y[i]) for i in range(len(clients))]
    x_all, y_all = tf.constant(x), tf.constant(y)

    def sequential() -> None:
        trained = [one_client(a, b) for a, b in zip(xs, ys)]
        [np.mean([t[i].numpy() for t in trained], axis=0) for i in range(len(weights))]

    def vectorised() -> None:
        [t.numpy() for t in all_clients(x_all, y_all)]

    return {"sequential_floor": sequential, "vectorised_floor": vectorised}


def round_floors(setup: Setup) -> dict:
    """Our FedAvg round on both executions and the two floors, interleaved; each execution's
    time over its floor."""
    spec, w0, clients = setup.spec, setup.w0, setup.clients
    t = alternate(
        {
            "tff_round": our_round_fn(spec, w0, clients, 1),
            "in_process_round": our_round_fn(spec, w0, clients, 1, "in_process"),
            **floor_round_fns(w0, clients),
        },
        FLAGS.rounds,
    )
    seq, vec = t["sequential_floor"], t["vectorised_floor"]
    print(
        f"FedAvg round, {setup.workload}: TFF runtime {t['tff_round']:.3f} s "
        f"({t['tff_round'] / seq:.2f}x the sequential floor), in process "
        f"{t['in_process_round']:.3f} s ({t['in_process_round'] / vec:.2f}x the "
        f"vectorised floor); plain TF floors: sequential {seq:.3f} s, vectorised "
        f"{vec:.3f} s",
        flush=True,
    )
    return {
        **seconds_row(t),
        "tff_over_sequential_floor": round(t["tff_round"] / seq, 3),
        "in_process_over_vectorised_floor": round(t["in_process_round"] / vec, 3),
        "in_process_over_sequential_floor": round(t["in_process_round"] / seq, 3),
    }


BENCHMARK = Benchmark(round_floors)
