"""A federated dataset: per-client train and test arrays (and TFF's `ClientData` on request).

Every loader returns a `FederatedData` built by `from_arrays`, which validates the arrays
once (each client's by `example_arrays`, the dataset's by `from_checked_arrays`), with errors
that name the client, the source file and the fix.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol, Union

import numpy as np

if TYPE_CHECKING:  # TFF is imported only when a ClientData is asked for (`client_datasets`)
    import tensorflow_federated as tff

ClientArrays = tuple[np.ndarray, np.ndarray]  # (x, y)
ClientArrayDict = Mapping[str, np.ndarray]  # OrderedDict(x=..., y=...)

INT64 = np.dtype(np.int64)  # the labels' type once checked (NumPy's own, native-endian dtype)
# Clients whose examples one pass (`read_examples`) checks at once: a block's arrays are
# concatenated, so its memory is bounded by this many clients' examples.
SCREEN_CLIENTS = 4096


# A federated dataset: TFF's ClientData, or per-client arrays, each `(x, y)` or a mapping with
# the inputs under `x_key` and the labels under `y_key`.
Clients = Union["tff.simulation.datasets.ClientData", Mapping[str, Any]]


class DataError(ValueError):
    """Bad input data: the message names the problem, where it is, and the fix."""


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (its type name if it has none), to quote
    inside a one-line DataError."""
    text = str(error)
    return text.splitlines()[0] if text.strip() else type(error).__name__


def unreadable_examples(client: str, error: BaseException) -> DataError:
    """The error of a client (`client`: who and where, e.g. "client 'c1' (train) in FILE")
    whose stored examples cannot be read: a damaged row or page, an undecodable record."""
    return DataError(
        f"{client}: its examples cannot be read ({type(error).__name__}: "
        f"{first_line(error)[:200]}); regenerate the file"
    )


