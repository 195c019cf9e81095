"""Measures why FeSEM's first K-means of the models collapses: the first updates' lengths.

Runs FeSEM's cold start on Synthetic(1,1) at the FedGroup authors' settings (MCLR, lr 0.01,
batch 10, K = 5) and prints how the length of each device's first update follows its size,
the clusters K-means gives on the models (the paper's `--fesem_init=models`) with their
update lengths, and the clusters on the update directions (the default), after one epoch and
after the same number of steps for every device. The K-means seed is the run's
(docs/fesem.md, "Why the clusters collapsed").

    .venv/bin/python scripts/fesem_cold_start.py [--seed=233]
"""

from __future__ import annotations

import argparse

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_dataset
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec
from tff_clustered.seeds import ALGORITHM, derived_seed

CLUSTERS = 5
BATCH = 10


def started_experiment(seed: int) -> Experiment:
    """FeSEM on Synthetic(1,1) with MCLR at the authors' settings, its cold start done."""
    data = load_dataset("synthetic", seed=seed)
    model = model_spec("mclr", data.input_shape, data.num_classes)
    config = TrainingConfig(
        rounds=1, clients_per_round=20, batch_size=BATCH, learning_rate=0.01, seed=seed
    )
    algorithm = make_algorithm("fesem", num_clusters=CLUSTERS, fesem_init="models")
    exp = Experiment(data, model, algorithm, config, execution=RunExecution.of("in_process"))
    exp.start()
    return exp


def kmeans_sizes(points: np.ndarray, seed: int) -> tuple[np.ndarray, list[int]]:
    """FeSEM's K-means (20 restarts, the run's seed): labels and sizes, largest first."""
    labels, _ = clustering.best_kmeans(points, CLUSTERS, 20, derived_seed(seed, ALGORITHM))
    return labels, sorted(np.bincount(labels, minlength=CLUSTERS).tolist(), reverse=True)


def report(exp: Experiment, seed: int) -> None:
    """Prints the lengths against the sizes, and K-means on models and on directions."""
    run = exp.run
    ids, width = list(run.client_ids), run.num_trainable_values
    sizes = np.array([run.train_sizes[c] for c in ids])
    steps = int(np.ceil(np.median(sizes) / BATCH))
    for label, fixed_steps in (("one epoch", None), (f"{steps} steps each", steps)):
        updates = exp.queries.local_updates(ids, run.initial_model, 1, 0, steps=fixed_steps)
        updates = updates[:, :width]
        lengths = np.linalg.norm(updates, axis=1)
        models = run.initial_model[None, :width] + updates
        by_models, model_sizes = kmeans_sizes(models, seed)
        _, direction_sizes = kmeans_sizes(updates / lengths[:, None], seed)
        quantiles = np.quantile(lengths, [0.5, 0.9, 1.0]).round(2).tolist()
        print(f"{label}: update length median / 90th percentile / max {quantiles}")
        print(
            f"  corr(log size, log length) {np.corrcoef(np.log(sizes), np.log(lengths))[0, 1]:.2f}"
        )
        print(f"  K-means of the models: {model_sizes}; of the directions: {direction_sizes}")
        largest = np.argmax(np.bincount(by_models, minlength=CLUSTERS))
        reference = np.median(lengths[by_models == largest])
        for k in range(CLUSTERS):
            members = by_models == k
            ratio = np.median(lengths[members]) / reference
            print(f"    models cluster {k}: {members.sum()} devices, median length x{ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=233)
    seed = parser.parse_args().seed
    report(started_experiment(seed), seed)


if __name__ == "__main__":
    main()
