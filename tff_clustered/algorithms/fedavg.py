"""FedAvg (McMahan et al., 2017): the one-cluster case of the core, nothing personal."""

from tff_clustered.algorithms.base import Algorithm


class FedAvg(Algorithm):
    """One global model: the weighted mean of the sampled clients' local SGD updates."""

    name = "fedavg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks, AISTATS 2017"
