"""FedRep: a shared body trained after each client's personal head (ICML 2021).

FedRep (Collins et al., Exploiting Shared Representations for Personalized Federated
Learning, ICML 2021): a shared body (the representation phi), a personal head h per client.

Algorithm 1, per sampled client i:
  lines 6-8:  tau_h epochs of SGD on its own head h_i, the received body frozen;
  lines 9-11: then the body's epochs with the new head frozen;
  line 13:    the body goes to the server, which averages it (lines 14-15); the head stays.
The paper trains the head for 10 epochs and the body for 1 in its experiments: here the head
takes `--fedrep_head_epochs` (10) and the body the run's own budget, `--local_epochs` or
`--local_steps` (set `--local_epochs=1` for the paper's). Which layers are the head is FedPer's
`--personal_layers` (default: the classifier head).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.algorithms.base import RunInfo, check
from tff_clustered.algorithms.fedper import FedPer
from tff_clustered.federated import client_work
from tff_clustered.options import option


class FedRep(FedPer):
    """FedPer's split trained in two phases: the personal head alone, then the shared body."""

    name = "fedrep"
    paper = (
        "Collins et al., Exploiting Shared Representations for Personalized Federated "
        "Learning, ICML 2021"
    )

    @dataclasses.dataclass(frozen=True)
    class Options(FedPer.Options):
        fedrep_head_epochs: int = option(
            10, "Epochs a FedRep client trains its head with the body frozen, before the body."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        epochs = self.options.fedrep_head_epochs
        check([(epochs >= 0, f"fedrep needs --fedrep_head_epochs >= 0, got {epochs}")])

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        body = self.initial_shared(run)  # FedPer's: all but the personal layers
        head = tuple(i for i in range(run.num_tensors) if i not in body)
        return client_work.PhasedSGD(
            (client_work.Phase(head, self.options.fedrep_head_epochs), client_work.Phase(body)),
            float(momentum),
        )
