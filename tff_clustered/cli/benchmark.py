"""Speed of the federated core, as ratios against a reference measured in the same run.

Speed, always as ratios against a reference measured in the same run: the benchmarks named
by `--benchmarks` (all but `memory`, `tff_client_costs`, `population`, `client_data` and
`scoring_ways` unless named), one module each in `tff_clustered/cli/benchmarks/`, their
reports gathered into one.

After a warm-up round each (tracing), timed rounds alternate between the two implementations so
that machine noise hits both alike; medians are reported. The last output line is one JSON object.

  python binaries/benchmark.py
  python binaries/benchmark.py --benchmarks=clustering --cluster_sizes=100,500,2000

The benchmarks:
"""

from __future__ import annotations

import dataclasses
import json

from absl import flags

from tff_clustered.cli import exits, logs

# The benchmark modules import TensorFlow and define their flags here, before absl parses
# flags: with TensorFlow imported inside `main`, Keras' Flatten layer fails to build (TF 2.14 /
# absl 1.4).
from tff_clustered.cli.benchmarks import common, registry
from tff_clustered.runtime.context import tff_runtime

# `--help` shows this docstring and this module's key flags: every benchmark's, adopted.
__doc__ += registry.descriptions()
for module in (common, *registry.MODULES.values()):
    flags.adopt_module_key_flags(module)

FLAGS = flags.FLAGS
flags.DEFINE_bool(logs.FLAG, False, logs.FLAG_HELP)
BENCHMARK_NAMES = tuple(registry.BENCHMARKS)
flags.DEFINE_list(
    "benchmarks",
    [name for name, benchmark in registry.BENCHMARKS.items() if benchmark.by_default],
    f"Benchmarks to run, from {', '.join(BENCHMARK_NAMES)}.",
)


@flags.validator("benchmarks")
def known_benchmarks(names: list[str]) -> bool:
    """A selection that measures something: a misspelt or empty one would run nothing and exit
    0."""
    unknown = [n for n in names if n not in BENCHMARK_NAMES]
    if unknown or not names:
        raise flags.ValidationError(
            f"{'unknown ' + ', '.join(unknown) if unknown else 'nothing selected'}; "
            f"choose from {', '.join(BENCHMARK_NAMES)}"
        )
    return True


def run_into(report: dict, name: str, setup: common.Setup) -> None:
    """Runs benchmark `name` on `setup` and adds its result to `report`: under its name, or
    its keys at the report's top level."""
    benchmark = registry.BENCHMARKS[name]
    result = benchmark.run(setup)
    if benchmark.top_level:
        report.update(result)
    else:
        report[name] = result


def main(argv: list[str]) -> None:
    """The selected benchmarks in `registry.RUN_ORDER` on one workload: those that need TFF's
    runtime while its worker is up (started only for them), then the others; one JSON report
    last."""
    del argv
    setup = common.prepare()
    report: dict = {
        "benchmark": "tff_clustered",
        "rounds": FLAGS.rounds,
        "clients": FLAGS.clients,
        "model": FLAGS.model,
    }
    selected = [name for name in registry.RUN_ORDER if name in FLAGS.benchmarks]
    if any(registry.BENCHMARKS[name].in_tff_runtime for name in selected):
        with tff_runtime() as runtime:
            with_worker = dataclasses.replace(setup, worker_pid=runtime.worker_pid)
            for name in selected:
                if registry.BENCHMARKS[name].in_tff_runtime:
                    run_into(report, name, with_worker)
    for name in selected:
        if not registry.BENCHMARKS[name].in_tff_runtime:
            run_into(report, name, setup)
    print(json.dumps(report))


def work() -> None:
    """The binary's work (`launch.launch`: TensorFlow quieted before this module loaded)."""
    exits.run_main("benchmark.py", main)
