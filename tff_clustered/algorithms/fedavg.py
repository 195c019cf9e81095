"""FedAvg (McMahan et al., 2017): the one-cluster case of the core, nothing personal."""

from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions


class FedAvg(Algorithm):
    name = "fedavg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks, AISTATS 2017"

    def default_prox_mu(self, options: AlgorithmOptions) -> float:
        if options.prox_mu:
            raise ValueError("fedavg has no proximal term; use --algorithm=fedprox for --mu > 0")
        return 0.0