class ClientSource(Protocol):
    """Clients whose examples are read when first needed (`client_source.LazyClients`)."""

    client_ids: Sequence[str]

    def arrays(self, split: str, client_id: str) -> ClientArrayDict: ...

    def arrays_of(self, split: str, client_ids: Sequence[str]) -> list[ClientArrayDict]: ...

    def fingerprint(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class FederatedData:
    name: str
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
    # what a round sends its clients (they build their batches themselves, `federated.batching`).
    train_arrays: Mapping[str, ClientArrayDict] = dataclasses.field(default_factory=dict)
    test_arrays: Mapping[str, ClientArrayDict] = dataclasses.field(default_factory=dict)

    # Where the examples are read from when a client is first needed (`client_source`); None:
    # every client's arrays are in `train_arrays` and `test_arrays`.
    source: Optional[ClientSource] = None
    # A digest of every client's examples made while they were read (the Python API's given
    # clients, `given_clients.federated_data`); None: `fingerprint.arrays_digest` of the arrays.
    examples_digest: Optional[str] = None
    # The examples `test` holds: "test", or "validation" (held out of the training examples by
    # `--split=validation`, `data/validation.py`): what a run's evaluation rows say they scored.
    evaluated_split: str = "test"

    @property
    def client_ids(self) -> list[str]:
        return list(self.source.client_ids if self.source else self.train_arrays)

    @property
    def num_clients(self) -> int:
        """How many clients there are (no list of their ids made)."""
        return len(self.source.client_ids if self.source else self.train_arrays)

    @functools.cached_property
    def train(self) -> tff.simulation.datasets.ClientData:
        """The training split as TFF's `ClientData` (made on first use; a run never asks)."""
        return self.client_data("train")

    @functools.cached_property
    def test(self) -> tff.simulation.datasets.ClientData:
        """The test split as TFF's `ClientData` (made on first use; a run never asks)."""
        return self.client_data("test")

    def client_data(self, split: str) -> tff.simulation.datasets.ClientData:
        """`split` as TFF's `ClientData`, each client's dataset made from its arrays."""
        from tff_clustered.data.client_datasets import ArraysClientData

        return ArraysClientData(
            self.client_ids, functools.partial(self.arrays, split), self.input_shape
        )

    @property
    def client_index(self) -> Mapping[str, int]:
        """Each client's position in `client_ids` (the run's random streams are per position):
        the source's own index where it keeps one in that order, else made here."""
        sizes = self.train_sizes
        index = getattr(sizes, "index", None)
        if index is not None and len(index) == len(sizes):
            return index
        return {c: i for i, c in enumerate(self.client_ids)}

    def arrays(self, split: str, client_id: str) -> ClientArrayDict:
        """A client's examples of `split` ("train" or "test") as arrays."""
        if self.source is not None:
            return self.source.arrays(split, client_id)
        return (self.train_arrays if split == "train" else self.test_arrays)[client_id]

    def arrays_of(self, split: str, client_ids: Sequence[str]) -> list[ClientArrayDict]:
        """Each of `client_ids`' examples of `split` as arrays (`arrays`; a lazy source reads
        the ones it has not cached together)."""
        if self.source is not None:
            return self.source.arrays_of(split, client_ids)
        return [self.arrays(split, c) for c in client_ids]


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
    """Validates per-client `(x, y)` arrays and wraps them as `ClientData`: each client's
    examples by `example_arrays`, then the whole dataset by `from_checked_arrays`."""
    where = f" in {source}" if source else ""
    checked = [
        {
            cid: example_arrays(f"client {cid!r} ({split_name}){where}", x, y)
            for cid, (x, y) in split.items()
        }
        for split_name, split in (("train", train), ("test", test))
    ]
    return from_checked_arrays(
        name,
        *checked,
        num_classes,
        image_shape=image_shape,
        true_clusters=true_clusters,
        source=source,
        public_x=public_x,
        vocabulary_size=vocabulary_size,
    )


def checked_public_inputs(public_x: np.ndarray, input_shape: tuple, where: str) -> np.ndarray:
    """The server's unlabeled inputs as float32, checked: not empty, finite, with the clients'
    per-example `input_shape` (`where`: the data's source, for the errors)."""
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
    return public_x


def from_checked_arrays(
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
    """`from_arrays` for clients whose `(x, y)` already passed `example_arrays` (examples with
    whole-number labels, one per example): checks what the dataset as a whole decides, that every
    client is in both splits with examples of one shape, finite inputs (token ids
    0..vocabulary_size-1 with `vocabulary_size`) and labels 0..num_classes-1; `public_x`, the
    server's unlabeled inputs if any, must be finite with the clients' per-example shape."""
    where = f" in {source}" if source else ""
    if not train:
        raise DataError(f"dataset {name!r}{where} has no clients; check the data path")
    missing = sorted(set(train) ^ set(test))
    if missing:
        raise DataError(
            f"client {missing[0]!r}{where} appears in only one of train/test; every client needs "
            "both splits (regenerate the split, or drop the client from both)"
        )
    input_shape = np.shape(next(iter(train.values()))[0])[1:]
    cleaned = checked_splits(
        train.items(), test.items(), input_shape, num_classes, vocabulary_size, where
    )
    if public_x is not None:
        public_x = checked_public_inputs(public_x, input_shape, where)
    return FederatedData(
        name=name,
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


def checked_splits(
    train: Iterable[tuple[str, ClientArrays]],
    test: Iterable[tuple[str, ClientArrays]],
    input_shape: tuple[int, ...],
    num_classes: int,
    vocabulary_size: Optional[int],
    where: str,
) -> dict[str, dict[str, ClientArrayDict]]:
    """Every client of both splits (client id, `(x, y)` pairs) checked by `checked_client`
    (train first, `where` naming the data's source in the errors); their checked arrays by
    split."""
    cleaned: dict[str, dict[str, ClientArrayDict]] = {"train": {}, "test": {}}
    for split_name, split in (("train", train), ("test", test)):
        for cid, (x, y) in split:
            checked = checked_client(
                f"client {cid!r} ({split_name}){where}",
                x,
                y,
                input_shape,
                num_classes,
                vocabulary_size,
            )
            cleaned[split_name][cid] = checked
    return cleaned


def checked_client(
    context: str,
    x: Any,
    y: np.ndarray,
    input_shape: tuple[int, ...],
    num_classes: int,
    vocabulary_size: Optional[int] = None,
) -> ClientArrayDict:
    """One client's examples that passed `example_arrays`, checked against what the dataset as a
    whole decides (`context` names the client in the errors): examples of `input_shape`, finite
    inputs (token ids 0..vocabulary_size-1 with `vocabulary_size`) and labels
    0..num_classes-1. Returns OrderedDict(x=float32, y=int32), what a round sends a client."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[1:] != tuple(input_shape):
        raise DataError(
            f"{context}: examples of shape {x.shape[1:]}, others have {tuple(input_shape)}; "
            "all inputs must share one shape"
        )
    if not np.all(np.isfinite(x)):
        raise DataError(f"{context}: inputs contain NaN or infinity; clean the data")
    if vocabulary_size is not None and not (
        np.all(np.mod(x, 1) == 0) and np.all((x >= 0) & (x < vocabulary_size))
    ):
        raise DataError(
            f"{context}: inputs must be token ids 0..{vocabulary_size - 1}; fix the tokenisation"
        )
    if np.any(y < 0):
        raise DataError(
            f"{context}: label {int(y.min())} is negative; labels are class indices "
            f"0..{num_classes - 1}, fix the labels"
        )
    bad = y[y >= num_classes]
    if bad.size:
        raise DataError(
            f"{context}: label {int(bad[0])} is outside the model's {num_classes} classes "
            f"0..{num_classes - 1}; fix the labels or raise --num_classes"
        )
    return collections.OrderedDict(x=x, y=y.astype(np.int32))


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


def train_count(sizes: Any, train_fraction: float) -> Any:
    """How many of a client's `sizes` examples (an int, or an array of clients' sizes) its
    training side keeps when split: `train_fraction` of them, each side at least one."""
    return np.clip(np.floor(train_fraction * np.asarray(sizes)), 1, np.asarray(sizes) - 1)


def split_train_test(
    x: np.ndarray, y: np.ndarray, train_fraction: float, rng: np.random.Generator
) -> tuple[ClientArrays, ClientArrays]:
    """Shuffles one client's examples and splits them; each side keeps at least one example."""
    order = rng.permutation(len(y))
    n_train = int(train_count(len(y), train_fraction))
    tr, te = order[:n_train], order[n_train:]
    return (x[tr], y[tr]), (x[te], y[te])


def example_arrays(where: str, x: Any, y: Any) -> ClientArrays:
    """One client's inputs `x` (a numeric array, one row per example, each with at least one
    value) and labels `y` (one whole number per example: `(n,)` or `(n, 1)`), as arrays with `y`
    int64 of shape `(n,)`. Whatever else they are is a DataError naming `where` and the fix:
    no examples, ragged or string inputs, one-hot, NaN or fractional labels, not as many labels
    as inputs.
    The labels' range is the dataset's to check (`from_checked_arrays`: the API may derive
    `num_classes` from them)."""
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
    if len(x) == 0:
        raise DataError(
            f"{where} has no examples; remove the client or give it data in both splits"
        )
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
    y = y if y.ndim == 1 else y.reshape(len(y))
    if len(x) != len(y):
        raise DataError(
            f"{where}: {len(x)} inputs but {len(y)} labels; every example needs exactly one label"
        )
    if not np.all(np.isfinite(y)):
        raise DataError(f"{where}: its labels contain NaN or infinity; give every example a class")
    if not np.all(np.equal(np.mod(y.astype(np.float64), 1), 0)):
        raise DataError(f"{where}: labels must be whole numbers (class indices); fix the labels")
    return x, y.astype(np.int64, copy=False)  # the caller's own labels when they are int64


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (as it was after): for a pass over millions of
    clients that makes short-lived objects but no cycles, where each collection would walk
    every object the process holds (the user's clients among them), doubling the pass."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Unhashed:
    """A digest that hashes nothing, for examples read without a fingerprint."""

    def update(self, data: Any) -> None:
        del data


class DigestAside:
    """A hash object (hashlib's) updated on a thread of its own, so that hashing a block of
    examples overlaps reading the next (hashlib lets go of the GIL while it hashes a large
    buffer). One thread takes the updates in their order; an update waits while more than
    `PENDING` are queued, so at most about two blocks are held for it. Leaving the `with`
    block waits for the last update."""

    PENDING = 8  # updates queued at most: a block makes 5

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.thread = concurrent.futures.ThreadPoolExecutor(1, "digest")
        self.pending: collections.deque[concurrent.futures.Future] = collections.deque()

    def update(self, data: Any) -> None:
        while len(self.pending) >= self.PENDING:
            self.pending.popleft().result()  # an error of the hashing raises here
        self.pending.append(self.thread.submit(self.digest.update, data))

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def hexdigest(self) -> str:
        self.wait()
        return self.digest.hexdigest()

    def __enter__(self) -> DigestAside:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.wait()
        finally:
            self.thread.shutdown(wait=True)


@dataclasses.dataclass
class GivenBlock:
    """Up to `SCREEN_CLIENTS` clients as given, in order, for `read_examples`: each one's id,
    inputs and labels; `error` is what the client after the last one raised (the clients
    before it are checked first, so their errors come first, as one client at a time)."""

    ids: Sequence[str]
    xs: Sequence[Any]
    ys: Sequence[Any]
    error: Optional[DataError] = None


def owners(bad_rows: np.ndarray, clients: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """The entries of `clients` owning a True of `bad_rows` (their rows end to end, client
    k's `lengths[k]` of them)."""
    if not bad_rows.any():
        return []
    owner = np.repeat(np.arange(len(clients)), lengths)
    return [clients[k] for k in np.unique(owner[bad_rows])]


def plain_examples(x: Any, y: Any) -> bool:
    """Whether `example_arrays` takes `(x, y)` as they are, unless a fractional or non-finite
    float label refuses them (`read_examples` screens those): arrays of numbers, x with
    at least one example of at least one value, y one label per example."""
    return (
        type(x) is np.ndarray
        and type(y) is np.ndarray
        and x.dtype.kind in "biuf"
        and y.dtype.kind in "biuf"
        and x.ndim >= 1
        and x.size > 0
        and y.ndim == 1
        and len(x) == len(y)
    )


DTYPE, SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")


def end_to_end(
    arrays: Sequence[np.ndarray], dtype: Any, dtypes: Optional[set[np.dtype]] = None
) -> np.ndarray:
    """`arrays` (of one shape but the first axis) concatenated as a C-contiguous array of
    `dtype`: the bytes of their buffers joined when they are all of `dtype` (`dtypes`, the
    set of their dtypes when the caller knows it) and C-contiguous (`bytes.join` refuses an
    array that is not; thousands of small arrays: 2.5x faster than `np.concatenate`, which
    handles each array as an object), else concatenated and converted."""
    if (set(map(DTYPE, arrays)) if dtypes is None else dtypes) == {np.dtype(dtype)}:
        try:
            joined = np.frombuffer(b"".join(arrays), dtype)
        except TypeError:  # an array that is not C-contiguous
            pass
        else:
            return joined.reshape(-1, *arrays[0].shape[1:])
    return np.ascontiguousarray(np.concatenate(arrays), dtype)


class PlainBlock(NamedTuple):
    """What `plain_sizes` found of a block whose every `(x, y)` is `plain_examples`."""

    sizes: np.ndarray  # each client's examples
    label_types: set[np.dtype]
    input_types: set[np.dtype]
    input_shapes: set[tuple[int, ...]]


def plain_sizes(xs: Sequence[Any], ys: Sequence[Any]) -> Optional[PlainBlock]:
    """Each client's examples and the block's dtypes and input shapes when every `(x, y)` of a
    block is `plain_examples` (None when one may not be), found from the sets of the block's
    classes, dtypes and shapes (a pass over the inputs and one over the labels for each)
    rather than one call per client; the sizes are read client by client only when the shapes
    differ."""
    try:
        classes = set(map(type, xs)) | set(map(type, ys))
        x_types, y_types = set(map(DTYPE, xs)), set(map(DTYPE, ys))
        x_shapes, y_shapes = set(map(SHAPE, xs)), set(map(SHAPE, ys))
    except Exception:  # noqa: BLE001 - not arrays: `plain_examples` tells client by client
        return None
    if classes != {np.ndarray} or any(d.kind not in "biuf" for d in x_types | y_types):
        return None
    if any(len(s) != 1 for s in y_shapes) or any(not s or 0 in s for s in x_shapes):
        return None  # y not one label per example; x without an example of one value
    if len(x_shapes) == len(y_shapes) == 1:  # every client of one size
        size = next(iter(y_shapes))[0]
        if next(iter(x_shapes))[0] != size:
            return None
        return PlainBlock(np.full(len(ys), size, np.int64), y_types, x_types, x_shapes)
    sizes = np.fromiter(map(len, ys), np.int64, len(ys))
    same = np.array_equal(np.fromiter(map(len, xs), np.int64, len(xs)), sizes)
    return PlainBlock(sizes, y_types, x_types, x_shapes) if same else None


@dataclasses.dataclass
class ExamplesRead:
    """What one pass over clients' examples found (`read_examples`)."""

    xs: list[np.ndarray]  # each client's inputs and labels as `example_arrays` returns them
    ys: list[np.ndarray]
    sizes: np.ndarray  # each client's examples, in order
    input_shape: tuple[int, ...]
    largest: int  # the largest label
    doubted: list[int]  # the positions of the clients `checked_client` refuses
    index: dict[str, int] = dataclasses.field(default_factory=dict)  # id -> position

    def by_client(self) -> dict[str, ClientArrays]:
        """Each client's (x, y) by its id."""
        return dict(zip(self.index, zip(self.xs, self.ys)))


def read_examples(
    blocks: Iterable[GivenBlock],
    where: Callable[[str], str],
    digest: Any,
    input_shape: Optional[tuple[int, ...]] = None,
    num_classes: Optional[int] = None,
) -> ExamplesRead:
    """Every client of `blocks` read in one pass, a block at a time, with no NumPy call per
    client when a block's data is plain (`plain_sizes`, else `plain_examples` per client):

    * `example_arrays` checks each client (`where(id)` naming it): plain arrays are taken as
      they are, their float labels screened a block at a time (whole, finite); every other
      client, and each one the screen doubts, goes through `example_arrays` itself, in order,
      so the errors are its own;
    * what `checked_client` would refuse once every client passed `example_arrays` is found a
      block at a time (`doubted`): examples of another shape than `input_shape` (None: the
      first client's), inputs not finite as float32, negative labels, labels beyond
      `num_classes` (None: the classes are the labels');
    * `digest` is updated with each block (`screened_block`).

    The clients' ids are the blocks' (`index` is left to the caller that made them)."""
    read = ExamplesRead([], [], np.zeros(0, np.int64), input_shape or (), -1, [])
    sizes: list[np.ndarray] = []
    for block in blocks:
        xs, ys, block_sizes, kinds = block_examples(block, where)
        if input_shape is None and len(xs):
            read.input_shape = input_shape = xs[0].shape[1:]
        screened, largest = screened_block(
            block.ids, xs, ys, block_sizes, input_shape, num_classes, digest, kinds
        )
        read.doubted += [len(read.xs) + k for k in screened]
        read.largest = max(read.largest, largest)
        read.xs += xs
        read.ys += ys
        sizes.append(block_sizes)
        if block.error is not None:
            raise block.error
    read.sizes = np.concatenate(sizes) if sizes else read.sizes
    return read


def block_examples(
    block: GivenBlock, where: Callable[[str], str]
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, Optional[PlainBlock]]:
    """A block's inputs and labels as `example_arrays` returns them (`read_examples`' first
    step), each client's examples, and what `plain_sizes` found of the inputs' dtypes and
    shapes (None when it found none, or some client went through `example_arrays`, which may
    convert its inputs)."""
    xs, ys = block.xs, block.ys
    found = plain_sizes(xs, ys)
    if found is None:  # some client is doubted: the sizes are counted once checked below
        plain = [k for k, (x, y) in enumerate(zip(xs, ys)) if plain_examples(x, y)]
        doubted = set(range(len(xs))) - set(plain)
        label_types = {ys[k].dtype for k in plain}
    else:
        sizes, label_types = found.sizes, found.label_types
        plain, doubted = range(len(xs)), set()
    if any(t.kind == "f" for t in label_types):
        floats = [k for k in plain if ys[k].dtype.kind == "f"]
        y = np.concatenate([ys[k] for k in floats]).astype(np.float64)
        whole = np.isfinite(y) & (np.mod(y, 1) == 0)
        doubted.update(owners(~whole, floats, [len(ys[k]) for k in floats]))
    if doubted or label_types != {INT64}:
        arrays = [
            example_arrays(where(client), x, y)
            if k in doubted
            else (x, y if y.dtype is INT64 else y.astype(np.int64))
            for k, (client, x, y) in enumerate(zip(block.ids, xs, ys))
        ]
        xs, ys = [x for x, _ in arrays], [y for _, y in arrays]
        sizes = np.fromiter(map(len, ys), np.int64, len(ys))
    return list(xs), list(ys), sizes, None if found is None or doubted else found


def screened_block(
    clients: Sequence[str],
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    sizes: np.ndarray,
    input_shape: tuple[int, ...],
    num_classes: Optional[int],
    digest: Any,
    kinds: Optional[PlainBlock] = None,
) -> tuple[list[int], int]:
    """The positions in a block of `clients`' inputs `xs` and labels `ys` (that passed
    `example_arrays`, `sizes` examples each) of the clients `checked_client` refuses: examples
    of another shape than `input_shape`, inputs not finite as float32, labels below 0 or (with
    `num_classes`) beyond the classes; and the block's largest label (-1: none checked). From
    the same concatenation of the block's examples, updates `digest` with the block: the
    lengths of the encoded ids, the ids, the sizes, the inputs as float32 and the labels as
    int64 (of the clients of `input_shape`: another is refused, so the bytes need no
    delimiter). `kinds`: the inputs' dtypes and shapes, when `plain_sizes` found them."""
    if all(s[1:] == input_shape for s in (kinds.input_shapes if kinds else set(map(SHAPE, xs)))):
        shaped: Sequence[int] = range(len(xs))
    else:
        shaped = [k for k, x in enumerate(xs) if x.shape[1:] == input_shape]
        xs, ys, kinds = [xs[k] for k in shaped], [ys[k] for k in shaped], None
    doubted = sorted(set(range(len(clients))) - set(shaped))
    id_lengths, ids = encoded_ids(clients)
    digest.update(id_lengths.tobytes())
    digest.update(ids)
    lengths = sizes[shaped]
    digest.update(lengths.tobytes())
    if not shaped:
        return doubted, -1
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32's range: refused
        input_types = kinds.input_types if kinds else set(map(DTYPE, xs))
        if len(input_types) > 1:  # each converted alone, as a round converts it
            xs, input_types = [np.asarray(x, np.float32) for x in xs], {np.dtype(np.float32)}
        x = end_to_end(xs, np.float32, input_types)
        # One sum is finite unless an input is not (or the sum passes float32's range: then
        # each example is looked at).
        suspect = xs[0].dtype.kind == "f" and not np.isfinite(x.sum())
    if suspect:
        bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
        doubted += owners(bad, shaped, lengths)
    y = end_to_end(ys, np.int64, {INT64} if kinds else None)  # plain labels: made int64
    bad = (y < 0) | (y >= num_classes) if num_classes is not None else y < 0
    doubted += owners(bad, shaped, lengths)
    digest.update(x)
    digest.update(y)
    return sorted(set(doubted)), int(y.max())


def encoded_ids(clients: Sequence[str]) -> tuple[np.ndarray, bytes]:
    """Each of `clients`' length in UTF-8 bytes, and their UTF-8 bytes end to end (encoded by
    one call: when the bytes are as many as the characters, every id is ASCII, one byte a
    character)."""
    joined = "".join(clients).encode()
    lengths = np.fromiter(map(len, clients), np.int64, len(clients))
    if len(joined) != int(lengths.sum()):  # an id beyond ASCII: each one's bytes counted
        lengths = np.fromiter((len(c.encode()) for c in clients), np.int64, len(clients))
    return lengths, joined
