"""Keras model builders, each model's output its logits.

Keras model builders. Every model outputs logits; losses are taken `from_logits`.

Parameter counts follow FedGroup's Table II (Duan et al.): MNIST MCLR 7,850 and MLP 101,770;
FEMNIST MCLR 20,410 and MLP(512) 415,258 (26-way head); Synthetic MCLR 610.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

ModelBuilder = Callable[[], tf.keras.Model]


def mclr(input_shape: Sequence[int], num_classes: int) -> tf.keras.Model:
    """Multinomial logistic regression: flatten -> Dense(num_classes)."""
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=tuple(input_shape)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(num_classes, name="logits"),
        ],
        name="mclr",
    )


def mlp(input_shape: Sequence[int], num_classes: int, hidden_units: int = 128) -> tf.keras.Model:
    """One hidden ReLU layer: flatten -> Dense(hidden, relu) -> Dense(num_classes)."""
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=tuple(input_shape)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(hidden_units, activation="relu", name="hidden"),
            tf.keras.layers.Dense(num_classes, name="logits"),
        ],
        name="mlp",
    )


def cnn(
    input_shape: Sequence[int],
    num_classes: int,
    image_shape: Optional[Sequence[int]] = None,
    filters: tuple[int, int] = (32, 64),
    kernel_size: int = 5,
    dense_units: int = 2048,
) -> tf.keras.Model:
    """LEAF-style CNN: 2 x [Conv(k x k, same, ReLU) -> MaxPool(2)] -> Dense(ReLU) -> Dense.

    With the defaults and 28x28x1 inputs this is the LEAF FEMNIST CNN (spec B.8).
    `image_shape` reshapes flat inputs (for example 64 -> 8x8x1 for the digits data).
    """
    image_shape = tuple(image_shape or input_shape)
    if len(image_shape) == 2:
        image_shape = (*image_shape, 1)
    if int(np.prod(image_shape)) != int(np.prod(input_shape)):
        raise ValueError(f"image_shape {image_shape} does not hold inputs of shape {input_shape}")
    layers: list[tf.keras.layers.Layer] = [
        tf.keras.Input(shape=tuple(input_shape)),
        tf.keras.layers.Reshape(image_shape),
    ]
    for i, n_filters in enumerate(filters):
        layers += [
            tf.keras.layers.Conv2D(
                n_filters, kernel_size, padding="same", activation="relu", name=f"conv{i + 1}"
            ),
            tf.keras.layers.MaxPool2D(2, padding="same"),
        ]
    layers += [
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(dense_units, activation="relu", name="dense"),
        tf.keras.layers.Dense(num_classes, name="logits"),
    ]
    return tf.keras.Sequential(layers, name="cnn")


def _image_layers(
    input_shape: Sequence[int], image_shape: Optional[Sequence[int]]
) -> list[tf.keras.layers.Layer]:
    """Input (and a reshape of flat inputs to `image_shape`, e.g. 64 -> 8x8x1)."""
    image_shape = tuple(image_shape or input_shape)
    if len(image_shape) == 2:
        image_shape = (*image_shape, 1)
    if int(np.prod(image_shape)) != int(np.prod(input_shape)):
        raise ValueError(f"image_shape {image_shape} does not hold inputs of shape {input_shape}")
    layers: list[tf.keras.layers.Layer] = [tf.keras.Input(shape=tuple(input_shape))]
    if tuple(image_shape) != tuple(input_shape):
        layers.append(tf.keras.layers.Reshape(image_shape))
    return layers


def tsdp_cnn(
    input_shape: Sequence[int], num_classes: int, image_shape: Optional[Sequence[int]] = None
) -> tf.keras.Model:
    """FedTSDP's CNN (Zhu et al. 2023, Section 4.1.3): Conv 3x3x32 ReLU -> Conv 3x3x64 ReLU
    (valid) -> MaxPool 2 -> Dropout 0.25 -> Dense 512 ReLU -> Dropout 0.5 -> Dense C.
    4 layers, 8 tensors; 6,447,562 parameters at 32x32x3, C = 10."""
    return tf.keras.Sequential(
        [
            *_image_layers(input_shape, image_shape),
            tf.keras.layers.Conv2D(32, 3, activation="relu", name="conv1"),
            tf.keras.layers.Conv2D(64, 3, activation="relu", name="conv2"),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(512, activation="relu", name="fc1"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(num_classes, name="fc2"),
        ],
        name="tsdp_cnn",
    )


def lenet(
    input_shape: Sequence[int],
    num_classes: int,
    image_shape: Optional[Sequence[int]] = None,
    filters: tuple[int, int] = (6, 16),
) -> tf.keras.Model:
    """A LeNet-5-like CNN (LeCun et al., "Gradient-based learning applied to document
    recognition", Proc. IEEE 86(11), 1998) for small grey images: Conv 5x5x6 ReLU -> MaxPool 2 ->
    Conv 5x5x16 ReLU -> MaxPool 2 -> Dense 120 ReLU -> Dense 84 ReLU -> Dense C, both convolutions
    with 'same' padding (so that 8x8 digits pass too) and max pooling instead of LeNet-5's
    subsampling; no Dropout or BatchNorm. 5 weighted layers, 10 tensors, the last three (120, 84,
    C) the fully connected classifier; 107,786 parameters at 28x28x1, C = 10 (7 x 7 x 16 = 784
    flattened)."""
    return tf.keras.Sequential(
        [
            *_image_layers(input_shape, image_shape),
            tf.keras.layers.Conv2D(filters[0], 5, padding="same", activation="relu", name="conv1"),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Conv2D(filters[1], 5, padding="same", activation="relu", name="conv2"),
            tf.keras.layers.MaxPool2D(2),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(120, activation="relu", name="fc1"),
            tf.keras.layers.Dense(84, activation="relu", name="fc2"),
            tf.keras.layers.Dense(num_classes, name="logits"),
        ],
        name="lenet",
    )


def resnet18(
    input_shape: Sequence[int],
    num_classes: int,
    image_shape: Optional[Sequence[int]] = None,
    width: int = 64,
) -> tf.keras.Model:
    """CIFAR ResNet18 (He et al. 2016, as in FedTSDP): 3x3 stem conv + BN + ReLU (no max-pool),
    four stages of two BasicBlocks (width x 1, 2, 4, 8 channels; strides 1, 2, 2, 2; 1x1
    conv + BN shortcuts where the shape changes), global average pooling, Dense C.

    62 trainable tensors in forward order (a block's shortcut after its second conv/BN), 11.17 M
    parameters at width 64, C = 10. BatchNorm uses PyTorch's epsilon 1e-5 and momentum 0.1
    (Keras momentum 0.9); its moving statistics stay with each client.
    """
    layers = _image_layers(input_shape, image_shape)
    inputs = layers[0]
    x = inputs
    for layer in layers[1:]:
        x = layer(x)

    def bn(name: str) -> tf.keras.layers.Layer:
        return tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)

    def conv(filters: int, kernel: int, stride: int, name: str) -> tf.keras.layers.Layer:
        return tf.keras.layers.Conv2D(
            filters, kernel, stride, padding="same", use_bias=False, name=name
        )

    x = tf.keras.layers.ReLU()(bn("stem_bn")(conv(width, 3, 1, "stem_conv")(x)))
    channels = width
    for stage, multiple in enumerate((1, 2, 4, 8)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"s{stage + 1}b{block + 1}"
            out = tf.keras.layers.ReLU()(
                bn(f"{name}_bn1")(conv(width * multiple, 3, stride, f"{name}_conv1")(x))
            )
            out = bn(f"{name}_bn2")(conv(width * multiple, 3, 1, f"{name}_conv2")(out))
            shortcut = x
            if stride != 1 or channels != width * multiple:
                # Keras orders a functional model's layers (hence its trainable weights) by
                # their distance to the output, ties in traversal order. This identity makes
                # conv2/bn2 one step further from the Add than the shortcut's conv/BN, so the
                # weights come in forward order: conv1, bn1, conv2, bn2, shortcut conv, BN.
                out = tf.keras.layers.Activation("linear", name=f"{name}_out")(out)
                shortcut = bn(f"{name}_short_bn")(
                    conv(width * multiple, 1, stride, f"{name}_short_conv")(x)
                )
            x = tf.keras.layers.ReLU()(tf.keras.layers.Add()([out, shortcut]))
            channels = width * multiple
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    outputs = tf.keras.layers.Dense(num_classes, name="fc")(x)
    return tf.keras.Model(inputs, outputs, name="resnet18")


def stacked_lstm(
    input_shape: Sequence[int],
    num_classes: int,
    units: int = 100,
    dense_units: int = 30,
) -> tf.keras.Model:
    """Sent140 classifier (FedGroup's setup): LSTM(100, sequences) -> LSTM(100) -> Dense(30, no
    activation) -> Dense(1) logit for 2 classes. 243,861 trainable parameters on 25 x 300 GloVe
    inputs. Inputs are already-embedded sequences (seq_len, dim): the frozen GloVe lookup is done
    by the data pipeline, so the 400,001 x 300 table is never shipped inside TFF computations.
    """
    outputs = 1 if num_classes == 2 else num_classes
    layers: list[tf.keras.layers.Layer] = [tf.keras.Input(shape=tuple(input_shape))]
    layers += [
        # unroll: TFF's functional_model_from_keras (the tests' oracle) cannot trace the LSTM's
        # while loop (it captures an input placeholder); 25 unrolled steps compute the same
        # function. The functional interpreter runs its own loop over time either way.
        tf.keras.layers.LSTM(units, return_sequences=True, unroll=True, name="lstm1"),
        tf.keras.layers.LSTM(units, unroll=True, name="lstm2"),
        tf.keras.layers.Dense(dense_units, name="dense"),
        tf.keras.layers.Dense(outputs, name="logits"),
    ]
    return tf.keras.Sequential(layers, name="stacked_lstm")


def char_lstm(
    sequence_length: int,
    vocabulary_size: int,
    num_classes: int,
    units: int = 256,
    embedding_dim: int = 8,
) -> tf.keras.Model:
    """LEAF's Shakespeare next-character model (Caldas et al., 2018; McMahan et al., AISTATS
    2017): Embedding(vocabulary, 8) -> LSTM(256, sequences) -> LSTM(256) -> Dense(classes)
    logits. Inputs are character ids as float32 (the data pipeline's dtype; the Embedding casts
    them to int32). 819,727 trainable parameters for TFF's 87 characters."""
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(sequence_length,)),
            # The functional interpreter runs the LSTMs as one loop over time: no unrolling.
            tf.keras.layers.Embedding(vocabulary_size, embedding_dim, name="embedding"),
            tf.keras.layers.LSTM(units, return_sequences=True, name="lstm1"),
            tf.keras.layers.LSTM(units, name="lstm2"),
            tf.keras.layers.Dense(num_classes, name="logits"),
        ],
        name="char_lstm",
    )


