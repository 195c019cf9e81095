"""Which trainable tensors are base (aggregated per cluster) and which personal (a client's).

Which trainable tensors are **base** (shared, aggregated per cluster) and which are
**personal** (kept by each client, never aggregated).

A `PersonalSplit` is a rule ("the top 1 layer", "the bottom 2 tensors", ...); `resolve` turns it
into the tensor indices of a concrete model. FedPer keeps the top layer personal, Local keeps
everything personal, FedAvg nothing; FedTSDP later moves the boundary between rounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

_UNITS = ("layers", "tensors")
_SIDES = ("top", "bottom")


@dataclasses.dataclass(frozen=True)
class PersonalSplit:
    """`count` personal units (layers with trainable weights, or single tensors) from `side`.

    `count=-1` means all of them (purely local models).
    """

    count: int = 0
    unit: str = "layers"
    side: str = "top"

    def __post_init__(self) -> None:
        if self.unit not in _UNITS:
            raise ValueError(f"split unit {self.unit!r} must be one of {_UNITS}")
        if self.side not in _SIDES:
            raise ValueError(f"split side {self.side!r} must be one of {_SIDES}")
        if self.count < -1:
            raise ValueError(f"split count must be >= -1 (-1 = all), got {self.count}")

    @classmethod
    def none(cls) -> PersonalSplit:
        return cls(0)

    @classmethod
    def all(cls) -> PersonalSplit:
        return cls(-1)

    def resolve(self, layer_sizes: Sequence[int]) -> tuple[int, ...]:
        """Personal tensor indices, given the number of trainable tensors of each layer
        (bottom to top, in `model.trainable_weights` order)."""
        num_tensors = sum(layer_sizes)
        if self.count == -1:
            return tuple(range(num_tensors))
        units = list(layer_sizes) if self.unit == "layers" else [1] * num_tensors
        if self.count > len(units):
            raise ValueError(
                f"asked for {self.count} personal {self.unit} but the model has only "
                f"{len(units)}; lower the personal count"
            )
        # Tensor index ranges of each unit, bottom to top.
        bounds, start = [], 0
        for size in units:
            bounds.append(range(start, start + size))
            start += size
        chosen = bounds[len(bounds) - self.count :] if self.side == "top" else bounds[: self.count]
        if self.count == 0:
            chosen = []
        return tuple(i for unit in chosen for i in unit)


def weighted_layers(model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
    """The layers that have trainable tensors, bottom to top (the order of
    `model.trainable_weights`); a nested model counts as its own layers."""
    found: list[tf.keras.layers.Layer] = []
    for layer in model.layers:
        if isinstance(layer, tf.keras.Model):
            found += weighted_layers(layer)
        elif layer.trainable_weights:
            found.append(layer)
    return found


def trainable_layer_sizes(model: tf.keras.Model) -> list[int]:
    """Number of trainable tensors per layer that has any, bottom to top: Dense and Conv2D
    count kernel and bias (or just the kernel without bias), BatchNormalization its gamma and
    beta (its moving statistics are not trainable)."""
    return [len(layer.trainable_weights) for layer in weighted_layers(model)]


def classifier_layers(model: tf.keras.Model) -> int:
    """The weighted layers at the top of `model` after its last convolutional or normalisation
    layer: its fully connected classifier (UA-PDFL's prose split: g = every convolutional/BN
    layer up to the last pooling, h = the FC layers); 0 for a model of Dense layers only."""
    dense = [isinstance(layer, tf.keras.layers.Dense) for layer in weighted_layers(model)]
    if all(dense):
        return 0
    return len(dense) - 1 - max(i for i, d in enumerate(dense) if not d)


@dataclasses.dataclass(frozen=True)
class ResolvedSplit:
    """Concrete base and personal tensor indices of one model."""

    num_tensors: int
    personal: tuple[int, ...]

    @property
    def base(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_tensors) if i not in self.personal)

    @classmethod
    def of(cls, model: tf.keras.Model, split: PersonalSplit) -> ResolvedSplit:
        sizes = trainable_layer_sizes(model)
        if sum(sizes) != len(model.trainable_weights):
            raise ValueError("model has trainable weights outside its top-level layers")
        return cls(len(model.trainable_weights), split.resolve(sizes))
