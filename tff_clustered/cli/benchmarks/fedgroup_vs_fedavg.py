"""`fedgroup_vs_fedavg`: one round of FedGroup against FedAvg on the same clients.

`fedgroup_vs_fedavg`: one round of FedGroup with m = `--groups` groups against our FedAvg on
the same clients (goal <= 1.3)."""

from __future__ import annotations

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, our_round_fn


def fedgroup_vs_fedavg(setup: Setup) -> dict:
    """A FedGroup round and a FedAvg round, interleaved; seconds per round and their ratio."""
    t = alternate(
        {
            "fedgroup": our_round_fn(setup.spec, setup.w0, setup.clients, FLAGS.groups),
            "fedavg": our_round_fn(setup.spec, setup.w0, setup.clients, 1),
        },
        FLAGS.rounds,
    )
    print(
        f"FedGroup (m={FLAGS.groups}) vs our FedAvg, {setup.workload}: "
        f"{t['fedgroup']:.3f} vs {t['fedavg']:.3f} s/round",
        flush=True,
    )
    return dict(
        fedgroup_s_per_round=round(t["fedgroup"], 4),
        fedavg_s_per_round=round(t["fedavg"], 4),
        fedgroup_over_fedavg=round(t["fedgroup"] / t["fedavg"], 3),
    )


BENCHMARK = Benchmark(fedgroup_vs_fedavg, top_level=True)
