"""Models as pure functions of their tensors: parity with Keras, BatchNorm statistics as state,
seeded dropout, and FedTSDP's model sizes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tff_clustered.models import count_trainable_parameters, model_spec, trainable_layer_sizes
from tff_clustered.models.functional import functional_model


def parts(spec: object) -> tuple:
    keras_model = spec.build()
    model = functional_model(keras_model, spec.input_spec())
    weights = [tf.constant(v.numpy()) for v in keras_model.trainable_weights]
    state = [tf.constant(v) for v in model.initial_state]
    return keras_model, model, weights, state


def test_paper_model_sizes() -> None:
    cnn = model_spec("tsdp_cnn", (32, 32, 3), 10).build()
    assert count_trainable_parameters(cnn) == 6_447_562 and len(cnn.trainable_weights) == 8
    resnet = model_spec("resnet18", (32, 32, 3), 10).build()
    assert count_trainable_parameters(resnet) == 11_173_962
    assert len(resnet.trainable_weights) == 62 == sum(trainable_layer_sizes(resnet))
    names = [w.name.split("/")[0] for w in resnet.trainable_weights]
    # Keras orders layers by graph depth: the FC is last and the stages come in order (a
    # block's 1x1 shortcut conv sits between its second conv and BN).
    assert names[-2:] == ["fc", "fc"] and names[0] == "stem_conv"
    assert names.index("s2b1_conv1") < names.index("s2b1_short_conv") < names.index("s3b1_conv1")


@pytest.mark.parametrize(
    "name, shape, kwargs",
    [
        ("tsdp_cnn", (32, 32, 3), {}),
        ("tsdp_cnn", (64,), {"image_shape": (8, 8, 1)}),
        ("resnet18", (32, 32, 3), {"resnet_width": 8}),
    ],
)
def test_inference_matches_keras(name: str, shape: tuple, kwargs: dict) -> None:
    keras_model, model, weights, state = parts(model_spec(name, shape, 10, **kwargs))
    x = tf.random.stateless_normal([5, *shape], seed=[1, 2])
    logits, new_state = model.apply(weights, state, x, False, None)
    np.testing.assert_allclose(logits, keras_model(x, training=False), atol=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(new_state, state))


def test_batchnorm_statistics_are_state_updated_as_keras_does() -> None:
    keras_model, model, weights, state = parts(
        model_spec("resnet18", (32, 32, 3), 10, resnet_width=4)
    )
    x = tf.random.stateless_normal([6, 32, 32, 3], seed=[3, 4])
    _, new_state = model.apply(weights, state, x, True, tf.constant([0, 0]))
    for layer in keras_model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.fused = False  # the unfused update: momentum * old + (1 - momentum) * batch
    keras_model(x, training=True)
    for got, want in zip(new_state, keras_model.non_trainable_weights):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert len(model.state_owner) == 40
    gammas = {i for i, w in enumerate(keras_model.trainable_weights) if "gamma" in w.name}
    assert set(model.state_owner) == gammas


def test_dropout_follows_the_seed_and_is_off_in_inference() -> None:
    _, model, weights, state = parts(model_spec("tsdp_cnn", (64,), 10, image_shape=(8, 8, 1)))
    x = tf.random.stateless_normal([8, 64], seed=[5, 6])
    a, _ = model.apply(weights, state, x, True, tf.constant([7, 0]))
    b, _ = model.apply(weights, state, x, True, tf.constant([7, 0]))
    c, _ = model.apply(weights, state, x, True, tf.constant([7, 1]))
    off, _ = model.apply(weights, state, x, False, None)
    assert np.array_equal(a, b) and not np.allclose(a, c) and not np.allclose(a, off)
    with pytest.raises(ValueError, match="seed"):
        model.apply(weights, state, x, True, None)


def test_gradients_reach_every_resnet_tensor() -> None:
    _, model, weights, state = parts(model_spec("resnet18", (32, 32, 3), 10, resnet_width=4))
    x = tf.random.stateless_normal([4, 32, 32, 3], seed=[8, 9])
    with tf.GradientTape() as tape:
        tape.watch(weights)
        logits, _ = model.apply(weights, state, x, True, tf.constant([0, 0]))
        loss = tf.reduce_mean(logits**2)
    grads = tape.gradient(loss, weights)
    assert len(grads) == 62 and all(g is not None for g in grads)


def test_unsupported_layers_are_named() -> None:
    keras_model = tf.keras.Sequential(
        [tf.keras.Input((4, 3)), tf.keras.layers.Dropout(0.1), tf.keras.layers.LSTM(2)]
    )
    with pytest.raises(ValueError, match="LSTM"):
        functional_model(keras_model, {})
