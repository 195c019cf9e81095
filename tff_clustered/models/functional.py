"""A Keras model as a pure function of explicit tensors, for local training inside TFF
computations: `apply(trainable, state, x, training, seed) -> (logits, new_state)`.

`trainable` are the model's trainable tensors (`model.trainable_weights` order), `state` its
non-trainable ones (BatchNorm moving statistics, `model.non_trainable_weights` order), `seed` a
stateless `[2]` int32/int64 seed for dropout. Two builders, one interface:

* models with BatchNorm or Dropout (the CNN and ResNet18 of Zhu et al., "Federated Two Stage
  Decoupling With Adaptive Personalization Layers", 2023) go through a small interpreter of the
  Keras layer graph: TFF's builder rejects BatchNorm (Ioffe & Szegedy, 2015), and its Dropout
  (Srivastava et al., 2014) would draw unseeded random numbers. BatchNorm statistics are an
  input and an output, so each client can keep its own; dropout masks come from the given seed
  (same seed, same run);
* models with LSTM or trainable Embedding layers (the Sent140 and Shakespeare LSTMs) go
  through the interpreter too when it runs all their layers: it computes an LSTM as one loop
  over time (`tf.scan`), where TFF's builder needs the Keras LSTM unrolled, one copy of the
  cell per time step, a graph that took minutes to trace and optimise at 80 steps;
* the other models go through TFF's own `tff.learning.models.functional_model_from_keras`
  (their results are unchanged).

The interpreter computes Dense, Conv2D, BatchNormalization, Embedding and LSTM from the given
tensors with the same TF ops Keras 2.14 uses, runs Dropout statelessly, and calls the
parameter-free layers (pooling, reshapes, activations, Add) themselves.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.models.split import trainable_layer_sizes

ApplyFn = Callable[
    [Sequence[tf.Tensor], Sequence[tf.Tensor], tf.Tensor, bool, Optional[tf.Tensor]],
    tuple[tf.Tensor, tuple[tf.Tensor, ...]],
]
# (trainable, state, x, head_start) -> the input of the layer that owns trainable tensor
# `head_start`, flattened per example, in inference mode: the output of the feature extractor
# g when the head h starts there (UA-PDFL's auxiliary representation, Eq. 11).
FeaturesFn = Callable[[Sequence[tf.Tensor], Sequence[tf.Tensor], tf.Tensor, int], tf.Tensor]

# Weighted layers the interpreter computes from the given tensors (exact types: subclasses such
# as Conv2DTranspose or SpatialDropout2D compute something else).
WEIGHTED = (
    tf.keras.layers.Dense,
    tf.keras.layers.Conv2D,
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.Embedding,
    tf.keras.layers.LSTM,
)
# Layers whose presence makes the interpreter the faster builder (`functional_model`).
RECURRENT = (tf.keras.layers.Embedding, tf.keras.layers.LSTM)
# Layers without weights, which the interpreter runs as TF ops (`parameter_free_ops`).
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
_SUPPORTED = (
    "supported: Dense, Conv2D, BatchNormalization, trainable Embedding, LSTM, Dropout and the "
    "parameter-free " + ", ".join(t.__name__ for t in PARAMETER_FREE)
)


@dataclasses.dataclass(frozen=True)
class FunctionalModel:
    """A model as shapes, initial state and a pure `apply` function."""

    trainable_shapes: tuple[tuple[int, ...], ...]  # model.trainable_weights order
    state_shapes: tuple[tuple[int, ...], ...]  # model.non_trainable_weights order
    state_owner: tuple[int, ...]  # per state tensor: the trainable tensor it follows (BN gamma)
    layer_sizes: tuple[int, ...]  # trainable tensors per layer with weights, bottom to top
    initial_state: tuple[np.ndarray, ...]
    apply: ApplyFn  # (trainable, state, x, training, seed) -> (logits, new_state)
    features: Optional[FeaturesFn] = None  # None: a layer the interpreter does not run
    # Each example's output depends on that example alone (no BatchNorm statistics, no
    # dropout draw shaped by the batch): extra rows in a batch change no other row's output.
    rows_independent: bool = False


def _shapes(variables: Sequence[tf.Variable]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in v.shape) for v in variables)


def _needs_interpreter(model: tf.keras.Model) -> bool:
    return any(
        isinstance(layer, (tf.keras.layers.BatchNormalization, tf.keras.layers.Dropout))
        for layer in model.layers
    )


def _is_recurrent(model: tf.keras.Model) -> bool:
    return any(isinstance(layer, RECURRENT) for layer in model.layers)


def functional_model(
    keras_model: tf.keras.Model,
    input_spec: Optional[dict] = None,
    bn_momentum: Optional[float] = None,
) -> FunctionalModel:
    """`keras_model` as a `FunctionalModel`.

    `input_spec` (a batched element spec with `x` and `y`) is needed by TFF's builder, used
    for models without BatchNorm or Dropout. `bn_momentum` overrides every BatchNorm layer's
    momentum, in Keras's convention (new = momentum * old + (1 - momentum) * batch; PyTorch's
    momentum 0.1 is Keras's 0.9).
    """
    if bn_momentum is not None and not 0.0 <= bn_momentum <= 1.0:
        raise ValueError(f"bn_momentum must be in [0, 1], got {bn_momentum}")
    if _needs_interpreter(keras_model):
        return _interpreted(keras_model, bn_momentum)
    if _is_recurrent(keras_model):
        try:
            return _interpreted(keras_model, bn_momentum)
        except ValueError:  # a layer it does not run (a frozen Embedding): TFF's builder
            pass
    if input_spec is None:
        raise ValueError(
            f"model {keras_model.name} has no BatchNorm or Dropout: it goes through TFF's "
            "functional_model_from_keras, which needs input_spec"
        )
    # TFF's builder exposes no intermediate values: the interpreter gives the features. It is
    # built first: TFF's builder leaves the model's layers unusable outside its graph.
    try:
        features: Optional[FeaturesFn] = _interpreted(keras_model, bn_momentum).features
    except ValueError:  # a layer the interpreter does not run (an LSTM)
        features = None
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
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        logits = functional.predict_on_batch((tuple(weights), non_trainable), x, training)
        return logits, tuple(state)

    return FunctionalModel(
        trainable_shapes=_shapes(keras_model.trainable_weights),
        state_shapes=(),
        state_owner=(),
        layer_sizes=tuple(trainable_layer_sizes(keras_model)),
        initial_state=(),
        apply=apply,
        features=features,
        rows_independent=True,
    )


@dataclasses.dataclass(frozen=True)
class _Step:
    """One call of one layer: where its weights are and which values it reads and writes."""

    layer: tf.keras.layers.Layer
    trainable: tuple[int, ...]  # indices into the trainable tensors
    state: tuple[int, ...]  # indices into the state tensors
    inputs: tuple[int, ...]  # ids of the Keras tensors it reads
    outputs: tuple[int, ...]  # ids of the Keras tensors it writes
    position: int  # index of the layer in model.layers (dropout seeds)
    call: int  # which call of this layer in the model (0 unless the layer is shared)
    fused: bool = False  # BatchNorm: Keras runs the fused kernel (its variance update differs)
    momentum: float = 0.0  # BatchNorm: the moving statistics' momentum (Keras convention)


def _nodes_in_order(model: tf.keras.Model) -> list:
    """The model's layer calls (Keras nodes), each after the calls whose outputs it reads."""
    if not model.inputs or not model.outputs:
        raise ValueError(
            f"model {model.name} has no symbolic inputs/outputs; build it with tf.keras.Input"
        )
    order, done, visiting = [], set(), set()
    stack = [(t.node, False) for t in reversed(tf.nest.flatten(model.outputs))]
    while stack:  # iterative depth-first post-order
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            visiting.discard(id(node))
            done.add(id(node))
            order.append(node)
            continue
        if id(node) in visiting:
            raise ValueError(f"model {model.name} has a cycle at layer {node.layer.name}")
        visiting.add(id(node))
        stack.append((node, True))
        if not node.is_input:
            for tensor in reversed(node.keras_inputs):
                stack.append((tensor.node, False))
    return order


