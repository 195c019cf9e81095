"""Client work as pure TensorFlow functions: a model and its batches in, a trained model out.

They know nothing about TFF placements, so they can be tested alone (FedJAX style). The round
builder (`round_functions.py`) takes a `ClientWork` as a parameter and wraps it in a
`tff.tensorflow.computation`.

A model is seen through `forward(weights, state, x, training, seed) -> (logits, new_state)`:
`weights` are the trainable tensors, `state` the non-trainable ones (BatchNorm moving
statistics, empty for most models), `seed` a stateless `[2]` seed for dropout. Batches are
anything with tf.data's `reduce(initial, fn)`: a `tf.data.Dataset`, or the round's
`federated_data.ArrayBatches` (the same batches, its loop placed with the graph).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional, Protocol, Union

import tensorflow as tf

Weights = Sequence[tf.Tensor]
PredictFn = Callable[[Weights, tf.Tensor, bool], tf.Tensor]
ForwardFn = Callable[
    [Weights, Weights, tf.Tensor, bool, Optional[tf.Tensor]], tuple[tf.Tensor, tuple]
]


class Batches(Protocol):
    """What client work loops over: `reduce(initial, fn)` with `fn(carry, batch) -> carry`."""

    def reduce(self, initial: Any, fn: Callable[[Any, dict], Any]) -> Any: ...


def stateless(predict: PredictFn) -> ForwardFn:
    """A `forward` for a model without state or randomness, from `predict(weights, x, training)`."""

    def forward(
        weights: Weights, state: Weights, x: tf.Tensor, training: bool, seed: object = None
    ) -> tuple[tf.Tensor, tuple]:
        return predict(weights, x, training), tuple(state)

    return forward


class TrainResult(NamedTuple):
    weights: tuple[tf.Tensor, ...]
    num_examples: tf.Tensor  # float32: examples processed over all local epochs
    loss_sum: tf.Tensor  # float32: sum over processed examples of the training loss
    state: tuple[tf.Tensor, ...] = ()


class EvalResult(NamedTuple):
    loss_sum: tf.Tensor
    num_correct: tf.Tensor
    num_examples: tf.Tensor


def example_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Cross-entropy of each example (no weight decay): softmax over classes, or sigmoid for a
    single-logit binary model (the Sent140 LSTM)."""
    if logits.shape[-1] == 1:
        return tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.float32), logits=logits[:, 0]
        )
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def batch_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of a batch (`example_losses`)."""
    return tf.reduce_mean(example_losses(logits, labels))


def masked_mean(values: tf.Tensor, mask: tf.Tensor, count: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Mean of `values` over the rows where `mask` is 1 (0 when there is none): the mean over
    a padded batch's own rows (`federated_data.ArrayBatches` with a `size`). `count`: the
    mask's sum, when the caller has it already."""
    count = tf.reduce_sum(mask) if count is None else count
    return tf.reduce_sum(values * mask) / tf.maximum(count, 1.0)


def batch_count(batch: dict) -> tf.Tensor:
    """Examples in a batch (float32): its rows, or its unmasked rows when it has a `mask`."""
    if "mask" in batch:
        return tf.reduce_sum(batch["mask"])
    return tf.cast(tf.shape(batch["y"])[0], tf.float32)


def predicted_labels(logits: tf.Tensor) -> tf.Tensor:
    """argmax over classes; a single logit predicts class 1 iff it is > 0."""
    if logits.shape[-1] == 1:
        return tf.cast(logits[:, 0] > 0, tf.int32)
    return tf.argmax(logits, axis=-1, output_type=tf.int32)


class Pull(NamedTuple):
    """A proximal term strength/2 * ||w[i] - target[i]||^2 over trainable tensors `indices`
    (None: all of them) added to the local loss: FedProx's pull toward the received model
    (Li et al., Eq. 2), Ditto's toward the global model (Eq. 2), FedAC's toward its cluster
    center and the global embedding."""

    strength: Union[float, tf.Tensor]
    target: tuple  # one tensor per pulled index
    indices: Optional[tuple[int, ...]] = None


