"""Clients whose examples are read when a round samples or scores them, not at start.

A `LazyClients` holds the population's client ids and example counts (read at start from a
small table, e.g. TFF's `client_metadata`) and a reader of one client's examples by id. A
client's examples are read and validated at their first use, with the errors the in-memory
path gives (`federated_data.checked_client`, naming the client), and kept in a bounded
least-recently-used cache: a population of 10^6 clients costs the memory of the clients a
round touches, not of the population. A source that can read several clients at once
(`read_many`, e.g. one SQL query and one parse for them all) reads the clients of a round that
are not cached together (`LazyClients.arrays_of`), with the same validation and errors.
`federated_data(source)` wraps it as the runs' `FederatedData`, whose `arrays(split, client)`
and `arrays_of(split, clients)` read through the cache and whose `train` and `test` are
`ClientData` over the same reader.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Callable, Optional

import numpy as np

from tff_clustered.data.federated_data import (
    ClientArrayDict,
    ClientArrays,
    DataError,
    FederatedData,
    checked_client,
    example_arrays,
    unreadable_examples,
)

# The cache's bounds: this many clients' splits, and this many bytes of their arrays.
CACHE_CLIENTS = 4096
CACHE_BYTES = 256 << 20

# One client's raw examples of a split: (split, client id) -> (x, y) before validation.
ClientReader = Callable[[str, str], ClientArrays]
# Several clients' raw examples of a split at once, in the order of the ids given, each as
# `ClientReader` gives it; raises when any of them cannot be read.
ClientsReader = Callable[[str, Sequence[str]], list[ClientArrays]]


@dataclasses.dataclass
class LazyClients:
    """A population read by client. `read(split, client)` returns the client's raw `(x, y)`,
    `read_many(split, clients)` (optional) several clients' at once; `sizes[split][client]`
    its number of examples (a client whose examples do not number that many is refused at its
    read: the sizes weight the averages); `where` names the source in errors; `digest`
    fingerprints the source cheaply (a checkpoint resumes only on the same data). Examples
    are checked at first read against `input_shape`, `num_classes` and `vocabulary_size`, and
    cached within `cache_clients` client splits and `cache_bytes` bytes."""

    client_ids: Sequence[str]
    sizes: Optional[Mapping[str, Mapping[str, int]]]  # None: counted at each client's read
    read: ClientReader
    num_classes: int
    digest: Callable[[], str]
    where: str = ""
    input_shape: Optional[tuple[int, ...]] = None  # None: the first client read sets it
    vocabulary_size: Optional[int] = None
    read_many: Optional[ClientsReader] = None  # None: clients are read one at a time
    cache_clients: int = CACHE_CLIENTS
    cache_bytes: int = CACHE_BYTES
    reads: int = 0  # clients' splits read from the source so far (a cache miss each)
    _cache: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)
    _cached_bytes: int = 0
    _counted: dict = dataclasses.field(default_factory=dict)

    def arrays(self, split: str, client_id: str) -> ClientArrayDict:
        """The client's validated examples of `split`, from the cache or read now."""
        key = (split, client_id)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if client_id not in self.split_sizes(split):
            raise KeyError(client_id)
        try:
            x, y = self.read(split, client_id)
        except DataError:
            raise
        except Exception as e:  # a damaged row or page: sqlite3, TF's parser
            raise unreadable_examples(self._context(split, client_id), e) from None
        return self._keep(split, client_id, x, y)

    def arrays_of(self, split: str, client_ids: Sequence[str]) -> list[ClientArrayDict]:
        """The validated examples of each of `client_ids` (`arrays`), those not in the cache
        read together (`prefetch`), in runs of clients the cache holds together."""
        arrays: list[ClientArrayDict] = []
        begin = 0
        while begin < len(client_ids):
            end = begin + self.prefetch(split, client_ids[begin:])
            arrays += [self.arrays(split, c) for c in client_ids[begin:end]]
            begin = end
        return arrays

    def prefetch(self, split: str, client_ids: Sequence[str]) -> int:
        """Reads the clients of `client_ids` not in the cache together (`read_many`: one query
        and one parse for them all instead of one each) and caches them, each validated as
        its own read (`arrays`) validates it, with the same errors naming the client. Only the
        leading clients that the cache holds together (`held_together`) are read, the cached
        ones among them made the most recent first, so that none of them is evicted before
        it is used: returns how many leading clients that is (prefetch the rest once these
        are used). Reads nothing without `read_many`, or when the clients cannot be read
        together (a damaged row or record): each client is then read at its use, whose error
        names it."""
        count = self.held_together(split, client_ids)
        if self.read_many is None:
            return count
        listed = self.split_sizes(split)
        missing: list[str] = []
        for client in dict.fromkeys(client_ids[:count]):
            if (split, client) in self._cache:
                self._cache.move_to_end((split, client))
            elif client in listed:
                missing.append(client)
        if missing:
            try:
                raw = self.read_many(split, missing)
            except Exception:  # which client is damaged only its own read tells
                return count
            for client, (x, y) in zip(missing, raw):
                self._keep(split, client, x, y)
        return count

    def held_together(self, split: str, client_ids: Sequence[str]) -> int:
        """How many leading clients of `client_ids` (at least one) fit the cache's bounds
        together: at most `cache_clients` different clients and `cache_bytes` bytes of their
        arrays (float32 inputs and int32 labels, known from the listed sizes; the client bound
        alone where sizes are counted at read or the input shape is not known yet)."""
        per_example = 0
        if self.sizes is not None and self.input_shape is not None:
            per_example = 4 * (int(np.prod(self.input_shape)) + 1)
        listed = self.split_sizes(split)
        seen: set[str] = set()
        size = 0
        for i, client in enumerate(client_ids):
            if client in seen:
                continue
            seen.add(client)
            if per_example and client in listed:
                size += listed[client] * per_example
            if i > 0 and (len(seen) > self.cache_clients or size > self.cache_bytes):
                return i
        return len(client_ids)

    def _context(self, split: str, client_id: str) -> str:
        return f"client {client_id!r} ({split}){f' in {self.where}' if self.where else ''}"

    def _keep(self, split: str, client_id: str, x: np.ndarray, y: np.ndarray) -> ClientArrayDict:
        """The client's raw examples validated (`example_arrays`, the listed size,
        `checked_client`), cached (the least recently used evicted beyond the bounds)."""
        context = self._context(split, client_id)
        x, y = example_arrays(context, x, y)
        expected = len(y) if self.sizes is None else self.sizes[split][client_id]
        if len(y) != expected:
            raise DataError(
                f"{context}: {len(y)} examples, but the source lists {expected}; regenerate the "
                "file (its client sizes weight the averages)"
            )
        if self.input_shape is None:
            self.input_shape = tuple(int(d) for d in np.shape(x)[1:])
        arrays = checked_client(
            context, x, y, self.input_shape, self.num_classes, self.vocabulary_size
        )
        self.reads += 1
        self._cache[(split, client_id)] = arrays
        self._cached_bytes += cached_bytes(arrays)
        while len(self._cache) > 1 and (
            len(self._cache) > self.cache_clients or self._cached_bytes > self.cache_bytes
        ):
            self._cached_bytes -= cached_bytes(self._cache.popitem(last=False)[1])
        return arrays

    def split_sizes(self, split: str) -> Mapping[str, int]:
        """Each client's number of examples of `split`: as the source lists them, or counted
        at the client's first read (`CountedSizes`)."""
        if self.sizes is not None:
            return self.sizes[split]
        if split not in self._counted:
            self._counted[split] = CountedSizes(self, split)
        return self._counted[split]

    def fingerprint(self) -> str:
        return self.digest()

    @property
    def cached(self) -> int:
        """How many client splits the cache holds."""
        return len(self._cache)


