"""`unequal_clients`: one in-process round of clients of unequal sizes, three ways.

`unequal_clients`: one in-process FedAvg round of `--clients` clients of unequal sizes
(`--unequal_sizes`, FEMNIST writers' range) padded and masked into vectorised groups, against
the same clients grouped by exact size only and against a floor: as many clients of one size
with the same total local steps, one vectorised call (goal: padded <= 1.3x the floor)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import numpy as np
from absl import flags

from tff_clustered.cli.benchmarks.common import FLAGS, Benchmark, Setup, alternate, seconds_row
from tff_clustered.federated import grouping, in_process
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import client_input, client_seed, round_hparams
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.models.functional import functional_model

flags.DEFINE_list("unequal_sizes", ["4", "165"], "Least and most examples (unequal_clients).")


# Long: one benchmark as a script: unequal clients built, three ways timed in turn, report
def unequal_clients(setup: Setup) -> dict:
    """One in-process FedAvg round of clients of unequal sizes (`--unequal_sizes`, FEMNIST
    writers' range) three ways: padded and masked into the groups `client_groups` plans (the
    default), grouped by exact size only (clients of a size of their own train alone, two at a
    time), and, as the floor, the same number of clients of one equal size with the same total
    number of local steps (one vectorised call)."""
    spec, w0, rng = setup.spec, setup.w0, setup.rng
    low, high = (int(v) for v in FLAGS.unequal_sizes)
    sizes = rng.integers(low, high + 1, FLAGS.clients)
    hparams = round_hparams(FLAGS.learning_rate, FLAGS.batch_size, FLAGS.local_epochs)
    total_steps = int(grouping.round_steps(sizes, hparams).sum())
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

    def round_fn(process: object, clients: list) -> Callable[[], None]:
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
        **seconds_row(t),
        "sizes": [int(n) for n in sizes],
        "total_steps": int(total_steps),
        "groups": [len(g) for g in groups],
        "padded_over_floor": round(t["padded"] / floor, 3),
        "by_size_over_floor": round(t["by_size"] / floor, 3),
        "by_size_over_padded": round(t["by_size"] / t["padded"], 3),
    }


BENCHMARK = Benchmark(unequal_clients)