def _check_layer(layer: tf.keras.layers.Layer, t_idx: list, s_idx: list) -> None:
    kind = type(layer).__name__
    if type(layer) in WEIGHTED or type(layer) is tf.keras.layers.Dropout:
        pass
    elif layer.weights:
        raise ValueError(
            f"layer {layer.name} ({kind}) has weights and is not supported; {_SUPPORTED}"
        )
    elif type(layer) not in PARAMETER_FREE:
        raise ValueError(f"layer {layer.name} ({kind}) is not supported; {_SUPPORTED}")
    if type(layer) is tf.keras.layers.BatchNormalization:
        if not t_idx or len(s_idx) != 2:
            raise ValueError(
                f"BatchNorm layer {layer.name} must be trainable, with scale or center"
            )
        if layer.renorm or layer.virtual_batch_size or layer.adjustment or layer.synchronized:
            raise ValueError(
                f"BatchNorm layer {layer.name}: renorm, virtual batches, adjustment and "
                "synchronized statistics are not supported"
            )
    elif s_idx:
        raise ValueError(f"layer {layer.name} ({kind}) has non-trainable weights; {_SUPPORTED}")
    if type(layer) is tf.keras.layers.Embedding and (
        not t_idx or layer.mask_zero or getattr(layer, "sparse", False)
    ):
        raise ValueError(
            f"Embedding layer {layer.name}: frozen, masked (mask_zero) or sparse embeddings are "
            "not supported"
        )
    if type(layer) is tf.keras.layers.LSTM:
        unsupported = [
            name
            for name, value in (
                ("dropout", layer.dropout),
                ("recurrent_dropout", layer.recurrent_dropout),
                ("go_backwards", layer.go_backwards),
                ("stateful", layer.stateful),
                ("return_state", layer.return_state),
                ("time_major", layer.time_major),
            )
            if value
        ]
        if unsupported:
            raise ValueError(f"LSTM layer {layer.name}: {', '.join(unsupported)} not supported")
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        raise ValueError(f"layer {layer.name} ({kind}): only channels_last data is supported")
    if type(layer) is tf.keras.layers.Conv2D and (layer.groups != 1 or layer.padding == "causal"):
        raise ValueError(f"Conv2D layer {layer.name}: groups > 1 and causal padding unsupported")


