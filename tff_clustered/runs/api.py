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

import contextlib
import dataclasses
import inspect
import os
import re
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import numpy as np
import tensorflow as tf

from tff_clustered import weights
from tff_clustered.algorithms import algorithm_class, make_algorithm, make_options
from tff_clustered.data.federated_data import Clients, FederatedData, first_line
from tff_clustered.data.fingerprint import SourceFingerprint, arrays_digest
from tff_clustered.data.given_clients import GIVEN_DIGEST, federated_data
from tff_clustered.data.registry import load_dataset, source_fingerprint
from tff_clustered.data.spec import DataSpec
from tff_clustered.federated.cluster_aggregators import ClusterAggregator
from tff_clustered.federated.executions import execution_class
from tff_clustered.loop.aggregation import check_aggregator, check_cold_start_settings
from tff_clustered.loop.client_store import checked_store_choice
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.state import RunState
from tff_clustered.models.description import architecture
from tff_clustered.models.functional import functional_model
from tff_clustered.models.keras_models import ModelSpec
from tff_clustered.options import checked, checked_value, described
from tff_clustered.run_folder import RunFolder
from tff_clustered.runs import checkpoint, runner
from tff_clustered.runs.aggregator_argument import with_aggregator
from tff_clustered.runs.run_spec import ModelChoice, RunSpec
from tff_clustered.runtime.context import RuntimeConfig, tff_runtime


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


# Final activations that turn logits into probabilities: the loss applies the softmax itself.
PROBABILITY_ACTIVATION = re.compile(r"(softmax|sigmoid)(_v\d+)?")


def keras_model_spec(
    model_fn: Callable[[], tf.keras.Model], data: FederatedData, name: str = "custom"
) -> ModelSpec:
    """`model_fn` as a `ModelSpec` for `data`, checked once (`checked_model`)."""
    return keras_model_spec_and_values(model_fn, data, name)[0]


def keras_model_spec_and_values(
    model_fn: Callable[[], tf.keras.Model], data: FederatedData, name: str = "custom"
) -> tuple[ModelSpec, tf.keras.Model]:
    """`keras_model_spec` and the one model the check builds (its values, `model_values`, and
    its `architecture`: what a resumed checkpoint's model must match)."""
    model = checked_model(model_fn, data)
    spec = ModelSpec(name, tuple(data.input_shape), data.num_classes, model_fn)
    functional_model(model, spec.input_spec())  # refuses a model no round can train
    return spec, model


def checked_model(model_fn: Callable[[], tf.keras.Model], data: FederatedData) -> tf.keras.Model:
    """A model from `model_fn`, checked: a Keras model with trainable weights, all finite, that
    takes the clients' inputs and returns one logit per class, not probabilities (it must not
    end in a softmax or a sigmoid, as an activation or a layer: the loss applies the softmax,
    and would train probabilities as logits)."""
    if not callable(model_fn) or isinstance(model_fn, tf.keras.Model):
        raise TypeError(
            f"model_fn must be a function that builds a Keras model, got {described(model_fn)}; "
            "pass the function itself (model_fn=make_model, not make_model())"
        )
    model = model_fn()
    if not isinstance(model, tf.keras.Model):
        raise TypeError(
            f"model_fn returned {described(model)}, not a tf.keras.Model; return the model"
        )
    inputs = np.zeros((1, *data.input_shape), np.float32)
    try:
        outputs = model(inputs)
    except Exception as e:
        raise ValueError(
            f"model_fn's model cannot take the clients' inputs of shape {data.input_shape}: "
            f"{first_line(e)}; make its input shape {data.input_shape}"
        ) from None
    if not isinstance(outputs, tf.Tensor):
        raise ValueError(
            f"model_fn's model returns {described(outputs)}; it must return one tensor of "
            f"{data.num_classes} logits per example"
        )
    if tuple(outputs.shape) != (1, data.num_classes):
        raise ValueError(
            f"model_fn's model returns shape {tuple(outputs.shape[1:])} per example; it must "
            f"return {data.num_classes} logits (one per class)"
        )
    activation = final_activation(model)
    if activation:
        raise ValueError(
            f"model_fn's model ends in a {activation}; return logits (remove the {activation}: "
            "the loss applies the softmax itself)"
        )
    if not model.trainable_weights:
        raise ValueError("model_fn's model has no trainable weights; give it a layer to train")
    for variable in model.trainable_weights + model.non_trainable_weights:
        if not np.isfinite(variable.numpy()).all():
            raise ValueError(
                f"model_fn's model starts with NaN or infinite weights ({variable.name}); "
                "initialise every weight with finite values"
            )
    return model


