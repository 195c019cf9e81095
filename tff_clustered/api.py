"""Any algorithm from Python, on your own federated data and your own Keras model.

    import tff_clustered

    result = tff_clustered.run(
        "fedgroup",
        train=client_data,                 # a tff ClientData, or {client: (x, y)}
        model_fn=make_model,               # () -> a Keras model that returns logits
        options={"num_clusters": 4},       # the algorithm's options (see docs/options.md)
        training=tff_clustered.TrainingConfig(rounds=20, clients_per_round=10),
        output_dir="runs/mine",
    )
    result.summary["results"]["final_accuracy"], result.assignment, result.cluster_model(0)

The run is the one `binaries/train.py` makes: the same loop, outputs (metrics.csv,
clients.csv, summary.json, pictures, TensorBoard events) and atomic checkpoints in
`output_dir` (`resume=True` continues it). The model's base/personal split is the algorithm's
rule applied to your model's layers (FedPer: the top `personal_layers` layers with weights).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import numpy as np
import tensorflow as tf

from tff_clustered import checkpoint, runner, weights
from tff_clustered.algorithms import algorithm_class, make_algorithm, make_options
from tff_clustered.data.federated_data import (
    Clients,
    FederatedData,
    client_arrays,
    from_arrays,
    split_train_test,
)
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.models.keras_models import ModelSpec, refuse_too_large
from tff_clustered.orchestration import Experiment
from tff_clustered.runtime import RuntimeConfig, tff_runtime


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run ended with. `summary` is summary.json's content (config and results),
    `history` one row per round (metrics.csv), `assignment` each client's cluster (-1: none
    yet), `cluster_models` the server's models as flat vectors (clusters x values, in the order
    of the model's trainable then non-trainable weights)."""

    summary: dict[str, Any]
    history: list[dict[str, Any]]
    assignment: dict[str, int]
    cluster_models: np.ndarray
    output_dir: str
    model_fn: Callable[[], tf.keras.Model]

    def cluster_model(self, cluster: int) -> tf.keras.Model:
        """A fresh Keras model from `model_fn` holding cluster `cluster`'s server weights. Layers
        an algorithm keeps personal hold the server's copy, which clients never average: each
        client's own copy stays with the run (its checkpoint)."""
        model = self.model_fn()
        variables = model.trainable_weights + model.non_trainable_weights
        values = weights.unflatten(self.cluster_models[cluster], [v.shape for v in variables])
        for variable, value in zip(variables, values):
            variable.assign(value)
        return model


def federated_data(
    train: Clients,
    test: Optional[Clients] = None,
    *,
    name: str = "custom",
    num_classes: Optional[int] = None,
    x_key: str = "x",
    y_key: str = "y",
    test_fraction: float = 0.2,
    seed: int = 0,
    planted_groups: Optional[Mapping[str, int]] = None,
) -> FederatedData:
    """Your clients as the runs' `FederatedData`. Without `test`, each client's examples are
    shuffled (from `seed`) and `test_fraction` of them become its test set. `num_classes`
    defaults to the largest label + 1. `planted_groups` (client -> group), when you know them,
    make each run report how well its clusters recover them (adjusted Rand)."""
    train_arrays = client_arrays(train, x_key, y_key, "train")
    if test is None:
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rng = np.random.default_rng([seed, 7])
        pairs = {
            c: split_train_test(x, y, 1 - test_fraction, rng) for c, (x, y) in train_arrays.items()
        }
        train_arrays = {c: pair[0] for c, pair in pairs.items()}
        test_arrays = {c: pair[1] for c, pair in pairs.items()}
    else:
        test_arrays = client_arrays(test, x_key, y_key, "test")
    if num_classes is None:
        labels = [y for split in (train_arrays, test_arrays) for _, y in split.values()]
        num_classes = int(max(np.max(y) for y in labels if len(y))) + 1
    if planted_groups is not None:
        missing = sorted(set(train_arrays) - set(planted_groups))
        if missing:
            raise ValueError(f"planted_groups has no group for client {missing[0]!r}")
    return from_arrays(
        name,
        train_arrays,
        test_arrays,
        num_classes,
        true_clusters=planted_groups,
        source="the given clients",
    )


