"""Whether a model fits in memory before it is built.

Its parameter count comes from a build inside a graph (nothing allocated), against the memory
the system has free.
"""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf

from tff_clustered.models.keras_models import ModelSpec


def declared_parameter_count(spec: ModelSpec) -> int:
    """Every value of the model (trainable and state), counted on a build inside a graph: the
    variables are declared but nothing is allocated, so a model too large for memory can be
    counted and refused before it is built for real."""
    with tf.Graph().as_default():
        return int(spec.build().count_params())


def available_memory_bytes() -> int:
    """Memory the system can give a new allocation now (`MemAvailable`), else its total."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def refuse_too_large(spec: ModelSpec, models_held: int, available: Optional[int] = None) -> None:
    """ValueError when `models_held` float32 copies of the model (the cluster models plus the
    working copies of a round: a client's model, its gradient, update and the per-cluster sums)
    cannot fit in `available` bytes (default: what the system has free now)."""
    count = declared_parameter_count(spec)
    needed = 4 * count * models_held
    available = available_memory_bytes() if available is None else available
    if needed > available:
        raise ValueError(
            f"--model={spec.name} has {count:,} parameters ({4 * count / 1e9:.3g} GB as float32); "
            f"a run holds about {models_held} copies ({needed / 1e9:.3g} GB) and this machine has "
            f"{available / 1e9:.3g} GB available: choose a smaller model (e.g. lower "
            "--hidden_units, --cnn_dense_units or --resnet_width)"
        )
