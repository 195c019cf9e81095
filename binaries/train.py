"""Trains one federated algorithm and writes metrics.csv, summary.json, curves.png.

  python binaries/train.py --algorithm=fedper --dataset=digits --rounds=50

With no flags it runs FedPer on the embedded digits data (40 clients in 4 label-permutation
groups). The dataset, model, training and algorithm flags are in `tff_clustered/run_flags.py`.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# TensorFlow is imported (through these) before absl parses flags: imported inside `main`,
# Keras' Flatten layer fails to build (seen with TF 2.14 / absl 1.4).
from tff_clustered import cli, logs  # noqa: E402 - light: before TensorFlow's import

cli.stop_at_once_on_signals("train.py")
logs.quiet_tensorflow(sys.argv)
from tff_clustered import checkpoint, run_flags, runner  # noqa: E402
from tff_clustered.algorithms import ALGORITHMS  # noqa: E402
from tff_clustered.runtime import tff_runtime  # noqa: E402

logs.quiet_python_logs(sys.argv)

FLAGS = flags.FLAGS
flags.DEFINE_enum("algorithm", "fedper", list(ALGORITHMS), "Federated algorithm.")
flags.DEFINE_string("output_dir", None, "Where outputs go (default runs/DATASET-ALGORITHM-sSEED).")
flags.DEFINE_bool("resume", False, "Continue the run in --output_dir from its checkpoint.")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    with run_flags.reported_errors("the last checkpoint is kept, continue with --resume"):
        run_flags.refuse_other_algorithms_flags([FLAGS.algorithm])
        spec = run_flags.run_spec_from_flags(FLAGS.algorithm)
        output_dir = FLAGS.output_dir or os.path.join(
            "runs", f"{spec.dataset}-{spec.algorithm}-s{spec.training.seed}"
        )
        checkpoint.make_output_folder(output_dir)  # before the worker writes its log there
        runtime_config = run_flags.runtime_config_from_flags(output_dir)
        with tff_runtime(runtime_config):
            summary = runner.run(
                spec,
                output_dir,
                checkpoint_every=FLAGS.checkpoint_every,
                resume=FLAGS.resume,
                execution=runtime_config.execution,
                device=runtime_config.device,
            )
    results = summary["results"]
    print(
        f"{spec.algorithm} on {spec.dataset}/{spec.model}: final accuracy "
        f"{results['final_accuracy']:.4f}, max {results['max_accuracy']:.4f} "
        f"(round {results['max_accuracy_round']}), mean per-client accuracy "
        f"{results['final_client_accuracy_mean']:.4f}; {results['total_train_seconds']:.1f}s "
        f"of training (assigned clients, the paper's figure)"
    )
    for key, kind in results.items():
        if key.startswith("all_clients_"):
            print(
                f"  {key[len('all_clients_') :]} model on all clients: final "
                f"{kind['final_accuracy']:.4f}, max {kind['max_accuracy']:.4f} (round "
                f"{kind['max_accuracy_round']}), mean per-client "
                f"{kind['final_client_accuracy_mean']:.4f}"
            )
    outputs = (
        f"metrics.csv, clients.csv, summary.json, curves.png, TensorBoard events, "
        f"{checkpoint.CHECKPOINT_NAME}"
    )
    print(f"outputs in {output_dir}: {outputs}")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
