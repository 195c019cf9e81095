"""What a Keras model is, as a run's settings record it: its layers' classes and configurations.

A run given its own `model_fn` (or one of the project's models on given data) records its
model's architecture in its settings (`architecture`), so that a resume with another model is
refused naming what differs (`runs.checkpoint.same_settings`: a layer's units, activation,
dtype, ...), not only when the number of values differs. Each layer, in the model's order, is
one entry `layer N Class` holding its Keras configuration without names (Keras numbers them per
process: `dense_3` in one process is `dense_7` in the next) and the shapes and dtypes of its
weights. A layer whose configuration Keras cannot give is recorded by its weights alone.
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

# Configuration keys left out: those that name layers (and differ between two builds of the
# same model), and where Keras' serializer finds a class (which moves between Keras versions).
NAME_KEYS = frozenset(
    {"name", "inbound_nodes", "input_layers", "output_layers", "module", "registered_name"}
)


def architecture(model: tf.keras.Model) -> dict[str, Any]:
    """`model`'s layers, `{"layer N Class": {configuration..., "weights": [...]}}` in order,
    as plain JSON values (lists, not tuples: what a checkpoint gives back)."""
    return {
        f"layer {i} {type(layer).__name__}": {**configuration(layer), "weights": weights(layer)}
        for i, layer in enumerate(model.layers, start=1)
    }


def configuration(layer: tf.keras.layers.Layer) -> dict[str, Any]:
    """The layer's Keras configuration without names, as JSON values; {} when it has none."""
    try:
        config = layer.get_config()
    except (NotImplementedError, TypeError, ValueError):
        return {}
    return json.loads(json.dumps(without_names(config), sort_keys=True, default=value_name))


def without_names(value: Any) -> Any:
    """`value` with every key of `NAME_KEYS` left out, in nested dicts and lists too."""
    if isinstance(value, dict):
        return {k: without_names(v) for k, v in value.items() if k not in NAME_KEYS}
    if isinstance(value, (list, tuple)):
        return [without_names(v) for v in value]
    return value


def value_name(value: Any) -> str:
    """A value JSON cannot hold (a function, an array), by a name stable across processes."""
    return str(getattr(value, "__name__", type(value).__name__))


def weights(layer: tf.keras.layers.Layer) -> list[str]:
    """Each weight of the layer as `shape dtype`, e.g. `(4, 2) float32`."""
    return [f"{tuple(w.shape)} {w.dtype.name}" for w in layer.weights]
