"""The clients a user gives the Python API, as checked per-client arrays.

The Python API (`tff_clustered.runs.api`) takes TFF's `ClientData`, or a mapping of client ids to
`(x, y)` or to mappings of arrays; they are turned into per-client arrays with one-line errors
naming the client and the fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from tff_clustered.data.client_source import LazyClients
from tff_clustered.data.client_source import federated_data as lazy_federated_data
from tff_clustered.data.federated_data import (
    ClientArrays,
    Clients,
    DataError,
    FederatedData,
    example_arrays,
    from_checked_arrays,
    split_train_test,
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


def split_off_test_sets(
    train_arrays: dict[str, ClientArrays], test_fraction: float, seed: int
) -> tuple[dict[str, ClientArrays], dict[str, ClientArrays]]:
    """Each client's examples shuffled (`DataStream.GIVEN_CLIENTS_SPLIT` of `seed`) and split:
    `test_fraction` of them its test set, the rest its training set."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = data_rng(seed, DataStream.GIVEN_CLIENTS_SPLIT)
    pairs = {}
    for client, (x, y) in train_arrays.items():
        if len(y) < 2:  # each side of a client's split keeps at least one example
            raise DataError(
                f"train client {client!r} has {len(y)} example(s); splitting off its test "
                "set needs at least 2 (give it more, drop it, or give test=)"
            )
        pairs[client] = split_train_test(x, y, 1 - test_fraction, rng)
    return {c: pair[0] for c, pair in pairs.items()}, {c: pair[1] for c, pair in pairs.items()}


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
        train_arrays, test_arrays = split_off_test_sets(train_arrays, test_fraction, seed)
    else:
        test_arrays = client_arrays(test, x_key, y_key, "test")
    if num_classes is None:
        labels = [y for split in (train_arrays, test_arrays) for _, y in split.values()]
        num_classes = max(int(max(np.max(y) for y in labels if len(y))) + 1, 1)
    refuse_missing_groups(planted_groups, train_arrays)
    return from_checked_arrays(
        name,
        train_arrays,
        test_arrays,
        num_classes,
        true_clusters=planted_groups,
        source="the given clients",
    )


def refuse_missing_groups(planted_groups: Optional[Mapping[str, int]], clients: Any) -> None:
    """Every client of `clients` needs a group in `planted_groups` (when given)."""
    if planted_groups is not None:
        missing = sorted(set(clients) - set(planted_groups))
        if missing:
            raise ValueError(
                f"planted_groups has no group for client {missing[0]!r}; give every client one"
            )