def keras_model_spec(
    model_fn: Callable[[], tf.keras.Model], data: FederatedData, name: str = "custom"
) -> ModelSpec:
    """`model_fn` as a `ModelSpec` for `data`, checked once: it must take the clients' inputs
    and return one logit per class (the loss applies the softmax)."""
    model = model_fn()
    inputs = np.zeros((1, *data.input_shape), np.float32)
    try:
        outputs = model(inputs)
    except Exception as e:
        raise ValueError(
            f"model_fn's model cannot take the clients' inputs of shape {data.input_shape}: {e}"
        ) from None
    if tuple(outputs.shape) != (1, data.num_classes):
        raise ValueError(
            f"model_fn's model returns shape {tuple(outputs.shape[1:])} per example; it must "
            f"return {data.num_classes} logits (one per class)"
        )
    last = model.layers[-1] if model.layers else None
    if getattr(getattr(last, "activation", None), "__name__", "") == "softmax":
        raise ValueError("model_fn's model ends in a softmax; return logits (no activation)")
    return ModelSpec(name, tuple(data.input_shape), data.num_classes, model_fn)


def run(
    algorithm: str,
    train: Union[Clients, FederatedData],
    model_fn: Callable[[], tf.keras.Model],
    *,
    output_dir: str,
    test: Optional[Clients] = None,
    options: Union[Mapping[str, Any], Any, None] = None,
    training: Optional[TrainingConfig] = None,
    resume: bool = False,
    checkpoint_every: int = 5,
    execution: str = "tff",
    device: Optional[str] = None,
    model_name: str = "custom",
    log: Callable[[str], None] = print,
    **data_args: Any,
) -> RunResult:
    """Runs `algorithm` (a name of `tff_clustered.algorithms.ALGORITHMS`) on `train` (and
    `test`, or a split of each client, see `federated_data`, which takes `data_args`) with the
    model `model_fn` builds. `options`: the algorithm's options as a mapping (e.g.
    `{"num_clusters": 4}`) or its `Options`. `execution="tff"` runs rounds on TFF's runtime
    (a local worker, stopped at the end), `"in_process"` in this process (on a GPU if
    TensorFlow sees one); the results agree."""
    data = train if isinstance(train, FederatedData) else federated_data(train, test, **data_args)
    if isinstance(train, FederatedData) and (test is not None or data_args):
        raise ValueError("train is already a FederatedData: give test and data options to it")
    cls = algorithm_class(algorithm)
    if options is None or isinstance(options, Mapping):
        options = make_options(algorithm, **dict(options or {}))
    elif not isinstance(options, cls.Options):
        raise TypeError(f"options for {algorithm} must be a mapping or {cls.Options.__name__}")
    training = training or TrainingConfig()
    model = keras_model_spec(model_fn, data, model_name)
    settings = {
        "algorithm": algorithm,
        "algorithm_options": dataclasses.asdict(options),
        "training": dataclasses.asdict(training),
        "data": {"name": data.name, "fingerprint": fingerprint(data)},
        "model": model_name,
    }

    def build() -> Experiment:
        built = make_algorithm(algorithm, options)
        refuse_too_large(model, getattr(built, "num_clusters", 1) + runner.WORKING_COPIES)
        return Experiment(data, model, built, training, execution=execution, device=device)

    checkpoint.refuse_held_run_folder(output_dir)  # before a worker writes its log there
    with tff_runtime(RuntimeConfig(execution=execution, device=device, log_dir=output_dir)):
        summary, experiment = runner.run_experiment(
            build, settings, output_dir, checkpoint_every, resume, log
        )
    history = summary.pop("history")
    return RunResult(
        summary=summary,
        history=history,
        assignment=dict(experiment.state.assignment),
        cluster_models=np.array(experiment.state.cluster_models),
        output_dir=output_dir,
        model_fn=model_fn,
    )


def fingerprint(data: FederatedData) -> str:
    """A digest of every client's examples: a checkpoint resumes only on the same data."""
    digest = hashlib.sha256()
    for split in (data.train_arrays, data.test_arrays):
        for client in sorted(split):
            digest.update(client.encode())
            for key in sorted(split[client]):
                digest.update(np.ascontiguousarray(split[client][key]).tobytes())
    return digest.hexdigest()[:16]
