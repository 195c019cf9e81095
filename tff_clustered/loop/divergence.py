"""When a round's training diverged, and its likely cause named.

The clients whose update is not finite, a cluster model that became non-finite; the cause named
is the aggregator's settings or the learning rate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class DivergenceError(ValueError):
    """Training produced NaN or infinite values."""


def check_finite(
    cluster_models: np.ndarray,
    round_num: int,
    step: str,
    clusters: np.ndarray,
    client_ids: Sequence[str],
    aggregator_hint: str = "",
) -> None:
    """Stops the run when a cluster model has NaN or infinite values, naming the round, the
    clusters and the clients that trained in them, and the likely cause: the aggregator's
    settings when `aggregator_hint` names them (`ClusterAggregator.divergence_hint`), else the
    learning rate."""
    bad = np.flatnonzero(~np.isfinite(cluster_models).all(axis=1))
    if not len(bad):
        return
    members = [c for c, k in zip(client_ids, clusters) if k in set(bad.tolist())]
    raise DivergenceError(
        f"round {round_num}: cluster model(s) {', '.join(map(str, bad))} became non-finite "
        f"after {step} (clients: {', '.join(members) or 'none this round'}); "
        f"{likely_cause(aggregator_hint, 'lower --learning_rate')} (the last checkpoint is kept)"
    )


def likely_cause(aggregator_hint: str, learning_rate_fix: str) -> str:
    """The cause a divergence message names: the aggregator's settings first when they may
    be it (DP noise or clip), the learning rate otherwise."""
    if not aggregator_hint:
        return learning_rate_fix
    return f"{aggregator_hint}; else {learning_rate_fix}"


def check_diverged_clients(
    finite: np.ndarray,
    client_ids: Sequence[str],
    round_num: int,
    learning_rate: float,
    max_fraction: float,
    aggregator_hint: str = "",
) -> list[int]:
    """The indices of the clients whose update is finite; stops the run when none is, or when
    more than `max_fraction` of them are not, naming the likely cause (`check_finite`). A
    round of no client has not diverged. In round 1 the clients trained from the initial
    model, which no aggregation has touched: the aggregator's settings are not named then."""
    if round_num <= 1:
        aggregator_hint = ""
    dropped = [c for c, ok in zip(client_ids, finite) if not ok]
    if len(finite) and (not finite.any() or len(dropped) > max_fraction * len(finite)):
        learning_rate_fix = (
            f"learning rate {learning_rate:g} may be too high for this model and data: lower "
            "--learning_rate (or raise --max_diverged_fraction to leave such clients out and "
            "go on)"
        )
        raise DivergenceError(
            f"round {round_num}: the updates of {len(dropped)} of {len(finite)} sampled "
            f"clients have NaN or infinite values ({', '.join(dropped)}); "
            f"{likely_cause(aggregator_hint, learning_rate_fix)}; the last checkpoint is kept"
        )
    return [i for i, ok in enumerate(finite) if ok]
