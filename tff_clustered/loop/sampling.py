"""Which clients a round samples: the seeded draw of `--client_sampling` (fixed or poisson).

Two samplings (`describe_sampling`): `fixed`, exactly min(m, N) of the round's N eligible
clients without replacement; and `poisson`, each eligible client independently with
probability min(1, m/N). The draw is a function of (seed, round) alone, as every run-time
choice is (`seeds`): amplification by sampling (`loop.dp_events.sampling_event`) holds only if
the seed is secret.
"""

from __future__ import annotations

import numpy as np

from tff_clustered.seeds import SAMPLING, derived_seed

SAMPLINGS = ("fixed", "poisson")


def check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise ValueError(f"client_sampling must be one of {SAMPLINGS}, got {sampling!r}")


def describe_sampling(sampling: str) -> str:
    """The sentence docs/privacy.md shows for `--client_sampling=sampling`."""
    check_sampling(sampling)
    if sampling == "fixed":
        return (
            "With --client_sampling=fixed (the default), each round draws exactly min(m, N) of "
            "the N clients eligible in that round, uniformly at random without replacement, so "
            "each eligible client is included with probability q = min(m, N)/N; neighbouring "
            "datasets replace one client's data, the clipped sum's sensitivity is 2C, and each "
            "round is accounted as SampledWithoutReplacementDpEvent(N, min(m, N), the round's "
            "event with its noise multipliers halved) under replace-one adjacency."
        )
    return (
        "With --client_sampling=poisson, each round includes each of the N clients eligible in "
        "that round independently with probability q = min(1, m/N), so the round's size is "
        "Binomial(N, q) and may be 0; neighbouring datasets add or remove one client, the "
        "clipped sum's sensitivity is C, and each round is accounted as "
        "PoissonSampledDpEvent(q, the round's event) under add-or-remove-one adjacency."
    )


def inclusion_probability(num_eligible: int, sample_size: int) -> float:
    """An eligible client's chance of being in a round, under either sampling: min(1, m/N)."""
    return min(1.0, sample_size / num_eligible)


def sampled_positions(
    sampling: str, num_eligible: int, sample_size: int, seed: int, round_num: int
) -> np.ndarray:
    """The positions, ascending, of round `round_num`'s clients among its `num_eligible`
    eligible ones, drawn from the run's `SAMPLING` stream: `sample_size` of them (all if
    fewer) without replacement, or each with probability min(1, sample_size/num_eligible)."""
    check_sampling(sampling)
    rng = np.random.default_rng(derived_seed(seed, SAMPLING, round_num))
    if sampling == "fixed":
        return np.sort(rng.choice(num_eligible, min(sample_size, num_eligible), replace=False))
    q = inclusion_probability(max(num_eligible, 1), sample_size)
    return np.flatnonzero(rng.random(num_eligible) < q)
