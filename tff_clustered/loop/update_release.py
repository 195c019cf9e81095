"""Individual clients' updates clipped and noised before the server reads them (private cold start).

A private run's cold start (FedGroup's group cold start and its newcomers, FeSEM's K-means of
every client's first model) reads each client's own pre-training update, outside the round's
per-cluster aggregate. `UpdateRelease` is the Gaussian mechanism applied to each update alone:
clipped to the run's clip norm C in global L2 norm over all its values (as the round clips:
`federated.cluster_dp`), then Gaussian noise of standard deviation z_c * C added to every value.
The server clusters individual updates, so nothing is divided by a count: each client's row is
one Gaussian mechanism of L2 sensitivity C on that client's data (2C under replace-one), which
`loop.accounting` charges to that client once per release.

The noise comes from one place, `noise_generator`: `seeded`, a fixed function of the run's seed
(at its full width), the stream `COLD_START_NOISE`, the round and the client's index, so runs
repeat and resume exactly; `secure`, every client's noise drawn from a Philox generator keyed
by 128 bits of the operating system's secure generator (`secrets`), which nothing records, so
no one can recompute it, each value the sum of `SECURE_NOISE_DRAWS` draws over its square root
as the round's secure noise is.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence

import numpy as np

from tff_clustered.federated.cluster_dp import SECURE_NOISE_DRAWS
from tff_clustered.seeds import COLD_START_NOISE


def noise_generator(seed: int, round_num: int, position: int, secure: bool) -> np.random.Generator:
    """The generator of one client's noise in round `round_num` (0: before round 1): seeded
    from (`seed`, `COLD_START_NOISE`, `round_num`, `position`), or, `secure`, keyed by 128 bits
    of the operating system's secure generator."""
    if secure:
        return np.random.Generator(np.random.Philox(key=secrets.randbits(128)))
    return np.random.default_rng([int(seed), COLD_START_NOISE, int(round_num), int(position)])


def standard_normal(generator: np.random.Generator, size: int, draws: int = 1) -> np.ndarray:
    """`size` standard normal values from `generator`: one draw each, or the sum of `draws`
    draws over its square root (secure noise, as the round's: Opacus's `secure_mode`)."""
    if draws == 1:
        return generator.standard_normal(size)
    return generator.standard_normal((draws, size)).sum(axis=0) / np.sqrt(draws)


@dataclasses.dataclass(frozen=True)
class UpdateRelease:
    """The Gaussian mechanism on individual clients' updates: each clipped to `clip`, then noise
    of standard deviation `noise_multiplier * clip` per value, drawn by `noise_generator` from
    the run's `seed` (`secure`: from the operating system's secure generator)."""

    clip: float
    noise_multiplier: float
    seed: int
    secure: bool = False

    @property
    def stddev(self) -> float:
        return self.noise_multiplier * self.clip

    def apply(self, updates: np.ndarray, positions: Sequence[int], round_num: int) -> np.ndarray:
        """`updates` (one row per client, the clients at `positions` of the run's index) as the
        server reads them: each row clipped to `clip` in L2 norm and noised, float32."""
        rows = np.asarray(updates, np.float64)
        if rows.ndim != 2 or len(rows) != len(positions):
            raise ValueError(f"one update row per client: {rows.shape}, {len(positions)} clients")
        norms = np.linalg.norm(rows, axis=1)
        clipped = rows * (self.clip / np.maximum(norms, self.clip))[:, None]
        noise = (
            np.stack(
                [
                    standard_normal(
                        noise_generator(self.seed, round_num, p, self.secure),
                        rows.shape[1],
                        SECURE_NOISE_DRAWS if self.secure else 1,
                    )
                    for p in positions
                ]
            )
            if len(rows)
            else np.zeros_like(rows)
        )
        return (clipped + self.stddev * noise).astype(np.float32)
