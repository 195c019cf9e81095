"""`uapdfl_vs_fedavg`: one whole UA-PDFL round against FedAvg's.

`uapdfl_vs_fedavg`: one whole UA-PDFL round (every peer receives its own and N_com routed
models, fingerprints each, mixes and trains with the alignment term; the mailbox is rebuilt)
against one FedAvg round with the same participants, at each N_com of `--uapdfl_neighbours`,
with how the ratio grows per extra neighbour."""

from __future__ import annotations

import numpy as np
from absl import flags

from tff_clustered.algorithms import make_algorithm
from tff_clustered.cli.benchmarks.common import (
    FLAGS,
    Benchmark,
    Setup,
    alternate,
    digits_rounds_setup,
    whole_round_fns,
)
from tff_clustered.loop.orchestration import Experiment

flags.DEFINE_list("uapdfl_neighbours", ["1", "3", "5", "9"], "N_com values (uapdfl_vs_fedavg).")
flags.DEFINE_integer("dfl_rounds", 4, "Timed rounds of uapdfl_vs_fedavg.", lower_bound=1)


def uapdfl_vs_fedavg(setup: Setup) -> dict:
    """Whole rounds of UA-PDFL at each N_com of --uapdfl_neighbours against a FedAvg round
    with the same participants (every client), interleaved; the ratios and a least-squares
    line of the UA-PDFL round time against N_com. The workload in `setup` is not used: the
    rounds are digits'."""
    del setup
    data, spec, config = digits_rounds_setup()
    counts = sorted({int(n) for n in FLAGS.uapdfl_neighbours})
    experiments = {"fedavg": Experiment(data, spec, make_algorithm("fedavg"), config)}
    for n in counts:
        algorithm = make_algorithm("uapdfl", num_neighbours=n)
        experiments[f"uapdfl_n{n}"] = Experiment(data, spec, algorithm, config)
    fns, _ = whole_round_fns(experiments)
    t = alternate(fns, FLAGS.dfl_rounds, warmup=2)
    fedavg = t["fedavg"]
    seconds = [t[f"uapdfl_n{n}"] for n in counts]
    slope, intercept = np.polyfit(counts, seconds, 1) if len(counts) > 1 else (0.0, seconds[0])
    ratios = {str(n): round(s / fedavg, 3) for n, s in zip(counts, seconds)}
    print(
        f"UA-PDFL vs FedAvg, {data.num_clients} digits clients every round, tsdp_cnn: "
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


BENCHMARK = Benchmark(uapdfl_vs_fedavg)