def train_client(
    forward: ForwardFn,
    weights: Weights,
    dataset: Batches,
    learning_rate: tf.Tensor,
    momentum: float = 0.0,
    state: Weights = (),
    seed: Optional[tf.Tensor] = None,
    pulls: Sequence[Pull] = (),
    penalty: Optional[Callable[[tuple, tuple], tf.Tensor]] = None,
    project: Optional[Callable[[tuple], tuple]] = None,
    trainable: Optional[Sequence[int]] = None,
) -> TrainResult:
    """Local minibatch SGD over every batch of `dataset` (its epochs already repeated).

    `trainable`: the indices of the tensors that train (None: all); the others are frozen:
    no gradient is taken for them, no pull or momentum acts on them, and they come out as they
    went in.

    Step: g = grad mean-loss(b; w) + sum over pulls p of p.strength * (w - p.target) on the
    pulled tensors; v = momentum v + g; w = w - lr v. The momentum buffer starts at zero every
    round. `momentum` is a Python number and a pull of Python strength 0 is left out: no pull
    and no momentum run exactly FedAvg's plain SGD step. `penalty(weights, state)`, when
    given, is added to each step's loss (differentiated with it; UA-PDFL's feature
    alignment). `project(weights) -> weights`, when given, is applied after every step (DisPFL's
    sparse training keeps the weights on the peer's mask). `state` (BatchNorm statistics) is
    updated by the forward pass in training mode; `seed` (int32 [2]) seeds dropout, step by
    step.
    """
    everything = tuple(range(len(weights)))
    trained = everything if trainable is None else tuple(trainable)
    position = {i: n for n, i in enumerate(trained)}  # a trained tensor's place in `direction`
    pulls = tuple(
        Pull(p.strength, tuple(tf.identity(t) for t in p.target), p.indices or everything)
        for p in pulls
        if not (isinstance(p.strength, (int, float)) and p.strength == 0)
    )
    for p in pulls:
        if len(p.target) != len(p.indices):
            raise ValueError(f"a pull has {len(p.target)} targets for {len(p.indices)} tensors")
    start = (
        tuple(tf.identity(w) for w in weights),
        tuple(tf.zeros_like(weights[i]) for i in trained) if momentum else (),
        tuple(tf.identity(s) for s in state),
        tf.constant(0.0),
        tf.constant(0.0),
        tf.constant(0, tf.int32),
    )

    def step(carry: tuple, batch: dict) -> tuple:
        current, velocity, model_state, num_examples, loss_sum, step_num = carry
        step_seed = None if seed is None else tf.stack([seed[0], seed[1] + step_num])
        mask = batch.get("mask")
        batch_size = batch_count(batch)
        with tf.GradientTape() as tape:
            tape.watch(current)
            logits, new_state = forward(current, model_state, batch["x"], True, step_seed)
            if mask is None:
                loss = batch_loss(logits, batch["y"])
            else:
                loss = masked_mean(example_losses(logits, batch["y"]), mask, batch_size)
            objective = loss if penalty is None else loss + penalty(current, model_state)
        # Dense: an embedding's gradient comes as IndexedSlices (`convert_to_tensor` is a no-op
        # on the others).
        direction = [
            tf.convert_to_tensor(g) for g in tape.gradient(objective, [current[i] for i in trained])
        ]
        for p in pulls:
            for i, target in zip(p.indices, p.target):
                if i in position:
                    n = position[i]
                    direction[n] = direction[n] + p.strength * (current[i] - target)
        if momentum:
            velocity = tuple(momentum * v + g for v, g in zip(velocity, direction))
            direction = list(velocity)
        rate = learning_rate
        if mask is not None:
            # A padded step (no unmasked row, only ever after the client's last step) is no
            # step: a zero rate leaves the weights exactly as they are (its loss, and so what
            # it adds to the sums, is 0; the velocity it changes is never used again), which
            # costs far less than selecting every tensor of the carry.
            rate = learning_rate * tf.cast(batch_size > 0, tf.float32)
            if model_state:
                new_state = [
                    tf.where(batch_size > 0, new, old) for new, old in zip(new_state, model_state)
                ]
        moved = list(current)
        for i, d in zip(trained, direction):
            moved[i] = current[i] - rate * d
        current = tuple(moved)
        if project is not None:
            current = tuple(project(current))
        return (
            current,
            velocity,
            tuple(new_state),
            num_examples + batch_size,
            loss_sum + loss * batch_size,
            step_num + 1,
        )

    final, _, final_state, num_examples, loss_sum, _ = dataset.reduce(start, step)
    return TrainResult(final, num_examples, loss_sum, final_state)


def evaluate_client(
    forward: ForwardFn, weights: Weights, dataset: Batches, state: Weights = ()
) -> EvalResult:
    """Summed loss, correct predictions and example count of `weights` on `dataset`."""

    def step(totals: EvalResult, batch: dict) -> EvalResult:
        logits, _ = forward(weights, state, batch["x"], False, None)
        labels = batch["y"]
        batch_size = batch_count(batch)
        hits = tf.cast(tf.equal(predicted_labels(logits), labels), tf.float32)
        mask = batch.get("mask")
        if mask is None:
            correct, loss_sum = tf.reduce_sum(hits), batch_loss(logits, labels) * batch_size
        else:
            correct = tf.reduce_sum(hits * mask)
            loss_sum = tf.reduce_sum(example_losses(logits, labels) * mask)
        return EvalResult(
            totals.loss_sum + loss_sum,
            totals.num_correct + correct,
            totals.num_examples + batch_size,
        )

    zero = tf.constant(0.0)
    return dataset.reduce(EvalResult(zero, zero, zero), step)


def flatten(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Concatenate tensors into one vector, in the given (canonical) order."""
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


# -- client work as a parameter of the round --------------------------------------------------


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
