"""The clients a user gives the Python API, as checked per-client arrays.

The Python API (`tff_clustered.runs.api`) takes TFF's `ClientData`, or a mapping of client ids to
`(x, y)` or to mappings of arrays; they are turned into per-client arrays with one-line errors
naming the client and the fix.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered.data.client_source import ClientCounts, LazyClients
from tff_clustered.data.client_source import federated_data as lazy_federated_data
from tff_clustered.data.federated_data import (
    ClientArrayDict,
    ClientArrays,
    Clients,
    DataError,
    FederatedData,
    checked_splits,
    example_arrays,
    train_count,
)
from tff_clustered.frameworks import tff
from tff_clustered.options import article_of, checked_value, described
from tff_clustered.seeds import DataStream, data_rng


def is_client_data(clients: object) -> bool:
    """Whether `clients` is TFF's `ClientData` (TFF is not imported to tell: a program that
    made one has imported it)."""
    return tff.imported and isinstance(clients, tff.simulation.datasets.ClientData)


def client_arrays(clients: Clients, x_key: str, y_key: str, split: str) -> dict[str, ClientArrays]:
    """Per-client `(x, y)` NumPy arrays from a ClientData or a mapping of clients, each client's
    checked by `example_arrays` (numbers, one whole-number label per example; their range is
    `from_checked_arrays`'s to check); client ids become strings, two ids that are the same
    string (1 and "1") are refused rather than merged."""
    if is_client_data(clients):
        arrays = {
            str(client): example_arrays(
                f"{split} client {client!r}",
                *clientdata_examples(clients, client, x_key, y_key, split),
            )
            for client in clients.client_ids
        }
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
        arrays: Sequence[ClientArrays],
        rows: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None,
    ) -> None:
        self.index, self.arrays, self.rows = index, arrays, rows

    def examples(self, client: str) -> ClientArrays:
        """Client `client`'s `(x, y)` of this split as given (not converted)."""
        i = self.index[client]
        x, y = self.arrays[i]
        if self.rows is None:
            return x, y
        order, starts, stops = self.rows
        taken = order[starts[i] : stops[i]]
        return x[taken], y[taken]

    def size(self, i: int) -> int:
        """Client number `i`'s examples in this split."""
        if self.rows is None:
            return len(self.arrays[i][1])
        return int(self.rows[2][i] - self.rows[1][i])

    def given(self) -> Iterator[tuple[str, ClientArrays]]:
        """Each client's `(x, y)` of this split as given, in order (for the checks)."""
        return ((c, self.examples(c)) for c in self.index)

    def __getitem__(self, client: str) -> ClientArrayDict:
        x, y = self.examples(client)
        return collections.OrderedDict(x=np.asarray(x, np.float32), y=y.astype(np.int32))

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def split_off_test_sets(
    train_arrays: dict[str, ClientArrays], test_fraction: float, seed: int
) -> tuple[GivenSplit, GivenSplit]:
    """Each client's examples shuffled (`DataStream.GIVEN_CLIENTS_SPLIT` of `seed`) and split:
    `test_fraction` of them its test set, the rest its training set (as `split_train_test`
    splits them), held as row orders into the given arrays."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = data_rng(seed, DataStream.GIVEN_CLIENTS_SPLIT)
    sizes = np.fromiter((len(y) for _, y in train_arrays.values()), np.int64, len(train_arrays))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    order = np.empty(int(sizes.sum()), np.min_scalar_type(int(sizes.max())))
    for i, (client, (_, y)) in enumerate(train_arrays.items()):
        if len(y) < 2:  # each side of a client's split keeps at least one example
            raise DataError(
                f"train client {client!r} has {len(y)} example(s); splitting off its test "
                "set needs at least 2 (give it more, drop it, or give test=)"
            )
        order[starts[i] : starts[i] + len(y)] = rng.permutation(len(y))
    cuts = starts + train_count(sizes, 1 - test_fraction).astype(np.int64)
    index = {c: i for i, c in enumerate(train_arrays)}
    arrays = list(train_arrays.values())
    return (
        GivenSplit(index, arrays, (order, starts, cuts)),
        GivenSplit(index, arrays, (order, cuts, starts + sizes)),
    )


def held_data(
    name: str,
    train: GivenSplit,
    test: GivenSplit,
    num_classes: int,
    planted_groups: Optional[dict[str, int]],
) -> FederatedData:
    """The given clients' `FederatedData`, holding `train` and `test` as they are: every client
    checked as `from_checked_arrays` checks it (the same errors, in the same order), its sizes
    counted in one array per split (`ClientCounts`) over the splits' shared index."""
    where = " in the given clients"
    missing = sorted(set(train) ^ set(test))
    if missing:
        raise DataError(
            f"client {missing[0]!r}{where} appears in only one of train/test; every client needs "
            "both splits (regenerate the split, or drop the client from both)"
        )
    input_shape = np.shape(train.examples(next(iter(train)))[0])[1:]
    checked_splits(train.given(), test.given(), input_shape, num_classes, None, where, keep=False)
    ids = list(train.index)
    counts = [
        np.fromiter(map(split.size, range(len(ids))), np.int64, len(ids)) for split in (train, test)
    ]
    return FederatedData(
        name=name,
        input_shape=tuple(int(d) for d in input_shape),
        num_classes=num_classes,
        train_sizes=ClientCounts(ids, train.index, counts[0]),
        test_sizes=ClientCounts(ids, train.index, counts[1][[test.index[c] for c in ids]]),
        true_clusters=planted_groups,
        train_arrays=train,
        test_arrays=test,
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
    train_arrays = client_arrays(train, x_key, y_key, "train")
    if test is None:
        held = split_off_test_sets(train_arrays, test_fraction, seed)
    else:
        test_arrays = client_arrays(test, x_key, y_key, "test")
        held = tuple(
            GivenSplit({c: i for i, c in enumerate(split)}, list(split.values()))
            for split in (train_arrays, test_arrays)
        )
    if num_classes is None:
        labels = [y for split in held for _, y in split.arrays]
        num_classes = max(int(max(np.max(y) for y in labels if len(y))) + 1, 1)
    refuse_missing_groups(planted_groups, train_arrays)
    return held_data(name, *held, num_classes, planted_groups)


def refuse_missing_groups(planted_groups: Optional[Mapping[str, int]], clients: Any) -> None:
    """Every client of `clients` needs a group in `planted_groups` (when given)."""
    if planted_groups is not None:
        missing = sorted(set(clients) - set(planted_groups))
        if missing:
            raise ValueError(
                f"planted_groups has no group for client {missing[0]!r}; give every client one"
            )
