"""Local: every client trains its own model alone; nothing is communicated or aggregated."""

from tff_clustered.algorithms.base import Algorithm, RunInfo


class Local(Algorithm):
    """Every client trains its own model alone; nothing is communicated or aggregated."""

    name = "local"
    model_kinds = ("personal",)
    paper = "baseline (no federation), e.g. NoFed in Long et al. 2023 / Local in FedGroup"
    keep_client_models = True

    def initial_shared(self, run: RunInfo) -> tuple[int, ...]:
        return ()