def _dense(
    layer: tf.keras.layers.Dense, x: tf.Tensor, kernel: tf.Tensor, bias: object
) -> tf.Tensor:
    """Keras 2.14 `Dense.call`: matmul (tensordot over the last axis for rank > 2)."""
    rank = x.shape.rank
    if rank == 2 or rank is None:
        y = tf.matmul(x, kernel)
    else:
        y = tf.tensordot(x, kernel, [[rank - 1], [0]])
        y.set_shape(x.shape[:-1].concatenate([kernel.shape[-1]]))
    if bias is not None:
        y = tf.nn.bias_add(y, bias)
    return layer.activation(y) if layer.activation is not None else y


def _conv2d(
    layer: tf.keras.layers.Conv2D, x: tf.Tensor, kernel: tf.Tensor, bias: object
) -> tf.Tensor:
    """Keras 2.14 `Conv.call` for Conv2D: tf.nn.convolution, bias_add, activation."""
    data_format = "NHWC" if layer.data_format == "channels_last" else "NCHW"
    strides = list(layer.strides)
    if tuple(layer.kernel_size) == (1, 1) and strides != [1, 1]:
        # A strided 1x1 convolution is the 1x1 convolution of the strided subsample (no
        # padding either way). Computed so: oneDNN's 1x1 backward-weights kernel for strided
        # channels-last inputs (TF 2.14, oneDNN 3.2) writes past its scratch buffer when there
        # are fewer input channels than its block (16 on AVX-512), which corrupts the heap
        # (ResNet18's shortcut convs at resnet_width < 16), or gives wrong gradients (AVX2).
        sh, sw = strides
        x = x[:, ::sh, ::sw, :] if data_format == "NHWC" else x[:, :, ::sh, ::sw]
        strides = [1, 1]
    y = tf.nn.convolution(
        x,
        kernel,
        strides=strides,
        padding=layer.padding.upper(),
        dilations=list(layer.dilation_rate),
        data_format=data_format,
        name=layer.__class__.__name__,
    )
    if bias is not None:
        y = tf.nn.bias_add(y, bias, data_format=data_format)
    return layer.activation(y) if layer.activation is not None else y


