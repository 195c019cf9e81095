"""Local: every client trains its own model alone; nothing is communicated or aggregated."""

from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions
from tff_clustered.models.split import PersonalSplit


class Local(Algorithm):
    name = "local"
    paper = "baseline (no federation), e.g. NoFed in Long et al. 2023 / Local in FedGroup"

    def default_split(self, options: AlgorithmOptions) -> PersonalSplit:
        if options.personal_layers not in (None, -1):
            raise ValueError("local keeps the whole model personal; drop --personal_layers")
        return PersonalSplit.all()
