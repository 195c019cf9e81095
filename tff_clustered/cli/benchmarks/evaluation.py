"""`evaluation`: scoring many clients of power-law sizes, pooled against one by one.

`evaluation`: scoring every one of `--eval_clients` clients of power-law sizes
(MNIST-FedProx-like: log-normal, 20% held out for test; MCLR) with the pooled path the runs use
(`Experiment.score_pooled`: one call per model) against the per-client path (one scoring per
client) and against one FedAvg training round of 20 of them at E=20, on both executions (goals:
pooled <= the training round, per-client >= 10x pooled)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from absl import flags

from tff_clustered.algorithms import make_algorithm
from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, seconds_row
from tff_clustered.data import FederatedData, from_arrays
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.evaluation import server_models
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec

flags.DEFINE_integer("eval_clients", 1000, "Clients scored (evaluation).", lower_bound=1)
flags.DEFINE_integer("eval_rounds", 3, "Timed repetitions of evaluation.", lower_bound=1)


def power_law_clients(rng: np.random.Generator, count: int) -> FederatedData:
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


def scoring_fns(exp: Experiment) -> dict[str, Callable[[], object]]:
    """Pooled scoring of every client, per-client scoring, and one training round of `exp`."""
    exp.start()
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "global", np.zeros(len(ids), np.int32))
    whole = exp.calls.whole_model_round(1)

    def train() -> None:
        exp.train_round(exp.state.round_num + 1)
        exp.state.round_num += 1

    return {
        "pooled": lambda: exp.calls.score_pooled(models, keys, ids),
        "per_client": lambda: exp.calls.score(whole, models, keys, ids),
        "training_round": train,
    }


def evaluation_speed(setup: Setup) -> dict:
    """Seconds to score every client (pooled and per client) against one training round of 20
    clients at E=20 (FedGroup's MNIST setting), on both executions. The workload in `setup` is
    not used: the clients are drawn from their own generator, seeded by `--seed`."""
    del setup
    data = power_law_clients(np.random.default_rng(FLAGS.seed), FLAGS.eval_clients)
    spec = model_spec("mclr", (FLAGS.input_dim,), FLAGS.num_classes)
    config = TrainingConfig(
        rounds=10_000, clients_per_round=20, local_epochs=20, batch_size=10, seed=FLAGS.seed
    )
    examples = sum(data.test_sizes.values())
    out: dict = {"clients": data.num_clients, "test_examples": examples}
    for execution in ("tff", "in_process"):
        exp = Experiment(
            data, spec, make_algorithm("fedavg"), config, execution=RunExecution.of(execution)
        )
        fns = scoring_fns(exp)
        start = time.perf_counter()
        fns["pooled"]()  # the first call pools the split and keeps it where scoring runs
        first = time.perf_counter() - start
        t = alternate(fns, FLAGS.eval_rounds)
        ids = data.client_ids
        out[execution] = {
            **seconds_row(t),
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


BENCHMARK = Benchmark(evaluation_speed)
