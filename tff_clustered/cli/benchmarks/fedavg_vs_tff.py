"""`fedavg_vs_tff`: one round of our FedAvg against TFF's own `build_weighted_fed_avg`.

`fedavg_vs_tff`: one round of our FedAvg against TFF's own `build_weighted_fed_avg` on the
same Keras model, clients, data, epochs and batch size, on the same TFF worker (goal <= 1.0)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, our_round_fn
from tff_clustered.models import ModelSpec


def datasets(clients: list) -> list:
    """Each client's examples as the batched, repeated `tf.data.Dataset` TFF's FedAvg takes."""
    return [
        tf.data.Dataset.from_tensor_slices(c).batch(FLAGS.batch_size).repeat(FLAGS.local_epochs)
        for c in clients
    ]


def tff_round_fn(spec: ModelSpec, w0: list, clients: list) -> Callable[[], None]:
    """One round of `tff.learning`'s weighted FedAvg from `w0` (client SGD, server SGD at 1)."""

    def model_fn() -> tff.learning.models.VariableModel:
        keras_model = spec.build()
        keras_model.set_weights(w0)
        return tff.learning.models.from_keras_model(
            keras_model,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=collections.OrderedDict(spec.input_spec()),
        )

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=FLAGS.learning_rate),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )
    state = process.initialize()

    def run() -> None:
        nonlocal state
        state = process.next(state, datasets(clients)).state

    return run


def fedavg_vs_tff(setup: Setup) -> dict:
    """Our FedAvg round and TFF's, interleaved; seconds per round and ours / TFF's."""
    t = alternate(
        {
            "ours": our_round_fn(setup.spec, setup.w0, setup.clients, 1),
            "tff": tff_round_fn(setup.spec, setup.w0, setup.clients),
        },
        FLAGS.rounds,
    )
    print(
        f"FedAvg, {setup.workload}: ours {t['ours']:.3f} s/round, tff.learning "
        f"{t['tff']:.3f} s/round (median of {FLAGS.rounds})",
        flush=True,
    )
    return dict(
        ours_s_per_round=round(t["ours"], 4),
        tff_s_per_round=round(t["tff"], 4),
        ratio=round(t["ours"] / t["tff"], 3),
    )


BENCHMARK = Benchmark(fedavg_vs_tff, top_level=True)
