"""tff_clustered from Python: your clients, your Keras model, any algorithm.

    .venv/bin/python examples/own_data.py [--rounds=20] [--output_dir=runs/example]

The clients here are a `tff.simulation.datasets.ClientData` built from scikit-learn's digits,
in two groups that label the digits differently (the second group's labels are shifted by
one): the kind of data a clustered algorithm is for. Replace `make_clients` with your own
ClientData (TFF's EMNIST: `x_key="pixels", y_key="label"`) or a dict {client: (x, y)}, and
`make_model` with your model (it must return logits). The run writes the outputs of
`binaries/train.py` (metrics.csv, summary.json, membership.png, ...) to --output_dir.
"""

from __future__ import annotations

# Before TensorFlow Federated: importing tff_clustered first turns off gRPC's fork handlers,
# which crash a process that starts a second run's worker while the first one's gRPC threads
# live (docs/runtime.md). The package is installed (scripts/bootstrap.sh: editable).
import tff_clustered

# isort: split
import argparse
import collections
import os

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from sklearn.datasets import load_digits


def make_clients(
    num_clients: int = 16, seed: int = 0
) -> tuple[tff.simulation.datasets.ClientData, dict]:
    """`num_clients` clients of digits in two groups; group 1's labels are (y + 1) mod 10."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    shares = np.array_split(np.random.default_rng(seed).permutation(len(x)), num_clients)
    clients, groups = {}, {}
    for i, share in enumerate(shares):
        client, group = f"client_{i:02d}", i % 2
        labels = (digits.target[share] + group) % 10
        clients[client] = collections.OrderedDict(pixels=x[share], label=labels.astype(np.int32))
        groups[client] = group
    return tff.simulation.datasets.TestClientData(clients), groups


def make_model() -> tf.keras.Model:
    """Any Keras model that returns logits; FedPer-style algorithms keep its top layer
    personal, clustered ones train one copy per cluster."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(64,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output_dir", default=os.path.join("runs", "example"))
    parser.add_argument("--execution", choices=("tff", "in_process"), default="tff")
    args = parser.parse_args()

    clients, groups = make_clients()
    training = tff_clustered.TrainingConfig(
        rounds=args.rounds, clients_per_round=8, local_epochs=2, batch_size=10, learning_rate=0.1
    )
    results = {}
    for algorithm, options in (("ifca", {"num_clusters": 2}), ("fedavg", {})):
        result = tff_clustered.run(
            algorithm,
            train=clients,
            model_fn=make_model,
            options=options,
            training=training,
            output_dir=os.path.join(args.output_dir, algorithm),
            execution=args.execution,
            x_key="pixels",
            y_key="label",
            planted_groups=groups,  # optional: only to report how well clusters match them
            log=lambda _: None,
        )
        results[algorithm] = result.summary["results"]
        clusters = results[algorithm]["clusters"]
        print(
            f"{algorithm}: final accuracy {results[algorithm]['final_accuracy']:.3f}, cluster "
            f"sizes {clusters['cluster_sizes']}, adjusted Rand against the two groups "
            f"{clusters['adjusted_rand_vs_planted']:.3f}; outputs in {result.output_dir}"
        )
    gain = results["ifca"]["final_accuracy"] - results["fedavg"]["final_accuracy"]
    print(f"ifca - fedavg: {gain:+.3f}")


if __name__ == "__main__":
    main()
