"""The local training loop and scoring as pure TensorFlow functions.

The local training loop and scoring as pure TensorFlow functions: a model and its batches
in, a trained model (or scores) out, with the losses and metrics they share. Client works
(`client_work.py`) are built from them.

A model is seen through `forward(weights, state, x, training, seed) -> (logits, new_state)`:
`weights` are the trainable tensors, `state` the non-trainable ones (BatchNorm moving
statistics, empty for most models), `seed` a stateless `[2]` seed for dropout. Batches are
anything with tf.data's `reduce(initial, fn)`: a `tf.data.Dataset`, or the round's
`batching.ArrayBatches` (the same batches, its loop placed with the graph).
"""

from __future__ import annotations

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
    a padded batch's own rows (`batching.ArrayBatches` with a `size`). `count`: the
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
    pulls = acting_pulls(pulls, everything)

    def step(carry: tuple, batch: dict) -> tuple:
        current, velocity, model_state, num_examples, loss_sum, step_num = carry
        step_seed = None if seed is None else tf.stack([seed[0], seed[1] + step_num])
        batch_size = batch_count(batch)
        loss, direction, new_state = step_gradient(
            forward, current, model_state, batch, batch_size, step_seed, penalty, trained
        )
        direction = pulled(direction, pulls, current, trained)
        if momentum:
            velocity = tuple(momentum * v + g for v, g in zip(velocity, direction))
            direction = list(velocity)
        rate, new_state = unless_padded(batch, batch_size, learning_rate, new_state, model_state)
        return (
            descended(current, trained, direction, rate, project),
            velocity,
            tuple(new_state),
            num_examples + batch_size,
            loss_sum + loss * batch_size,
            step_num + 1,
        )

    start = initial_carry(weights, state, trained, momentum)
    final, _, final_state, num_examples, loss_sum, _ = dataset.reduce(start, step)
    return TrainResult(final, num_examples, loss_sum, final_state)


def acting_pulls(pulls: Sequence[Pull], everything: tuple[int, ...]) -> tuple[Pull, ...]:
    """The pulls that act (one of Python strength 0 is left out), their targets held as they
    are at the start and their tensors named (a pull's None: `everything`)."""
    acting = tuple(
        Pull(p.strength, tuple(tf.identity(t) for t in p.target), p.indices or everything)
        for p in pulls
        if not (isinstance(p.strength, (int, float)) and p.strength == 0)
    )
    for p in acting:
        if len(p.target) != len(p.indices):
            raise ValueError(f"a pull has {len(p.target)} targets for {len(p.indices)} tensors")
    return acting


def initial_carry(
    weights: Weights, state: Weights, trained: tuple[int, ...], momentum: float
) -> tuple:
    """The local loop's carry at its start: the weights, a zero momentum buffer per trained
    tensor (none without momentum), the model's state, no examples, no loss, step 0."""
    return (
        tuple(tf.identity(w) for w in weights),
        tuple(tf.zeros_like(weights[i]) for i in trained) if momentum else (),
        tuple(tf.identity(s) for s in state),
        tf.constant(0.0),
        tf.constant(0.0),
        tf.constant(0, tf.int32),
    )


def step_gradient(
    forward: ForwardFn,
    current: tuple,
    model_state: tuple,
    batch: dict,
    batch_size: tf.Tensor,
    step_seed: Optional[tf.Tensor],
    penalty: Optional[Callable[[tuple, tuple], tf.Tensor]],
    trained: tuple[int, ...],
) -> tuple[tf.Tensor, list, Sequence[tf.Tensor]]:
    """One step's mean loss on `batch` (over its own rows when it has a `mask` of
    `batch_size` rows), the dense gradient of its objective (the loss plus `penalty`) for the
    `trained` tensors, and the model's state after the forward pass in training mode."""
    mask = batch.get("mask")
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
    return loss, direction, new_state


def pulled(direction: list, pulls: tuple[Pull, ...], current: tuple, trained: tuple) -> list:
    """`direction` (one gradient per `trained` tensor) with each pull's strength *
    (w - target) added on the trained tensors it pulls, pull after pull."""
    position = {i: n for n, i in enumerate(trained)}  # a trained tensor's place in `direction`
    direction = list(direction)
    for p in pulls:
        for i, target in zip(p.indices, p.target):
            if i in position:
                n = position[i]
                direction[n] = direction[n] + p.strength * (current[i] - target)
    return direction


def unless_padded(
    batch: dict,
    batch_size: tf.Tensor,
    learning_rate: tf.Tensor,
    new_state: Sequence[tf.Tensor],
    model_state: tuple,
) -> tuple[tf.Tensor, Sequence[tf.Tensor]]:
    """The step's rate and the model's state after it: `learning_rate` and `new_state`, unless
    `batch` has a `mask`. A padded step (no unmasked row, only ever after the client's last
    step) is no step: a zero rate leaves the weights exactly as they are (its loss, and so what
    it adds to the sums, is 0; the velocity it changes is never used again), which costs far
    less than selecting every tensor of the carry; there the state stays `model_state`."""
    if batch.get("mask") is None:
        return learning_rate, new_state
    rate = learning_rate * tf.cast(batch_size > 0, tf.float32)
    if model_state:
        new_state = [tf.where(batch_size > 0, new, old) for new, old in zip(new_state, model_state)]
    return rate, new_state


def descended(
    current: tuple,
    trained: tuple[int, ...],
    direction: Sequence[tf.Tensor],
    rate: tf.Tensor,
    project: Optional[Callable[[tuple], tuple]],
) -> tuple:
    """The weights after one step: w - rate * d on each trained tensor (the frozen ones as
    they are), then `project`ed when given."""
    moved = list(current)
    for i, d in zip(trained, direction):
        moved[i] = current[i] - rate * d
    current = tuple(moved)
    if project is not None:
        current = tuple(project(current))
    return current


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
