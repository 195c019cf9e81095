"""FedPer (Arivazhagan et al., 2019): base layers federated, the top layer(s) personal."""

from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions
from tff_clustered.models.split import PersonalSplit


class FedPer(Algorithm):
    name = "fedper"
    paper = "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818"

    def default_split(self, options: AlgorithmOptions) -> PersonalSplit:
        layers = 1 if options.personal_layers is None else options.personal_layers
        if layers < 1:
            raise ValueError("fedper needs --personal_layers >= 1 (the personal head)")
        return PersonalSplit(layers, unit="layers", side="top")
