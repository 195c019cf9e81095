"""The clients a user gives the Python API, as checked per-client arrays.

The Python API (`tff_clustered.runs.api`) takes TFF's `ClientData`, or a mapping of client ids to
`(x, y)` or to mappings of arrays; they are turned into per-client arrays with one-line errors
naming the client and the fix.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.data.client_source import ClientCounts, LazyClients
from tff_clustered.data.client_source import federated_data as lazy_federated_data
from tff_clustered.data.federated_data import (
    SCREEN_CLIENTS,
    ClientArrayDict,
    ClientArrays,
    Clients,
    DataError,
    DigestAside,
    ExamplesRead,
    FederatedData,
    GivenBlock,
    Unhashed,
    checked_client,
    gc_paused,
    read_examples,
    train_count,
)
from tff_clustered.frameworks import tff
from tff_clustered.options import article_of, checked_value, described
from tff_clustered.seeds import DataStream, data_rng

# The version of the given clients' digest (`read_examples`), before its digits: a checkpoint
# made before it holds `fingerprint.arrays_digest` of the split arrays (16 hex digits alone).
GIVEN_DIGEST = "given-v2"


def is_client_data(clients: object) -> bool:
    """Whether `clients` is TFF's `ClientData` (TFF is not imported to tell: a program that
    made one has imported it)."""
    return tff.imported and isinstance(clients, tff.simulation.datasets.ClientData)


def client_arrays(
    clients: Clients,
    x_key: str,
    y_key: str,
    split: str,
    digest: Any = None,
    input_shape: Optional[tuple[int, ...]] = None,
    num_classes: Optional[int] = None,
) -> ExamplesRead:
    """Per-client `(x, y)` NumPy arrays from a ClientData or a mapping of clients, read in one
    pass (`read_examples`: each client's checked by `example_arrays`, what `checked_client`
    refuses found, `digest` updated); client ids become strings, two ids that are the same
    string (1 and "1") are refused rather than merged. No `digest`: nothing is hashed."""
    digest = Unhashed() if digest is None else digest
    ids = GivenIds(split)
    if is_client_data(clients):
        keys = in_chunks(str(client) for client in clients.client_ids)
        chunks: Iterator[Sequence[Sequence]] = ((chunk, chunk) for chunk in keys)

        def examples(clients_ids: Sequence[str], _: Sequence) -> GivenExamples:
            def read(client: str) -> ClientArrays:
                return clientdata_examples(clients, client, x_key, y_key, split)

            return examples_in_turn(clients_ids, read)

    elif isinstance(clients, Mapping):
        chunks = zip(in_chunks(clients.keys()), in_chunks(clients.values()))

        def examples(clients_ids: Sequence[str], values: Sequence) -> GivenExamples:
            return pairs(clients_ids, values, x_key, y_key, f"{split} client", ids.key)

    else:
        raise TypeError(
            f"{split} data must be a tff.simulation.datasets.ClientData or a mapping of client "
            f"ids to (x, y), got {type(clients).__name__}"
        )
    read = read_examples(
        ids.blocks(chunks, examples),
        lambda client: f"{split} client {ids.key(client)!r}",
        digest,
        input_shape,
        num_classes,
    )
    if not read.xs:
        raise DataError(f"the {split} data has no clients; give at least one client with examples")
    read.index = ids.index
    return read


def in_chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """`items` in lists of `SCREEN_CLIENTS` (the last one shorter)."""
    items = iter(items)
    while chunk := list(itertools.islice(items, SCREEN_CLIENTS)):
        yield chunk


# Inputs and labels of clients in a row, up to the first client refused, with its position and
# its error (None: none refused).
GivenExamples = tuple[Sequence[Any], Sequence[Any], Optional[tuple[int, DataError]]]


class GivenIds:
    """The ids of one split's clients as one pass reads them (`blocks`): each client's key as a
    string (an int key in digits), its position (`index`), and its key as given when that was
    not a string (`key`, for the errors). A key that is neither, or two keys that are one
    string (1 and "1"), is refused where it comes, as one client at a time would find it."""

    def __init__(self, split: str) -> None:
        self.split = split
        self.index: dict[str, int] = {}
        self.given: dict[str, Any] = {}  # the keys given as other than strings, by id

    def key(self, client: str) -> Any:
        return self.given.get(client, client)

    def blocks(
        self,
        chunks: Iterable[Sequence[Sequence]],
        examples: Callable[[Sequence[str], Sequence], GivenExamples],
    ) -> Iterator[GivenBlock]:
        """A block of each chunk of `(keys, values)`: its clients' ids (`ids_of`) and their
        `examples(ids, values)`, up to the first client refused, whose error ends the last."""
        for keys, values in chunks:
            ids, error = self.ids_of(keys)
            xs, ys, refused = examples(ids, values[: len(ids)])
            at, error = refused or (len(ids), error)
            yield GivenBlock(ids[:at], xs[:at], ys[:at], error)
            if error is not None:
                return

    def ids_of(self, keys: Sequence[Any]) -> tuple[Sequence[str], Optional[DataError]]:
        """The ids of `keys` (placed in `index`), up to the first key that is not an id or
        repeats one, with its error."""
        kinds, error = set(map(type, keys)), None
        if kinds == {str}:
            ids: Sequence[str] = keys
        elif kinds == {int}:
            ids = list(map(str, keys))
        else:
            ids = []
            for key in keys:
                try:
                    ids.append(client_id(key, self.split))
                except DataError as refused:
                    error = refused
                    break
        at = len(self.index)
        self.index.update(zip(ids, range(at, at + len(ids))))
        if len(self.index) < at + len(ids):  # an id repeated: the first repeat ends the ids
            ids, error = self.before_repeat(ids, keys, at)
        if kinds != {str}:
            self.given.update(zip(ids, keys))
        return ids, error

    def before_repeat(
        self, ids: Sequence[str], keys: Sequence[Any], at: int
    ) -> tuple[Sequence[str], DataError]:
        """The ids of a chunk (its clients after the first `at`) before the first that repeats
        an id, and the error naming both keys."""
        seen = set(itertools.islice(self.index, at))  # the ids before the chunk, in order
        first: dict[str, int] = {}
        for k, client in enumerate(ids):
            if client in seen or client in first:
                earlier = self.key(client) if client in seen else keys[first[client]]
                return ids[:k], DataError(
                    f"{self.split} clients {earlier!r} and {keys[k]!r} are both client "
                    f"{client!r} (ids are compared as strings); rename one so no client's data "
                    "is lost"
                )
            first[client] = k
        raise AssertionError("no repeated id in a chunk whose ids repeat one")


def examples_in_turn(
    values: Sequence[Any], examples: Callable[[Any], ClientArrays]
) -> GivenExamples:
    """`examples(value)` of each of `values` in turn, up to the first DataError."""
    xs: list[Any] = []
    ys: list[Any] = []
    for value in values:
        try:
            x, y = examples(value)
        except DataError as error:
            return xs, ys, (len(xs), error)
        xs.append(x)
        ys.append(y)
    return xs, ys, None


def pairs(
    clients: Sequence[str],
    values: Sequence[Any],
    x_key: str,
    y_key: str,
    what: str,
    key: Callable[[str], Any],
) -> GivenExamples:
    """The inputs and labels of `clients`' values in a mapping, each an `(x, y)` pair or a
    mapping with `x_key` and `y_key`; errors name `what` and the client's key as given
    (`key(id)`). Values that are all 2-tuples are taken apart by one call."""
    if set(map(type, values)) == {tuple} and set(map(len, values)) == {2}:
        xs, ys = zip(*values) if values else ((), ())
        return xs, ys, None

    def pair(k: int) -> ClientArrays:
        value = values[k]
        if type(value) is tuple and len(value) == 2:
            return value
        if isinstance(value, Mapping):
            if x_key not in value or y_key not in value:
                raise DataError(
                    f"{what} {key(clients[k])!r} has keys {sorted(map(str, value))}; pass "
                    "x_key= and y_key="
                )
            return value[x_key], value[y_key]
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise DataError(
                f"{what} {key(clients[k])!r}: its value is {described_briefly(value)}, not an "
                f"(x, y) pair; give (inputs, labels) or a mapping with keys {x_key!r} and "
                f"{y_key!r}"
            )
        return value[0], value[1]

    return examples_in_turn(range(len(values)), pair)


def clientdata_examples(
    clients: tff.simulation.datasets.ClientData, client: str, x_key: str, y_key: str, split: str
) -> ClientArrays:
    """One client's `(x, y)` of a ClientData whose elements hold `x_key` and `y_key`, as
    NumPy arrays (a DataError naming the client when they cannot be)."""
    dataset = clients.create_tf_dataset_for_client(client)
    spec = dataset.element_spec
    if not isinstance(spec, Mapping) or x_key not in spec or y_key not in spec:
        raise DataError(
            f"{split} client {client!r}: elements are {spec}; pass x_key= and y_key= naming the "
            "inputs and the labels (TFF's EMNIST: x_key='pixels', y_key='label')"
        )
    batches = list(dataset.batch(1 << 16).as_numpy_iterator())
    if not batches:
        raise DataError(f"{split} client {client!r} has no examples; drop the client")
    try:
        x = np.concatenate([b[x_key] for b in batches])
    except ValueError:
        raise DataError(
            f"{split} client {client!r}: its examples have different shapes; pad or crop them "
            "to one shape"
        ) from None
    return x, np.concatenate([b[y_key] for b in batches])


def clientdata_source(
    train: tff.simulation.datasets.ClientData,
    test: tff.simulation.datasets.ClientData,
    x_key: str,
    y_key: str,
    num_classes: int,
) -> LazyClients:
    """The clients of `train` and `test` read by id when first needed; both must hold the same
    clients. Fingerprinted by the client ids alone (the examples are not read at start)."""
    ids = [client_id(c, "train") for c in train.client_ids]
    if len(set(ids)) != len(ids):
        raise DataError("train clients repeat an id; give every client one id")
    missing = sorted(set(ids) ^ {client_id(c, "test") for c in test.client_ids})
    if missing:
        raise DataError(
            f"client {missing[0]!r} appears in only one of train/test; every client needs both "
            "splits (drop the client from both)"
        )
    splits = {"train": train, "test": test}

    def read(split: str, client: str) -> ClientArrays:
        return clientdata_examples(splits[split], client, x_key, y_key, split)

    def digest() -> str:
        return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]

    return LazyClients(ids, None, read, num_classes, digest, where="the given clients")


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


def checked_groups(planted_groups: Optional[Mapping[str, int]]) -> Optional[dict[str, int]]:
    """The planted groups by client id, checked to be a mapping of clients (None: none)."""
    if planted_groups is None:
        return None
    if not isinstance(planted_groups, Mapping):
        raise TypeError(
            f"planted_groups must be a mapping of client -> group, got "
            f"{described(planted_groups)}; give {{client: group}}"
        )
    return {client_id(c, "planted_groups"): g for c, g in planted_groups.items()}


class GivenSplit(Mapping):
    """One split of the given clients -> their arrays (`FederatedData.train_arrays`), held as
    the user's own arrays and, for a split carved out of them, each client's rows: a client's
    rows are gathered and converted (x float32, y int32) when it is looked up, so the split
    holds no copy of the examples. `rows` is one array of every client's row order
    end to end, this split's share of client i being `rows[starts[i]:stops[i]]`; None: all of
    each client's rows."""

    def __init__(
        self,
        index: Mapping[str, int],
        xs: Sequence[np.ndarray],
        ys: Sequence[np.ndarray],
        rows: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None,
    ) -> None:
        self.index, self.xs, self.ys, self.rows = index, xs, ys, rows

    def examples(self, client: str) -> ClientArrays:
        """Client `client`'s `(x, y)` of this split as given (not converted)."""
        i = self.index[client]
        x, y = self.xs[i], self.ys[i]
        if self.rows is None:
            return x, y
        order, starts, stops = self.rows
        taken = order[starts[i] : stops[i]]
        return x[taken], y[taken]

    def sizes(self) -> np.ndarray:
        """Each client's examples in this split, in the index's order."""
        if self.rows is None:
            return np.fromiter(map(len, self.ys), np.int64, len(self.ys))
        return (self.rows[2] - self.rows[1]).astype(np.int64)

    def __getitem__(self, client: str) -> ClientArrayDict:
        x, y = self.examples(client)
        return collections.OrderedDict(x=np.asarray(x, np.float32), y=y.astype(np.int32))

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def ends_before(counts: np.ndarray) -> np.ndarray:
    """Where each of runs of `counts` items laid end to end starts."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def split_off_test_sets(
    read: ExamplesRead, test_fraction: float, seed: int, digest: Any
) -> tuple[GivenSplit, GivenSplit]:
    """Each client's examples shuffled (`DataStream.GIVEN_CLIENTS_SPLIT` of `seed`) and split:
    `test_fraction` of them its test set, the rest its training set (as `split_train_test`
    splits them), held as row orders into the given arrays (`digest` updated with them).
    Clients of one size in a row are shuffled at once (`shuffled_rows`)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    sizes = read.sizes
    few = np.flatnonzero(sizes < 2)  # each side of a client's split keeps at least one example
    if few.size:
        client = next(itertools.islice(read.index, int(few[0]), None))
        raise DataError(
            f"train client {client!r} has {sizes[few[0]]} example(s); splitting off its test "
            "set needs at least 2 (give it more, drop it, or give test=)"
        )
    starts = ends_before(sizes)
    order = shuffled_rows(sizes, data_rng(seed, DataStream.GIVEN_CLIENTS_SPLIT))
    cuts = starts + train_count(sizes, 1 - test_fraction).astype(np.int64)
    for start in range(0, len(order), ORDER_PIECE):  # as int64, a piece at a time
        digest.update(order[start : start + ORDER_PIECE].astype(np.int64))
    digest.update(cuts)
    return (
        GivenSplit(read.index, read.xs, read.ys, (order, starts, cuts)),
        GivenSplit(read.index, read.xs, read.ys, (order, cuts, starts + sizes)),
    )


