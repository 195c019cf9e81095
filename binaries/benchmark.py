"""Speed, always as ratios against a reference measured in the same run.
* `round_floors`: one FedAvg round on TFF's runtime and in process (`--execution=in_process`)
  against two plain-TensorFlow floors of the same local training: the clients one after
  another, one `tf.function` each, and all clients vectorised along a client axis.

* `fedavg_vs_tff`: one round of our FedAvg against TFF's own `build_weighted_fed_avg` on the
  same Keras model, clients, data, epochs and batch size, on the same TFF worker (goal <= 1.0).
* `fedgroup_vs_fedavg`: one round of FedGroup with m=5 groups against our FedAvg on the same
  clients (goal <= 1.3).
* `client_scaling`: seconds per FedAvg round against clients per round (10, 100, 1,000), on
  TFF's runtime and in process, with the fixed and per-client parts of a linear fit and a
  log-log text plot (a round must stay linear, no per-round constant dominating).
* `clustering`: server-side EDC time as the number of clustered clients grows (2,000, 5,000,
  10,000) at FEMNIST-MLP size d = 415,258, the updates streamed from a disk memmap (10,000 are
  16.6 GB), with the planted groups' adjusted Rand index; MADC beside it up to 2,000 clients
  (EDC must stay linear in the number of clients).
* `fedtsdp_vs_fedavg`: one whole FedTSDP round (stateful clients uploading whole models,
  public-batch inference of every model, Hopkins statistic, and, when it fires, the two
  DBSCAN stages and the regrouping) against one FedAvg round on the same clients, both through
  the same orchestration, and where FedTSDP's time goes: the mean per timed round as FedAvg's
  round + the K-cluster round + inference + Hopkins + DBSCAN/regrouping + fetching + builds
  (goal: <= 1.5x FedAvg + what the algorithm adds). `--tsdp_trigger=always` forces the
  clustering every round (psi = 1 so the split stays put), the worst case; `paper` uses
  h_th = 0.65.
* `evaluation`: scoring every one of 1,000 clients of power-law sizes (MNIST-FedProx-like:
  log-normal, 20% held out for test; MCLR) with the pooled path the runs use
  (`Experiment.score_pooled`: one call per model) against the per-client path (one scoring per
  client) and against one FedAvg training round of 20 of them at E=20, on both executions
  (goals: pooled <= the training round, per-client >= 10x pooled).
* `unequal_clients`: one in-process FedAvg round of 20 clients of unequal sizes (4-165
  examples, FEMNIST writers' range) padded and masked into vectorised groups, against the
  same clients grouped by exact size only and against a floor: as many clients of one size
  with the same total local steps, one vectorised call (goal: padded <= 1.3x the floor).
* `tff_client_costs` (not run by default): what TFF's runtime costs per client besides its
  training, each a small federated computation over `--clients` clients timed alone: being
  sent the model by `tff.federated_select` (a row of K = 1 or 3 stacked models) against
  `tff.federated_broadcast` of it (every cluster's models when K = 3, the client gathering
  its row), at the MLP's size and at 1 M values; and being sent its examples
  (`--examples_per_client` x `--input_dim` float32).
* `uapdfl_vs_fedavg`: one whole UA-PDFL round (every peer receives its own and N_com routed
  models, fingerprints each, mixes and trains with the alignment term; the mailbox is rebuilt)
  against one FedAvg round with the same participants, at each N_com of
  `--uapdfl_neighbours`, with how the ratio grows per extra neighbour.

After a warm-up round each (tracing), timed rounds alternate between the two implementations so
that machine noise hits both alike; medians are reported. The last output line is one JSON object.

  python binaries/benchmark.py
  python binaries/benchmark.py --benchmarks=clustering --cluster_sizes=100,500,2000
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Optional
from unittest import mock

from absl import flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tff_clustered import cli, logs  # noqa: E402 - light; quiets TensorFlow before its import

cli.stop_at_once_on_signals("benchmark.py")

logs.quiet_tensorflow(sys.argv)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

# TensorFlow must be imported before absl parses flags: imported inside `main`, Keras' Flatten
# layer fails to build (seen with TF 2.14 / absl 1.4).
from tff_clustered import clustering  # noqa: E402
from tff_clustered.algorithms import fedtsdp as fedtsdp_algorithm  # noqa: E402
from tff_clustered.algorithms import make_algorithm  # noqa: E402
from tff_clustered.data import load_dataset  # noqa: E402
from tff_clustered.data.federated_data import from_arrays  # noqa: E402
from tff_clustered.federated import grouping, in_process  # noqa: E402
from tff_clustered.federated.executions import RoundCache, repeated_round  # noqa: E402
from tff_clustered.federated.round_functions import (  # noqa: E402
    round_functions,
)
from tff_clustered.federated.signature import (  # noqa: E402
    RoundSignature,
    client_input,
    client_seed,
    round_hparams,
)
from tff_clustered.loop.config import TrainingConfig  # noqa: E402
from tff_clustered.loop.evaluation import server_models  # noqa: E402
from tff_clustered.models import initial_weights, model_spec  # noqa: E402
from tff_clustered.models.functional import functional_model  # noqa: E402
from tff_clustered.orchestration import Experiment  # noqa: E402
from tff_clustered.runtime import tff_runtime  # noqa: E402

logs.quiet_python_logs(sys.argv)

FLAGS = flags.FLAGS
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
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
# Every benchmark `main` runs; `memory` and `tff_client_costs` only when named.
BENCHMARK_NAMES = (
    "round_floors",
    "fedavg_vs_tff",
    "fedgroup_vs_fedavg",
    "client_scaling",
    "clustering",
    "fedtsdp_vs_fedavg",
    "uapdfl_vs_fedavg",
    "evaluation",
    "unequal_clients",
    "memory",
    "tff_client_costs",
)
flags.DEFINE_list(
    "benchmarks",
    [n for n in BENCHMARK_NAMES if n not in ("memory", "tff_client_costs")],
    f"Benchmarks to run, from {', '.join(BENCHMARK_NAMES)}.",
)


@flags.validator("benchmarks")
def known_benchmarks(names: list[str]) -> bool:
    """A selection that measures something: a misspelt or empty one ran nothing and exited 0."""
    unknown = [n for n in names if n not in BENCHMARK_NAMES]
    if unknown or not names:
        raise flags.ValidationError(
            f"{'unknown ' + ', '.join(unknown) if unknown else 'nothing selected'}; "
            f"choose from {', '.join(BENCHMARK_NAMES)}"
        )
    return True

flags.DEFINE_list("unequal_sizes", ["4", "165"], "Least and most examples (unequal_clients).")
flags.DEFINE_list("uapdfl_neighbours", ["1", "3", "5", "9"], "N_com values (uapdfl_vs_fedavg).")
flags.DEFINE_integer("dfl_rounds", 4, "Timed rounds of uapdfl_vs_fedavg.", lower_bound=1)
flags.DEFINE_enum(
    "tsdp_trigger",
    "always",
    ["always", "paper", "calibrated"],
    "FedTSDP clustering per round: always, or FedTSDP's --tsdp_trigger (paper: H > 0.65).",
)
flags.DEFINE_integer("tsdp_rounds", 6, "Timed rounds of fedtsdp_vs_fedavg.", lower_bound=1)
flags.DEFINE_integer("groups", 5, "FedGroup groups for fedgroup_vs_fedavg.")
flags.DEFINE_list("cluster_sizes", ["2000", "5000", "10000"], "Clients clustered (clustering).")
flags.DEFINE_integer("madc_max_clients", 2000, "Largest P MADC is timed at (O(P^3)).")
flags.DEFINE_string("scratch_dir", None, "Where clustering's update memmaps go (default: /tmp).")
flags.DEFINE_list("scaling_clients", ["10", "100", "1000"], "Clients per round (client_scaling).")
flags.DEFINE_integer("scaling_epochs", 1, "Local epochs in client_scaling.", lower_bound=1)
flags.DEFINE_integer("scaling_rounds", 3, "Timed rounds per size (client_scaling).", lower_bound=1)
flags.DEFINE_integer("cluster_dim", 415_258, "Update length d (clustering): FEMNIST MLP.")
flags.DEFINE_integer("eval_clients", 1000, "Clients scored (evaluation).", lower_bound=1)
flags.DEFINE_integer("eval_rounds", 3, "Timed repetitions of evaluation.", lower_bound=1)
flags.DEFINE_integer("memory_rounds", 300, "Rounds of the memory benchmark.", lower_bound=20)
flags.DEFINE_enum(
    "memory_execution", "tff", ["tff", "in_process"], "What runs the memory benchmark's rounds."
)
flags.DEFINE_integer("memory_warmup", 50, "Rounds before memory growth is measured.", lower_bound=0)


def alternate(fns: dict, rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each callable, after `warmup` calls each, calls interleaved."""
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


