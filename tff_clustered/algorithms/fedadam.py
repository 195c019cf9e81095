"""FedAdam: FedAvg whose server steps with Adam on the clients' mean update (ICLR 2021).

FedAdam (Reddi et al., Adaptive Federated Optimization, ICLR 2021): FedAvg whose server
steps with Adam on the mean update.

FedOpt's Algorithm 2 with Adam as ServerOpt: Delta = the clients' mean update,
m <- beta_1 m + (1 - beta_1) Delta, v <- beta_2 v + (1 - beta_2) Delta^2, and
x <- x + eta_s m / (sqrt(v) + tau). Its server learning rate eta_s and adaptivity tau are its
own options: Reddi et al. tune eta_s per task on a grid (1e-2 to 1e-1 on their image tasks;
0.01 here is ours), with tau = 1e-3; beta_1 = 0.9, beta_2 = 0.99. Any algorithm gets the same
step with `--server_optimizer=adam` (per cluster for the clustered ones).
"""

from __future__ import annotations

import dataclasses

from tff_clustered.algorithms.fedavg import FedAvg
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.options import option


class FedAdam(FedAvg):
    """FedAvg with Adam on the server (`--fedadam_learning_rate`, `--fedadam_tau`)."""

    name = "fedadam"
    paper = "Reddi et al., Adaptive Federated Optimization, ICLR 2021"

    @dataclasses.dataclass(frozen=True)
    class Options:
        fedadam_learning_rate: float = option(0.01, "FedAdam server learning rate eta_s.")
        fedadam_tau: float = option(1e-3, "FedAdam adaptivity tau (Adam's epsilon).")

    def server_optimizer(self, configured: ServerOptimizer) -> ServerOptimizer:
        if configured != ServerOptimizer():
            raise ValueError(
                "fedadam sets its own server step (--fedadam_learning_rate, --fedadam_tau); "
                "leave --server_optimizer and its settings unset, or use --algorithm=fedavg "
                "with --server_optimizer"
            )
        return ServerOptimizer(
            "adam",
            learning_rate=float(self.options.fedadam_learning_rate),
            epsilon=float(self.options.fedadam_tau),
        )