def _lstm(
    layer: tf.keras.layers.LSTM,
    x: tf.Tensor,
    kernel: tf.Tensor,
    recurrent_kernel: tf.Tensor,
    bias: object,
) -> tf.Tensor:
    """Keras 2.14's LSTM cell (Hochreiter & Schmidhuber, 1997; gates in Keras's i, f, c, o
    order) run over time with `tf.scan` from zero states: z = x_t W + h U + b,
    c' = f(z_f) c + i(z_i) act(z_c), h' = o(z_o) act(c'), with f, i, o the recurrent
    activation. The input projection of every step is one matmul before the loop. Returns the
    sequence of h (return_sequences) or the last h."""
    projected = tf.tensordot(x, kernel, [[2], [0]])  # (batch, time, 4 units)
    if bias is not None:
        projected = projected + bias
    units = layer.units
    zeros = tf.zeros(tf.stack([tf.shape(x)[0], units]), projected.dtype)
    gate, act = layer.recurrent_activation, layer.activation

    def cell(carry: tuple[tf.Tensor, tf.Tensor], z_x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        h, c = carry
        z = z_x + tf.matmul(h, recurrent_kernel)
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
        c = gate(z_f) * c + gate(z_i) * act(z_c)
        return gate(z_o) * act(c), c

    hs, _ = tf.scan(cell, tf.transpose(projected, [1, 0, 2]), initializer=(zeros, zeros))
    if layer.return_sequences:
        return tf.transpose(hs, [1, 0, 2])
    return hs[-1]


def _batch_norm(
    layer: tf.keras.layers.BatchNormalization,
    x: tf.Tensor,
    gamma: object,
    beta: object,
    moving_mean: tf.Tensor,
    moving_variance: tf.Tensor,
    training: bool,
    momentum: float,
    fused: bool,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Keras 2.14 BatchNormalization (Ioffe & Szegedy, 2015).

    Training normalises with the batch mean and biased variance over every axis but the
    channel axes; inference with the moving statistics. Moving statistics update as
    new = momentum * old + (1 - momentum) * batch. The batch variance averaged in differs with
    Keras's kernel choice, and this follows it: a fused layer (Keras's default for 4D inputs
    such as the CNNs' feature maps; `layer.fused` after build, read when the model is
    converted) averages the Bessel-corrected
    variance n / (n - 1) * biased (its `_bessels_correction_test_only` flag leaves the fused
    kernel's unbiased output as is; PyTorch's `BatchNorm2d` does the same), an unfused layer
    the biased variance (`old - (old - batch) * (1 - momentum)`, `_assign_moving_average`).
    """
    ndims = x.shape.rank
    axes = [a % ndims for a in layer.axis]
    reduction = [a for a in range(ndims) if a not in axes]
    if axes != [ndims - 1]:  # broadcast per-channel vectors when the channel axis is not last
        shape = [1] * ndims
        for a in axes:
            shape[a] = x.shape[a]
        gamma = None if gamma is None else tf.reshape(gamma, shape)
        beta = None if beta is None else tf.reshape(beta, shape)
    else:
        shape = None
    if training:
        mean, variance = tf.nn.moments(x, reduction)
        decay = tf.cast(1.0 - momentum, moving_mean.dtype)
        averaged = variance
        if fused:  # the fused kernel's Bessel correction (n = 1 is left uncorrected)
            n = tf.cast(tf.size(x) // tf.size(variance), variance.dtype)
            averaged = variance * (n / tf.maximum(n - 1.0, 1.0))
            new_mean = (1.0 - decay) * moving_mean + decay * mean
            new_variance = (1.0 - decay) * moving_variance + decay * averaged
        else:
            new_mean = moving_mean - (moving_mean - mean) * decay
            new_variance = moving_variance - (moving_variance - averaged) * decay
    else:
        mean, variance = moving_mean, moving_variance
        new_mean, new_variance = moving_mean, moving_variance
    if shape is not None:
        mean, variance = tf.reshape(mean, shape), tf.reshape(variance, shape)
    y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, layer.epsilon)
    return y, new_mean, new_variance


def parameter_free_ops(layer: tf.keras.layers.Layer, x: object) -> tf.Tensor:
    """A layer of `PARAMETER_FREE` (channels-last) as TF ops. Calling a Keras layer fails once
    TFF's own builder has run inside a TF1 graph (it leaves every Keras layer made outside that
    graph unusable), so no pass calls one."""
    kind = type(layer)
    if kind is tf.keras.layers.Flatten:
        return tf.reshape(x, [tf.shape(x)[0], -1])
    if kind is tf.keras.layers.Reshape:
        return tf.reshape(x, [tf.shape(x)[0], *layer.target_shape])
    if kind in (tf.keras.layers.MaxPool2D, tf.keras.layers.AveragePooling2D):
        pool = tf.nn.max_pool2d if kind is tf.keras.layers.MaxPool2D else tf.nn.avg_pool2d
        return pool(x, layer.pool_size, layer.strides, layer.padding.upper())
    if kind is tf.keras.layers.GlobalAveragePooling2D:
        return tf.reduce_mean(x, axis=[1, 2], keepdims=bool(layer.keepdims))
    if kind is tf.keras.layers.Activation:
        return layer.activation(x)
    if kind is tf.keras.layers.ReLU:
        max_value = None if layer.max_value is None else float(layer.max_value)
        return tf.keras.backend.relu(
            x,
            alpha=float(layer.negative_slope),
            max_value=max_value,
            threshold=float(layer.threshold),
        )
    if kind is tf.keras.layers.Add:
        return tf.add_n(list(x))
    if kind is tf.keras.layers.ZeroPadding2D:
        (top, bottom), (left, right) = layer.padding
        return tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
    raise ValueError(f"layer {layer.name} ({kind.__name__}) is not supported; {_SUPPORTED}")


def _interpreted(model: tf.keras.Model, bn_momentum: Optional[float]) -> FunctionalModel:
    trainable_of = {v.ref(): i for i, v in enumerate(model.trainable_weights)}
    state_of = {v.ref(): i for i, v in enumerate(model.non_trainable_weights)}
    position_of = {id(layer): i for i, layer in enumerate(model.layers)}
    owner = [-1] * len(state_of)
    steps: list[_Step] = []
    calls: dict[int, int] = collections.Counter()
    for node in _nodes_in_order(model):
        layer = node.layer
        if node.is_input:
            continue
        t_idx = [trainable_of[v.ref()] for v in layer.trainable_weights if v.ref() in trainable_of]
        s_idx = [state_of[v.ref()] for v in layer.non_trainable_weights if v.ref() in state_of]
        _check_layer(layer, t_idx, s_idx)
        if type(layer) is tf.keras.layers.BatchNormalization:
            for j in s_idx:
                owner[j] = t_idx[0]  # gamma (beta when the layer has no scale)
        steps.append(
            _Step(
                layer=layer,
                trainable=tuple(t_idx),
                state=tuple(s_idx),
                inputs=tuple(id(t) for t in node.keras_inputs),
                outputs=tuple(id(t) for t in tf.nest.flatten(node.outputs)),
                position=position_of.get(id(layer), len(position_of)),
                call=calls[id(layer)],
                fused=bool(getattr(layer, "fused", False)),
                momentum=float(
                    getattr(layer, "momentum", 0.0) if bn_momentum is None else bn_momentum
                ),
            )
        )
        calls[id(layer)] += 1
    used = {i for s in steps for i in s.trainable}
    if len(used) != len(trainable_of) or -1 in owner:
        raise ValueError(
            f"model {model.name} has weights outside the layers it calls; {_SUPPORTED}"
        )
    model_inputs = [id(t) for t in tf.nest.flatten(model.inputs)]
    if len(model_inputs) != 1 or len(tf.nest.flatten(model.outputs)) != 1:
        raise ValueError(f"model {model.name} must have exactly one input and one output")
    model_output = id(tf.nest.flatten(model.outputs)[0])

    def run_step(
        step: _Step,
        x: object,
        weights: Sequence[tf.Tensor],
        stats: list,
        training: bool,
        seed: Optional[tf.Tensor],
    ) -> tf.Tensor:
        layer = step.layer
        kind = type(layer)
        if kind is tf.keras.layers.Dense or kind is tf.keras.layers.Conv2D:
            kernel = weights[step.trainable[0]]
            bias = weights[step.trainable[1]] if layer.use_bias else None
            return (_dense if kind is tf.keras.layers.Dense else _conv2d)(layer, x, kernel, bias)
        if kind is tf.keras.layers.Embedding:
            # Keras casts non-integer ids to int32 (our inputs are float32 ids).
            return tf.gather(weights[step.trainable[0]], tf.cast(x, tf.int32))
        if kind is tf.keras.layers.LSTM:
            bias = weights[step.trainable[2]] if layer.use_bias else None
            return _lstm(layer, x, weights[step.trainable[0]], weights[step.trainable[1]], bias)
        if kind is tf.keras.layers.BatchNormalization:
            it = iter(step.trainable)
            gamma = weights[next(it)] if layer.scale else None
            beta = weights[next(it)] if layer.center else None
            mean_i, var_i = step.state
            y, stats[mean_i], stats[var_i] = _batch_norm(
                layer,
                x,
                gamma,
                beta,
                stats[mean_i],
                stats[var_i],
                training,
                step.momentum,
                step.fused,
            )
            return y
        if kind is tf.keras.layers.Dropout:
            if not training or layer.rate == 0:
                return x
            if seed is None:
                raise ValueError(
                    f"Dropout layer {layer.name} in training needs a seed (reproducible runs)"
                )
            layer_seed = tf.random.experimental.stateless_fold_in(seed, step.position)
            if step.call:
                layer_seed = tf.random.experimental.stateless_fold_in(layer_seed, step.call)
            noise_shape = None
            if layer.noise_shape is not None:
                dynamic = tf.shape(x)
                noise_shape = [
                    dynamic[i] if d is None else d for i, d in enumerate(layer.noise_shape)
                ]
            return tf.nn.experimental.stateless_dropout(
                x, layer.rate, seed=layer_seed, noise_shape=noise_shape
            )
        return parameter_free_ops(layer, x)

    def run(
        weights: Sequence[tf.Tensor],
        stats: list,
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor],
        head_start: Optional[int] = None,
    ) -> tuple[tf.Tensor, bool]:
        """The layers in order; with `head_start`, stops at the layer owning that trainable
        tensor and returns its (flattened) input. (value, whether it stopped there)."""
        values = {model_inputs[0]: x}
        for step in steps:
            inputs = [values[i] for i in step.inputs]
            if head_start is not None and head_start in step.trainable:
                if len(inputs) != 1:
                    raise ValueError(f"the head starts at layer {step.layer.name}, which merges")
                return tf.reshape(inputs[0], [tf.shape(x)[0], -1]), True
            value = run_step(
                step, inputs[0] if len(inputs) == 1 else inputs, weights, stats, training, seed
            )
            for out_id, out in zip(step.outputs, tf.nest.flatten(value)):
                values[out_id] = out
        return values[model_output], False

    def apply(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        if len(weights) != len(trainable_of) or len(state) != len(state_of):
            raise ValueError(
                f"model {model.name} takes {len(trainable_of)} trainable and {len(state_of)} "
                f"state tensors, got {len(weights)} and {len(state)}"
            )
        if seed is not None:
            seed = tf.convert_to_tensor(seed)
        stats = list(state)
        output, _ = run(weights, stats, x, training, seed)
        return output, tuple(stats)

    def features(
        weights: Sequence[tf.Tensor], state: Sequence[tf.Tensor], x: tf.Tensor, head_start: int
    ) -> tf.Tensor:
        value, reached = run(weights, list(state), x, False, None, head_start)
        if not reached:
            raise ValueError(f"no layer of model {model.name} owns trainable tensor {head_start}")
        return value

    return FunctionalModel(
        trainable_shapes=_shapes(model.trainable_weights),
        state_shapes=_shapes(model.non_trainable_weights),
        state_owner=tuple(owner),
        layer_sizes=tuple(trainable_layer_sizes(model)),
        initial_state=tuple(v.numpy() for v in model.non_trainable_weights),
        apply=apply,
        features=features,
        # Without BatchNorm or Dropout each example's output is its own.
        rows_independent=not _needs_interpreter(model),
    )
