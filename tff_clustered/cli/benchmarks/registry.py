"""Every benchmark by name, and the order they run in.

Every benchmark by name: adding one is its module (its flags and its `BENCHMARK`) and its
name here, in `MODULES` and in `RUN_ORDER`."""

from __future__ import annotations

from tff_clustered.cli.benchmarks import (
    api_population,
    client_data,
    client_scaling,
    clustering,
    evaluation,
    fedavg_vs_tff,
    fedgroup_vs_fedavg,
    fedtsdp_vs_fedavg,
    memory,
    population,
    round_floors,
    scoring_ways,
    tff_client_costs,
    uapdfl_vs_fedavg,
    unequal_clients,
    vs_pfllib,
)
from tff_clustered.cli.benchmarks.common import Benchmark

# Name -> module, in the order `--benchmarks` lists them.
MODULES = {
    "round_floors": round_floors,
    "fedavg_vs_tff": fedavg_vs_tff,
    "fedgroup_vs_fedavg": fedgroup_vs_fedavg,
    "client_scaling": client_scaling,
    "clustering": clustering,
    "fedtsdp_vs_fedavg": fedtsdp_vs_fedavg,
    "uapdfl_vs_fedavg": uapdfl_vs_fedavg,
    "evaluation": evaluation,
    "unequal_clients": unequal_clients,
    "scoring_ways": scoring_ways,
    "memory": memory,
    "tff_client_costs": tff_client_costs,
    "population": population,
    "api_population": api_population,
    "client_data": client_data,
    "vs_pfllib": vs_pfllib,
}
BENCHMARKS: dict[str, Benchmark] = {name: module.BENCHMARK for name, module in MODULES.items()}

# The order the selected benchmarks run and report in. The benchmarks that draw more clients
# from the shared generator (unequal_clients, tff_client_costs, client_scaling, scoring_ways)
# draw in this order, so it fixes their data.
RUN_ORDER = (
    "memory",
    "fedavg_vs_tff",
    "round_floors",
    "fedgroup_vs_fedavg",
    "fedtsdp_vs_fedavg",
    "uapdfl_vs_fedavg",
    "evaluation",
    "unequal_clients",
    "tff_client_costs",
    "client_scaling",
    "clustering",
    "population",
    "api_population",
    "client_data",
    "scoring_ways",
    "vs_pfllib",
)
if sorted(RUN_ORDER) != sorted(BENCHMARKS):
    raise ValueError(f"RUN_ORDER {RUN_ORDER} must name every benchmark once: {list(BENCHMARKS)}")


def descriptions() -> str:
    """Each benchmark's module docstring as one bullet, in the order `--benchmarks` lists them
    (for `--help`)."""
    return "\n".join(
        "* " + module.__doc__.strip().replace("\n", "\n  ") for module in MODULES.values()
    )