MODEL_NAMES = ("mclr", "mlp", "cnn", "lstm", "tsdp_cnn", "resnet18", "lenet", "char_lstm")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the federated computations need to know about a model."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    build: ModelBuilder

    def input_spec(self) -> dict:
        """Element spec of a batched client dataset."""
        return dict(
            x=tf.TensorSpec([None, *self.input_shape], tf.float32),
            y=tf.TensorSpec([None], tf.int32),
        )


def model_spec(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    hidden_units: int = 128,
    image_shape: Optional[Sequence[int]] = None,
    cnn_dense_units: int = 2048,
    resnet_width: int = 64,
    vocabulary_size: Optional[int] = None,
) -> ModelSpec:
    """The named model for inputs of `input_shape` and `num_classes` outputs; `vocabulary_size`
    when the inputs are token ids (`FederatedData.vocabulary_size`), which only `char_lstm`
    reads."""
    input_shape = tuple(int(d) for d in input_shape)
    if (name == "char_lstm") != (vocabulary_size is not None):
        raise ValueError(
            "the char_lstm model embeds character ids: use it with --dataset=tff_shakespeare, "
            "or --dataset=leaf on LEAF's Shakespeare or Sent140 JSON"
            if name == "char_lstm"
            else f"the {name} model reads features, and this dataset's inputs are character "
            "ids: use --model=char_lstm"
        )
    if name == "mclr":
        build: ModelBuilder = lambda: mclr(input_shape, num_classes)  # noqa: E731
    elif name == "mlp":
        build = lambda: mlp(input_shape, num_classes, hidden_units)  # noqa: E731
    elif name == "cnn":
        build = lambda: cnn(  # noqa: E731
            input_shape, num_classes, image_shape, dense_units=cnn_dense_units
        )
    elif name == "lstm":
        if len(input_shape) != 2:
            raise ValueError(
                f"the lstm model reads (sequence, features) inputs, got shape {input_shape}; "
                "use it with --dataset=sent140"
            )
        build = lambda: stacked_lstm(input_shape, num_classes)  # noqa: E731
    elif name == "char_lstm":
        build = lambda: char_lstm(  # noqa: E731
            input_shape[0], vocabulary_size, num_classes
        )
    elif name == "tsdp_cnn":
        build = lambda: tsdp_cnn(input_shape, num_classes, image_shape)  # noqa: E731
    elif name == "lenet":
        build = lambda: lenet(input_shape, num_classes, image_shape)  # noqa: E731
    elif name == "resnet18":
        build = lambda: resnet18(  # noqa: E731
            input_shape, num_classes, image_shape, width=resnet_width
        )
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return ModelSpec(name, input_shape, num_classes, build)


def initial_weights(spec: ModelSpec, seed: int) -> list[np.ndarray]:
    """Trainable weights of a freshly built model, a deterministic function of `seed`.

    The global TF seed is reset afterwards: left set, it would silently change every later
    seeded op (tf.data shuffles combine it with their own seed), so results would depend on
    how often this was called, and a resumed run would differ from an uninterrupted one.
    """
    tf.keras.utils.set_random_seed(int(seed) % (2**31 - 1))
    try:
        model = spec.build()
        return [w.numpy() for w in model.trainable_weights]
    finally:
        tf.random.set_seed(None)


def initial_state(spec: ModelSpec) -> list[np.ndarray]:
    """Non-trainable weights of a freshly built model (BatchNorm moving mean 0 and variance 1;
    empty for models without BatchNorm), in `model.non_trainable_weights` order. They do not
    depend on a seed."""
    return [w.numpy() for w in spec.build().non_trainable_weights]


def count_trainable_parameters(model: tf.keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))
