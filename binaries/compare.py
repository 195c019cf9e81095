"""Runs several algorithms on one dataset/model with the same seed, clients and sampling, and
writes FedGroup's Table III row for it: comparison.md, comparison.csv, comparison.png.

  python binaries/compare.py                      # the Table III algorithms on digits
  python binaries/compare.py --algorithms=fedavg,ifca,fedgroup --rounds=100

Accuracy is the paper's weighted metric (A.11): each client's test set evaluated with the model
of the group it is assigned to, pooled over clients. Each algorithm's run is kept under
OUTPUT_DIR/ALGORITHM/ with its checkpoint; running the same command again continues or reuses
them.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# TensorFlow is imported (through these) before absl parses flags (see train.py).
from tff_clustered import reporting, run_flags, runner  # noqa: E402
from tff_clustered.algorithms import ALGORITHMS, AlgorithmOptions, make_algorithm  # noqa: E402
from tff_clustered.runtime import tff_runtime  # noqa: E402

TABLE_III = (
    "fedavg,fedprox,ifca,fesem,fedgroup_rcc,fedgroup_rac,"
    "fedgroup,fedgrouprox,fedgroup_madc,fedgrouprox_madc"
)
FLAGS = flags.FLAGS
flags.DEFINE_list("algorithms", TABLE_III, f"Algorithms to compare ({', '.join(ALGORITHMS)}).")
flags.DEFINE_float("target_accuracy", 0.9, "Accuracy for the rounds-to-target column.")
flags.DEFINE_string(
    "output_dir", None, "Where outputs go (default runs/compare-DATASET-MODEL-sSEED)."
)
# Defaults for the embedded digits data (4 planted groups, 40 clients), a few minutes for the
# whole table: alpha = 5 so that 20 clients cluster and 20 are newcomers (alpha*m >= 40 would
# cluster everyone and make RAC identical to FedGroup); mu = 1 as in FedGroup's Table III setup.
defaults = dict(
    rounds=30, local_epochs=3, num_clusters=4, pretrain_epochs=3, pretrain_scale=5, mu=1.0
)
for name, value in defaults.items():
    FLAGS.set_default(name, value)


def options_for(algorithm: str, options: AlgorithmOptions) -> AlgorithmOptions:
    """Drops the shared options an algorithm does not take (one model: no --num_clusters; no
    proximal term: no --mu), so one command line serves the whole table."""
    default = make_algorithm(algorithm)
    return dataclasses.replace(
        options,
        num_clusters=options.num_clusters if default.num_clusters > 1 else None,
        prox_mu=options.prox_mu if default.prox_mu > 0 else None,
    )


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    with run_flags.reported_errors("finished algorithms are kept, run again to continue"):
        unknown = [a for a in FLAGS.algorithms if a not in ALGORITHMS]
        if unknown or not FLAGS.algorithms:
            raise ValueError(
                f"unknown algorithm(s) {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(ALGORITHMS)}"
            )
        base = run_flags.run_spec_from_flags(FLAGS.algorithms[0])
        output_dir = FLAGS.output_dir or os.path.join(
            "runs", f"compare-{base.dataset}-{base.model}-s{base.training.seed}"
        )
        rows, histories = [], {}
        with tff_runtime(run_flags.runtime_config_from_flags(output_dir)):
            for algorithm in FLAGS.algorithms:
                spec = dataclasses.replace(
                    base,
                    algorithm=algorithm,
                    algorithm_options=options_for(algorithm, base.algorithm_options),
                )
                summary = runner.run(
                    spec,
                    os.path.join(output_dir, algorithm),
                    checkpoint_every=FLAGS.checkpoint_every,
                    resume=True,
                    log=lambda message: None,
                    track_discrepancy=True,
                )
                histories[algorithm] = summary["history"]
                rows.append(
                    reporting.comparison_row(algorithm, summary["history"], FLAGS.target_accuracy)
                )
                print(
                    f"{algorithm:>18}: max {rows[-1]['max_accuracy']:.4f}  "
                    f"final {rows[-1]['final_accuracy']:.4f}",
                    flush=True,
                )
    title = (
        f"{base.dataset} / {base.model}, seed {base.training.seed}, {base.training.rounds} rounds"
    )
    reporting.write_comparison(output_dir, rows, title, FLAGS.target_accuracy)
    reporting.write_comparison_png(os.path.join(output_dir, "comparison.png"), histories, title)
    print(open(os.path.join(output_dir, "comparison.md")).read())
    print(f"outputs in {output_dir}: comparison.md, comparison.csv, comparison.png")
    return 0


if __name__ == "__main__":
    app.run(main)
