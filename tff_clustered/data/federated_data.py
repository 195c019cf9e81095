"""A federated dataset: per-client train and test `tff.simulation.datasets.ClientData`.

Every loader returns a `FederatedData` built by `from_arrays`, which validates the arrays
once, with errors that name the client, the source file and the fix.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_clustered.options import article_of, described

ClientArrays = tuple[np.ndarray, np.ndarray]  # (x, y)
ClientArrayDict = Mapping[str, np.ndarray]  # OrderedDict(x=..., y=...)


# A federated dataset: TFF's ClientData, or per-client arrays, each `(x, y)` or a mapping with
# the inputs under `x_key` and the labels under `y_key`.
Clients = Union[tff.simulation.datasets.ClientData, Mapping[str, Any]]


class DataError(ValueError):
    """Bad input data: the message names the problem, where it is, and the fix."""


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (its type name if it has none), to quote
    inside a one-line DataError."""
    text = str(error)
    return text.splitlines()[0] if text.strip() else type(error).__name__


@dataclasses.dataclass(frozen=True)
class FederatedData:
    name: str
    train: tff.simulation.datasets.ClientData
    test: tff.simulation.datasets.ClientData
    input_shape: tuple[int, ...]
    num_classes: int
    train_sizes: Mapping[str, int]
    test_sizes: Mapping[str, int]
    image_shape: Optional[tuple[int, ...]] = None
    # Planted cluster of each client where the generator knows it (for tests and diagnostics).
    true_clusters: Optional[Mapping[str, int]] = None
    # Unlabeled inputs held by the server (FedTSDP runs every uploaded model on a batch).
    public_x: Optional[np.ndarray] = None
    # Inputs that are token ids 0..vocabulary_size-1 (stored as float32, exact below 2**24),
    # not features: a model embeds them (`char_lstm`). None: inputs are features.
    vocabulary_size: Optional[int] = None

    # Each client's validated arrays, OrderedDict(x=float32 (n, *input_shape), y=int32 (n,)):
    # what a round sends its clients (they build their batches themselves, see `batches`).
    train_arrays: Mapping[str, ClientArrayDict] = dataclasses.field(default_factory=dict)
    test_arrays: Mapping[str, ClientArrayDict] = dataclasses.field(default_factory=dict)

    @property
    def client_ids(self) -> list[str]:
        return list(self.train.client_ids)

    def arrays(self, split: str, client_id: str) -> ClientArrayDict:
        """A client's examples of `split` ("train" or "test") as arrays."""
        return (self.train_arrays if split == "train" else self.test_arrays)[client_id]

    def batched(
        self,
        split: str,
        client_id: str,
        batch_size: int,
        epochs: int = 1,
        shuffle_seed: Optional[int] = None,
    ) -> tf.data.Dataset:
        """A client's batched dataset, reshuffled every epoch from `shuffle_seed` (`batches`)."""
        return batches(self.arrays(split, client_id), batch_size, epochs, shuffle_seed)


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
    a few ops (no tf.data pipeline to build per client and call, which was 18 ms of a client's
    34 ms fixed cost in process), and vectorises. Arguments may be Python numbers or TF
    scalars."""
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
    and length no longer depend on the client, so clients of different sizes vectorise
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


def from_arrays(
    name: str,
    train: Mapping[str, ClientArrays],
    test: Mapping[str, ClientArrays],
    num_classes: int,
    image_shape: Optional[tuple[int, ...]] = None,
    true_clusters: Optional[Mapping[str, int]] = None,
    source: str = "",
    public_x: Optional[np.ndarray] = None,
    vocabulary_size: Optional[int] = None,
) -> FederatedData:
    """Validates per-client `(x, y)` arrays and wraps them as `ClientData`; `public_x`, the
    server's unlabeled inputs if any, must be finite with the clients' per-example shape;
    with `vocabulary_size`, inputs must be token ids in 0..vocabulary_size-1."""
    where = f" in {source}" if source else ""
    if not train:
        raise DataError(f"dataset {name!r}{where} has no clients; check the data path")
    missing = sorted(set(train) ^ set(test))
    if missing:
        raise DataError(
            f"client {missing[0]!r}{where} appears in only one of train/test; every client needs "
            "both splits (regenerate the split, or drop the client from both)"
        )
    input_shape = None
    cleaned: dict[str, dict[str, collections.OrderedDict]] = {"train": {}, "test": {}}
    for split_name, split in (("train", train), ("test", test)):
        for cid, (x, y) in split.items():
            x = np.asarray(x, dtype=np.float32)
            y_raw = np.asarray(y)
            context = f"client {cid!r} ({split_name}){where}"
            if len(x) != len(y_raw):
                raise DataError(
                    f"{context}: {len(x)} inputs but {len(y_raw)} labels; every example needs "
                    "exactly one label"
                )
            if len(x) == 0:
                raise DataError(
                    f"{context} has no examples; remove the client or give it data in both splits"
                )
            if input_shape is None:
                input_shape = x.shape[1:]
            elif x.shape[1:] != input_shape:
                raise DataError(
                    f"{context}: examples of shape {x.shape[1:]}, others have {input_shape}; "
                    "all inputs must share one shape"
                )
            if not np.all(np.isfinite(x)):
                raise DataError(f"{context}: inputs contain NaN or infinity; clean the data")
            if vocabulary_size is not None and not (
                np.all(np.mod(x, 1) == 0) and np.all((x >= 0) & (x < vocabulary_size))
            ):
                raise DataError(
                    f"{context}: inputs must be token ids 0..{vocabulary_size - 1}; fix the "
                    "tokenisation"
                )
            if not np.all(np.equal(np.mod(y_raw.astype(np.float64), 1), 0)):
                raise DataError(
                    f"{context}: labels must be whole numbers (class indices); fix the labels"
                )
            y_int = y_raw.astype(np.int64)
            if np.any(y_int < 0):
                raise DataError(
                    f"{context}: label {int(y_int.min())} is negative; labels are class indices "
                    f"0..{num_classes - 1}, fix the labels"
                )
            bad = y_int[y_int >= num_classes]
            if bad.size:
                raise DataError(
                    f"{context}: label {int(bad[0])} is outside the model's {num_classes} classes "
                    f"0..{num_classes - 1}; fix the labels or raise --num_classes"
                )
            cleaned[split_name][cid] = collections.OrderedDict(x=x, y=y_int.astype(np.int32))
    if public_x is not None:
        public_x = np.asarray(public_x, dtype=np.float32)
        if public_x.ndim == 0 or not len(public_x):
            raise DataError(
                f"the server's public inputs{where} are empty; give at least one example, or "
                "public_x=None for no public set"
            )
        if public_x.shape[1:] != input_shape:
            raise DataError(
                f"public inputs{where} of shape {public_x.shape[1:]} do not match the clients' "
                f"{input_shape}; the server's public set must hold examples like the clients'"
            )
        if not np.all(np.isfinite(public_x)):
            raise DataError(f"public inputs{where} contain NaN or infinity; clean the data")
    return FederatedData(
        name=name,
        train=tff.simulation.datasets.TestClientData(cleaned["train"]),
        test=tff.simulation.datasets.TestClientData(cleaned["test"]),
        input_shape=tuple(int(d) for d in input_shape),
        num_classes=num_classes,
        train_sizes={cid: len(v["y"]) for cid, v in cleaned["train"].items()},
        test_sizes={cid: len(v["y"]) for cid, v in cleaned["test"].items()},
        image_shape=image_shape,
        true_clusters=dict(true_clusters) if true_clusters is not None else None,
        public_x=public_x,
        vocabulary_size=vocabulary_size,
        train_arrays=cleaned["train"],
        test_arrays=cleaned["test"],
    )


def chosen_clients(
    available: int, num_clients: Optional[int], rng: np.random.Generator, holds: str
) -> list[int]:
    """Sorted indices of `num_clients` of `available` clients drawn without replacement by
    `rng` (all of them when `num_clients` is None). `holds` says what the data holds, for the
    error when `num_clients` is out of range (e.g. "PATH holds 3,400 writers")."""
    if num_clients is None:
        return list(range(available))
    if not 1 <= num_clients <= available:
        raise DataError(
            f"--num_clients={num_clients}: {holds}; use --num_clients between 1 and {available}"
        )
    return sorted(int(i) for i in rng.choice(available, num_clients, replace=False))


def split_train_test(
    x: np.ndarray, y: np.ndarray, train_fraction: float, rng: np.random.Generator
) -> tuple[ClientArrays, ClientArrays]:
    """Shuffles one client's examples and splits them; each side keeps at least one example."""
    order = rng.permutation(len(y))
    n_train = int(np.clip(np.floor(train_fraction * len(y)), 1, len(y) - 1))
    tr, te = order[:n_train], order[n_train:]
    return (x[tr], y[tr]), (x[te], y[te])