def client_data(rng: np.random.Generator, count: Optional[int] = None) -> list:
    return [
        collections.OrderedDict(
            x=rng.normal(size=(FLAGS.examples_per_client, FLAGS.input_dim)).astype(np.float32),
            y=rng.integers(0, FLAGS.num_classes, FLAGS.examples_per_client).astype(np.int32),
        )
        for _ in range(FLAGS.clients if count is None else count)
    ]


def datasets(clients: list) -> list:
    return [
        tf.data.Dataset.from_tensor_slices(c).batch(FLAGS.batch_size).repeat(FLAGS.local_epochs)
        for c in clients
    ]


def our_round_fn(
    spec: object,
    w0: list,
    clients: list,
    num_clusters: int,
    execution: str = "tff",
    epochs: Optional[int] = None,
) -> object:
    """One round of the clustered core with clients spread over `num_clusters` clusters, run
    by `execution` (TFF's runtime, or in this process)."""
    keras_model = spec.build()
    cache = RoundCache(
        functional_model(keras_model, spec.input_spec()), spec.input_spec(), w0, execution
    )
    epochs = FLAGS.local_epochs if epochs is None else epochs
    hparams = round_hparams(FLAGS.learning_rate, FLAGS.batch_size, epochs)
    return repeated_round(cache, clients, num_clusters, hparams)


def dense_stack_forward(weights: list, x: tf.Tensor) -> tf.Tensor:
    """The MLP / MCLR of this benchmark as plain TF: (kernel, bias) pairs, ReLU between; with
    a leading client axis on everything, the matmuls are batched."""
    for i in range(0, len(weights), 2):
        x = tf.matmul(x, weights[i]) + tf.expand_dims(weights[i + 1], -2)
        if i + 2 < len(weights):
            x = tf.nn.relu(x)
    return x


def stacked_batches(clients: list) -> tuple[np.ndarray, np.ndarray]:
    """Every client's epochs of batches in one fixed order: x (clients, steps, batch, d),
    y (clients, steps, batch). The floors' data needs no shuffling: the order costs nothing."""
    per_epoch = FLAGS.examples_per_client // FLAGS.batch_size
    used = per_epoch * FLAGS.batch_size
    x = np.stack([c["x"][:used] for c in clients]).reshape(
        len(clients), per_epoch, FLAGS.batch_size, -1
    )
    y = np.stack([c["y"][:used] for c in clients]).reshape(len(clients), per_epoch, -1)
    return np.tile(x, (1, FLAGS.local_epochs, 1, 1)), np.tile(y, (1, FLAGS.local_epochs, 1))


