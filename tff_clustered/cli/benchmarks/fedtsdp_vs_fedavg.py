"""`fedtsdp_vs_fedavg`: one whole FedTSDP round against FedAvg's, and where its time goes.

`fedtsdp_vs_fedavg`: one whole FedTSDP round (stateful clients uploading whole models,
public-batch inference of every model, Hopkins statistic, and, when it fires, the two DBSCAN
stages and the regrouping) against one FedAvg round on the same clients, both through the same
orchestration, and where FedTSDP's time goes: the mean per timed round as FedAvg's round + the
K-cluster round + inference + Hopkins + DBSCAN/regrouping + fetching + builds (goal: <= 1.5x
FedAvg + what the algorithm adds). `--tsdp_trigger=always` forces the clustering every round
(psi = 1 so the split stays put), the worst case; `paper` uses h_th = 0.65."""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
from absl import flags

from tff_clustered import clustering
from tff_clustered.algorithms import fedtsdp as fedtsdp_algorithm
from tff_clustered.algorithms import make_algorithm
from tff_clustered.cli.benchmarks.common import (
    FLAGS,
    Benchmark,
    Setup,
    digits_rounds_setup,
    whole_round_fns,
)
from tff_clustered.loop.orchestration import Experiment

flags.DEFINE_enum(
    "tsdp_trigger",
    "always",
    ["always", "paper", "calibrated"],
    "FedTSDP clustering per round: always, or FedTSDP's --tsdp_trigger (paper: H > 0.65).",
)
flags.DEFINE_integer("tsdp_rounds", 6, "Timed rounds of fedtsdp_vs_fedavg.", lower_bound=1)

# The steps of a FedTSDP round timed apart, each by the functions its code calls, patched where
# the algorithm looks them up (`tff_clustered.clustering`, its module).
TSDP_STEPS = {
    "hopkins": (
        "hopkins_statistic",
        "hopkins_estimate",
        "rotated_outputs",
        "hopkins_against_references",
    ),
    "dbscan_regroup": ("js_divergence_matrix", "weight_distance_matrix", "two_stage_clusters"),
}


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


class Stopwatch:
    """Seconds spent in the callables `watch` wraps, summed per step until `lap()`."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def watch(self, step: str, owner: object, name: str) -> None:
        """`owner.name` timed as part of `step` until the stack closes."""
        wrapped: Callable = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return wrapped(*args, **kwargs)
            finally:
                self.seconds[step] += time.perf_counter() - start

        self.stack.enter_context(mock.patch.object(owner, name, timed))

    def lap(self) -> dict[str, float]:
        """The seconds per step since the last lap, the count restarted."""
        laps, self.seconds = dict(self.seconds), collections.defaultdict(float)
        return laps


# Long: one benchmark as a script: runs warmed up, timed in turn, FedTSDP's stages, report
def fedtsdp_vs_fedavg(setup: Setup) -> dict:
    """Whole FedTSDP and FedAvg rounds (`tsdp_round_fns`), interleaved after three warm-up
    rounds, and where FedTSDP's time goes: its federated round against FedAvg's (K clusters
    sent and summed, whole models returned to the store), the inference of the m uploaded
    models on the public batch, the Hopkins test, the DBSCAN stages with the regrouping (in
    the rounds that trigger them), the stored models fetched, and the rounds that built (traced)
    a new round signature (the split shrinks at every trigger). The workload in `setup` is not
    used: the rounds are digits'."""
    del setup
    fns, (experiments, info) = tsdp_round_fns()
    tsdp = experiments["fedtsdp"]
    cache = tsdp.calls.rounds_cache
    for _ in range(3):  # the cluster counts FedTSDP forms early are built (traced) once
        for fn in fns.values():
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    train: dict[str, list[float]] = {name: [] for name in fns}
    steps: list[dict[str, float]] = []
    built: list[bool] = []
    with contextlib.ExitStack() as stack:
        watch = Stopwatch(stack)
        watch.watch("inference", tsdp.calls, "predict_probabilities")
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


BENCHMARK = Benchmark(fedtsdp_vs_fedavg, top_level=True)
