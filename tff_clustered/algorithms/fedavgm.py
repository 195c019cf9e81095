"""FedAvgM (Hsu et al., 2019): FedAvg whose server adds its mean update through momentum.

The server keeps v <- beta v + Delta and moves the model by eta_s v (Hsu et al., Section 3;
Reddi et al.'s FedOpt, Algorithm 2, with SGD with momentum as ServerOpt): `--server_momentum`
is beta (0.9 by default, the paper's best on CIFAR-10), `--server_learning_rate` is eta_s (1).
Any other algorithm gets the same step with `--server_optimizer=sgdm` (per cluster for the
clustered ones), and FedAdam with `--server_optimizer=adam` and a server learning rate of its
scale (Reddi et al. tune it, 1e-2 to 1e-1 on their image tasks), or `--algorithm=fedadam`.
"""

from __future__ import annotations

import dataclasses

from tff_clustered.algorithms.fedavg import FedAvg
from tff_clustered.federated.server_optimizers import ServerOptimizer


class FedAvgM(FedAvg):
    """FedAvg with server momentum (`--server_momentum`, `--server_learning_rate`)."""

    name = "fedavgm"
    paper = (
        "Hsu et al., Measuring the Effects of Non-Identical Data Distribution for Federated "
        "Visual Classification, arXiv:1909.06335, 2019"
    )

    def server_optimizer(self, configured: ServerOptimizer) -> ServerOptimizer:
        if configured.name not in ("sgd", "sgdm"):
            raise ValueError(
                f"fedavgm is FedAvg with server momentum; for --server_optimizer="
                f"{configured.name} use --algorithm=fedavg"
            )
        return dataclasses.replace(configured, name="sgdm")
