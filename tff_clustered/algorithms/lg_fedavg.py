"""LG-FedAvg: each client's own lower layers, the top layers federated (FedPer reversed).

LG-FedAvg (Liang et al., Think Locally, Act Globally: Federated Learning with Local and
Global Representations, NeurIPS 2019 workshop, arXiv:2001.01523): FedPer's split reversed.

Each client keeps its own lower layers, a local representation of its inputs; only the top
`--lg_global_layers` layers are federated (Algorithm 1: clients update both with local SGD,
the server averages the global layers only). The paper first trains the whole model with
FedAvg and then localises the lower layers; here the lower layers are local from round 1 (each
client's start from the common initial model).
"""

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


class LGFedAvg(Algorithm):
    """Lower layers local to each client, the top `--lg_global_layers` federated."""

    name = "lg_fedavg"
    model_kinds = ("personal",)  # each client's own lower layers under the global top
    paper = (
        "Liang et al., Think Locally, Act Globally: Federated Learning with Local and Global "
        "Representations, arXiv:2001.01523"
    )

    @dataclasses.dataclass(frozen=True)
    class Options:
        lg_global_layers: Optional[int] = option(
            None,
            "Global top layers of lg_fedavg (unset: the classifier head, the fully connected "
            "layers after the last convolutional layer; 1 for an MLP).",
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        given = self.options.lg_global_layers
        check([(given is None or given >= 1, "lg_fedavg needs --lg_global_layers >= 1")])

    def initial_shared(self, run: RunInfo) -> tuple[int, ...]:
        top = head_layers(self.options.lg_global_layers, run)
        local = layers_to_tensors(run.layer_sizes, top)  # every tensor below the top layers
        return tuple(i for i in range(run.num_tensors) if i not in local)