def floor_round_fns(w0: list, clients: list) -> dict:
    """The same local training in plain TensorFlow, no TFF and no framework: `sequential`, one
    `tf.function` per client (traced once) with the clients run one after another, then the
    mean; `vectorised`, every client at once along a leading client axis (batched matmuls) in
    one `tf.function`. What a round could cost on this machine."""
    x, y = stacked_batches(clients)
    lr = FLAGS.learning_rate
    weights = [tf.constant(w) for w in w0]

    def sgd(start: list, xs: tf.Tensor, ys: tf.Tensor) -> list:
        def step(i: tf.Tensor, current: list) -> tuple:
            with tf.GradientTape() as tape:
                tape.watch(current)
                logits = dense_stack_forward(current, xs[..., i, :, :])
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(ys[..., i, :], logits)
                loss = tf.reduce_sum(tf.reduce_mean(losses, axis=-1))  # per-client means
            grads = tape.gradient(loss, current)
            return i + 1, [w - lr * g for w, g in zip(current, grads)]

        steps = xs.shape[-3]
        _, trained = tf.while_loop(lambda i, _: i < steps, step, (tf.constant(0), start))
        return trained

    @tf.function
    def one_client(xs: tf.Tensor, ys: tf.Tensor) -> list:
        return sgd(weights, xs, ys)

    @tf.function
    def all_clients(xs: tf.Tensor, ys: tf.Tensor) -> list:
        stacked = [tf.repeat(w[None], len(clients), axis=0) for w in weights]
        trained = sgd(stacked, xs, ys)
        return [tf.reduce_mean(t, axis=0) for t in trained]

    xs = [tf.constant(x[i]) for i in range(len(clients))]
    ys = [tf.constant(y[i]) for i in range(len(clients))]
    x_all, y_all = tf.constant(x), tf.constant(y)

    def sequential() -> None:
        trained = [one_client(a, b) for a, b in zip(xs, ys)]
        [np.mean([t[i].numpy() for t in trained], axis=0) for i in range(len(weights))]

    def vectorised() -> None:
        [t.numpy() for t in all_clients(x_all, y_all)]

    return {"sequential_floor": sequential, "vectorised_floor": vectorised}


def tff_round_fn(spec: object, w0: list, clients: list) -> object:
    def model_fn() -> tff.learning.models.VariableModel:
        keras_model = spec.build()
        keras_model.set_weights(w0)
        return tff.learning.models.from_keras_model(
            keras_model,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=collections.OrderedDict(spec.input_spec()),
        )

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=FLAGS.learning_rate),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )
    state = process.initialize()

    def run() -> None:
        nonlocal state
        state = process.next(state, datasets(clients)).state

    return run


def planted_updates_on_disk(
    path: str, size: int, dim: int, groups: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`size` float32 updates of length `dim` in a .npy memmap at `path`: update i is
    scale_i * (center of its group + unit noise), groups drawn at random; written in blocks,
    so 10,000 x 415,258 (16.6 GB) never has to fit in memory. Returns (memmap, groups)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, groups, size)
    centers = rng.standard_normal((groups, dim), dtype=np.float32)
    updates = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(size, dim))
    for start in range(0, size, clustering.BLOCK_ROWS):
        rows = labels[start : start + clustering.BLOCK_ROWS]
        block = rng.standard_normal((len(rows), dim), dtype=np.float32)
        block += centers[rows]
        block *= rng.uniform(0.2, 5.0, (len(rows), 1)).astype(np.float32)
        updates[start : start + len(rows)] = block
    updates.flush()
    return updates, labels


def clustering_scaling() -> dict:
    """EDC (and MADC, up to --madc_max_clients) seconds on P planted updates of length d
    (float32, streamed from a disk memmap), P growing; and how well EDC recovers the groups."""
    import tempfile

    from sklearn.metrics import adjusted_rand_score

    out: dict[str, dict] = {}
    for size in (int(s) for s in FLAGS.cluster_sizes):
        with tempfile.TemporaryDirectory(dir=FLAGS.scratch_dir) as scratch:
            start = time.perf_counter()
            updates, planted = planted_updates_on_disk(
                os.path.join(scratch, "updates.npy"), size, FLAGS.cluster_dim, FLAGS.groups, size
            )
            written = time.perf_counter() - start
            start = time.perf_counter()
            labels = clustering.cluster_edc(updates, FLAGS.groups, seed=0)
            edc = time.perf_counter() - start
            row = {
                "edc_s": round(edc, 3),
                "edc_adjusted_rand": round(adjusted_rand_score(planted, labels), 4),
                "gigabytes": round(updates.nbytes / 1e9, 2),
                "write_s": round(written, 1),
            }
            if size <= FLAGS.madc_max_clients:
                start = time.perf_counter()
                clustering.cluster_madc(np.asarray(updates), FLAGS.groups)
                madc = time.perf_counter() - start
                row.update(madc_s=round(madc, 3), madc_over_edc=round(madc / edc, 2))
            del updates
        out[str(size)] = row
        madc_text = f", MADC {row['madc_s']:.2f} s" if "madc_s" in row else ""
        print(
            f"clustering P={size} d={FLAGS.cluster_dim} ({row['gigabytes']} GB on disk): EDC "
            f"{edc:.2f} s (adjusted Rand {row['edc_adjusted_rand']}){madc_text}",
            flush=True,
        )
    sizes = sorted(out, key=int)
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        growth = out[last]["edc_s"] / out[first]["edc_s"]
        out["edc_time_growth_vs_clients_growth"] = round(growth / (int(last) / int(first)), 3)
    return out


