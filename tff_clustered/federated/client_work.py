"""Client work as pure TensorFlow functions: a model and its batches in, a trained model out.

They know nothing about TFF placements, so they can be tested alone (FedJAX style). The round
builder (`round_functions.py`) takes a `ClientWork` as a parameter and wraps it in a
`tff.tensorflow.computation`.

What a client holds when its work starts (`ClientInputs`) and returns (`ClientOutputs`), and
the works: `LocalSGD` (FedAvg, FedProx, an anchor's pull), `DittoSGD`, `PhasedSGD` (a local
schedule of phases with their own trainable tensors). The training loop they share is
`local_training.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional, Protocol

import tensorflow as tf

from tff_clustered.federated.local_training import (
    Batches,
    ForwardFn,
    Pull,
    TrainResult,
    train_client,
)


class RoutedRows(NamedTuple):
    """What a decentralized peer is routed (the `Neighbours` distributor): every variable
    stacked along a leading row axis, its own published model first, then its neighbours';
    the examples each row's peer holds; the server rows they are (a row equal to its own, after
    the first, pads a queue shorter than the round's and counts as absent; None: all real);
    and the model's feature extractor (`FeaturesFn`)."""

    rows: tuple
    weights: tf.Tensor
    row_ids: Optional[tf.Tensor] = None
    features: Optional[Callable[..., tf.Tensor]] = None


class ClientInputs(NamedTuple):
    """What one client holds when its work starts (TF values)."""

    weights: tuple  # trainable tensors: its cluster's shared ones joined with its own others
    state: tuple  # model state (BatchNorm statistics), joined the same way
    own_weights: tuple  # its whole stored model, when the work reads it (Ditto), else ()
    own_state: tuple
    dataset: Batches
    learning_rate: tf.Tensor
    client_scalar: tf.Tensor  # set by the algorithm's plan (1.0 by default): `Plan.client_scalars`
    seed: tf.Tensor  # int32 [2]
    anchor: tuple = ()  # the server's broadcast anchor tensors, when the round sends one
    anchor_indices: tuple[int, ...] = ()  # the trainable tensors the anchor stands for
    routed: Optional[RoutedRows] = None  # a decentralized peer's rows (`distribution="neighbours"`)
    # Where the round stands in the run (int64 scalars, 1-based; 0 of 0 outside a run).
    round_num: Optional[tf.Tensor] = None
    total_rounds: Optional[tf.Tensor] = None


class ClientOutputs(NamedTuple):
    """`weights`/`state`: the model whose shared part is aggregated; `own_*`: what the client
    keeps (for plain SGD the same model)."""

    weights: tuple
    state: tuple
    own_weights: tuple
    own_state: tuple
    num_examples: tf.Tensor
    loss_sum: tf.Tensor
    metrics: dict = {}  # per-client values the algorithm logs (a fixed structure per work)

    @classmethod
    def kept(cls, result: TrainResult, metrics: Optional[dict] = None) -> ClientOutputs:
        """The trained model, both aggregated and kept (plain local training)."""
        return cls(
            result.weights,
            result.state,
            result.weights,
            result.state,
            result.num_examples,
            result.loss_sum,
            metrics or {},
        )


@dataclasses.dataclass(frozen=True)
class LocalSGD:
    """FedAvg's ClientUpdate (McMahan et al. Alg. 1), with FedProx's proximal term (Li et al.
    Eq. 2) toward the received model when `prox_mu` > 0 (times the client's prox scale), a pull
    of strength `anchor_lambda` toward the round's broadcast anchor when > 0, and heavy-ball
    momentum when `momentum` > 0.

    `from_own_model`: training starts from the client's whole stored model instead of the
    received one, which it only pulls toward (FedAC's LocalUpdate, Zhang et al. Alg. 1: own
    model omega_i, pulls toward its cluster centre and the global embedding; CGPFL's personal
    model pulled toward its context model). Then the client keeps and uploads its own model."""

    prox_mu: float = 0.0
    momentum: float = 0.0
    anchor_lambda: float = 0.0
    from_own_model: bool = False

    @property
    def reads_own_model(self) -> bool:
        return self.from_own_model

    def __call__(self, forward: ForwardFn, inputs: ClientInputs) -> ClientOutputs:
        pulls = []
        if self.prox_mu:
            pulls.append(Pull(self.prox_mu * inputs.client_scalar, tuple(inputs.weights)))
        if self.anchor_lambda:
            if not inputs.anchor_indices:
                raise ValueError("anchor_lambda > 0 needs a round that broadcasts an anchor")
            pulls.append(Pull(self.anchor_lambda, inputs.anchor, inputs.anchor_indices))
        own = self.from_own_model
        result = train_client(
            forward,
            inputs.own_weights if own else inputs.weights,
            inputs.dataset,
            inputs.learning_rate,
            momentum=self.momentum,
            state=inputs.own_state if own else inputs.state,
            seed=inputs.seed,
            pulls=pulls,
        )
        return ClientOutputs.kept(result)


