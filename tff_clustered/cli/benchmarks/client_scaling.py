"""`client_scaling`: seconds per FedAvg round against clients per round.

`client_scaling`: seconds per FedAvg round against clients per round (`--scaling_clients`),
on TFF's runtime and in process, with the fixed and per-client parts of a linear fit and a
log-log text plot (a round must stay linear, no per-round constant dominating)."""

from __future__ import annotations

import numpy as np
from absl import flags

from tff_clustered.cli.benchmarks.common import (
    FLAGS,
    Benchmark,
    Setup,
    alternate,
    client_data,
    our_round_fn,
    seconds_row,
)

flags.DEFINE_list("scaling_clients", ["10", "100", "1000"], "Clients per round (client_scaling).")
flags.DEFINE_integer("scaling_epochs", 1, "Local epochs in client_scaling.", lower_bound=1)
flags.DEFINE_integer("scaling_rounds", 3, "Timed rounds per size (client_scaling).", lower_bound=1)


def client_scaling(setup: Setup) -> dict:
    """Seconds per FedAvg round against clients per round, TFF runtime and in process, with a
    least-squares fit seconds = fixed + per_client * clients (what a round costs whatever its
    size, and per client)."""
    sizes = [int(s) for s in FLAGS.scaling_clients]
    rows: dict[str, dict] = {}
    for size in sizes:
        clients = client_data(setup.rng, size)
        fns = {
            execution: our_round_fn(
                setup.spec, setup.w0, clients, 1, execution, FLAGS.scaling_epochs
            )
            for execution in ("tff", "in_process")
        }
        t = alternate(fns, FLAGS.scaling_rounds)
        rows[str(size)] = seconds_row(t)
        print(
            f"{size} clients x {FLAGS.examples_per_client} examples, {FLAGS.scaling_epochs} "
            f"epoch(s): TFF {t['tff']:.3f} s/round, in process {t['in_process']:.3f} s/round",
            flush=True,
        )
    out: dict = {"rounds": rows}
    for execution in ("tff", "in_process"):
        seconds = np.array([rows[str(n)][f"{execution}_s"] for n in sizes])
        per_client, fixed = np.polyfit(np.array(sizes, float), seconds, 1)
        out[execution] = {
            "fixed_s": round(float(fixed), 4),
            "per_client_ms": round(1000 * float(per_client), 3),
            # the per-round constant's share of the smallest round
            "fixed_share_at_smallest": round(float(fixed) / float(seconds[0]), 3),
        }
    print(ascii_loglog(sizes, {e: [rows[str(n)][f"{e}_s"] for n in sizes] for e in fns}))
    return out


def ascii_loglog(sizes: list[int], series: dict[str, list[float]]) -> str:
    """A log-log text plot of seconds per round against clients (one letter per series)."""
    width, height = 50, 14
    xs = np.log10(sizes)
    ys = {name: np.log10(np.maximum(v, 1e-4)) for name, v in series.items()}
    lo = min(v.min() for v in ys.values())
    hi = max(v.max() for v in ys.values())
    grid = [[" "] * (width + 1) for _ in range(height + 1)]
    for name, values in ys.items():
        for x, y in zip(xs, values):
            col = int(round((x - xs[0]) / max(xs[-1] - xs[0], 1e-9) * width))
            row = height - int(round((y - lo) / max(hi - lo, 1e-9) * height))
            grid[row][col] = "*" if grid[row][col] != " " else name[0].upper()
    lines = [f"s/round (log): {10**hi:.3g} at top, {10**lo:.3g} at bottom"]
    lines += ["|" + "".join(r) for r in grid]
    lines.append("+" + "-" * (width + 1))
    legend = ", ".join(f"{n[0].upper()} = {n}" for n in series) + ", * = both"
    lines.append(f" clients (log): {sizes[0]} .. {sizes[-1]};  {legend}")
    return "\n".join(lines)


BENCHMARK = Benchmark(client_scaling)
