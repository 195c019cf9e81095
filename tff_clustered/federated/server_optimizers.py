"""The finalizer's server optimizer, one state per cluster (FedOpt: Reddi et al., Adaptive
Federated Optimization, ICLR 2021, Algorithm 2).

After the aggregator has averaged a cluster's client updates, plain FedAvg adds the mean update
Delta_k to the cluster model x_k. A server optimizer instead treats -Delta_k as a gradient:
x_k <- ServerOpt(x_k, -Delta_k), with an optimizer of `tff.learning.optimizers` (SGD with
momentum: FedAvgM, Hsu et al. 2019; Adam: FedAdam). Each cluster keeps its own optimizer state
(momentum, Adam's moments and step), so FedGroup or IFCA with server momentum keeps one
momentum per group. Rules:

* Only the trainable values move by the optimizer; the other variables (BatchNorm statistics)
  keep the aggregator's mean.
* A cluster no sampled client trained in this round is left as it was, model and state.
* The state is kept per cluster index while the number of clusters stays; a change of that
  number (a split, a merge, a cold start) starts every cluster's state from zero.

`sgd` at learning rate 1 is the identity (FedAvg's finalizer) and keeps no state.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

SERVER_OPTIMIZERS = ("sgd", "sgdm", "adam")
OptimizerState = dict[str, np.ndarray]  # each entry stacked along a leading cluster axis


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """Which optimizer the server applies to each cluster's mean update, and its
    hyperparameters: `momentum` is sgdm's; `beta_1`, `beta_2` and `epsilon` are adam's
    (epsilon is FedAdam's adaptivity tau, 1e-3 in Reddi et al.)."""

    name: str = "sgd"
    learning_rate: float = 1.0
    momentum: float = 0.9
    beta_1: float = 0.9
    beta_2: float = 0.99
    epsilon: float = 1e-3

    def __post_init__(self) -> None:
        checks = [
            (
                self.name in SERVER_OPTIMIZERS,
                f"server_optimizer must be one of {SERVER_OPTIMIZERS}",
            ),
            (self.learning_rate > 0, "server_learning_rate must be > 0"),
            (0 <= self.momentum < 1, "server_momentum must be in [0, 1)"),
            (0 <= self.beta_1 < 1 and 0 <= self.beta_2 < 1, "adam's betas must be in [0, 1)"),
            (self.epsilon > 0, "server_epsilon must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message}, got {self}")

    @property
    def is_identity(self) -> bool:
        """FedAvg's finalizer: add the mean update as it is."""
        return self.name == "sgd" and self.learning_rate == 1.0

    def build(self) -> tff.learning.optimizers.Optimizer:
        return built_optimizer(self)

    def initial_state(self, num_clusters: int, size: int) -> OptimizerState:
        """Zero state for `num_clusters` clusters of `size` trainable values each: every entry
        of the optimizer's state that is not a hyperparameter (sgdm's accumulator, adam's
        step and moments), stacked along a leading cluster axis."""
        optimizer = self.build()
        initial = optimizer.initialize((tf.TensorSpec([size], tf.float32),))
        hparams = optimizer.get_hparams(initial)
        return {
            key: np.repeat(np.asarray(per_tensor(value))[None], num_clusters, 0)
            for key, value in initial.items()
            if key not in hparams
        }

    def step(
        self,
        state: Optional[OptimizerState],
        before: np.ndarray,
        after: np.ndarray,
        updated: np.ndarray,
        trainable_values: int,
    ) -> tuple[np.ndarray, Optional[OptimizerState]]:
        """The cluster models after the server step, and the new state. `before`: the cluster
        models the round started from, (K, D); `after`: the aggregator's result (`before` plus
        each cluster's mean update); `updated`: (K,) whether any client trained in each
        cluster; the first `trainable_values` of a flat model are its trainable ones."""
        if self.is_identity:
            return after, None
        num_clusters, t = len(before), trainable_values
        if state is None or any(len(value) != num_clusters for value in state.values()):
            state = self.initial_state(num_clusters, t)
        optimizer = self.build()
        hparams = optimizer.get_hparams(optimizer.initialize((tf.TensorSpec([t], tf.float32),)))
        models = np.array(after, np.float32, copy=True)
        new_state = {key: value.copy() for key, value in state.items()}
        for k in np.flatnonzero(updated):
            current: dict[str, Any] = dict(hparams)
            for key, value in state.items():
                current[key] = value[k] if value.ndim == 1 else (tf.constant(value[k]),)
            moved, (weights,) = optimizer.next(
                current,
                (tf.constant(before[k, :t]),),
                (tf.constant(before[k, :t] - after[k, :t]),),  # the pseudo-gradient -Delta_k
            )
            models[k, :t] = weights.numpy()
            for key in state:
                new_state[key][k] = np.asarray(per_tensor(moved[key]))
        return models, new_state


def per_tensor(value: Any) -> Any:
    """A state entry of the optimizer over one flat tensor: its one element when the entry
    holds one per weight tensor (a tuple), else the value itself (adam's step)."""
    return value[0] if isinstance(value, (tuple, list)) else value


@functools.cache
def built_optimizer(spec: ServerOptimizer) -> tff.learning.optimizers.Optimizer:
    if spec.name == "adam":
        return tff.learning.optimizers.build_adam(
            learning_rate=spec.learning_rate,
            beta_1=spec.beta_1,
            beta_2=spec.beta_2,
            epsilon=spec.epsilon,
        )
    momentum = spec.momentum if spec.name == "sgdm" else None
    return tff.learning.optimizers.build_sgdm(learning_rate=spec.learning_rate, momentum=momentum)