def client_arrays(clients: Clients, x_key: str, y_key: str, split: str) -> dict[str, ClientArrays]:
    """Per-client `(x, y)` NumPy arrays from a ClientData or a mapping of clients, each client's
    checked by `example_arrays` (numbers, one label per example); client ids become strings,
    two ids that are the same string (1 and "1") are refused rather than merged."""
    if isinstance(clients, tff.simulation.datasets.ClientData):
        arrays = {}
        for client in clients.client_ids:
            dataset = clients.create_tf_dataset_for_client(client)
            spec = dataset.element_spec
            if not isinstance(spec, Mapping) or x_key not in spec or y_key not in spec:
                raise DataError(
                    f"{split} client {client!r}: elements are {spec}; pass x_key= and y_key= "
                    "naming the inputs and the labels (TFF's EMNIST: x_key='pixels', "
                    "y_key='label')"
                )
            batches = list(dataset.batch(1 << 16).as_numpy_iterator())
            if not batches:
                raise DataError(f"{split} client {client!r} has no examples; drop the client")
            try:
                x = np.concatenate([b[x_key] for b in batches])
            except ValueError:
                raise DataError(
                    f"{split} client {client!r}: its examples have different shapes; pad or crop "
                    "them to one shape"
                ) from None
            y = np.concatenate([b[y_key] for b in batches])
            arrays[str(client)] = example_arrays(f"{split} client {client!r}", x, y)
    elif isinstance(clients, Mapping):
        arrays = {}
        original: dict[str, Any] = {}
        for client, value in clients.items():
            where = f"{split} client {client!r}"
            cid = client_id(client, split)
            if cid in original:
                raise DataError(
                    f"{split} clients {original[cid]!r} and {client!r} are both client {cid!r} "
                    "(ids are compared as strings); rename one so no client's data is lost"
                )
            original[cid] = client
            if isinstance(value, Mapping):
                if x_key not in value or y_key not in value:
                    raise DataError(
                        f"{where} has keys {sorted(map(str, value))}; pass x_key= and y_key="
                    )
                value = (value[x_key], value[y_key])
            elif not isinstance(value, (tuple, list)) or len(value) != 2:
                raise DataError(
                    f"{where}: its value is {described_briefly(value)}, not an (x, y) pair; give "
                    f"(inputs, labels) or a mapping with keys {x_key!r} and {y_key!r}"
                )
            arrays[cid] = example_arrays(where, *value)
    else:
        raise TypeError(
            f"{split} data must be a tff.simulation.datasets.ClientData or a mapping of client "
            f"ids to (x, y), got {type(clients).__name__}"
        )
    if not arrays:
        raise DataError(f"the {split} data has no clients; give at least one client with examples")
    return arrays


