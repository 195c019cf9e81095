"""Seconds per round of our FedAvg against TFF's own `build_weighted_fed_avg`, same run.

Both get the same Keras model, clients, data, local epochs and batch size, on the same TFF
worker. After one warm-up round each (tracing), rounds alternate ours/TFF so that machine noise
hits both alike; the median is reported. The last output line is one JSON object.

  python binaries/benchmark.py --rounds=10
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# TensorFlow must be imported before absl parses flags: imported inside `main`, Keras' Flatten
# layer fails to build (seen with TF 2.14 / absl 1.4).
from tff_clustered.federated.clustered_process import (  # noqa: E402
    build_clustered_process,
    round_hparams,
)
from tff_clustered.models import PersonalSplit, ResolvedSplit, initial_weights, model_spec  # noqa: E402
from tff_clustered.runtime import tff_runtime  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 8, "Timed rounds per implementation.", lower_bound=1)
flags.DEFINE_integer("clients", 20, "Clients per round.", lower_bound=1)
flags.DEFINE_integer("examples_per_client", 100, "Training examples per client.", lower_bound=1)
flags.DEFINE_integer("input_dim", 784, "Input features (784 = MNIST size).", lower_bound=1)
flags.DEFINE_integer("num_classes", 10, "Classes.", lower_bound=2)
flags.DEFINE_enum("model", "mlp", ["mclr", "mlp"], "Model.")
flags.DEFINE_integer("hidden_units", 128, "MLP hidden units.", lower_bound=1)
flags.DEFINE_integer("local_epochs", 5, "Local epochs.", lower_bound=1)
flags.DEFINE_integer("batch_size", 10, "Batch size.", lower_bound=1)
flags.DEFINE_float("learning_rate", 0.03, "Client learning rate.")
flags.DEFINE_integer("seed", 0, "Seed of the data and initial model.")


def main(argv: list[str]) -> None:
    del argv
    rng = np.random.default_rng(FLAGS.seed)
    spec = model_spec(FLAGS.model, (FLAGS.input_dim,), FLAGS.num_classes, FLAGS.hidden_units)
    clients = [
        collections.OrderedDict(
            x=rng.normal(size=(FLAGS.examples_per_client, FLAGS.input_dim)).astype(np.float32),
            y=rng.integers(0, FLAGS.num_classes, FLAGS.examples_per_client).astype(np.int32),
        )
        for _ in range(FLAGS.clients)
    ]

    def datasets() -> list:
        return [
            tf.data.Dataset.from_tensor_slices(c).batch(FLAGS.batch_size).repeat(FLAGS.local_epochs)
            for c in clients
        ]

    w0 = initial_weights(spec, FLAGS.seed)
    ours = build_clustered_process(
        spec, ResolvedSplit.of(spec.build(), PersonalSplit.none()), 1, w0
    )

    def model_fn() -> tff.learning.models.VariableModel:
        keras_model = spec.build()
        keras_model.set_weights(w0)
        return tff.learning.models.from_keras_model(
            keras_model,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=collections.OrderedDict(spec.input_spec()),
        )

    theirs = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=FLAGS.learning_rate),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )

    with tff_runtime():
        our_state, their_state = ours.initialize(), theirs.initialize()
        keys = [np.array([0], np.int32)] * FLAGS.clients
        hparams = round_hparams(FLAGS.learning_rate)

        def our_round() -> None:
            nonlocal our_state
            our_state, _, _ = ours.next(our_state, datasets(), keys, [()] * FLAGS.clients, hparams)

        def their_round() -> None:
            nonlocal their_state
            their_state = theirs.next(their_state, datasets()).state

        our_round(), their_round()  # warm-up: tracing and compilation
        timings: dict[str, list[float]] = {"ours": [], "tff": []}
        for _ in range(FLAGS.rounds):
            for name, fn in (("ours", our_round), ("tff", their_round)):
                start = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - start)

    ours_s, tff_s = statistics.median(timings["ours"]), statistics.median(timings["tff"])
    print(
        f"FedAvg, {FLAGS.clients} clients x {FLAGS.examples_per_client} examples, "
        f"{FLAGS.local_epochs} epochs, batch {FLAGS.batch_size}, {FLAGS.model}: "
        f"ours {ours_s:.3f} s/round, tff.learning {tff_s:.3f} s/round (median of {FLAGS.rounds})"
    )
    print(
        json.dumps(
            {
                "benchmark": "fedavg_round",
                "ours_s_per_round": round(ours_s, 4),
                "tff_s_per_round": round(tff_s, 4),
                "ratio": round(ours_s / tff_s, 3),
                "rounds": FLAGS.rounds,
                "clients": FLAGS.clients,
                "model": FLAGS.model,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