def client_scaling(spec: object, w0: list, rng: np.random.Generator) -> dict:
    """Seconds per FedAvg round against clients per round, TFF runtime and in process, with a
    least-squares fit seconds = fixed + per_client * clients (what a round costs whatever its
    size, and per client)."""
    sizes = [int(s) for s in FLAGS.scaling_clients]
    rows: dict[str, dict] = {}
    for size in sizes:
        clients = client_data(rng, size)
        fns = {
            execution: our_round_fn(spec, w0, clients, 1, execution, FLAGS.scaling_epochs)
            for execution in ("tff", "in_process")
        }
        t = alternate(fns, FLAGS.scaling_rounds)
        rows[str(size)] = {f"{name}_s": round(v, 4) for name, v in t.items()}
        print(
            f"{size} clients x {FLAGS.examples_per_client} examples, {FLAGS.scaling_epochs} "
            f"epoch(s): TFF {t['tff']:.3f} s/round, in process {t['in_process']:.3f} s/round",
            flush=True,
        )
    out: dict = {"rounds": rows}
    for execution in ("tff", "in_process"):
        seconds = np.array([rows[str(n)][f"{execution}_s"] for n in sizes])
        per_client, fixed = np.polyfit(np.array(sizes, float), seconds, 1)
        out[execution] = {
            "fixed_s": round(float(fixed), 4),
            "per_client_ms": round(1000 * float(per_client), 3),
            # the per-round constant's share of the smallest round
            "fixed_share_at_smallest": round(float(fixed) / float(seconds[0]), 3),
        }
    print(ascii_loglog(sizes, {e: [rows[str(n)][f"{e}_s"] for n in sizes] for e in fns}))
    return out


def ascii_loglog(sizes: list[int], series: dict[str, list[float]]) -> str:
    """A log-log text plot of seconds per round against clients (one letter per series)."""
    width, height = 50, 14
    xs = np.log10(sizes)
    ys = {name: np.log10(np.maximum(v, 1e-4)) for name, v in series.items()}
    lo = min(v.min() for v in ys.values())
    hi = max(v.max() for v in ys.values())
    grid = [[" "] * (width + 1) for _ in range(height + 1)]
    for name, values in ys.items():
        for x, y in zip(xs, values):
            col = int(round((x - xs[0]) / max(xs[-1] - xs[0], 1e-9) * width))
            row = height - int(round((y - lo) / max(hi - lo, 1e-9) * height))
            grid[row][col] = "*" if grid[row][col] != " " else name[0].upper()
    lines = [f"s/round (log): {10**hi:.3g} at top, {10**lo:.3g} at bottom"]
    lines += ["|" + "".join(r) for r in grid]
    lines.append("+" + "-" * (width + 1))
    legend = ", ".join(f"{n[0].upper()} = {n}" for n in series) + ", * = both"
    lines.append(f" clients (log): {sizes[0]} .. {sizes[-1]};  {legend}")
    return "\n".join(lines)


