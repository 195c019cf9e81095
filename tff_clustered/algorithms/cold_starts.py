"""Cold starts several clustered algorithms share.

Independently initialised cluster models (IFCA), and K-means over the clients' locally trained
models (FeSEM, CGPFL), whose updates a private run clips and noises before the server reads
them (`Queries.released_updates`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Decision,
    Queries,
    ReleasedUpdates,
    RunInfo,
    check_cluster_count,
)
from tff_clustered.seeds import ALGORITHM, derived_seed


def independent_clusters(name: str, run: RunInfo, queries: Queries, num_clusters: int) -> Decision:
    """Start of IFCA: one independently initialised model per cluster, a seed each;
    nobody assigned yet (a client counts in evaluation once it has been). More clusters than
    clients is refused: some would never have a member."""
    check_cluster_count(name, num_clusters, run)
    seeds = [derived_seed(run.seed, ALGORITHM, k) for k in range(num_clusters)]
    return Decision(
        assignment={c: -1 for c in run.client_ids},
        cluster_models=np.stack([queries.initial_model(s) for s in seeds]),
        state=None,
    )


def shrunk_toward_start(
    start: np.ndarray, means: np.ndarray, released: ReleasedUpdates, counts: np.ndarray
) -> np.ndarray:
    """Cluster models `means` (K, D), `start` plus a mean of `released` (noised) updates,
    shrunk toward `start` by the positive-part James-Stein factor
    max(0, 1 - (D - 2) s_k^2 / ||mean_k - start||^2), s_k = the noise's standard deviation /
    sqrt(`counts`[k]) the noise per value left in cluster k's mean (`counts`: its members, or
    their effective number under weights), then brought within the clip of `start` (each
    clipped update is, so their mean is): a mean that is mostly noise starts near `start`, one
    that is mostly signal as it is. Post-processing of the released updates; raw ones return
    `means` itself."""
    if not released.noise_stddev > 0:
        return means
    directions = means - start[None, :]
    variance = released.noise_stddev**2 / np.maximum(np.asarray(counts, np.float64), 1.0)
    norms = np.maximum(np.linalg.norm(directions.astype(np.float64), axis=1), 1e-150)
    factor = np.clip(1.0 - (means.shape[1] - 2) * variance / norms**2, 0.0, 1.0)
    factor = np.minimum(factor, float(released.clip) / norms)  # within the clip ball
    return (start[None, :] + factor[:, None] * directions).astype(means.dtype)


def effective_counts(
    labels: np.ndarray, num_clusters: int, weights: Optional[np.ndarray]
) -> np.ndarray:
    """Each cluster's number of members, or under `weights` its effective number
    (sum w)^2 / sum w^2, the count whose plain mean has the weighted mean's noise."""
    if weights is None:
        return np.bincount(labels, minlength=num_clusters).astype(np.float64)
    w = np.asarray(weights, np.float64)
    total = np.bincount(labels, w, minlength=num_clusters)
    squares = np.bincount(labels, w * w, minlength=num_clusters)
    return np.where(squares > 0, total**2 / np.maximum(squares, 1e-300), 0.0)


def clusters_of_local_models(
    name: str,
    run: RunInfo,
    queries: Queries,
    num_clusters: int,
    epochs: int,
    restarts: int,
    weights: Optional[np.ndarray] = None,
    directions: bool = False,
) -> Decision:
    """Start of FeSEM and CGPFL: every client's model after `epochs` of plain local SGD from
    w0; K-means (best of `restarts`, by intra-cluster distance) on their trainable values gives
    the first assignment, and each cluster model is its members' mean (weighted by `weights`,
    one per client, when given). With `directions`, K-means runs on the updates scaled to unit
    length instead, so that how far a client moved (its local steps, its inputs' scale) does not
    decide its cluster. The updates are read as the run releases them (clipped and noised in a
    private run, each mean then `shrunk_toward_start`) and returned in the decision's
    `released`."""
    check_cluster_count(name, num_clusters, run)
    ids = list(run.client_ids)
    released = queries.released_updates(ids, run.initial_model, epochs, 0)
    updates = released.updates
    models = run.initial_model[None, :] + updates
    width = run.num_trainable_values
    points = models[:, :width]
    if directions:
        lengths = np.linalg.norm(updates[:, :width], axis=1, keepdims=True)
        points = updates[:, :width] / np.maximum(lengths, np.finfo(np.float64).tiny)
    labels, _ = clustering.best_kmeans(
        points,
        num_clusters,
        restarts,
        derived_seed(run.seed, ALGORITHM),
    )
    previous = np.repeat(run.initial_model[None, :], num_clusters, axis=0)
    means = clustering.mean_per_cluster(models, labels, previous, weights)
    counts = effective_counts(labels, num_clusters, weights)
    return Decision(
        assignment=dict(zip(ids, labels.tolist())),
        cluster_models=shrunk_toward_start(run.initial_model, means, released, counts),
        state=None,
        released=(released,),
    )
