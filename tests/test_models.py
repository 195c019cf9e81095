"""Model parameter counts (FedGroup Table II) and the base/personal split."""

from __future__ import annotations

import pytest

from tff_clustered.models import (
    PersonalSplit,
    ResolvedSplit,
    count_trainable_parameters,
    initial_weights,
    model_spec,
)


@pytest.mark.parametrize(
    "name, input_shape, classes, hidden, expected",
    [
        ("mclr", (784,), 10, 0, 7_850),  # MNIST MCLR
        ("mlp", (784,), 10, 128, 101_770),  # MNIST MLP
        ("mclr", (784,), 26, 0, 20_410),  # FEMNIST MCLR
        ("mlp", (784,), 26, 512, 415_258),  # FEMNIST MLP
        ("mclr", (60,), 10, 0, 610),  # Synthetic(1,1) MCLR
    ],
)
def test_parameter_counts_match_fedgroup_table_2(
    name: str, input_shape: tuple, classes: int, hidden: int, expected: int
) -> None:
    spec = model_spec(name, input_shape, classes, hidden_units=hidden or 128)
    assert count_trainable_parameters(spec.build()) == expected


def test_leaf_femnist_cnn_count() -> None:
    # Spec B.8: 832 + 51,264 + 6,424,576 + 127,038.
    spec = model_spec("cnn", (28, 28, 1), 62)
    assert count_trainable_parameters(spec.build()) == 6_603_710


def test_cnn_reshapes_flat_inputs() -> None:
    spec = model_spec("cnn", (64,), 10, image_shape=(8, 8, 1), cnn_dense_units=16)
    assert spec.build().output_shape == (None, 10)


def test_initial_weights_are_a_function_of_the_seed() -> None:
    spec = model_spec("mlp", (8,), 3, hidden_units=4)
    a, b, c = initial_weights(spec, 1), initial_weights(spec, 1), initial_weights(spec, 2)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))


MLP_LAYERS = [2, 2]  # hidden kernel+bias, logits kernel+bias
CNN_LAYERS = [2, 2, 2, 2]


@pytest.mark.parametrize(
    "split, sizes, personal",
    [
        (PersonalSplit.none(), MLP_LAYERS, ()),
        (PersonalSplit.all(), MLP_LAYERS, (0, 1, 2, 3)),
        (PersonalSplit(1, "layers", "top"), MLP_LAYERS, (2, 3)),
        (PersonalSplit(1, "layers", "bottom"), MLP_LAYERS, (0, 1)),
        (PersonalSplit(1, "tensors", "top"), MLP_LAYERS, (3,)),
        (PersonalSplit(3, "tensors", "bottom"), MLP_LAYERS, (0, 1, 2)),
        (PersonalSplit(2, "layers", "top"), CNN_LAYERS, (4, 5, 6, 7)),
    ],
)
def test_split_resolution(split: PersonalSplit, sizes: list, personal: tuple) -> None:
    assert split.resolve(sizes) == personal


def test_split_of_a_real_model_and_base_complement() -> None:
    model = model_spec("mlp", (8,), 3, hidden_units=4).build()
    resolved = ResolvedSplit.of(model, PersonalSplit(1))
    assert resolved.personal == (2, 3) and resolved.base == (0, 1)


def test_split_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="only 2"):
        PersonalSplit(3, "layers").resolve(MLP_LAYERS)
    with pytest.raises(ValueError, match="unit"):
        PersonalSplit(1, "neurons")
    with pytest.raises(ValueError, match="unknown model"):
        model_spec("resnet", (8,), 3)
