"""The given clients read in one pass (`data/given_clients.py`, `federated_data.read_examples`)
against the per-client checks they screen for: the same errors, in the same order, and the same
row orders as one `rng.permutation` per client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import numpy as np
import pytest

from tff_clustered.data import federated_data as fd
from tff_clustered.data import given_clients
from tff_clustered.data.federated_data import DataError, checked_client, example_arrays


def population(num_clients: int, seed: int = 0) -> dict[str, tuple]:
    rng = np.random.default_rng(seed)
    return {
        f"c{i:03d}": (rng.normal(size=(6, 3)).astype(np.float32), rng.integers(0, 4, 6))
        for i in range(num_clients)
    }


def reference_error(clients: dict, num_classes: Optional[int]) -> Optional[str]:
    """The first error of the checks one client at a time, in their order: every client's
    `example_arrays`, the split's size, then `checked_client` on each client's train rows, then
    on its test rows (which rows fall on which side is read from the run's own split)."""
    try:
        arrays = {c: example_arrays(f"train client {c!r}", x, y) for c, (x, y) in clients.items()}
        for c, (_, y) in arrays.items():
            if len(y) < 2:
                raise DataError(f"train client {c!r} has {len(y)} example(s)")
        classes = num_classes or max(int(y.max()) for _, y in arrays.values()) + 1
        shape = next(iter(arrays.values()))[0].shape[1:]
        train, test = split_only(arrays)
        for name, split in (("train", train), ("test", test)):
            for c in split:
                where = f"client {c!r} ({name}) in the given clients"
                checked_client(where, *split.examples(c), shape, classes)
    except DataError as e:
        return str(e)
    return None


def split_only(arrays: dict) -> tuple:
    """The run's own train/test split of `arrays` (its row orders, from the same seed)."""
    sizes = np.array([len(y) for _, y in arrays.values()])
    index = dict(zip(arrays, range(len(arrays))))
    xs, ys = [x for x, _ in arrays.values()], [y for _, y in arrays.values()]
    read = fd.ExamplesRead(xs, ys, sizes, (), 0, [], index)
    return given_clients.split_off_test_sets(read, 0.2, 0, fd.Unhashed())


def first_error(clients: dict, num_classes: Optional[int]) -> Optional[str]:
    try:
        given_clients.federated_data(clients, num_classes=num_classes)
    except DataError as e:
        return str(e)
    return None


def at(client: str, change: Callable[[tuple], tuple]) -> Callable[[dict], None]:
    def apply(clients: dict) -> None:
        clients[client] = change(clients[client])

    return apply


def nan_input(row: int) -> Callable[[tuple], tuple]:
    def change(xy: tuple) -> tuple:
        x = xy[0].copy()
        x[row, 1] = np.nan
        return x, xy[1]

    return change


FAULTS = {
    "nan input": [at("c017", nan_input(0))],
    "nan inputs in two clients": [at("c030", nan_input(5)), at("c009", nan_input(2))],
    "label beyond the classes, then a nan": [
        at("c021", lambda xy: (xy[0], np.full(6, 9))),
        at("c040", nan_input(0)),
    ],
    "negative label late, fractional label later": [
        at("c033", lambda xy: (xy[0], np.array([0, 1, -1, 2, 0, 1]))),
        at("c050", lambda xy: (xy[0], xy[1] + 0.5)),
    ],
    "another shape": [at("c026", lambda xy: (np.zeros((6, 4), np.float32), xy[1]))],
    "float64 beyond float32": [at("c012", lambda xy: (xy[0].astype(np.float64) * 1e300, xy[1]))],
    "strings": [at("c044", lambda xy: (xy[0], xy[1].astype(str)))],
    "one example": [at("c036", lambda xy: (xy[0][:1], xy[1][:1]))],
    "one-hot labels after a nan": [
        at("c005", nan_input(3)),
        at("c047", lambda xy: (xy[0], np.eye(4)[xy[1]])),
    ],
    "lists and (n, 1) labels, no fault": [
        at("c002", lambda xy: (xy[0].tolist(), xy[1].reshape(-1, 1))),
        at("c003", lambda xy: (xy[0].astype(np.float64), xy[1].astype(np.float32))),
    ],
}


@pytest.mark.parametrize("num_classes", [None, 4])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_one_pass_refuses_what_the_checks_one_client_at_a_time_refuse_first(
    fault: str, num_classes: Optional[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fd, "SCREEN_CLIENTS", 8)  # many blocks, faults in different ones
    clients = population(56)
    for change in FAULTS[fault]:
        change(clients)
    expected = reference_error(clients, num_classes)
    found = first_error(clients, num_classes)
    if expected is None:
        assert found is None
    else:  # the split's size error is worded by the run alone; the client it names must agree
        assert found is not None and found.startswith(expected.split(" has ")[0]), (found, expected)
    assert (expected is None) == fault.endswith("no fault")


def test_clients_of_one_size_are_shuffled_as_one_permutation_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(given_clients, "SHUFFLED_ROWS", 12)  # runs cut into several calls
    sizes = np.array([3, 3, 3, 3, 3, 7, 2, 2, 7, 7, 7, 1_000, 4])
    one_by_one = np.random.default_rng(5)
    expected = np.concatenate([one_by_one.permutation(n) for n in sizes])
    rng = np.random.default_rng(5)
    assert np.array_equal(given_clients.shuffled_rows(sizes, rng), expected)
    assert rng.random() == one_by_one.random()  # the stream goes on where it would have
