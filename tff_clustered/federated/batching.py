"""One client's minibatches for a round, in a stateless shuffled order.

One client's minibatches for a round: the stateless shuffled order of its examples
(`batch_order`, `padded_batch_order` for clients padded to a common size) and the loop over
them inside a round's graph (`ArrayBatches`), or as a dataset (`batches`)."""

from __future__ import annotations

import collections
import copy
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import tensorflow as tf


def batch_order(
    size: Any,
    batch_size: Any,
    epochs: Any = 1,
    shuffle_seed: Any = None,
    max_steps: Any = -1,
    pass_index: int = 0,
) -> tuple[tf.Tensor, tf.Tensor]:
    """The example indices of one client's minibatches: `epochs` passes (-1: without end) over
    `size` examples, each pass reshuffled from `shuffle_seed` (None: in order), cut after
    `max_steps` batches (-1: no cut); the last partial batch of each pass is kept (FedGroup's
    `batch_data`). Returns `(indices, lengths)`: (steps, batch_size) indices, each row padded
    with 0 after its first `lengths[step]` entries.

    The shuffle is stateless: epoch e of `pass_index` p is the argsort of uniform keys drawn
    from the seed `(shuffle_seed, p)`, so the order is a pure function of its arguments, costs
    a few ops (no tf.data pipeline to build per client), and vectorises. Arguments may be Python
    numbers or TF scalars."""
    size = tf.cast(size, tf.int64)
    batch_size = tf.cast(batch_size, tf.int64)
    per_epoch = (size + batch_size - 1) // batch_size
    steps = client_steps(size, batch_size, epochs, max_steps)
    num_epochs = (steps + per_epoch - 1) // tf.maximum(per_epoch, 1)
    if shuffle_seed is None:
        order = tf.tile(tf.range(size)[None], tf.stack([num_epochs, 1]))
    else:
        seed = tf.stack([tf.cast(shuffle_seed, tf.int64), tf.constant(pass_index, tf.int64)])
        keys = tf.random.stateless_uniform(tf.stack([num_epochs, size]), seed)
        order = tf.argsort(keys, axis=1, stable=True, direction="ASCENDING")
        order = tf.cast(order, tf.int64)
    padded = tf.pad(order, [[0, 0], [0, per_epoch * batch_size - size]])
    indices = tf.reshape(padded, tf.stack([num_epochs * per_epoch, batch_size]))[:steps]
    within = tf.minimum(batch_size, size - tf.range(per_epoch) * batch_size)
    lengths = tf.tile(within, tf.reshape(num_epochs, [1]))[:steps]
    return indices, lengths


def client_steps(size: Any, batch_size: Any, epochs: Any = 1, max_steps: Any = -1) -> tf.Tensor:
    """How many minibatches `batch_order` gives a client of `size` examples (int64)."""
    size = tf.cast(size, tf.int64)
    batch_size = tf.cast(batch_size, tf.int64)
    epochs, max_steps = tf.cast(epochs, tf.int64), tf.cast(max_steps, tf.int64)
    per_epoch = (size + batch_size - 1) // batch_size
    steps = tf.where(epochs >= 0, epochs * per_epoch, max_steps)
    steps = tf.where(max_steps >= 0, tf.minimum(steps, max_steps), steps)
    return tf.where(per_epoch > 0, tf.maximum(steps, 0), tf.constant(0, tf.int64))


