"""The validation split: a seeded share of each client's training examples held out for tuning.

`--split=validation` trains on the rest of each client's training examples and scores the
held-out ones where a run otherwise scores its test examples; the test examples are never read.
The rule is ours (no paper fixes one): `VALIDATION_FRACTION` of a client's training examples,
rounded, at least one where the client has two or more and never all of them; a client with one
training example keeps it to train on and has no validation examples. Which examples are held
out is client k's own draw from the seed (`seeds.DataStream.VALIDATION_EXAMPLES`, part k), so
it does not depend on the other clients or on the order clients are read in.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tff_clustered.data.client_source import SourceArrays
from tff_clustered.data.federated_data import (
    ClientArrayDict,
    ClientSource,
    DataError,
    FederatedData,
)
from tff_clustered.seeds import DataStream, data_rng

# The share of each client's training examples held out as its validation set.
VALIDATION_FRACTION = 0.15


def validation_size(num_train: int) -> int:
    """How many of a client's `num_train` training examples are held out: `VALIDATION_FRACTION`
    of them rounded, at least one where it has two or more, never all."""
    if num_train < 2:
        return 0
    return int(min(max(round(VALIDATION_FRACTION * num_train), 1), num_train - 1))


def carved(arrays: ClientArrayDict, seed: int, client_index: int) -> dict[str, ClientArrayDict]:
    """One client's training `arrays` cut into `train` (kept to train on) and `test` (its
    validation examples), each in the examples' original order."""
    n = len(arrays["y"])
    order = data_rng(seed, DataStream.VALIDATION_EXAMPLES, client_index).permutation(n)
    held = np.sort(order[: validation_size(n)])
    kept = np.sort(order[validation_size(n) :])
    return {
        split: collections.OrderedDict((k, np.asarray(v)[rows]) for k, v in arrays.items())
        for split, rows in (("train", kept), ("test", held))
    }


class CarvedSizes(Mapping):
    """A split's example count per client of the validation view, from the training counts."""

    def __init__(self, train_sizes: Mapping[str, int], split: str) -> None:
        self._train_sizes, self._split = train_sizes, split
        index = getattr(train_sizes, "index", None)  # a compact source's shared client index
        if index is not None:
            self.index = index

    def __getitem__(self, client: str) -> int:
        n = self._train_sizes[client]
        return validation_size(n) if self._split == "test" else n - validation_size(n)

    def __contains__(self, client: object) -> bool:
        return client in self._train_sizes

    def __iter__(self) -> Iterator[str]:
        return iter(self._train_sizes)

    def __len__(self) -> int:
        return len(self._train_sizes)


@dataclasses.dataclass
class CarvedSource:
    """A lazily read population's validation view: a client's `train` and `test` are its
    training examples carved (`carved`); its test examples are never read."""

    base: Any  # the dataset's ClientSource (`client_source.LazyClients`)
    seed: int
    index: Mapping[str, int]

    def __getattr__(self, name: str) -> Any:  # input_shape, num_classes, cached, ...
        return getattr(self.base, name)

    @property
    def client_ids(self) -> Sequence[str]:
        return self.base.client_ids

    def arrays(self, split: str, client_id: str) -> ClientArrayDict:
        return carved(self.base.arrays("train", client_id), self.seed, self.index[client_id])[split]

    def arrays_of(self, split: str, client_ids: Sequence[str]) -> list[ClientArrayDict]:
        trains = self.base.arrays_of("train", client_ids)
        return [carved(a, self.seed, self.index[c])[split] for c, a in zip(client_ids, trains)]

    def prefetch(self, split: str, client_ids: Sequence[str]) -> int:
        return self.base.prefetch("train", client_ids)

    def held_together(self, split: str, client_ids: Sequence[str]) -> int:
        return self.base.held_together("train", client_ids)

    def fingerprint(self) -> str:
        return self.base.fingerprint()


def validation_view(data: FederatedData, seed: int) -> FederatedData:
    """`data` as a `--split=validation` run sees it: each client's training examples cut into
    those it trains on (`train`) and its validation examples (`test`, what the run scores),
    `evaluated_split` "validation"; the test examples are dropped, never read."""
    if not any(validation_size(n) for n in data.train_sizes.values()):
        raise DataError(
            f"--split=validation: no client of {data.name} has a validation example (a client "
            f"holds out {VALIDATION_FRACTION:.0%} of its training examples, at least one from 2 "
            "on, and these have at most 1 each); give the clients more training examples, or "
            "use --split=test"
        )
    index = data.client_index
    if data.source is not None:
        source: ClientSource = CarvedSource(data.source, seed, index)
        return dataclasses.replace(
            data,
            train_sizes=CarvedSizes(data.train_sizes, "train"),
            test_sizes=CarvedSizes(data.train_sizes, "test"),
            train_arrays=SourceArrays(source, "train"),  # type: ignore[arg-type]
            test_arrays=SourceArrays(source, "test"),  # type: ignore[arg-type]
            source=source,
            evaluated_split="validation",
        )
    splits: dict[str, dict[str, ClientArrayDict]] = {"train": {}, "test": {}}
    for client, arrays in data.train_arrays.items():
        for split, part in carved(arrays, seed, index[client]).items():
            splits[split][client] = part
    return dataclasses.replace(
        data,
        train_sizes={c: len(a["y"]) for c, a in splits["train"].items()},
        test_sizes={c: len(a["y"]) for c, a in splits["test"].items()},
        train_arrays=splits["train"],
        test_arrays=splits["test"],
        evaluated_split="validation",
    )
