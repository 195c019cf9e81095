"""FedProx (Li et al., 2020): FedAvg whose local loss adds (mu/2)||w - w^t||^2 (FedGroup Eq. 3)."""

from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions

DEFAULT_MU = 0.01


class FedProx(Algorithm):
    name = "fedprox"
    paper = "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"

    def default_prox_mu(self, options: AlgorithmOptions) -> float:
        return DEFAULT_MU if options.prox_mu is None else options.prox_mu
