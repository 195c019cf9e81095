"""What the benchmarks share: the workload's flags, data and model, and how they time.

What the benchmarks share: the workload flags (clients, data, model, local training), the data
and model every benchmark of the synthetic workload starts from, timing callables against each
other in the same run, the rounds they time, and what the runner needs of a benchmark module."""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Optional

import numpy as np
from absl import flags

from tff_clustered.data import FederatedData, load_dataset
from tff_clustered.data.client_files import worker_source
from tff_clustered.federated.executions import RoundCache, repeated_round
from tff_clustered.federated.round_inputs import round_hparams
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import ModelSpec, initial_weights, model_spec
from tff_clustered.models.functional import functional_model

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 8, "Timed rounds per implementation.", lower_bound=1)
flags.DEFINE_integer("clients", 20, "Clients per round.", lower_bound=1)
flags.DEFINE_integer("examples_per_client", 100, "Training examples per client.", lower_bound=1)
flags.DEFINE_integer("input_dim", 784, "Input features (784 = MNIST size).", lower_bound=1)
flags.DEFINE_integer("num_classes", 10, "Classes.", lower_bound=2)
flags.DEFINE_enum("model", "mlp", ["mclr", "mlp"], "Model.")
flags.DEFINE_integer("hidden_units", 128, "MLP hidden units.", lower_bound=1)
flags.DEFINE_integer("local_epochs", 5, "Local epochs.", lower_bound=1)
flags.DEFINE_integer("batch_size", 10, "Batch size.", lower_bound=1)
flags.DEFINE_float("learning_rate", 0.03, "Client learning rate.")
flags.DEFINE_integer("seed", 0, "Seed of the data and initial model.")
# FedGroup's m in fedgroup_vs_fedavg and the planted groups (and EDC's k) in clustering.
flags.DEFINE_integer("groups", 5, "FedGroup groups for fedgroup_vs_fedavg.")


@dataclasses.dataclass(frozen=True)
class Setup:
    """The synthetic workload every benchmark is handed: `--clients` clients of random data,
    the model and its initial weights, and the random generator they came from, which the
    benchmarks that draw more clients keep drawing from (so their data depends on the order
    they run in). `worker_pid` is the TFF worker's process while the runtime is up."""

    rng: np.random.Generator
    spec: ModelSpec
    w0: list
    clients: list
    worker_pid: Optional[int] = None

    @property
    def workload(self) -> str:
        """The workload in words, for the printed lines."""
        return (
            f"{FLAGS.clients} clients x {FLAGS.examples_per_client} examples, "
            f"{FLAGS.local_epochs} epochs, batch {FLAGS.batch_size}, {FLAGS.model}"
        )


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """What the runner needs of a benchmark module: `run` prints its lines and returns its
    part of the report, nested under its name unless `top_level` (its keys then go straight
    into the report); `by_default` whether it runs without being named; `in_tff_runtime`
    whether TFF's worker is up while it runs."""

    run: Callable[[Setup], dict]
    top_level: bool = False
    by_default: bool = True
    in_tff_runtime: bool = True


def prepare() -> Setup:
    """The workload from the flags: the data drawn first from a generator seeded by `--seed`."""
    rng = np.random.default_rng(FLAGS.seed)
    spec = model_spec(FLAGS.model, (FLAGS.input_dim,), FLAGS.num_classes, FLAGS.hidden_units)
    w0 = initial_weights(spec, FLAGS.seed)
    return Setup(rng, spec, w0, client_data(rng))


def alternate(fns: dict, rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each callable, after `warmup` calls each, calls interleaved so that
    machine noise hits every callable alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    timings: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in timings.items()}


def seconds_row(timings: dict[str, float]) -> dict[str, float]:
    """`alternate`'s medians as report entries: `{name}_s`, to 0.1 ms."""
    return {f"{name}_s": round(v, 4) for name, v in timings.items()}


def client_data(rng: np.random.Generator, count: Optional[int] = None) -> list:
    """`count` (default `--clients`) clients of `--examples_per_client` random examples."""
    return [
        collections.OrderedDict(
            x=rng.normal(size=(FLAGS.examples_per_client, FLAGS.input_dim)).astype(np.float32),
            y=rng.integers(0, FLAGS.num_classes, FLAGS.examples_per_client).astype(np.int32),
        )
        for _ in range(FLAGS.clients if count is None else count)
    ]


def our_round_fn(
    spec: ModelSpec,
    w0: list,
    clients: list,
    num_clusters: int,
    execution: str = "tff",
    epochs: Optional[int] = None,
) -> Callable[[], object]:
    """One round of the clustered core with clients spread over `num_clusters` clusters, run
    by `execution` (TFF's runtime, or in this process); on TFF's runtime the clients reach the
    worker as a run's would (`--client_data`: read from files for clients of 100 x 784 values,
    `data/client_files.py`)."""
    keras_model = spec.build()
    cache = RoundCache(
        functional_model(keras_model, spec.input_spec()), spec.input_spec(), w0, execution
    )
    ids = [f"c{i}" for i in range(len(clients))]
    if execution == "tff":
        sizes = {c: len(data["y"]) for c, data in zip(ids, clients)}
        arrays = dict(zip(ids, clients))
        data = FederatedData("benchmark", (FLAGS.input_dim,), FLAGS.num_classes, sizes, sizes)
        data = dataclasses.replace(data, train_arrays=arrays, test_arrays=arrays)
        cache.read_on_worker(lambda: worker_source(data, spec.input_spec()))
    epochs = FLAGS.local_epochs if epochs is None else epochs
    hparams = round_hparams(FLAGS.learning_rate, FLAGS.batch_size, epochs)
    return repeated_round(cache, clients, num_clusters, hparams, ids)


def digits_rounds_setup() -> tuple[FederatedData, ModelSpec, TrainingConfig]:
    """The digits Dirichlet clients, the FedTSDP CNN and its paper's training settings, every
    client in every round: what the whole-round benchmarks run."""
    data = load_dataset("digits_dirichlet", seed=FLAGS.seed, dirichlet_beta=0.2)
    spec = model_spec("tsdp_cnn", data.input_shape, data.num_classes, image_shape=(8, 8, 1))
    config = TrainingConfig(
        rounds=10_000,
        clients_per_round=data.num_clients,
        local_epochs=2,
        batch_size=10,
        learning_rate=0.05,
        momentum=0.5,
        seed=FLAGS.seed,
    )
    return data, spec, config


def whole_round_fns(experiments: dict[str, Experiment]) -> tuple[dict, dict]:
    """One callable per experiment running its next whole round (orchestration included), and
    the dict where each one's last round row lands."""
    info: dict = {}

    def round_fn(name: str) -> Callable[[], None]:
        experiment = experiments[name]
        experiment.start()

        def run() -> None:
            round_num = experiment.state.round_num + 1
            row = experiment.train_round(round_num)
            experiment.state.round_num = round_num
            info[name] = row

        return run

    return {name: round_fn(name) for name in experiments}, info
