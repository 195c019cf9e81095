"""Every random choice of a run derives from its seed through `derived_seed`, so a run resumed
from a checkpoint ends exactly where an uninterrupted run would."""

from __future__ import annotations

import numpy as np

# Independent random streams derived from the run seed.
SAMPLING, SHUFFLE, PRETRAIN_SHUFFLE, ALGORITHM, DROPOUT, PUBLIC_BATCH = 1, 2, 3, 4, 5, 6
FINE_TUNE_SHUFFLE = 7


def derived_seed(*parts: int) -> int:
    """A 31-bit seed that is a fixed function of its integer parts."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


def rng_for(*parts: int) -> np.random.Generator:
    return np.random.default_rng(derived_seed(*parts))