# Rows shuffled by one call of `Generator.permuted` (a bound on its array's memory).
SHUFFLED_ROWS = 1 << 22
# Rows of the split's order hashed at once, as int64 (8 MB: the whole order as int64 would
# be 8 bytes a row of the population's examples).
ORDER_PIECE = 1 << 20


def shuffled_rows(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`rng.permutation(n)` of each client's `n` of `sizes` in turn, laid end to end (in the
    smallest unsigned type that holds them). Each run of clients of one size is shuffled by
    `rng.permuted` along rows, which draws as those permutations one after another would."""
    order = np.empty(int(sizes.sum()), np.min_scalar_type(int(sizes.max())))
    changes = np.flatnonzero(np.diff(sizes)) + 1
    at = 0
    for first, stop in zip(np.concatenate([[0], changes]), np.append(changes, len(sizes))):
        n = int(sizes[first])
        for part in range(first, stop, max(SHUFFLED_ROWS // n, 1)):
            clients = min(stop - part, max(SHUFFLED_ROWS // n, 1))
            rows = np.tile(np.arange(n, dtype=order.dtype), (clients, 1))
            rng.permuted(rows, axis=1, out=rows)
            order[at : at + rows.size] = rows.ravel()
            at += rows.size
    return order


def held_data(
    name: str,
    held: tuple[GivenSplit, GivenSplit],
    reads: tuple[ExamplesRead, ExamplesRead],
    num_classes: int,
    planted_groups: Optional[dict[str, int]],
    digest: Any,
) -> FederatedData:
    """The given clients' `FederatedData`, holding the `held` train and test splits as they
    are, their clients checked as `from_checked_arrays` checks them (the same errors, in the
    same order: the clients each split's `reads` found refused, by `checked_client`), its
    sizes counted in one array per split (`ClientCounts`) over the splits' shared index, its
    examples' digest the one `digest` made while reading them."""
    train, test = held
    where = " in the given clients"
    missing = [] if train.index is test.index else sorted(set(train) ^ set(test))
    if missing:
        raise DataError(
            f"client {missing[0]!r}{where} appears in only one of train/test; every client needs "
            "both splits (regenerate the split, or drop the client from both)"
        )
    input_shape = reads[0].input_shape
    for split_name, split, read in zip(("train", "test"), held, reads):
        ids = list(split.index) if read.doubted else []
        for i in read.doubted:
            context = f"client {ids[i]!r} ({split_name}){where}"
            checked_client(context, *split.examples(ids[i]), input_shape, num_classes)
    ids = list(train.index)
    test_sizes = test.sizes()
    if test.index is not train.index:
        test_sizes = test_sizes[[test.index[c] for c in ids]]
    return FederatedData(
        name=name,
        input_shape=tuple(int(d) for d in input_shape),
        num_classes=num_classes,
        train_sizes=ClientCounts(ids, train.index, train.sizes()),
        test_sizes=ClientCounts(ids, train.index, test_sizes),
        true_clusters=planted_groups,
        train_arrays=train,
        test_arrays=test,
        examples_digest=f"{GIVEN_DIGEST}:{digest.hexdigest()[:16]}",
    )


def federated_data(
    train: Clients,
    test: Optional[Clients] = None,
    *,
    name: str = "custom",
    num_classes: Optional[int] = None,
    x_key: str = "x",
    y_key: str = "y",
    test_fraction: float = 0.2,
    seed: int = 0,
    planted_groups: Optional[Mapping[str, int]] = None,
) -> FederatedData:
    """Your clients as the runs' `FederatedData`. Without `test`, each client's examples are
    shuffled (from `seed`) and `test_fraction` of them become its test set. `num_classes`
    defaults to the largest label + 1. `planted_groups` (client -> group), when you know them,
    make each run report how well its clusters recover them (adjusted Rand).

    A `ClientData` `train` with a `ClientData` `test` and `num_classes` given is read lazily:
    each client's examples when a round first samples or scores it, checked then
    (`client_source.LazyClients`, a bounded cache), its size counted at that read; otherwise
    every client is read and checked here (splitting off test sets and finding `num_classes`
    need every client's examples).

    Everything is checked before it is used: a wrong argument, or a client whose examples are
    not numbers with one class index each, is one line naming it and the fix (`DataError`, a
    ValueError, or a TypeError for an argument of a wrong type)."""
    owner = "federated_data"
    name = checked_value(owner, "name", name, str)
    x_key = checked_value(owner, "x_key", x_key, str)
    y_key = checked_value(owner, "y_key", y_key, str)
    seed = checked_value(owner, "seed", seed, int)
    test_fraction = checked_value(owner, "test_fraction", test_fraction, float)
    num_classes = checked_value(owner, "num_classes", num_classes, Optional[int])
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if num_classes is not None and num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}; or leave it out")
    planted_groups = checked_groups(planted_groups)
    if is_client_data(train) and is_client_data(test) and num_classes:
        source = clientdata_source(train, test, x_key, y_key, num_classes)
        refuse_missing_groups(planted_groups, source.client_ids)
        return lazy_federated_data(name, source, true_clusters=planted_groups)
    with gc_paused(), DigestAside(hashlib.sha256()) as digest:  # a pass over every client
        train_read = client_arrays(train, x_key, y_key, "train", digest, None, num_classes)
        if test is None:
            held = split_off_test_sets(train_read, test_fraction, seed, digest)
            reads = (train_read, train_read)  # one pass read both splits' examples
        else:
            shape = train_read.input_shape
            test_read = client_arrays(test, x_key, y_key, "test", digest, shape, num_classes)
            reads = (train_read, test_read)
            held = tuple(GivenSplit(read.index, read.xs, read.ys) for read in reads)
        if num_classes is None:
            num_classes = max(max(read.largest for read in reads) + 1, 1)
        refuse_missing_groups(planted_groups, train_read.index)
        return held_data(name, held, reads, num_classes, planted_groups, digest)


def refuse_missing_groups(planted_groups: Optional[Mapping[str, int]], clients: Any) -> None:
    """Every client of `clients` needs a group in `planted_groups` (when given)."""
    if planted_groups is not None:
        missing = sorted(set(clients) - set(planted_groups))
        if missing:
            raise ValueError(
                f"planted_groups has no group for client {missing[0]!r}; give every client one"
            )
