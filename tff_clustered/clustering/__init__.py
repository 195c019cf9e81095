"""Server-side clustering math, NumPy / scikit-learn only (no TFF): testable alone.

* `common`: what the others share (cosine, row blocks, input checks, per-cluster means, which
  are FeSEM's and FedAC's M-steps);
* `decomposed`: FedGroup (MADC, EDC, newcomers, inter-group aggregation) and FeSEM (E-step,
  initial K-means);
* `density`: FedTSDP (JS divergence, Eq. 9 distance, two DBSCAN stages, amended sampling,
  shared-layer schedule); `hopkins`: its Hopkins statistic and the trigger's reference;
* `bipartition`: CFL (split criterion, optimal bipartition);
* `low_rank_cosine`: FedAC's PCA map and LrCos; `cluster_number` (with `cnt_settings`,
  `cnt_statistics`, `cnt_steps`): its cluster number tuning; `fedac`: its E-step, M-step,
  clustering step and initial assignment.
"""

from tff_clustered.clustering.bipartition import (
    max_cross_similarity,
    neighbour_separation_gap,
    optimal_bipartition,
    pairwise_cosine,
    separation_gap,
    should_split,
    update_norms,
)
from tff_clustered.clustering.cluster_number import CntResult, tune_cluster_number
from tff_clustered.clustering.cnt_settings import CntSettings
from tff_clustered.clustering.cnt_statistics import gc_ratios
from tff_clustered.clustering.common import (
    BLOCK_ROWS,
    cosine_similarity,
    drop_empty_clusters,
    mean_per_cluster,
)
from tff_clustered.clustering.decomposed import (
    agglomerative_madc,
    assign_newcomers,
    best_kmeans,
    cluster_edc,
    cluster_madc,
    decomposed_cosine,
    edc_embedding,
    edc_matrix,
    inter_group_aggregation,
    kmeans_edc,
    madc_matrix,
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
    js_divergence_matrix,
    raise_sampling_weights,
    shared_tensor_count,
    two_stage_clusters,
    weight_distance_matrix,
)
from tff_clustered.clustering.fedac import (
    ClusteringStep,
    clustering_step,
    e_step,
    m_step,
    random_assignment,
    spherical_kmeans,
)
from tff_clustered.clustering.hopkins import (
    hopkins_against_references,
    hopkins_estimate,
    hopkins_statistic,
    rotated_outputs,
)
from tff_clustered.clustering.low_rank_cosine import (
    PcaMap,
    fit_pca_map,
    lrcos,
    lrcos_models,
    project,
    random_projection_map,
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
    "hopkins_against_references",
    "hopkins_estimate",
    "hopkins_statistic",
    "raise_sampling_weights",
    "rotated_outputs",
    "inter_group_aggregation",
    "js_divergence_matrix",
    "madc_matrix",
    "max_cross_similarity",
    "mean_per_cluster",
    "nearest_centers",
    "newcomer_dissimilarity",
    "optimal_bipartition",
    "separation_gap",
    "neighbour_separation_gap",
    "pairwise_cosine",
    "shared_tensor_count",
    "should_split",
    "svd_directions",
    "two_stage_clusters",
    "update_norms",
    "weight_distance_matrix",
    "ClusteringStep",
    "CntResult",
    "CntSettings",
    "PcaMap",
    "clustering_step",
    "drop_empty_clusters",
    "e_step",
    "fit_pca_map",
    "gc_ratios",
    "lrcos",
    "lrcos_models",
    "m_step",
    "project",
    "random_assignment",
    "random_projection_map",
    "spherical_kmeans",
    "tune_cluster_number",
]