class ClientCounts(Mapping):
    """A split's example count per client, compact for a population of millions: one index
    (client id -> row) shared by the splits and the run (`FederatedData.client_index`), and one
    int64 array per split (-1: the client has no such split), instead of a dict per split."""

    def __init__(self, ids: Sequence[str], index: Mapping[str, int], counts: np.ndarray) -> None:
        self.ids, self.index, self.counts = ids, index, counts

    def __getitem__(self, client: str) -> int:
        count = int(self.counts[self.index[client]])
        if count < 0:
            raise KeyError(client)
        return count

    def __contains__(self, client: object) -> bool:
        row = self.index.get(client)  # type: ignore[call-overload]
        return row is not None and self.counts[row] >= 0

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return (c for c, n in zip(self.ids, self.counts) if n >= 0)

    def __len__(self) -> int:
        return int(np.count_nonzero(self.counts >= 0))

    def values(self) -> list[int]:  # type: ignore[override]
        """The listed clients' counts in one NumPy pass (Mapping's default looks up each
        client: half a second for `sum(sizes.values())` at a million clients)."""
        return self.counts[self.counts >= 0].tolist()


def only_in_one_split(train: Mapping[str, int], test: Mapping[str, int]) -> list[str]:
    """Clients listed in one split and not the other (from the counts when both splits share
    one index, none when both are counted from one source: no set of every client)."""
    if isinstance(train, ClientCounts) and isinstance(test, ClientCounts):
        if train.index is test.index:
            rows = np.flatnonzero((train.counts >= 0) != (test.counts >= 0))
            return sorted(train.ids[i] for i in rows)
    if isinstance(train, CountedSizes) and isinstance(test, CountedSizes):
        if train._source is test._source:  # both list the source's clients
            return []
    return sorted(set(train) ^ set(test))