@dataclasses.dataclass(frozen=True)
class DittoSGD:
    """Ditto's client (Li et al., "Ditto: Fair and Robust Federated Learning Through
    Personalization", ICML 2021, Alg. 1): the personal model v_k takes the same local epochs of
    SGD on h_k(v; w) = F_k(v) + lambda/2 ||v - w^t||^2 (Eq. 2), anchored at the received global
    model w^t; then w^t takes plain local SGD (the global objective's update, aggregated as in
    FedAvg). v is trained first, so with lambda = 0 it sees exactly the batches Local would."""

    ditto_lambda: float = 0.1
    momentum: float = 0.0

    @property
    def reads_own_model(self) -> bool:
        return True

    def __call__(self, forward: ForwardFn, inputs: ClientInputs) -> ClientOutputs:
        personal = train_client(
            forward,
            inputs.own_weights,
            inputs.dataset,
            inputs.learning_rate,
            momentum=self.momentum,
            state=inputs.own_state,
            seed=inputs.seed,
            pulls=[Pull(self.ditto_lambda, tuple(inputs.weights))],
        )
        # The global model's pass runs after the personal one: without this dependency the
        # graph may run them in either order, and the dataset's reshuffle would hand v the
        # second epoch order on some calls.
        with tf.control_dependencies([t for t in personal.weights]):
            shared = self._train_global(forward, inputs)
        return ClientOutputs(
            shared.weights,
            shared.state,
            personal.weights,
            personal.state,
            shared.num_examples,
            shared.loss_sum,
        )

    def _train_global(self, forward: ForwardFn, inputs: ClientInputs) -> TrainResult:
        return train_client(
            forward,
            inputs.weights,
            inputs.dataset,
            inputs.learning_rate,
            momentum=self.momentum,
            state=inputs.state,
            seed=inputs.seed,
        )


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a local schedule: the trainable tensors that train in it (the others
    frozen) and its budget, `epochs` passes over the client's data, or None for the round's
    own budget (`--local_epochs`, or `--local_steps` when given)."""

    tensors: tuple[int, ...]
    epochs: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class PhasedSGD:
    """Local SGD in phases, one after another, each on its own tensors with the others truly
    frozen (`train_client`'s `trainable`), from the model the previous phase left: FedRep's
    head epochs, then its body epochs (Collins et al., ICML 2021, Alg. 1, lines 6-11). Each
    phase draws its own minibatch order from the client's arrays and seed. What the round
    counts and aggregates (examples, loss) is the last phase's; momentum restarts each phase."""

    phases: tuple[Phase, ...]
    momentum: float = 0.0

    @property
    def reads_own_model(self) -> bool:
        return False

    def __call__(self, forward: ForwardFn, inputs: ClientInputs) -> ClientOutputs:
        weights, state = tuple(inputs.weights), tuple(inputs.state)
        result: Optional[TrainResult] = None
        for phase in self.phases:
            batches = inputs.dataset
            if phase.epochs is not None:
                if not hasattr(batches, "with_budget"):
                    raise TypeError("a phase with its own epochs needs the round's ArrayBatches")
                batches = batches.with_budget(phase.epochs)
            with tf.control_dependencies(list(weights)):  # phases run in their order
                result = train_client(
                    forward,
                    weights,
                    batches,
                    inputs.learning_rate,
                    momentum=self.momentum,
                    state=state,
                    seed=inputs.seed,
                    trainable=phase.tensors,
                )
            weights, state = result.weights, result.state
        if result is None:
            raise ValueError("a local schedule needs at least one phase")
        return ClientOutputs.kept(result)


class ClientWork(Protocol):
    """What a round builder takes as client work: hashable (frozen dataclass: processes are
    cached by it), `reads_own_model` (whether the client's whole stored model comes in), and a
    pure TF function of the model's forward pass and the client's inputs."""

    @property
    def reads_own_model(self) -> bool: ...

    def __call__(self, forward: ForwardFn, inputs: ClientInputs) -> ClientOutputs: ...