def padded_batch_order(
    size: Any,
    capacity: Any,
    batch_size: Any,
    epochs: Any = 1,
    shuffle_seed: Any = None,
    max_steps: Any = -1,
    pass_index: int = 0,
) -> tuple[tf.Tensor, tf.Tensor]:
    """`batch_order` for a client holding the first `size` of `capacity` rows, with shapes
    that depend on `capacity` only (so that clients of different sizes vectorise):
    `(indices, mask)`, both (steps, batch_size) with as many steps as a client filling the
    `capacity` rows has; the mask (float32) is 1 on the entries `batch_order(size, ...)` has
    at that step and 0 elsewhere (all 0 past the client's last step). Computed once per pass,
    so that a step only slices its row.

    Epoch e's order is the stable argsort of the elements e * size .. e * size + size - 1 of
    the stateless uniform stream of the seed `(shuffle_seed, pass_index)`: the row e of the
    `(epochs, size)` keys `batch_order` draws (a stateless draw of a longer shape starts with
    the elements of a shorter one), the padding rows sorted after them."""
    size, capacity = tf.cast(size, tf.int64), tf.cast(capacity, tf.int64)
    batch_size = tf.cast(batch_size, tf.int64)
    epochs, max_steps = tf.cast(epochs, tf.int64), tf.cast(max_steps, tf.int64)
    most = client_steps(capacity, batch_size, epochs, max_steps)
    # As many epoch orders as any client of at most `capacity` rows can need.
    rows = tf.maximum(tf.minimum(tf.where(epochs >= 0, epochs, max_steps), most), 1)
    if shuffle_seed is None:
        orders = tf.tile(tf.range(capacity)[None], tf.stack([rows, 1]))
    else:
        seed = tf.stack([tf.cast(shuffle_seed, tf.int64), tf.constant(pass_index, tf.int64)])
        stream = tf.random.stateless_uniform(tf.reshape(rows * capacity, [1]), seed)
        at = tf.range(rows)[:, None] * size + tf.range(capacity)[None, :]
        keys = tf.where(
            tf.range(capacity)[None, :] < size,
            tf.gather(stream, tf.minimum(at, rows * capacity - 1)),
            tf.constant(np.inf, stream.dtype),
        )
        orders = tf.cast(tf.argsort(keys, axis=1, stable=True), tf.int64)
    steps = tf.range(most)
    per_epoch = tf.maximum((size + batch_size - 1) // batch_size, 1)
    epoch = tf.minimum(steps // per_epoch, rows - 1)
    positions = ((steps % per_epoch) * batch_size)[:, None] + tf.range(batch_size)[None, :]
    at = epoch[:, None] * capacity + tf.minimum(positions, capacity - 1)
    indices = tf.gather(tf.reshape(orders, [-1]), at)
    own_step = steps < client_steps(size, batch_size, epochs, max_steps)
    valid = (positions < size) & own_step[:, None]
    return indices, tf.cast(valid, tf.float32)


def batches(
    arrays: Mapping[str, Any],
    batch_size: Any,
    epochs: Any = 1,
    shuffle_seed: Any = None,
    max_steps: Any = -1,
    pass_index: int = 0,
) -> tf.data.Dataset:
    """One client's minibatches as a dataset, in the order `batch_order` gives (what a
    client's `ArrayBatches` loop goes through on its pass `pass_index`). Iterating the dataset
    again gives the same batches."""
    arrays = collections.OrderedDict(
        (name, tf.convert_to_tensor(value)) for name, value in arrays.items()
    )
    size = tf.shape(next(iter(arrays.values())), out_type=tf.int64)[0]
    indices, lengths = batch_order(size, batch_size, epochs, shuffle_seed, max_steps, pass_index)
    return tf.data.Dataset.from_tensor_slices((indices, lengths)).map(
        lambda chosen, length: collections.OrderedDict(
            (name, tf.gather(value, chosen[:length])) for name, value in arrays.items()
        )
    )


class ArrayBatches:
    """One client's minibatches (`batch_order`), for a loop inside a graph.

    `reduce(initial, fn)` is `tf.data.Dataset.reduce` over those batches, with its loop a
    `tf.while_loop` that gathers each batch from the arrays: the loop body (the forward and
    backward pass) runs on the device the graph puts it on, a GPU included, where the function of
    a `Dataset.reduce` always runs inside tf.data on the CPU. As a reshuffling dataset does, each
    further `reduce` of the same object draws a new order (pass 0, 1, ...: Ditto loops twice).

    `size`: the arrays are padded, and the client holds only their first `size` rows. Then
    every batch has `batch_size` rows and a `mask` (float32, 1 on the rows `batch_order(size)`
    puts in that batch, `padded_batch_order`), and the loop runs as many steps as a client filling
    the arrays would, the steps past the client's own with an all-zero mask: the loop's shapes
    and length do not depend on the client, so clients of different sizes vectorise
    together. Client work treats a masked batch as the batch of its unmasked rows and a step
    with no unmasked row as no step (`local_training.train_client`).
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        batch_size: Any,
        epochs: Any = 1,
        shuffle_seed: Any = None,
        max_steps: Any = -1,
        size: Any = None,
    ) -> None:
        self.arrays = collections.OrderedDict(
            (name, tf.convert_to_tensor(value)) for name, value in arrays.items()
        )
        self.capacity = tf.shape(next(iter(self.arrays.values())), out_type=tf.int64)[0]
        self.size = None if size is None else tf.cast(size, tf.int64)
        self.order_args = (batch_size, epochs, shuffle_seed, max_steps)
        self._passes = [0]  # shared with the copies `with_budget` makes

    def with_budget(self, epochs: Any, max_steps: Any = -1) -> ArrayBatches:
        """The same client's batches for another budget (`epochs` passes, cut after
        `max_steps`): a local schedule's phase. Its reduces draw their order from the same
        seed and pass counter, so no two passes of the client repeat an order."""
        batch_size, _, shuffle_seed, _ = self.order_args
        other = copy.copy(self)
        other.order_args = (batch_size, epochs, shuffle_seed, max_steps)
        return other

    def _batches(self) -> tuple[tf.Tensor, Callable[[tf.Tensor], dict]]:
        """This pass's step count and its `step -> batch`."""
        pass_index = self._passes[0]
        self._passes[0] += 1
        if self.size is None:
            indices, lengths = batch_order(self.capacity, *self.order_args, pass_index=pass_index)

            def batch(step: tf.Tensor) -> dict:
                chosen = indices[step, : lengths[step]]
                return collections.OrderedDict(
                    (name, tf.gather(value, chosen)) for name, value in self.arrays.items()
                )

            return tf.shape(lengths, tf.int64)[0], batch

        # Once per pass, outside the loop: argsort has no vectorised form (pfor runs it client
        # by client), and each op a step runs is paid once per step.
        indices, masks = padded_batch_order(
            self.size, self.capacity, *self.order_args, pass_index=pass_index
        )

        def masked_batch(step: tf.Tensor) -> dict:
            chosen, mask = indices[step], masks[step]
            batch = collections.OrderedDict(
                (name, tf.gather(value, chosen)) for name, value in self.arrays.items()
            )
            batch["mask"] = mask
            return batch

        return tf.shape(masks, tf.int64)[0], masked_batch

    def reduce(self, initial: Any, fn: Any) -> Any:
        """`fn(carry, batch) -> carry` over this pass's batches, from `initial`."""
        steps, batch = self._batches()

        def body(step: tf.Tensor, carry: Any) -> tuple:
            return step + 1, fn(carry, batch(step))

        loop_vars = (tf.constant(0, tf.int64), initial)
        try:
            _, result = tf.while_loop(lambda step, _: step < steps, body, loop_vars)
        except ValueError:  # a carry whose shape changes (Dataset.reduce relaxes it too)
            relaxed = tf.nest.map_structure(
                lambda t: tf.TensorShape([None] * t.shape.rank), loop_vars
            )
            _, result = tf.while_loop(
                lambda step, _: step < steps, body, loop_vars, shape_invariants=relaxed
            )
        return result