def final_activation(model: tf.keras.Model) -> str:
    """The softmax or sigmoid the model's last layer applies (inside nested models too), as
    a `Softmax` layer, an `Activation` layer or a layer's `activation`; "" when none."""
    layer = model.layers[-1] if model.layers else None
    while isinstance(layer, tf.keras.Model) and layer.layers:
        layer = layer.layers[-1]
    if isinstance(layer, tf.keras.layers.Softmax):
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", "")
    found = PROBABILITY_ACTIVATION.fullmatch(name)
    return found.group(1) if found else ""


def model_values(model: tf.keras.Model) -> int:
    """How many values the model holds (trainable and not): the width of a flat model."""
    return int(sum(np.prod(v.shape) for v in model.trainable_weights + model.non_trainable_weights))


# The arguments of `federated_data` that `run` passes on (its keyword-only ones).
DATA_ARGUMENTS = tuple(
    name
    for name, parameter in inspect.signature(federated_data).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY
)


# Long: the API's one entry point, its signature and docstring 46 lines; the body checks every
# argument in the docstring's order before any TensorFlow work, then starts the run
def run(
    algorithm: str,
    train: Union[Clients, FederatedData, DataSpec],
    model_fn: Union[Callable[[], tf.keras.Model], ModelChoice],
    *,
    output_dir: str,
    test: Optional[Clients] = None,
    options: Union[Mapping[str, Any], Any, None] = None,
    training: Optional[TrainingConfig] = None,
    resume: bool = False,
    overwrite: bool = False,
    checkpoint_every: int = 5,
    execution: str = "tff",
    device: Optional[str] = None,
    client_store: str = "auto",
    model_name: str = "custom",
    log: Callable[[str], None] = print,
    aggregator: Union[str, ClusterAggregator, AggregatorConfig, Any, None] = None,
    **data_args: Any,
) -> RunResult:
    """Runs `algorithm` (a name of `tff_clustered.algorithms.ALGORITHMS`) on `train` (and
    `test`, or a split of each client, see `federated_data`, which takes `data_args`; or one of
    the project's datasets, a `DataSpec` whose fields are `binaries/train.py`'s data flags)
    with the model `model_fn` builds (or one of the project's models, a `ModelChoice`).
    `options`: the algorithm's options as a mapping (e.g. `{"num_clusters": 4}`) or its
    `Options`. `execution`: "tff" (TFF's runtime, a local worker) or "in_process" (on a GPU if
    TF sees one); `client_store`: "memory", "disk" (the clients' models in a file of
    `output_dir`) or "auto" (disk for many clients); the results agree. `aggregator`: what
    each cluster does with its clients' updates, "mean" (their weighted mean), "robust",
    "compression" or "secure" (TFF's robust, compressed and secure aggregators per cluster, at
    TFF's defaults; `tff_clustered.ClusterRobust(...)`, `ClusterCompression(...)`,
    `ClusterSecure(...)` to set them), `tff_clustered.ClusterDP(noise_multiplier=..., clip=...)`
    (DP-FedAvg per cluster, clients weighted uniformly), any `tff.aggregators` factory
    (weighted or unweighted, one instance per cluster: `TffFactoryPerCluster`, on execution
    "tff" only), your own `ClusterAggregator` subclass (with a `name` of its own; docs/
    aggregation.md's worked example), or an `AggregatorConfig`; None: `training.aggregator`
    (the mean).
    `output_dir` holding a run is refused unless `resume=True` continues it or `overwrite=True`
    deletes it and starts anew, as `binaries/train.py`'s `--resume` and `--overwrite`.

    Every argument is checked before any TensorFlow work, as `binaries/train.py` checks its
    flags: a wrong one is a ValueError or TypeError of one line naming it and the fix."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a name such as 'fedavg', got {described(algorithm)}")
    cls = algorithm_class(algorithm)
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
        raise TypeError(f"output_dir must be a folder path, got {described(output_dir)}")
    output_dir = os.fspath(output_dir)
    resume = checked_value("run", "resume", resume, bool)
    overwrite = checked_value("run", "overwrite", overwrite, bool)
    checkpoint_every = checked_value("run", "checkpoint_every", checkpoint_every, int)
    if checkpoint_every < 0:
        raise ValueError("checkpoint_every must be >= 0 (0 = only at the end)")
    model_name = checked_value("run", "model_name", model_name, str)
    execution = checked_value("run", "execution", execution, str)
    device = checked_value("run", "device", device, Optional[str])
    client_store = checked_store_choice(client_store)
    runtime = RuntimeConfig(execution=execution, device=device, log_dir=output_dir)
    if not callable(log):
        raise TypeError(f"log must be a function of one string, got {described(log)}")
    training = TrainingConfig() if training is None else training
    if not isinstance(training, TrainingConfig):
        raise TypeError(
            f"training must be a tff_clustered.TrainingConfig, got {described(training)}; "
            "write training=tff_clustered.TrainingConfig(rounds=..., ...)"
        )
    training = with_aggregator(training, aggregator)
    execution_class(execution).check_aggregator(training.aggregator.build())
    if options is None or isinstance(options, Mapping):
        names = [key for key in (options or {}) if not isinstance(key, str)]
        if names:
            raise TypeError(
                f"options are named by strings, got the key {described(names[0])}; write "
                "options={'num_clusters': 4}"
            )
        options = make_options(algorithm, **dict(options or {}))
    elif isinstance(options, cls.Options):
        options = checked(options, algorithm)
    else:
        raise TypeError(
            f"options for {algorithm} must be a mapping or {cls.__name__}.Options, got "
            f"{described(options)}"
        )
    if resume:  # an option whose default changed: as the checkpoint's run had it
        options = checkpoint.options_as_checkpointed(RunFolder(output_dir).checkpoint, options, log)
    built = make_algorithm(algorithm, options)  # its range checks, before any work
    check_aggregator(built, training.aggregator.build())
    check_cold_start_settings(built, training.aggregator)
    unknown = sorted(set(data_args) - set(DATA_ARGUMENTS))
    if unknown:
        raise TypeError(
            f"run takes no argument {unknown[0]!r}; the algorithm's options go in options=, the "
            f"data's are {', '.join(DATA_ARGUMENTS)}"
        )
    if isinstance(train, (FederatedData, DataSpec)) and (test is not None or data_args):
        raise ValueError(
            f"train is already a {type(train).__name__}: give test and data options to it"
        )
    # How the run executes; its timer (the run's phases and wall time) starts here, once the
    # arguments are checked.
    how = RunExecution(runtime, client_store=client_store, store_folder=output_dir)
    timer = how.timer
    with timer.phase("loading"):
        data = given_data(train, test, data_args, training.seed)
    with timer.phase("validation"):
        settings = None
        source: Optional[SourceFingerprint] = None  # given clients: their digest in settings
        if isinstance(model_fn, ModelChoice):  # one of the project's models, as --model says
            if isinstance(train, DataSpec):  # train.py's run: its settings, its data files
                spec = RunSpec(algorithm, train, model_fn, options, training)
                settings, source = spec.settings(), source_fingerprint(train)
            model = model_fn.spec_for(data)
            keras_model = model.build()
            model_name, model_fn = model_fn.model, model.build
        else:
            model, keras_model = keras_model_spec_and_values(model_fn, data, model_name)
        values = model_values(keras_model)
        settings = settings or run_settings(
            algorithm, options, training, data, model_name, architecture(keras_model)
        )
        # Before a worker writes its log there: another run's folder, or one not to write over.
        checkpoint.refuse_held_run_folder(output_dir, resume, overwrite)
        saved = None
        if resume:  # refuses other settings or data first
            settings = resumable_settings(output_dir, settings, data)
            saved = checkpoint.load(RunFolder(output_dir).checkpoint, settings, source)
            refuse_another_model(output_dir, saved, values)

    with contextlib.ExitStack() as running:
        with timer.phase("runtime"):
            running.enter_context(tff_runtime(how.runtime))
        summary, experiment = runner.run_experiment(
            lambda: runner.build_experiment(data, model, built, training, how),
            settings,
            output_dir,
            timer,
            checkpoint_every,
            resume,
            log,
            data_source=lambda: SourceFingerprint() if source is None else source,
            read_checkpoint=lambda: saved,
            overwrite=overwrite,
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


def given_data(
    train: Union[Clients, FederatedData, DataSpec],
    test: Optional[Clients],
    data_args: Mapping[str, Any],
    seed: int,
) -> FederatedData:
    """The run's data: `train` itself, the dataset a `DataSpec` names (loaded as
    `binaries/train.py` loads it, seeded by the training's seed), or given clients
    (`federated_data`)."""
    if isinstance(train, FederatedData):
        return train
    if isinstance(train, DataSpec):
        return load_dataset(train, seed=seed)
    return federated_data(train, test, **data_args)


def run_settings(
    algorithm: str,
    options: Any,
    training: TrainingConfig,
    data: FederatedData,
    model_name: str,
    model_architecture: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """What defines a run's results, kept in its checkpoints: resuming needs the same (the
    model's `architecture` too, when given: a resume with another model is refused)."""
    settings = {
        "algorithm": algorithm,
        "algorithm_options": dataclasses.asdict(options),
        "training": training.settings(),
        "data": {"name": data.name, "fingerprint": fingerprint(data)},
        "model": model_name,
    }
    if model_architecture is not None:
        settings[checkpoint.MODEL_ARCHITECTURE] = model_architecture
    return settings