def client_id(client: Any, split: str) -> str:
    """A client's id as the runs name it: a string (an int id is written in digits)."""
    if isinstance(client, (str, np.str_)):
        return str(client)
    if isinstance(client, (int, np.integer)) and not isinstance(client, (bool, np.bool_)):
        return str(int(client))
    raise DataError(
        f"{split} client id {described(client)} is not a string or an int; name each client by "
        "a string"
    )


def described_briefly(value: Any) -> str:
    """A value's type, and its shape when it is an array, for a one-line error."""
    shape = getattr(value, "shape", None)
    kind = article_of(type(value))
    return f"{kind} of shape {tuple(shape)}" if shape is not None else kind


def example_arrays(where: str, x: Any, y: Any) -> ClientArrays:
    """One client's inputs `x` (a numeric array, one row per example, each with at least one
    value) and labels `y` (one number per example: `(n,)` or `(n, 1)`), as arrays with `y` of
    shape `(n,)`. Whatever else they are is a DataError naming `where` and the fix: ragged or
    string inputs, one-hot or NaN labels, as many labels as inputs."""
    try:
        x = np.asarray(x)
    except (ValueError, TypeError):
        raise DataError(
            f"{where}: its inputs are ragged (examples of different shapes); pad or crop them to "
            "one shape"
        ) from None
    if x.dtype.kind not in "biuf":
        problem = "ragged, mixed or strings" if x.dtype.kind == "O" else f"of dtype {x.dtype}"
        raise DataError(
            f"{where}: its inputs are {problem}, not one array of numbers; give x as numbers "
            "(encode text or categories as numbers first), every example of one shape"
        )
    if x.ndim == 0:
        raise DataError(f"{where}: its inputs are one number; give x with one row per example")
    if 0 in x.shape[1:]:
        raise DataError(
            f"{where}: its examples have shape {x.shape[1:]}, no values; give every example at "
            "least one feature"
        )
    try:
        y = np.asarray(y)
    except (ValueError, TypeError):
        raise DataError(
            f"{where}: its labels are ragged; give one class index per example"
        ) from None
    if y.dtype.kind not in "biuf":
        raise DataError(
            f"{where}: its labels are of dtype {y.dtype}, not numbers; give class indices "
            "0..num_classes-1 (np.unique(y, return_inverse=True)[1] makes them)"
        )
    if y.ndim == 0:
        raise DataError(f"{where}: its labels are one number; give one label per example")
    if y.ndim > 1 and int(np.prod(y.shape[1:])) != 1:
        raise DataError(
            f"{where}: its labels have shape {y.shape}, not one class index per example "
            "(one-hot?); give np.argmax(y, axis=1)"
        )
    y = y.reshape(len(y))
    if len(x) != len(y):
        raise DataError(
            f"{where}: {len(x)} inputs but {len(y)} labels; every example needs exactly one label"
        )
    if not np.all(np.isfinite(y)):
        raise DataError(f"{where}: its labels contain NaN or infinity; give every example a class")
    return x, y
