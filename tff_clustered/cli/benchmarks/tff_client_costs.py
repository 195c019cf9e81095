"""`tff_client_costs`: what TFF's runtime costs per client besides its training.

`tff_client_costs` (run only when named): what TFF's runtime costs per client besides its
training, each a small federated computation over `--clients` clients timed alone: being sent
the model by `tff.federated_select` (a row of K = 1 or 3 stacked models) against
`tff.federated_broadcast` of it (every cluster's models when K = 3, the client gathering its
row), at the MLP's size and at 1 M values; and being sent its examples
(`--examples_per_client` x `--input_dim` float32)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, client_data
from tff_clustered.models import initial_weights


def model_paths(size: int, k: int, keys: list[int]) -> dict[str, Callable[[], object]]:
    """Sending each client of `keys` a row of `k` stacked models of `size` values: by
    `tff.federated_select` of its cluster's row, and by `tff.federated_broadcast` of them all
    (the client gathering its row)."""
    key_type = tff.TensorType(np.int32)
    stacked = tff.TensorType(np.float32, [k, size])
    row = tff.TensorType(np.float32, [size])

    @tff.tensorflow.computation(stacked, key_type)
    def select_row(models: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
        return models[key]

    @tff.tensorflow.computation(tff.SequenceType(row), key_type)
    def use_selected(selected: object, key: tf.Tensor) -> tf.Tensor:
        total = selected.reduce(0.0, lambda acc, v: acc + tf.reduce_sum(v))
        return total + tf.cast(key, tf.float32)

    @tff.tensorflow.computation(stacked, key_type)
    def use_broadcast(models: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.gather(models, key % k)) + tf.cast(key, tf.float32)

    @tff.tensorflow.computation(key_type)
    def cluster_of(key: tf.Tensor) -> tf.Tensor:
        return tf.reshape(key % k, [1])

    server, clients = (
        tff.FederatedType(stacked, tff.SERVER),
        tff.FederatedType(key_type, tff.CLIENTS),
    )

    @tff.federated_computation(server, clients)
    def selected(models: object, client_keys: object) -> object:
        rows = tff.federated_select(
            tff.federated_map(cluster_of, client_keys),
            tff.federated_value(k, tff.SERVER),
            models,
            select_row,
        )
        return tff.federated_map(use_selected, (rows, client_keys))

    @tff.federated_computation(server, clients)
    def broadcast(models: object, client_keys: object) -> object:
        return tff.federated_map(use_broadcast, (tff.federated_broadcast(models), client_keys))

    models = np.zeros((k, size), np.float32)
    return {
        f"select_{size}x{k}": lambda: selected(models, keys),
        f"broadcast_{size}x{k}": lambda: broadcast(models, keys),
    }


def tff_client_costs(setup: Setup) -> dict:
    """Milliseconds per client of what TFF's runtime does for a client besides its training
    (see the module docstring), each the median of 3 calls after a warm-up, `--clients`
    clients."""
    n = FLAGS.clients
    keys = list(range(n))
    model_size = sum(int(np.prod(w.shape)) for w in initial_weights(setup.spec, FLAGS.seed))
    examples = tff.TensorType(np.float32, [None, FLAGS.input_dim])

    @tff.tensorflow.computation(examples)
    def total(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(x)

    @tff.federated_computation(tff.FederatedType(examples, tff.CLIENTS))
    def sent_examples(x: object) -> object:
        return tff.federated_map(total, x)

    data = [c["x"] for c in client_data(setup.rng, n)]
    fns = {"examples_sent": lambda: sent_examples(data)}
    for size, k in ((model_size, 1), (model_size, 3), (1_000_000, 3)):
        fns.update(model_paths(size, k, keys))
    out = {f"{name}_ms_per_client": round(1000 * t / n, 3) for name, t in alternate(fns, 3).items()}
    for name, ms in out.items():
        print(f"TFF runtime, {n} clients: {name} {ms:.2f}", flush=True)
    return out


BENCHMARK = Benchmark(tff_client_costs, by_default=False)
