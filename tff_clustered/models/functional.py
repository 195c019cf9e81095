"""A Keras model as a pure function of explicit tensors, for local training inside TFF
computations: `apply(weights, state, x, training, seed) -> (logits, new_state)`.

`weights` are the model's trainable tensors (`model.trainable_weights` order), `state` its
non-trainable ones (BatchNorm moving statistics, `model.non_trainable_weights` order), `seed` a
stateless `[2]` int32 seed for dropout. Two builders, one interface:

* models without BatchNorm or Dropout go through TFF's own
  `tff.learning.models.functional_model_from_keras` (their results are unchanged);
* models with them (the FedTSDP CNN, ResNet18) go through a small interpreter of the Keras
  graph: TFF's builder rejects BatchNorm, and its Dropout would draw unseeded random numbers.
  BatchNorm statistics are an input and an output, so each client keeps its own; Dropout
  masks come from the given seed (same seed, same run).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ApplyFn = Callable[..., tuple[tf.Tensor, tuple]]
# Layers without weights that the interpreter runs by calling the layer itself.
PARAMETER_FREE = (
    tf.keras.layers.InputLayer,
    tf.keras.layers.Flatten,
    tf.keras.layers.Reshape,
    tf.keras.layers.MaxPool2D,
    tf.keras.layers.AveragePooling2D,
    tf.keras.layers.GlobalAveragePooling2D,
    tf.keras.layers.Activation,
    tf.keras.layers.ReLU,
    tf.keras.layers.Add,
    tf.keras.layers.ZeroPadding2D,
)


@dataclasses.dataclass(frozen=True)
class FunctionalModel:
    trainable_shapes: tuple[tuple[int, ...], ...]
    state_shapes: tuple[tuple[int, ...], ...]
    state_owner: tuple[int, ...]  # per state tensor: the trainable tensor it follows (BN gamma)
    initial_state: tuple[np.ndarray, ...]
    apply: ApplyFn


def _shapes(variables: Sequence[tf.Variable]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in v.shape) for v in variables)


def _needs_interpreter(model: tf.keras.Model) -> bool:
    return any(
        isinstance(layer, (tf.keras.layers.BatchNormalization, tf.keras.layers.Dropout))
        for layer in model.layers
    )


def functional_model(keras_model: tf.keras.Model, input_spec: dict) -> FunctionalModel:
    """`keras_model` as a `FunctionalModel`; `input_spec` is a batched element spec."""
    if _needs_interpreter(keras_model):
        return _interpreted(keras_model)
    functional = tff.learning.models.functional_model_from_keras(
        keras_model,
        loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(input_spec),
    )
    non_trainable = tuple(functional.initial_weights[1])

    def apply(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple]:
        logits = functional.predict_on_batch((tuple(weights), non_trainable), x, training)
        return logits, tuple(state)

    return FunctionalModel(_shapes(keras_model.trainable_weights), (), (), (), apply)


def _interpreted(model: tf.keras.Model) -> FunctionalModel:
    trainable = {v.ref(): i for i, v in enumerate(model.trainable_weights)}
    state = {v.ref(): i for i, v in enumerate(model.non_trainable_weights)}
    owner = [-1] * len(state)
    plan = []  # (layer, trainable indices, state indices, input refs, output ref)
    sequential = isinstance(model, tf.keras.Sequential)
    for position, layer in enumerate(model.layers):
        t_idx = [trainable[v.ref()] for v in layer.trainable_weights]
        s_idx = [state[v.ref()] for v in layer.non_trainable_weights]
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            if not t_idx:
                raise ValueError(f"BatchNorm layer {layer.name} needs scale or center")
            for j in s_idx:
                owner[j] = t_idx[0]
        elif s_idx:
            raise ValueError(f"layer {layer.name} has non-trainable weights; unsupported")
        elif t_idx and not isinstance(layer, (tf.keras.layers.Dense, tf.keras.layers.Conv2D)):
            raise ValueError(
                f"layer {layer.name} ({type(layer).__name__}) is not supported with BatchNorm or "
                "Dropout; supported weighted layers: Dense, Conv2D, BatchNormalization"
            )
        elif not t_idx and not isinstance(layer, (*PARAMETER_FREE, tf.keras.layers.Dropout)):
            raise ValueError(f"layer {layer.name} ({type(layer).__name__}) is not supported")
        if sequential:
            inputs, output = None, None
        else:
            node_inputs = layer.input if isinstance(layer.input, list) else [layer.input]
            inputs, output = [id(t) for t in node_inputs], id(layer.output)
        plan.append((position, layer, t_idx, s_idx, inputs, output))
    model_inputs = None if sequential else [id(t) for t in model.inputs]
    model_output = None if sequential else id(model.outputs[0])

    def run_layer(
        position: int,
        layer: tf.keras.layers.Layer,
        values: list,
        weights: Sequence[tf.Tensor],
        stats: list,
        s_idx: list,
        t_idx: list,
        training: bool,
        seed: Optional[tf.Tensor],
    ) -> tf.Tensor:
        x = values[0] if len(values) == 1 else values
        if isinstance(layer, tf.keras.layers.Dense):
            y = tf.matmul(x, weights[t_idx[0]])
            if layer.use_bias:
                y = tf.nn.bias_add(y, weights[t_idx[1]])
            return layer.activation(y)
        if isinstance(layer, tf.keras.layers.Conv2D):
            y = tf.nn.convolution(
                x,
                weights[t_idx[0]],
                strides=list(layer.strides),
                padding=layer.padding.upper(),
                dilations=list(layer.dilation_rate),
            )
            if layer.use_bias:
                y = tf.nn.bias_add(y, weights[t_idx[1]])
            return layer.activation(y)
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            axes = [a for a in range(len(x.shape)) if a != len(x.shape) - 1]
            it = iter(t_idx)
            gamma = weights[next(it)] if layer.scale else None
            beta = weights[next(it)] if layer.center else None
            mean_i, var_i = s_idx
            if training:
                mean, variance = tf.nn.moments(x, axes)
                m = layer.momentum
                stats[mean_i] = stats[mean_i] * m + mean * (1 - m)
                stats[var_i] = stats[var_i] * m + variance * (1 - m)
            else:
                mean, variance = stats[mean_i], stats[var_i]
            return tf.nn.batch_normalization(x, mean, variance, beta, gamma, layer.epsilon)
        if isinstance(layer, tf.keras.layers.Dropout):
            if not training or layer.rate == 0:
                return x
            if seed is None:
                raise ValueError("training with Dropout needs a seed (reproducible runs)")
            layer_seed = tf.random.experimental.stateless_fold_in(
                tf.cast(seed, tf.int32), position
            )
            return tf.nn.experimental.stateless_dropout(x, layer.rate, seed=layer_seed)
        return layer(x, training=training)

    def apply(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple]:
        stats = list(state)
        if sequential:
            value = x
            for position, layer, t_idx, s_idx, _, _ in plan:
                value = run_layer(
                    position, layer, [value], weights, stats, s_idx, t_idx, training, seed
                )
            return value, tuple(stats)
        values = dict(zip(model_inputs, [x]))
        for position, layer, t_idx, s_idx, inputs, output in plan:
            if isinstance(layer, tf.keras.layers.InputLayer):
                continue
            values[output] = run_layer(
                position,
                layer,
                [values[i] for i in inputs],
                weights,
                stats,
                s_idx,
                t_idx,
                training,
                seed,
            )
        return values[model_output], tuple(stats)

    return FunctionalModel(
        trainable_shapes=_shapes(model.trainable_weights),
        state_shapes=_shapes(model.non_trainable_weights),
        state_owner=tuple(owner),
        initial_state=tuple(v.numpy() for v in model.non_trainable_weights),
        apply=apply,
    )
