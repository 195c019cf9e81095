"""Keras 2.14 layers as TF ops on explicit tensors, for the functional interpreter.

Keras 2.14 layers as TF ops on explicit tensors: the per-layer forward functions of the
functional interpreter (`functional.py`, which walks the layer graph and calls these).

Dense, Conv2D, Embedding and LSTM (`weighted_layer`) and BatchNormalization (`batch_norm`)
compute from the tensors they are given, with the TF ops Keras 2.14 uses; Dropout draws its
mask from a stateless seed (`dropout`); the parameter-free layers run as TF ops
(`parameter_free_ops`). No function calls a Keras layer: that fails once TFF's own Keras builder
has run inside a TF1 graph (it leaves every Keras layer made outside that graph unusable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

# Weighted layers computed from the given tensors (exact types: subclasses such as
# Conv2DTranspose or SpatialDropout2D compute something else).
WEIGHTED = (
    tf.keras.layers.Dense,
    tf.keras.layers.Conv2D,
    tf.keras.layers.BatchNormalization,
    tf.keras.layers.Embedding,
    tf.keras.layers.LSTM,
)
# Layers without weights, run as TF ops (`parameter_free_ops`).
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
SUPPORTED = (
    "supported: Dense, Conv2D, BatchNormalization, trainable Embedding, LSTM, Dropout and the "
    "parameter-free " + ", ".join(t.__name__ for t in PARAMETER_FREE)
)


class NotInterpretable(ValueError):
    """A model or layer these ops do not compute as Keras does."""


def check_layer(layer: tf.keras.layers.Layer, trainable: int, non_trainable: int) -> None:
    """`NotInterpretable` unless these ops compute `layer` as Keras does; `trainable` and
    `non_trainable` count its weights of each kind in the model."""
    kind = type(layer).__name__
    if type(layer) in WEIGHTED or type(layer) is tf.keras.layers.Dropout:
        pass
    elif layer.weights:
        raise NotInterpretable(
            f"layer {layer.name} ({kind}) has weights and is not supported; {SUPPORTED}"
        )
    elif type(layer) not in PARAMETER_FREE:
        raise NotInterpretable(f"layer {layer.name} ({kind}) is not supported; {SUPPORTED}")
    if type(layer) is tf.keras.layers.BatchNormalization:
        if not trainable or non_trainable != 2:
            raise NotInterpretable(
                f"BatchNorm layer {layer.name} must be trainable, with scale or center"
            )
        if layer.renorm or layer.virtual_batch_size or layer.adjustment or layer.synchronized:
            raise NotInterpretable(
                f"BatchNorm layer {layer.name}: renorm, virtual batches, adjustment and "
                "synchronized statistics are not supported"
            )
    elif non_trainable:
        raise NotInterpretable(
            f"layer {layer.name} ({kind}) has non-trainable weights; {SUPPORTED}"
        )
    if type(layer) is tf.keras.layers.Embedding and (
        not trainable or layer.mask_zero or getattr(layer, "sparse", False)
    ):
        raise NotInterpretable(
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
            raise NotInterpretable(
                f"LSTM layer {layer.name}: {', '.join(unsupported)} not supported"
            )
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        raise NotInterpretable(f"layer {layer.name} ({kind}): only channels_last data is supported")
    if type(layer) is tf.keras.layers.Conv2D and (layer.groups != 1 or layer.padding == "causal"):
        raise NotInterpretable(
            f"Conv2D layer {layer.name}: groups > 1 and causal padding unsupported"
        )


def dense(layer: tf.keras.layers.Dense, x: tf.Tensor, kernel: tf.Tensor, bias: object) -> tf.Tensor:
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


def conv2d(
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


def lstm(
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


def batch_norm(
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


def embedding(x: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
    """Keras 2.14 `Embedding.call`: the rows of `table` at the ids `x`, cast to int32 (our
    inputs are float32 ids)."""
    return tf.gather(table, tf.cast(x, tf.int32))


def weighted_layer(
    layer: tf.keras.layers.Layer, x: tf.Tensor, params: Sequence[tf.Tensor]
) -> tf.Tensor:
    """A Dense, Conv2D, Embedding or LSTM layer on `x`, with its weights `params` in
    `layer.weights` order (kernel, [recurrent kernel], [bias])."""
    kind = type(layer)
    if kind is tf.keras.layers.Embedding:
        return embedding(x, params[0])
    if kind is tf.keras.layers.LSTM:
        bias = params[2] if layer.use_bias else None
        return lstm(layer, x, params[0], params[1], bias)
    bias = params[1] if layer.use_bias else None
    return (dense if kind is tf.keras.layers.Dense else conv2d)(layer, x, params[0], bias)


def dropout(
    layer: tf.keras.layers.Dropout,
    x: tf.Tensor,
    training: bool,
    seed: Optional[tf.Tensor],
    position: int,
    call: int,
) -> tf.Tensor:
    """Keras Dropout (Srivastava et al., 2014) with a stateless mask: the run's `seed` folded
    with the layer's `position` in `model.layers` (and with `call` for a shared layer's later
    calls), so the same seed draws the same masks and every layer its own."""
    if not training or layer.rate == 0:
        return x
    if seed is None:
        raise ValueError(f"Dropout layer {layer.name} in training needs a seed (reproducible runs)")
    layer_seed = tf.random.experimental.stateless_fold_in(seed, position)
    if call:
        layer_seed = tf.random.experimental.stateless_fold_in(layer_seed, call)
    noise_shape = None
    if layer.noise_shape is not None:
        dynamic = tf.shape(x)
        noise_shape = [dynamic[i] if d is None else d for i, d in enumerate(layer.noise_shape)]
    return tf.nn.experimental.stateless_dropout(
        x, layer.rate, seed=layer_seed, noise_shape=noise_shape
    )


def parameter_free_ops(layer: tf.keras.layers.Layer, x: object) -> tf.Tensor:
    """A layer of `PARAMETER_FREE` (channels-last) as TF ops."""
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
    raise NotInterpretable(f"layer {layer.name} ({kind.__name__}) is not supported; {SUPPORTED}")
