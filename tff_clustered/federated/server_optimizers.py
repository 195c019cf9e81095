"""The finalizer's server optimizer, one state per cluster (FedAvgM, FedAdam).

The finalizer's server optimizer, one state per cluster (FedOpt: Reddi et al., Adaptive
Federated Optimization, ICLR 2021, Algorithm 2).

After the aggregator has averaged a cluster's client updates, plain FedAvg adds the mean update
Delta_k to the cluster model x_k. A server optimizer instead treats -Delta_k as a gradient:
x_k <- ServerOpt(x_k, -Delta_k), with an optimizer of `tff.learning.optimizers` (SGD with
momentum: FedAvgM, Hsu et al. 2019; Adam: FedAdam). Each cluster keeps its own optimizer state
(momentum, Adam's moments and step), so FedGroup or IFCA with server momentum keeps one
momentum per group. Rules:

* Only the trainable values move by the optimizer; the other variables (BatchNorm statistics)
  keep the aggregator's mean.
* A cluster no sampled client trained in this round is left as it was, model and state
  (under a private aggregator, `cluster_dp.py`, every cluster in use steps: its noised mean
  is its update, whether or not a client of it took part).
* The state is kept per cluster index while the number of clusters stays; a change of that
  number (a split, a merge, a cold start) starts every cluster's state from zero.

`sgd` at learning rate 1 is the identity (FedAvg's finalizer) and keeps no state.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.frameworks import tff

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
        return collections.OrderedDict(
            (key, np.repeat(np.asarray(per_tensor(value))[None], num_clusters, 0))
            for key, value in sorted(initial.items())
            if key not in hparams
        )

    def state_or_initial(
        self, state: Optional[OptimizerState], num_clusters: int, size: int
    ) -> Optional[OptimizerState]:
        """`state` while it holds `num_clusters` clusters, else a zero state (a change in the
        number of clusters restarts it); None for the identity."""
        if self.is_identity:
            return None
        if state is None or any(len(value) != num_clusters for value in state.values()):
            return self.initial_state(num_clusters, size)
        return state


def server_step(spec: ServerOptimizer, num_trainable: int) -> Callable[..., tuple]:
    """The finalizer's step as a TF function `(before, after, updated, state) -> (models,
    state)` on cluster models stacked per variable (`[K, ...]`, the first `num_trainable`
    trainable): for each cluster k that `updated[k]` says some client trained in, the
    optimizer's step from `before` with the pseudo-gradient -(after - before) on the flat
    vector of its trainable values; its other variables keep `after` (the aggregator's mean),
    and an untrained cluster keeps `after` (its model unchanged) and its state. `state`: the
    optimizer's non-hyperparameter entries stacked per cluster (`ServerOptimizer.initial_state`).
    The identity returns `after` and the state as they are."""

    def step(before: tuple, after: tuple, updated: tf.Tensor, state: dict) -> tuple:
        if spec.is_identity:
            return tuple(after), state
        num_clusters = int(before[0].shape[0])
        shapes = [tuple(before[i].shape[1:]) for i in range(num_trainable)]

        def flat(models: tuple) -> tf.Tensor:
            return tf.concat(
                [tf.reshape(models[i], [num_clusters, -1]) for i in range(num_trainable)], 1
            )

        start, mean = flat(before), flat(after)
        optimizer = spec.build()
        size = int(start.shape[1])
        initial = optimizer.initialize((tf.TensorSpec([size], tf.float32),))
        # float32 tensors, as the optimizer casts its integer step to their dtype (adam)
        hparams = {key: tf.cast(v, tf.float32) for key, v in optimizer.get_hparams(initial).items()}
        rows, moved_state = [], {key: [] for key in state}
        for k in range(num_clusters):
            current: dict[str, Any] = dict(hparams)
            for key, value in state.items():
                current[key] = value[k] if value.shape.rank == 1 else (value[k],)
            moved, (weights,) = optimizer.next(current, (start[k],), (start[k] - mean[k],))
            rows.append(tf.where(updated[k], weights, mean[k]))
            for key, value in state.items():
                moved_state[key].append(tf.where(updated[k], per_tensor(moved[key]), value[k]))
        sizes = [int(np.prod(shape)) for shape in shapes]
        trainable = tf.split(tf.stack(rows), sizes, axis=1)
        models = [tf.reshape(t, [num_clusters, *shape]) for t, shape in zip(trainable, shapes)]
        new_state = collections.OrderedDict(
            (key, tf.stack(values)) for key, values in moved_state.items()
        )
        return tuple(models) + tuple(after[num_trainable:]), new_state

    return step


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
