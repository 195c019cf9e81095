"""FedPer (Arivazhagan et al., 2019): base layers federated, the top layer(s) personal.

How many layers are personal is the user's choice in the paper; by default here it is the
model's classifier head, the fully connected layers after its last convolutional or BatchNorm
layer (the top layer of a model of Dense layers only): FedTSDP's comparison personalises the
CNN's dense layers, which is this rule on its CNN (2 layers)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.algorithms.base import (
    Algorithm,
    RunInfo,
    check,
    head_layers,
    layers_to_tensors,
)
from tff_clustered.options import option
from tff_clustered.search_space import Choice


class FedPer(Algorithm):
    """Base layers federated; the top `--personal_layers` (the classifier head) stay personal."""

    name = "fedper"
    model_kinds = ("personal",)  # the shared base with each client's own head
    paper = "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818"

    @dataclasses.dataclass(frozen=True)
    class Options:
        personal_layers: Optional[int] = option(
            None,
            "Personal top layers (fedper; unset: the classifier head, the fully connected "
            "layers after the last convolutional layer; 1 for an MLP).",
            search=Choice((1, 2)),
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        given = self.options.personal_layers
        check([(given is None or given >= 1, "fedper needs --personal_layers >= 1 (the head)")])

    def personal_layers(self, run: RunInfo) -> int:
        return head_layers(self.options.personal_layers, run)

    def initial_shared(self, run: RunInfo) -> tuple[int, ...]:
        return layers_to_tensors(run.layer_sizes, self.personal_layers(run))
