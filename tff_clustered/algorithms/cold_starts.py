"""Cold starts several clustered algorithms share.

Independently initialised cluster models (IFCA), and K-means over the clients' locally trained
models (FeSEM, CGPFL).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import Decision, Queries, RunInfo, check_cluster_count
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
    decide its cluster."""
    check_cluster_count(name, num_clusters, run)
    ids = list(run.client_ids)
    updates = queries.local_updates(ids, run.initial_model, epochs, 0)
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
    return Decision(
        assignment=dict(zip(ids, labels.tolist())),
        cluster_models=clustering.mean_per_cluster(models, labels, previous, weights),
        state=None,
    )
