"""Example-weighted mean **per cluster**, as a `tff.aggregators` factory.

Each client contributes its update `v` and a weight vector `w` of length `num_clusters` that is
zero except at its own cluster (`w = n_i * onehot(cluster_i)`). The result is the stack

    mean[k] = sum_i w_i[k] v_i / sum_i w_i[k]          (0 where no client of cluster k came)

along a leading cluster axis, plus the per-cluster total weight. This is one `federated_sum` of
masked updates, exact in the sense of a plain weighted mean. TFF's `MeanFactory` averages one
value with one scalar weight; a vector of per-cluster weights needs this small factory.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class ClusteredMeanFactory(tff.aggregators.WeightedAggregationFactory):
    """`create(value_type, weight_type)` with `weight_type = float32[num_clusters]`."""

    def __init__(self, num_clusters: int) -> None:
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        self.num_clusters = num_clusters

    def create(
        self, value_type: tff.types.Type, weight_type: tff.types.Type
    ) -> tff.templates.AggregationProcess:
        num_clusters = self.num_clusters
        expected = tff.TensorType(np.float32, [num_clusters])
        if not weight_type.is_equivalent_to(expected):
            raise TypeError(f"weight type must be {expected}, got {weight_type}")
        stacked_specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec([num_clusters, *t.shape], t.dtype),
            tff.types.type_to_tf_tensor_specs(value_type),
        )

        @tff.tensorflow.computation(value_type, weight_type)
        def scatter(value: object, weight: tf.Tensor) -> object:
            def masked(t: tf.Tensor) -> tf.Tensor:
                w = tf.reshape(weight, [num_clusters] + [1] * len(t.shape))
                return w * tf.expand_dims(t, 0)

            return tf.nest.map_structure(masked, value)

        @tff.tensorflow.computation(tff.types.tensorflow_to_type(stacked_specs), weight_type)
        def divide(total: object, total_weight: tf.Tensor) -> object:
            def mean(t: tf.Tensor) -> tf.Tensor:
                w = tf.reshape(total_weight, [num_clusters] + [1] * (len(t.shape) - 1))
                return tf.math.divide_no_nan(t, w)

            return tf.nest.map_structure(mean, total)

        @tff.federated_computation()
        def init_fn() -> object:
            return tff.federated_value((), tff.SERVER)

        @tff.federated_computation(
            init_fn.type_signature.result,
            tff.FederatedType(value_type, tff.CLIENTS),
            tff.FederatedType(weight_type, tff.CLIENTS),
        )
        def next_fn(state: object, value: object, weight: object) -> object:
            total = tff.federated_sum(tff.federated_map(scatter, (value, weight)))
            total_weight = tff.federated_sum(weight)
            result = tff.federated_map(divide, (total, total_weight))
            measurements = tff.federated_zip(collections.OrderedDict(cluster_weight=total_weight))
            return tff.templates.MeasuredProcessOutput(
                state=state, result=result, measurements=measurements
            )

        return tff.templates.AggregationProcess(init_fn, next_fn)
