"""Measures what the private cold start costs: its clusters' adjusted Rand index and the accuracy.

Takes `binaries/train.py`'s flags (the dataset, model, algorithm and training), and runs, for
each of `--settings` (a comparison row: `mean`, `epsilon:E`; `epsilon:E/raw` reads the cold
start raw, `--dp_cold_start=raw`; `epsilon:E/z=Z` gives it the noise multiplier Z) and each of
`--seeds`, the run in this process: its cold start
(`Experiment.start`), whose assignment is scored against the data's planted groups (adjusted
Rand index), then its rounds; one JSON line each (the cold start's and the final ARI, the final
accuracy, epsilon and the noise multipliers), and a table of means over the seeds at the end.
With `--table=privacy`'s settings (the privacy table of docs/privacy.md):

    python scripts/private_cold_start_cost.py --algorithm=fedgroup --dataset=digits \
      --num_clusters=4 --rounds=30 --local_epochs=3 --clients_per_round=10 \
      --learning_rate=0.1 --pretrain_scale=5 --pretrain_epochs=3 --client_sampling=poisson \
      --execution=in_process --seeds=0,1,2 --settings=mean,epsilon:8,epsilon:8/raw
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import numpy as np
from absl import app, flags
from sklearn.metrics import adjusted_rand_score

from tff_clustered.algorithms import ALGORITHMS
from tff_clustered.cli import run_flags
from tff_clustered.comparison.setting_rows import parse_setting
from tff_clustered.loop.execution import RunExecution
from tff_clustered.runs import runner
from tff_clustered.runs.run_spec import RunSpec
from tff_clustered.runtime.context import tff_runtime

FLAGS = flags.FLAGS
flags.DEFINE_enum("algorithm", "fedgroup", list(ALGORITHMS), "Federated algorithm.")
flags.DEFINE_list("seeds", ["0"], "The seeds, each one run per setting.")
flags.DEFINE_list(
    "settings", ["mean", "epsilon:8"], "Rows: mean, epsilon:E, epsilon:E/raw, epsilon:E/z=Z."
)
flags.DEFINE_bool("cold_start_only", False, "Measure the cold start only (no rounds).")
flags.DEFINE_enum(
    "reference",
    "planted",
    ["planted", "raw"],
    "What the clusters are scored against: the data's planted groups, or the raw cold start's "
    "clusters of the same seed (the first `/raw` row of --settings, measured first).",
)
# The raw cold start's assignment of each seed (`--reference=raw`).
RAW_COLD_STARTS: dict[int, dict[str, int]] = {}
assert run_flags  # its flags: the dataset, model, training and algorithm options


def spec_of(setting: str, seed: int) -> RunSpec:
    """The run of one row and seed: the flags' spec, the row's aggregator, the seed."""
    row, _, cold_start = setting.partition("/")
    spec = parse_setting(row)(run_flags.run_spec_from_flags(FLAGS.algorithm))
    training = dataclasses.replace(spec.training, seed=seed)
    if cold_start:
        given = cold_start.partition("z=")[2]
        change = (  # a sweep of the cold start's noise: no target, rounds at z = 1
            dict(cold_start_noise_multiplier=float(given), noise_multiplier=1.0, target_epsilon=0.0)
            if given
            else dict(cold_start_release=cold_start)
        )
        training = dataclasses.replace(
            training, aggregator=training.aggregator.with_settings(**change)
        )
    return dataclasses.replace(spec, training=training)


def measured(setting: str, seed: int, execution: RunExecution) -> dict[str, Any]:
    """One run's cold-start ARI, final ARI and accuracy, epsilon and noise multipliers."""
    experiment = runner.spec_experiment(spec_of(setting, seed), execution)
    experiment.start()
    if FLAGS.reference == "raw" and setting.endswith("/raw"):
        RAW_COLD_STARTS.setdefault(seed, dict(experiment.state.assignment))
    reference = (
        experiment.data.true_clusters if FLAGS.reference == "planted" else RAW_COLD_STARTS[seed]
    )

    def ari() -> float:
        if reference is None:  # no planted groups
            return float("nan")
        assignment = experiment.state.assignment
        ids = [c for c, k in assignment.items() if k >= 0 and reference.get(c, -1) >= 0]
        return float(adjusted_rand_score([reference[c] for c in ids], [assignment[c] for c in ids]))

    cold = ari()
    account = experiment.account
    cold_epsilon = experiment.state.privacy.epsilon(account.delta) if account else 0.0
    rows = [{"accuracy": np.nan}] if FLAGS.cold_start_only else list(experiment.rounds())
    options = experiment.config.aggregator.options
    last = rows[-1]
    epsilon = float(last.get("epsilon", cold_epsilon))
    return dict(
        algorithm=FLAGS.algorithm,
        dataset=FLAGS.dataset,
        setting=setting,
        seed=seed,
        cold_start_ari=round(cold, 4),
        final_ari=round(ari(), 4),
        accuracy=round(float(last["accuracy"]), 4),
        epsilon=round(epsilon, 4),
        noise_multiplier=getattr(options, "noise_multiplier", None),
        cold_start_noise_multiplier=getattr(options, "cold_start_noise_multiplier", None),
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    results = []
    execution = RunExecution.of(FLAGS.execution)
    with tff_runtime(execution.runtime):
        for setting in FLAGS.settings:
            for seed in FLAGS.seeds:
                results.append(measured(setting, int(seed), execution.timed_anew()))
                print(json.dumps(results[-1]), flush=True)
    print(f"| {FLAGS.algorithm} on {FLAGS.dataset} | cold-start ARI | final ARI | accuracy |")
    print("|---|---|---|---|")
    for setting in FLAGS.settings:
        rows = [r for r in results if r["setting"] == setting]
        cells = [
            f"{np.mean([r[k] for r in rows]):.3f} ± {np.std([r[k] for r in rows]):.3f}"
            for k in ("cold_start_ari", "final_ari", "accuracy")
        ]
        print(f"| {setting} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    app.run(main)
