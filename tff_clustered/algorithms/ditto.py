"""Ditto: a FedAvg global model, and a personal model per client held close to it (ICML 2021).

Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021): a global model w trained by FedAvg, plus a personal model v_k per client trained
on F_k(v) + lambda/2 ||v - w^t||^2 (Eq. 2) against the global model it just received
(Alg. 1). The personal models are what is evaluated. lambda = 0 is purely local training;
lambda -> infinity pulls every v_k to the global model."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tff_clustered.algorithms.base import Algorithm, RunInfo, check
from tff_clustered.federated import client_work
from tff_clustered.options import option
from tff_clustered.search_space import LogUniform


class Ditto(Algorithm):
    """FedAvg's global model plus a personal model per client, pulled toward it (lambda)."""

    name = "ditto"
    model_kinds = ("personal", "global")
    paper = (
        "Li et al., Ditto: Fair and Robust Federated Learning Through Personalization, ICML 2021"
    )

    @dataclasses.dataclass(frozen=True)
    class Options:
        ditto_lambda: float = option(
            0.1,
            "Ditto: strength lambda of the pull toward w (Eq. 2).",
            search=LogUniform(0.01, 1.0),
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check([(self.options.ditto_lambda >= 0, "ditto_lambda must be >= 0")])

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        return client_work.DittoSGD(float(self.options.ditto_lambda), float(momentum))
