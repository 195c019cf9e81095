"""The per-cluster weighted sums and mean of clients' updates, the arithmetic of `ClusterMean`.

Each client contributes its update `v` and a weight vector `w` of length `num_clusters` that is
zero except at its own cluster (`w = n_i * onehot(cluster_i)`). The result is the stack

    mean[k] = sum_i w_i[k] v_i / sum_i w_i[k]          (0 where no client of cluster k came)

along a leading cluster axis, plus the per-cluster total weight. It is one
`tff.federated_aggregate` whose accumulator is the [num_clusters, ...] stack: each client adds
its weighted update into its own cluster's row only (`tensor_scatter_nd_add`), so the cost per
client does not grow with the number of clusters. TFF's `MeanFactory` averages one value with
one scalar weight; a vector of per-cluster weights needs these steps. `add_to_cluster` and
`cluster_mean` are plain TF functions every execution runs (`ClusterSums` on TFF's runtime;
`cluster_aggregators.ClusterMean.finalize` divides).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_clustered.frameworks import tff


def add_to_cluster(total: tuple, value: tuple, weight: tf.Tensor) -> tuple:
    """One client's step of the sum: `weight * value` added into the row of its cluster (the
    one non-zero entry of `weight`) only, O(d) per client whatever the number of clusters.
    A zero weight (a diverged client) adds nothing."""
    key = tf.reshape(tf.argmax(weight, output_type=tf.int32), [1, 1])
    scale = tf.reduce_max(weight)

    def add(acc: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
        return tf.tensor_scatter_nd_add(acc, key, tf.expand_dims(scale * t, 0))

    return tuple(add(total[i], value[i]) for i in range(len(value)))


def cluster_mean(total: tuple, total_weight: tf.Tensor) -> tuple:
    """Each cluster's row of the weighted sums divided by its total weight (0 where none)."""

    def mean(t: tf.Tensor) -> tf.Tensor:
        w = tf.reshape(total_weight, [-1] + [1] * (len(t.shape) - 1))
        return tf.math.divide_no_nan(t, w)

    return tuple(mean(t) for t in total)


class ClusterSums:
    """The per-cluster weighted sums of CLIENTS-placed updates as SERVER-placed values:
    `sums(value, weight) -> (total, total_weight)`, `total[k] = sum_i w_i[k] v_i` (one
    `tff.federated_aggregate` whose accumulator is the [num_clusters, ...] stack) and
    `total_weight = sum_i w_i`. Sums of disjoint sets of clients add up to the sums of their
    union, which is how a round split over several workers is merged."""

    def __init__(self, value_type: tff.types.Type, num_clusters: int) -> None:
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        self.num_clusters = num_clusters
        self.weight_type = tff.TensorType(np.float32, [num_clusters])
        self.stacked_specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec([num_clusters, *t.shape], t.dtype),
            tff.types.type_to_tf_tensor_specs(value_type),
        )
        self.stacked_type = tff.types.tensorflow_to_type(self.stacked_specs)
        stacked_type = self.stacked_type

        # The zero stack made by TF inside the computation: as a literal, its values would be
        # serialized one by one into the computation at every build, and sent with it.
        @tff.tensorflow.computation
        def zero() -> object:
            return tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), self.stacked_specs)

        @tff.tensorflow.computation(stacked_type, tff.StructType([value_type, self.weight_type]))
        def accumulate(total: object, element: object) -> object:
            value, weight = element
            return add_to_cluster(total, value, weight)

        @tff.tensorflow.computation(stacked_type, stacked_type)
        def merge(a: object, b: object) -> object:
            return tuple(a[i] + b[i] for i in range(len(a)))

        @tff.tensorflow.computation(stacked_type)
        def report(total: object) -> object:
            return tuple(total[i] for i in range(len(total)))

        self._zero, self._accumulate, self._merge, self._report = zero, accumulate, merge, report

    def __call__(self, value: object, weight: object) -> tuple[object, object]:
        total = tff.federated_aggregate(
            tff.federated_zip((value, weight)),
            self._zero(),
            self._accumulate,
            self._merge,
            self._report,
        )
        return total, tff.federated_sum(weight)
