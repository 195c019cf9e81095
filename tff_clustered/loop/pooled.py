"""Many clients' examples pooled into one pair of arrays, to be scored in one call.

The callers: `RoundCalls.score_pooled`, `RoundCalls.pooled_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable, NamedTuple

import numpy as np


class PooledRows(NamedTuple):
    """Examples to score pooled (`pooled_scores_fn`): pooled arrays `(x, y)` (or their
    references on the worker), the rows of them scored, and each row's client (its index in
    the clients asked for)."""

    examples: tuple
    rows: np.ndarray
    client: np.ndarray


@dataclasses.dataclass(frozen=True)
class PooledSplit:
    """Some clients' examples of a split in one pair of arrays (`examples()` gives them where
    the scoring runs), and where each client's rows start and how many it has."""

    examples: Callable[[], tuple]
    start: dict[str, int]
    size: dict[str, int]

    def holds(self, client_ids: Sequence[str]) -> bool:
        """Whether every one of `client_ids` is pooled here."""
        return all(c in self.start for c in client_ids)

    def rows(self, client_ids: Sequence[str]) -> PooledRows:
        sizes = [self.size[c] for c in client_ids]
        rows = [
            np.arange(self.start[c], self.start[c] + n, dtype=np.int32)
            for c, n in zip(client_ids, sizes)
        ]
        return PooledRows(
            self.examples(),
            np.concatenate(rows) if rows else np.zeros(0, np.int32),
            np.repeat(np.arange(len(sizes), dtype=np.int32), sizes),
        )
