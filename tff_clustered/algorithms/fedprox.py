"""FedProx (Li et al., 2020): FedAvg whose local loss adds (mu/2)||w - w^t||^2 (Eq. 2)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.algorithms.base import Algorithm, check
from tff_clustered.options import option
from tff_clustered.search_space import LogUniform

DEFAULT_MU = 0.01
MU_HELP = "Proximal strength mu of the local loss's (mu/2)||w - w^t||^2."
# The values a tuned comparison tries for mu (FedProx's and FedGrouProx's).
MU_SEARCH = LogUniform(1e-3, 1.0)


class FedProx(Algorithm):
    """FedAvg whose local loss adds the proximal term (mu/2)||w - w^t||^2 (`--mu`)."""

    name = "fedprox"
    paper = "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"

    @dataclasses.dataclass(frozen=True)
    class Options:
        mu: float = option(DEFAULT_MU, MU_HELP, search=MU_SEARCH)

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check([(self.prox_mu >= 0, f"{self.name}: mu must be >= 0, got {self.prox_mu}")])

    @property
    def prox_mu(self) -> float:
        return float(self.options.mu)
