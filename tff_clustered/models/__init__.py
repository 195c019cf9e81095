"""Keras models and their base/personal split."""

from tff_clustered.models.keras_models import (
    MODEL_NAMES,
    ModelSpec,
    cnn,
    count_trainable_parameters,
    initial_weights,
    mclr,
    mlp,
    model_spec,
)
from tff_clustered.models.split import PersonalSplit, ResolvedSplit, trainable_layer_sizes

__all__ = [
    "MODEL_NAMES",
    "ModelSpec",
    "PersonalSplit",
    "ResolvedSplit",
    "cnn",
    "count_trainable_parameters",
    "initial_weights",
    "mclr",
    "mlp",
    "model_spec",
    "trainable_layer_sizes",
]