def refuse_another_model(output_dir: str, saved: Optional[RunState], values: int) -> None:
    """Before resuming: the checkpoint `saved` read from `output_dir`, if any, must hold models
    of `values` values (the model_fn's). The settings do not describe a model the user builds,
    so another model_fn would pass them and fail inside the restore; this names the two sizes
    instead."""
    if saved is None or saved.cluster_models is None:
        return
    made_with = int(np.shape(saved.cluster_models)[-1])
    if made_with != values:
        raise ValueError(
            f"the checkpoint in {output_dir} was made with a model of {made_with:,} values and "
            f"this model_fn's has {values:,}; resume with the model_fn that made it, or give "
            "another output_dir for a new run"
        )


def fingerprint(data: FederatedData) -> str:
    """A digest of every client's examples (in-memory data has no files to fingerprint): the
    one made as they were read, or `arrays_digest` of their arrays; for a lazily read source
    its own fingerprint: a checkpoint resumes only on the same data."""
    if data.source is not None:
        return data.source.fingerprint()
    return data.examples_digest or arrays_digest(data.train_arrays, data.test_arrays)


def resumable_settings(
    output_dir: str, settings: dict[str, Any], data: FederatedData
) -> dict[str, Any]:
    """`settings` as the checkpoint in `output_dir` holds them when it predates the digest of
    given clients made as they are read (`given_clients.GIVEN_DIGEST`): its data fingerprint
    is then `arrays_digest` of the split arrays, computed again here (a pass over every
    example), so that its run resumes on the same data and on no other."""
    if data.examples_digest is None or not data.examples_digest.startswith(GIVEN_DIGEST):
        return settings
    saved = checkpoint.saved_settings(RunFolder(output_dir).checkpoint) or {}
    made = saved.get("data", {}).get("fingerprint") if isinstance(saved.get("data"), dict) else None
    if not isinstance(made, str) or ":" in made:
        return settings
    old = arrays_digest(data.train_arrays, data.test_arrays)
    return {**settings, "data": {**settings["data"], "fingerprint": old}}
