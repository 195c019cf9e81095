"""FedPer (Arivazhagan et al., 2019): base layers federated, the top layer(s) personal."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.algorithms.base import Algorithm, RunInfo, check, layers_to_tensors
from tff_clustered.options import option


class FedPer(Algorithm):
    name = "fedper"
    model_kinds = ("personal",)  # the shared base with each client's own head
    paper = "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818"

    @dataclasses.dataclass(frozen=True)
    class Options:
        personal_layers: Optional[int] = option(
            None, "Personal top layers (fedper; unset: 1, the head)."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check([(self.personal_layers >= 1, "fedper needs --personal_layers >= 1 (the head)")])

    @property
    def personal_layers(self) -> int:
        return 1 if self.options.personal_layers is None else self.options.personal_layers

    def initial_shared(self, run: RunInfo) -> tuple[int, ...]:
        return layers_to_tensors(run.layer_sizes, self.personal_layers)