def digits_rounds_setup() -> tuple[object, object, TrainingConfig]:
    """The digits Dirichlet clients, the FedTSDP CNN and its paper's training settings, every
    client in every round: what the whole-round benchmarks run."""
    data = load_dataset("digits_dirichlet", seed=FLAGS.seed, dirichlet_beta=0.2)
    spec = model_spec("tsdp_cnn", data.input_shape, data.num_classes, image_shape=(8, 8, 1))
    config = TrainingConfig(
        rounds=10_000,
        clients_per_round=len(data.client_ids),
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

    def round_fn(name: str) -> object:
        experiment = experiments[name]
        experiment.start()

        def run() -> None:
            round_num = experiment.state.round_num + 1
            row = experiment.train_round(round_num)
            experiment.state.round_num = round_num
            info[name] = row

        return run

    return {name: round_fn(name) for name in experiments}, info


def tsdp_round_fns() -> tuple[dict, tuple[dict, dict]]:
    """Whole rounds of FedTSDP and FedAvg (`digits_rounds_setup`)."""
    data, spec, config = digits_rounds_setup()
    if FLAGS.tsdp_trigger == "always":
        options = dict(tsdp_trigger="paper", hopkins_threshold=1e-6, psi=1.0)
    else:
        options = dict(tsdp_trigger=FLAGS.tsdp_trigger)
    experiments = {
        "fedtsdp": Experiment(data, spec, make_algorithm("fedtsdp", **options), config),
        "fedavg": Experiment(data, spec, make_algorithm("fedavg"), config),
    }
    fns, info = whole_round_fns(experiments)
    return fns, (experiments, info)


# The steps of a FedTSDP round timed apart (`fedtsdp_vs_fedavg`), each by the functions its code
# calls, patched where the algorithm looks them up (`tff_clustered.clustering`, its module).
TSDP_STEPS = {
    "hopkins": (
        "hopkins_statistic",
        "hopkins_estimate",
        "rotated_outputs",
        "hopkins_against_references",
    ),
    "dbscan_regroup": ("js_divergence_matrix", "weight_distance_matrix", "two_stage_clusters"),
}


class Stopwatch:
    """Seconds spent in the callables `watch` wraps, summed per step until `lap()`."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def watch(self, step: str, owner: object, name: str) -> None:
        """`owner.name` timed as part of `step` until the stack closes."""
        wrapped = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return wrapped(*args, **kwargs)
            finally:
                self.seconds[step] += time.perf_counter() - start

        self.stack.enter_context(mock.patch.object(owner, name, timed))

    def lap(self) -> dict[str, float]:
        laps, self.seconds = dict(self.seconds), collections.defaultdict(float)
        return laps


def fedtsdp_vs_fedavg() -> dict:
    """Whole FedTSDP and FedAvg rounds (`tsdp_round_fns`), interleaved after three warm-up
    rounds, and where FedTSDP's time goes: its federated round against FedAvg's (K clusters
    sent and summed, whole models returned to the store), the inference of the m uploaded
    models on the public batch, the Hopkins test, the DBSCAN stages with the regrouping (in
    the rounds that trigger them), the stored models fetched, and the rounds that built (traced)
    a new round signature (the split shrinks at every trigger)."""
    fns, (experiments, info) = tsdp_round_fns()
    tsdp = experiments["fedtsdp"]
    cache = tsdp.runner.rounds_cache
    for _ in range(3):  # the cluster counts FedTSDP forms early are built (traced) once
        for fn in fns.values():
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    train: dict[str, list[float]] = {name: [] for name in fns}
    steps: list[dict[str, float]] = []
    built: list[bool] = []
    with contextlib.ExitStack() as stack:
        watch = Stopwatch(stack)
        watch.watch("inference", tsdp.runner, "predict_probabilities")
        watch.watch("fetch_models", tsdp.store, "flat")
        watch.watch("dbscan_regroup", fedtsdp_algorithm, "regroup")
        for step, names in TSDP_STEPS.items():
            for name in names:
                if hasattr(clustering, name):
                    watch.watch(step, clustering, name)
        for _ in range(FLAGS.tsdp_rounds):
            for name, fn in fns.items():
                builds = cache.builds
                watch.lap()
                start = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - start)
                train[name].append(info[name]["train_seconds"])
                if name == "fedtsdp":
                    steps.append(watch.lap())
                    built.append(cache.builds > builds)
    rounds = range(len(built))
    steady = [i for i in rounds if not built[i]] or list(rounds)
    fedavg = statistics.mean(seconds["fedavg"])
    steady_train = float(np.mean([train["fedtsdp"][i] for i in steady]))
    # Means per timed round, adding up to FedTSDP's mean round: a build (a round signature
    # traced for the first time) counted apart from the round it happened in.
    parts = {
        "fedavg_round": fedavg,
        "k_cluster_round": steady_train - statistics.mean(train["fedavg"]),
        **{
            step: float(np.mean([s.get(step, 0.0) for s in steps]))
            for step in ("inference", "hopkins", "dbscan_regroup", "fetch_models")
        },
        "builds": float(
            np.mean([train["fedtsdp"][i] - steady_train if built[i] else 0.0 for i in rounds])
        ),
    }
    mean_round = statistics.mean(seconds["fedtsdp"])
    parts["other"] = mean_round - sum(parts.values())
    algorithm_adds = sum(
        parts[k] for k in ("k_cluster_round", "inference", "hopkins", "dbscan_regroup")
    )
    goal = mean_round / (1.5 * fedavg + algorithm_adds)
    median_ratio = statistics.median(seconds["fedtsdp"]) / statistics.median(seconds["fedavg"])
    print(
        f"FedTSDP (clustering {FLAGS.tsdp_trigger}) vs FedAvg, 20 digits clients, tsdp_cnn: "
        f"{statistics.median(seconds['fedtsdp']):.3f} vs {statistics.median(seconds['fedavg']):.3f}"
        f" s/round (medians of {FLAGS.tsdp_rounds}), {median_ratio:.2f}x; {tsdp.num_clusters} "
        f"clusters and clustered={info['fedtsdp'].get('clustered')} in the last round; "
        f"{cache.builds} round signatures built in all, {sum(built)} in the timed rounds\n"
        f"  means per timed round: FedTSDP {mean_round:.3f} s = "
        + " + ".join(f"{name} {value:.3f}" for name, value in parts.items())
        + f"\n  FedTSDP / (1.5 x FedAvg + what the algorithm adds, {algorithm_adds:.3f} s): "
        f"{goal:.2f} (goal <= 1)",
        flush=True,
    )
    return {
        "fedtsdp_s_per_round": round(statistics.median(seconds["fedtsdp"]), 4),
        "fedtsdp_fedavg_s_per_round": round(statistics.median(seconds["fedavg"]), 4),
        "fedtsdp_over_fedavg": round(median_ratio, 3),
        "fedtsdp_trigger": FLAGS.tsdp_trigger,
        "fedtsdp_mean_s_per_round": round(mean_round, 4),
        "fedtsdp_parts_s": {name: round(value, 4) for name, value in parts.items()},
        "fedtsdp_timed_rounds_built": int(sum(built)),
        "fedtsdp_over_goal": round(goal, 3),
    }


def uapdfl_vs_fedavg() -> dict:
    """Whole rounds of UA-PDFL at each N_com of --uapdfl_neighbours against a FedAvg round
    with the same participants (every client), interleaved; the ratios and a least-squares
    line of the UA-PDFL round time against N_com."""
    data, spec, config = digits_rounds_setup()
    counts = sorted({int(n) for n in FLAGS.uapdfl_neighbours})
    experiments = {"fedavg": Experiment(data, spec, make_algorithm("fedavg"), config)}
    for n in counts:
        algorithm = make_algorithm("uapdfl", num_neighbours=n)
        experiments[f"uapdfl_n{n}"] = Experiment(data, spec, algorithm, config)
    fns, info = whole_round_fns(experiments)
    t = alternate(fns, FLAGS.dfl_rounds, warmup=2)
    fedavg = t["fedavg"]
    seconds = [t[f"uapdfl_n{n}"] for n in counts]
    slope, intercept = np.polyfit(counts, seconds, 1) if len(counts) > 1 else (0.0, seconds[0])
    ratios = {str(n): round(s / fedavg, 3) for n, s in zip(counts, seconds)}
    print(
        f"UA-PDFL vs FedAvg, {len(data.client_ids)} digits clients every round, tsdp_cnn: "
        f"FedAvg {fedavg:.3f} s/round; UA-PDFL "
        + ", ".join(f"N_com={n} {s:.3f} s ({s / fedavg:.2f}x)" for n, s in zip(counts, seconds))
        + f"; +{slope / fedavg:.3f} FedAvg rounds per extra neighbour",
        flush=True,
    )
    return {
        "fedavg_s_per_round": round(fedavg, 4),
        "uapdfl_s_per_round": {str(n): round(s, 4) for n, s in zip(counts, seconds)},
        "uapdfl_over_fedavg": ratios,
        "extra_neighbour_over_fedavg": round(float(slope) / fedavg, 4),
        "zero_neighbour_intercept_over_fedavg": round(float(intercept) / fedavg, 3),
    }


def power_law_clients(rng: np.random.Generator, count: int) -> object:
    """`count` MNIST-sized clients of log-normal sizes (median 55, long tail; FedProx's MNIST
    split is power-law), random inputs and labels, 20% of each held out for test."""
    sizes = np.clip(rng.lognormal(4.0, 0.8, count).astype(int), 5, 2000)
    train, test = {}, {}
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, FLAGS.input_dim)).astype(np.float32)
        y = rng.integers(0, FLAGS.num_classes, n).astype(np.int32)
        cut = max(1, n // 5)
        test[f"c{i:04d}"], train[f"c{i:04d}"] = (x[:cut], y[:cut]), (x[cut:], y[cut:])
    return from_arrays("power_law", train, test, FLAGS.num_classes)


def scoring_fns(exp: Experiment) -> dict:
    """Pooled scoring of every client, per-client scoring, and one training round of `exp`."""
    exp.start()
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "global", np.zeros(len(ids), np.int32))
    whole = exp.runner.whole_model_round(1)

    def train() -> None:
        exp.train_round(exp.state.round_num + 1)
        exp.state.round_num += 1

    return {
        "pooled": lambda: exp.runner.score_pooled(models, keys, ids),
        "per_client": lambda: exp.runner.score(whole, models, keys, ids),
        "training_round": train,
    }


def evaluation_speed() -> dict:
    """Seconds to score every client (pooled and per client) against one training round of 20
    clients at E=20 (FedGroup's MNIST setting), on both executions."""
    data = power_law_clients(np.random.default_rng(FLAGS.seed), FLAGS.eval_clients)
    spec = model_spec("mclr", (FLAGS.input_dim,), FLAGS.num_classes)
    config = TrainingConfig(
        rounds=10_000, clients_per_round=20, local_epochs=20, batch_size=10, seed=FLAGS.seed
    )
    examples = sum(data.test_sizes.values())
    out: dict = {"clients": len(data.client_ids), "test_examples": examples}
    for execution in ("tff", "in_process"):
        exp = Experiment(data, spec, make_algorithm("fedavg"), config, execution=execution)
        fns = scoring_fns(exp)
        start = time.perf_counter()
        fns["pooled"]()  # the first call pools the split and keeps it where scoring runs
        first = time.perf_counter() - start
        t = alternate(fns, FLAGS.eval_rounds)
        ids = data.client_ids
        out[execution] = {
            **{f"{name}_s": round(v, 4) for name, v in t.items()},
            "first_pooled_s": round(first, 4),
            "pooled_ms_per_client": round(1000 * t["pooled"] / len(ids), 3),
            "per_client_ms_per_client": round(1000 * t["per_client"] / len(ids), 3),
            "per_client_over_pooled": round(t["per_client"] / t["pooled"], 1),
            "pooled_over_training_round": round(t["pooled"] / t["training_round"], 3),
        }
        print(
            f"Scoring {len(ids)} power-law clients ({examples} test examples, mclr) on "
            f"{execution}: pooled {t['pooled']:.3f} s (first call {first:.3f} s), "
            f"per client {t['per_client']:.3f} s "
            f"({t['per_client'] / t['pooled']:.1f}x); one training round of 20 clients at E=20 "
            f"{t['training_round']:.3f} s (pooled / round = "
            f"{t['pooled'] / t['training_round']:.2f})",
            flush=True,
        )
    return out


def tff_client_costs(spec: object, rng: np.random.Generator) -> dict:
    """Milliseconds per client of what TFF's runtime does for a client besides its training
    (see the module docstring), each the median of 3 calls after a warm-up, `--clients`
    clients."""
    n, key_type = FLAGS.clients, tff.TensorType(np.int32)
    keys = list(range(n))
    model_size = sum(int(np.prod(w.shape)) for w in initial_weights(spec, FLAGS.seed))

    def model_paths(size: int, k: int) -> dict:
        stacked = tff.TensorType(np.float32, [k, size])
        row = tff.TensorType(np.float32, [size])

        @tff.tensorflow.computation(stacked, key_type)
        def select_row(models: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
            return models[key]

        @tff.tensorflow.computation(tff.SequenceType(row), key_type)
        def use_selected(selected: object, key: tf.Tensor) -> tf.Tensor:
            total = selected.reduce(0.0, lambda acc, v: acc + tf.reduce_sum(v))
            return total + tf.cast(key, tf.float32)

        @tff.tensorflow.computation(stacked, key_type)
        def use_broadcast(models: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
            return tf.reduce_sum(tf.gather(models, key % k)) + tf.cast(key, tf.float32)

        @tff.tensorflow.computation(key_type)
        def cluster_of(key: tf.Tensor) -> tf.Tensor:
            return tf.reshape(key % k, [1])

        server, clients = (
            tff.FederatedType(stacked, tff.SERVER),
            tff.FederatedType(key_type, tff.CLIENTS),
        )

        @tff.federated_computation(server, clients)
        def selected(models: object, client_keys: object) -> object:
            rows = tff.federated_select(
                tff.federated_map(cluster_of, client_keys),
                tff.federated_value(k, tff.SERVER),
                models,
                select_row,
            )
            return tff.federated_map(use_selected, (rows, client_keys))

        @tff.federated_computation(server, clients)
        def broadcast(models: object, client_keys: object) -> object:
            return tff.federated_map(use_broadcast, (tff.federated_broadcast(models), client_keys))

        models = np.zeros((k, size), np.float32)
        return {
            f"select_{size}x{k}": lambda: selected(models, keys),
            f"broadcast_{size}x{k}": lambda: broadcast(models, keys),
        }

    examples = tff.TensorType(np.float32, [None, FLAGS.input_dim])

    @tff.tensorflow.computation(examples)
    def total(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(x)

    @tff.federated_computation(tff.FederatedType(examples, tff.CLIENTS))
    def sent_examples(x: object) -> object:
        return tff.federated_map(total, x)

    data = [c["x"] for c in client_data(rng, n)]
    fns = {"examples_sent": lambda: sent_examples(data)}
    for size, k in ((model_size, 1), (model_size, 3), (1_000_000, 3)):
        fns.update(model_paths(size, k))
    out = {f"{name}_ms_per_client": round(1000 * t / n, 3) for name, t in alternate(fns, 3).items()}
    for name, ms in out.items():
        print(f"TFF runtime, {n} clients: {name} {ms:.2f}", flush=True)
    return out


def resident_mb(pid: int) -> float:
    """Resident set size of a process, MB (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory_growth(worker_pid: Optional[int]) -> dict:
    """A FedAvg digits run of `memory_rounds` rounds (10 clients a round, evaluated every
    round) on `--memory_execution`: resident memory of this process and of the TFF worker (none
    in process) every 10 rounds, and the growth per 100 rounds after `memory_warmup`
    (least-squares slope)."""
    execution = FLAGS.memory_execution
    data = load_dataset("digits", seed=FLAGS.seed)
    spec = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=64)
    config = TrainingConfig(
        rounds=FLAGS.memory_rounds,
        clients_per_round=10,
        local_epochs=1,
        batch_size=10,
        learning_rate=0.1,
        seed=FLAGS.seed,
    )
    experiment = Experiment(data, spec, make_algorithm("fedavg"), config, execution=execution)
    experiment.start()
    samples = []
    in_worker = execution == "tff" and worker_pid is not None
    for row in experiment.rounds():
        if row["round"] % 10 == 0:
            worker_mb = resident_mb(worker_pid) if in_worker else 0.0
            samples.append((row["round"], resident_mb(os.getpid()), worker_mb))
    measured = np.array([s for s in samples if s[0] >= FLAGS.memory_warmup])
    result: dict = {
        "rounds": FLAGS.memory_rounds,
        "warmup": FLAGS.memory_warmup,
        "execution": execution,
    }
    for column, name in ((1, "python"), (2, "worker")):
        slope = np.polyfit(measured[:, 0], measured[:, column], 1)[0]
        result[f"{name}_mb_per_100_rounds"] = round(float(slope * 100), 2)
        result[f"{name}_mb_at_warmup"] = round(float(measured[0, column]), 1)
        result[f"{name}_mb_at_end"] = round(float(measured[-1, column]), 1)
    result["resident_mb_every_100_rounds"] = [
        {"round": int(r), "python_mb": round(p, 1), "worker_mb": round(w, 1)}
        for r, p, w in samples
        if r % 100 == 0
    ]
    for point in result["resident_mb_every_100_rounds"]:
        print(
            f"  round {point['round']:5d}: python {point['python_mb']:.1f} MB, "
            f"worker {point['worker_mb']:.1f} MB",
            flush=True,
        )
    print(
        f"memory over {FLAGS.memory_rounds} FedAvg digits rounds ({execution}): python "
        f"{result['python_mb_at_warmup']} -> {result['python_mb_at_end']} MB "
        f"({result['python_mb_per_100_rounds']:+.2f} MB/100 rounds), worker "
        f"{result['worker_mb_at_warmup']} -> {result['worker_mb_at_end']} MB "
        f"({result['worker_mb_per_100_rounds']:+.2f} MB/100 rounds) after round "
        f"{FLAGS.memory_warmup}",
        flush=True,
    )
    return result


def unequal_clients(spec: object, w0: list, rng: np.random.Generator) -> dict:
    """One in-process FedAvg round of clients of unequal sizes (`--unequal_sizes`, FEMNIST
    writers' range) three ways: padded and masked into the groups `client_groups` plans (the
    default), grouped by exact size only (clients of a size of their own train alone, two at a
    time), and, as the floor, the same number of clients of one equal size with the same total
    number of local steps (one vectorised call)."""
    low, high = (int(v) for v in FLAGS.unequal_sizes)
    sizes = rng.integers(low, high + 1, FLAGS.clients)
    hparams = round_hparams(FLAGS.learning_rate, FLAGS.batch_size, FLAGS.local_epochs)
    total_steps = sum(grouping.client_steps(int(n), hparams) for n in sizes)
    per_client = max(1, round(total_steps / len(sizes) / FLAGS.local_epochs))
    equal = per_client * FLAGS.batch_size  # examples giving each client the mean step count

    def clients_of(counts: Sequence[int]) -> list:
        return [
            collections.OrderedDict(
                x=rng.normal(size=(n, FLAGS.input_dim)).astype(np.float32),
                y=rng.integers(0, FLAGS.num_classes, n).astype(np.int32),
            )
            for n in counts
        ]

    unequal, equal_clients = clients_of(sizes), clients_of([equal] * len(sizes))
    model = functional_model(spec.build(), spec.input_spec())
    signature = RoundSignature(1, tuple(range(len(w0))))
    fns = round_functions(model, spec.input_spec(), signature, w0)
    padded = in_process.in_process_round(fns)
    by_size = in_process.in_process_round(fns, pad_unequal_clients=False)

    def round_fn(process: object, clients: list) -> object:
        state = process.initialize()
        inputs = [
            client_input(data, 0, (), 1.0, client_seed(i, i)) for i, data in enumerate(clients)
        ]

        def run() -> None:
            process.next(state, inputs, hparams)

        return run

    t = alternate(
        {
            "padded": round_fn(padded, unequal),
            "by_size": round_fn(by_size, unequal),
            "equal_floor": round_fn(padded, equal_clients),
        },
        FLAGS.rounds,
    )
    groups = grouping.client_groups([int(n) for n in sizes], hparams, pad=True)
    floor = t["equal_floor"]
    print(
        f"Unequal clients in process: {len(sizes)} clients of {low}-{high} examples "
        f"({total_steps} local steps in all), {FLAGS.local_epochs} epochs, batch "
        f"{FLAGS.batch_size}, {FLAGS.model}: padded {t['padded']:.3f} s "
        f"({t['padded'] / floor:.2f}x the floor; {len(groups)} groups of "
        f"{[len(g) for g in groups]} clients), by exact size {t['by_size']:.3f} s "
        f"({t['by_size'] / floor:.2f}x); floor ({len(sizes)} clients x {equal} examples, same "
        f"steps, one vectorised call) {floor:.3f} s",
        flush=True,
    )
    return {
        **{f"{name}_s": round(v, 4) for name, v in t.items()},
        "sizes": [int(n) for n in sizes],
        "total_steps": int(total_steps),
        "groups": [len(g) for g in groups],
        "padded_over_floor": round(t["padded"] / floor, 3),
        "by_size_over_floor": round(t["by_size"] / floor, 3),
        "by_size_over_padded": round(t["by_size"] / t["padded"], 3),
    }


def main(argv: list[str]) -> None:
    del argv
    rng = np.random.default_rng(FLAGS.seed)
    spec = model_spec(FLAGS.model, (FLAGS.input_dim,), FLAGS.num_classes, FLAGS.hidden_units)
    w0 = initial_weights(spec, FLAGS.seed)
    clients = client_data(rng)
    report: dict = {
        "benchmark": "tff_clustered",
        "rounds": FLAGS.rounds,
        "clients": FLAGS.clients,
        "model": FLAGS.model,
    }
    workload = (
        f"{FLAGS.clients} clients x {FLAGS.examples_per_client} examples, "
        f"{FLAGS.local_epochs} epochs, batch {FLAGS.batch_size}, {FLAGS.model}"
    )
    with tff_runtime() as runtime:
        if "memory" in FLAGS.benchmarks:
            report["memory"] = memory_growth(runtime.worker_pid)
        if "fedavg_vs_tff" in FLAGS.benchmarks:
            t = alternate(
                {
                    "ours": our_round_fn(spec, w0, clients, 1),
                    "tff": tff_round_fn(spec, w0, clients),
                },
                FLAGS.rounds,
            )
            print(
                f"FedAvg, {workload}: ours {t['ours']:.3f} s/round, tff.learning "
                f"{t['tff']:.3f} s/round (median of {FLAGS.rounds})",
                flush=True,
            )
            report.update(
                ours_s_per_round=round(t["ours"], 4),
                tff_s_per_round=round(t["tff"], 4),
                ratio=round(t["ours"] / t["tff"], 3),
            )
        if "round_floors" in FLAGS.benchmarks:
            t = alternate(
                {
                    "tff_round": our_round_fn(spec, w0, clients, 1),
                    "in_process_round": our_round_fn(spec, w0, clients, 1, "in_process"),
                    **floor_round_fns(w0, clients),
                },
                FLAGS.rounds,
            )
            seq, vec = t["sequential_floor"], t["vectorised_floor"]
            print(
                f"FedAvg round, {workload}: TFF runtime {t['tff_round']:.3f} s "
                f"({t['tff_round'] / seq:.2f}x the sequential floor), in process "
                f"{t['in_process_round']:.3f} s ({t['in_process_round'] / vec:.2f}x the "
                f"vectorised floor); plain TF floors: sequential {seq:.3f} s, vectorised "
                f"{vec:.3f} s",
                flush=True,
            )
            report["round_floors"] = {
                **{f"{name}_s": round(v, 4) for name, v in t.items()},
                "tff_over_sequential_floor": round(t["tff_round"] / seq, 3),
                "in_process_over_vectorised_floor": round(t["in_process_round"] / vec, 3),
                "in_process_over_sequential_floor": round(t["in_process_round"] / seq, 3),
            }
        if "fedgroup_vs_fedavg" in FLAGS.benchmarks:
            t = alternate(
                {
                    "fedgroup": our_round_fn(spec, w0, clients, FLAGS.groups),
                    "fedavg": our_round_fn(spec, w0, clients, 1),
                },
                FLAGS.rounds,
            )
            print(
                f"FedGroup (m={FLAGS.groups}) vs our FedAvg, {workload}: "
                f"{t['fedgroup']:.3f} vs {t['fedavg']:.3f} s/round",
                flush=True,
            )
            report.update(
                fedgroup_s_per_round=round(t["fedgroup"], 4),
                fedavg_s_per_round=round(t["fedavg"], 4),
                fedgroup_over_fedavg=round(t["fedgroup"] / t["fedavg"], 3),
            )
        if "fedtsdp_vs_fedavg" in FLAGS.benchmarks:
            report.update(fedtsdp_vs_fedavg())
        if "uapdfl_vs_fedavg" in FLAGS.benchmarks:
            report["uapdfl_vs_fedavg"] = uapdfl_vs_fedavg()
        if "evaluation" in FLAGS.benchmarks:
            report["evaluation"] = evaluation_speed()
        if "unequal_clients" in FLAGS.benchmarks:
            report["unequal_clients"] = unequal_clients(spec, w0, rng)
        if "tff_client_costs" in FLAGS.benchmarks:
            report["tff_client_costs"] = tff_client_costs(spec, rng)
        if "client_scaling" in FLAGS.benchmarks:
            report["client_scaling"] = client_scaling(spec, w0, rng)
    if "clustering" in FLAGS.benchmarks:
        report["clustering"] = clustering_scaling()
    print(json.dumps(report))


if __name__ == "__main__":
    cli.run_main("benchmark.py", main)
