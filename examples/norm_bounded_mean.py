"""A per-cluster aggregator of your own, in one file: a norm-bounded mean.

Each cluster's weighted mean over its clients whose update is within an L2 norm bound, each
client beyond it dropped.

    .venv/bin/python examples/norm_bounded_mean.py [--max_norm=0.5] [--output_dir=runs/nbm]

`NormBoundedMean(max_norm=B)` is a `ClusterAggregator` (the interface every aggregator of the
round fits, `tff_clustered/federated/cluster_aggregators.py`):

* client side, `preprocess`: a client whose shared update Delta_i has ||Delta_i||_2 > B (the
  global L2 norm over all its tensors) gets weight 0 in its cluster's sum (dropped, as a
  diverged client is); the others keep their weight w_i (their examples, or 1). Its statistics
  row is one value: 1 for a dropped client;
* server side, `finalize`: each cluster's mean is its sum over its kept clients' total weight,
  `sum_{i kept} w_i Delta_i / sum_{i kept} w_i`; a cluster with no kept client keeps its model.
  The round reports `dropped_count_cluster_k` (metrics.csv).

It is a norm-bounded mean, not a coordinate-wise trimmed mean: a trimmed mean needs every
client's values sorted per coordinate, which per-cluster sums cannot give; dropping whole
updates by their norm can be computed from the sums alone, on every execution.

Give it to `tff_clustered.run(..., aggregator=NormBoundedMean(max_norm=...))`: its settings
are its own fields (`option(...)`, as an algorithm's `Options`), recorded in the run's
summary.json and checkpoints under its `name`, so a resumed run with another bound is refused.
"""

from __future__ import annotations

# Before TensorFlow Federated: importing tff_clustered first turns off gRPC's fork handlers
# (docs/runtime.md). The package is installed (scripts/bootstrap.sh: editable).
import tff_clustered

# isort: split
import argparse
import collections
import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import tensorflow as tf

from tff_clustered.data import DataSpec
from tff_clustered.federated.cluster_aggregators import ClusterAggregator, divide_rows
from tff_clustered.options import option


@dataclasses.dataclass(frozen=True)
class NormBoundedMean(ClusterAggregator):
    """Each cluster's weighted mean over its clients whose update's L2 norm is at most
    `max_norm`; the others are dropped (see the module docstring)."""

    max_norm: float = option(1.0, "drop each client whose update's global L2 norm exceeds this")

    name: ClassVar[str] = "norm_bounded_mean"
    summary: ClassVar[str] = "the weighted mean of the clients whose update is within --max_norm"

    def __post_init__(self) -> None:
        super().__post_init__()  # the types first: max_norm="1" is a TypeError
        if not self.max_norm > 0:
            raise ValueError(f"NormBoundedMean: max_norm must be > 0, got {self.max_norm}")

    @property
    def stats_width(self) -> int:
        return 1  # dropped or not

    def preprocess(
        self,
        params: Mapping[str, tf.Tensor],
        delta: tuple,
        cluster: tf.Tensor,
        weight: tf.Tensor,
        seed: tf.Tensor,
    ) -> tuple[tuple, tf.Tensor, tf.Tensor]:
        norm = tf.linalg.global_norm(list(delta))
        kept = norm <= self.max_norm
        taking_part = tf.cast(weight > 0, tf.float32)  # a diverged client weighs 0 already
        dropped = (1.0 - tf.cast(kept, tf.float32)) * taking_part
        return tuple(delta), tf.where(kept, weight, tf.zeros_like(weight)), tf.reshape(dropped, [1])

    def finalize(
        self,
        sums: tuple,
        total_weight: tf.Tensor,
        stats: tf.Tensor,
        state: Mapping[str, tf.Tensor],
        inputs: Mapping[str, tf.Tensor],
    ) -> tuple[tuple, tf.Tensor, collections.OrderedDict, collections.OrderedDict]:
        means = tuple(divide_rows(total, total_weight) for total in sums)
        stepped = total_weight > 0  # a cluster with no kept client keeps its model
        measurements = collections.OrderedDict(dropped_count=stats[:, 0])
        return means, stepped, collections.OrderedDict(state), measurements


def digits_model() -> tf.keras.Model:
    """A small classifier of the 8x8 digits (logits)."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(64,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_norm", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output_dir", default="runs/norm_bounded_mean")
    args = parser.parse_args()
    result = tff_clustered.run(
        "ifca",
        DataSpec("digits", num_clients=8),
        digits_model,
        options={"num_clusters": 2},
        training=tff_clustered.TrainingConfig(rounds=args.rounds, clients_per_round=8),
        aggregator=NormBoundedMean(max_norm=args.max_norm),
        output_dir=args.output_dir,
        overwrite=True,
        execution="in_process",
    )
    for row in result.history[1:]:
        dropped = [v for k, v in row.items() if k.startswith("dropped_count_cluster_")]
        print(f"round {row['round']}: accuracy {row['accuracy']:.3f}, dropped {sum(dropped):g}")


if __name__ == "__main__":
    main()
