"""Server-side clustering math, NumPy / scikit-learn only (no TFF): testable alone.

* `decomposed`: FedGroup (cosine, MADC, EDC, newcomers, inter-group aggregation) and FeSEM
  (E-step, M-step);
* `density`: FedTSDP (JS divergence, Hopkins, Eq. 9 distance, two DBSCAN stages, amended
  sampling, shared-layer schedule);
* `bipartition`: CFL (split criterion, optimal bipartition).
"""

from tff_clustered.clustering.bipartition import (
    max_cross_similarity,
    optimal_bipartition,
    pairwise_cosine,
    should_split,
    update_norms,
)
from tff_clustered.clustering.decomposed import (
    BLOCK_ROWS,
    agglomerative_madc,
    assign_newcomers,
    best_kmeans,
    cluster_edc,
    cluster_madc,
    cosine_similarity,
    decomposed_cosine,
    edc_embedding,
    edc_matrix,
    inter_group_aggregation,
    kmeans_edc,
    madc_matrix,
    mean_per_cluster,
    nearest_centers,
    newcomer_dissimilarity,
    squared_center_distances,
    svd_directions,
)
from tff_clustered.clustering.density import (
    ROUNDINGS,
    STAGES,
    amend_sampling_weights,
    dbscan_clusters,
    draw_public_batch,
    hopkins_statistic,
    js_divergence_matrix,
    shared_tensor_count,
    two_stage_clusters,
    weight_distance_matrix,
)

__all__ = [
    "BLOCK_ROWS",
    "squared_center_distances",
    "kmeans_edc",
    "edc_embedding",
    "agglomerative_madc",
    "ROUNDINGS",
    "STAGES",
    "amend_sampling_weights",
    "assign_newcomers",
    "best_kmeans",
    "cluster_edc",
    "cluster_madc",
    "cosine_similarity",
    "dbscan_clusters",
    "decomposed_cosine",
    "draw_public_batch",
    "edc_matrix",
    "hopkins_statistic",
    "inter_group_aggregation",
    "js_divergence_matrix",
    "madc_matrix",
    "max_cross_similarity",
    "mean_per_cluster",
    "nearest_centers",
    "newcomer_dissimilarity",
    "optimal_bipartition",
    "pairwise_cosine",
    "shared_tensor_count",
    "should_split",
    "svd_directions",
    "two_stage_clusters",
    "update_norms",
    "weight_distance_matrix",
]