class CountedSizes(Mapping):
    """A split's client sizes where the source lists none: a client's size is counted when it
    is first asked for, by reading its examples (through the cache); the clients are known."""

    def __init__(self, source: LazyClients, split: str) -> None:
        self._source, self._split = source, split
        self._ids = frozenset(source.client_ids)
        self._counts: dict[str, int] = {}

    def __getitem__(self, client: str) -> int:
        if client not in self._counts:
            if client not in self._ids:
                raise KeyError(client)
            self._counts[client] = len(self._source.arrays(self._split, client)["y"])
        return self._counts[client]

    def __contains__(self, client: object) -> bool:
        return client in self._ids

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return iter(self._source.client_ids)

    def __len__(self) -> int:
        return len(self._ids)


class SourceArrays(Mapping):
    """A split's clients -> their arrays, read through the source (`FederatedData.train_arrays`
    of a lazy dataset): looking a client up reads it; iterating reads every client."""

    def __init__(self, source: LazyClients, split: str) -> None:
        self._source, self._split = source, split

    def __getitem__(self, client: str) -> ClientArrayDict:
        return self._source.arrays(self._split, client)

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return iter(self._source.client_ids)

    def __len__(self) -> int:
        return len(self._source.client_ids)


def cached_bytes(arrays: ClientArrayDict) -> int:
    return sum(int(np.asarray(v).nbytes) for v in arrays.values())


def federated_data(
    name: str,
    source: LazyClients,
    image_shape: Optional[tuple[int, ...]] = None,
    true_clusters: Optional[Mapping[str, int]] = None,
) -> FederatedData:
    """The runs' `FederatedData` over `source`: every client must be in both splits (checked
    from the sizes, without reading examples); the first client's training examples are read
    and checked now (the cheap whole-source check, and the input shape when not given)."""
    where = f" in {source.where}" if source.where else ""
    if not source.client_ids:
        raise DataError(f"dataset {name!r}{where} has no clients; check the data path")
    train_sizes, test_sizes = source.split_sizes("train"), source.split_sizes("test")
    missing = only_in_one_split(train_sizes, test_sizes)
    if missing:
        raise DataError(
            f"client {missing[0]!r}{where} appears in only one of train/test; every client needs "
            "both splits (regenerate the split, or drop the client from both)"
        )
    source.arrays("train", source.client_ids[0])
    return FederatedData(
        name=name,
        input_shape=tuple(int(d) for d in source.input_shape),
        num_classes=source.num_classes,
        train_sizes=train_sizes,
        test_sizes=test_sizes,
        image_shape=image_shape,
        true_clusters=dict(true_clusters) if true_clusters is not None else None,
        vocabulary_size=source.vocabulary_size,
        train_arrays=SourceArrays(source, "train"),
        test_arrays=SourceArrays(source, "test"),
        source=source,
    )
