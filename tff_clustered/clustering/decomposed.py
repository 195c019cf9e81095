"""FedGroup's and FeSEM's server-side math, NumPy / scikit-learn only (no TFF).

FedGroup (Duan et al.): MADC (Eq. 7) on the cosine of Eq. 5-6 (common.cosine_similarity),
truncated-SVD directions and EDC (Eq. 8), newcomer dissimilarity (Eq. 9), inter-group
aggregation (Alg. 2 line 5). FeSEM (Long et al.): the E-step (Eq. 8) and the initial K-means on
flattened client models (its M-step, Eq. 9, is common.mean_per_cluster).
Rows of every matrix are flattened client updates or models.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

from tff_clustered.clustering.common import BLOCK_ROWS, EPS, cosine_similarity, row_blocks


def madc_matrix(updates: np.ndarray) -> np.ndarray:
    """MADC(i, j) = 1/(P-2) sum_{z != i, j} |S(i,z) - S(j,z)| (Eq. 7); zero diagonal.

    O(P^2 d) for the cosine matrix plus O(P^3) here, O(P^2) memory.
    """
    sim = cosine_similarity(updates, updates)
    p = len(sim)
    if p < 3:
        raise ValueError(f"MADC needs at least 3 clients, got {p}")
    out = np.empty((p, p))
    for i in range(p):
        diff = np.abs(sim[i][None, :] - sim)  # [j, z] = |S(i,z) - S(j,z)|
        total = diff.sum(axis=1)
        # Remove the z = i and z = j terms.
        total -= diff[:, i] + diff[np.arange(p), np.arange(p)]
        out[i] = total
    out /= p - 2
    np.fill_diagonal(out, 0.0)
    return (out + out.T) / 2  # exact symmetry against rounding


def svd_directions(
    updates: np.ndarray,
    num_directions: int,
    seed: int = 0,
    power_iterations: int = 4,
    block_rows: int = BLOCK_ROWS,
) -> np.ndarray:
    """V = SVD(DW^T, m): the top-m right singular vectors of DW, no centering (Eq. 8),
    as rows (m x d), by randomized subspace iteration streamed over row blocks of DW.

    Z (d x l, l = m + 10 oversampling) starts Gaussian (from `seed`); each power iteration is
    one pass Z <- orth(sum_b DW_b^T (DW_b Z)); a last pass C = DW Z (P x l) and the SVD
    C = U S W^T give V = (Z W)[:, :m]^T. So `power_iterations + 1` passes over the rows, time
    and memory linear in the number of clients: DW is never copied, and may be a disk memmap
    (10,000 clients of FEMNIST's MLP are 16.6 GB in float32). Signs: each direction's largest
    entry is positive (EDC does not depend on them)."""
    p, d = updates.shape
    if num_directions > min(p, d):
        raise ValueError(f"{num_directions} directions need at least as many clients; got {p}")
    width = min(num_directions + 10, p, d)
    rng = np.random.default_rng(seed)
    z, _ = np.linalg.qr(rng.standard_normal((d, width)))
    for _ in range(power_iterations):
        product = np.zeros((d, width))
        z32 = z.astype(np.float32) if updates.dtype == np.float32 else z
        for block in row_blocks(updates, block_rows):
            product += block.T @ (block @ z32)
        z, _ = np.linalg.qr(product)
    z32 = z.astype(np.float32) if updates.dtype == np.float32 else z
    c = np.concatenate([block @ z32 for block in row_blocks(updates, block_rows)]).astype(float)
    _, _, wt = np.linalg.svd(c, full_matrices=False)
    directions = (z @ wt.T[:, :num_directions]).T
    largest = np.argmax(np.abs(directions), axis=1)
    signs = np.sign(directions[np.arange(num_directions), largest])
    return directions * signs[:, None]


def decomposed_cosine(
    updates: np.ndarray, directions: np.ndarray, block_rows: int = BLOCK_ROWS
) -> np.ndarray:
    """M_d = K(DW, V^T): cosine of each update with each direction (P x m, Alg. 3 line 13),
    streamed over row blocks of DW."""
    return np.concatenate(
        [cosine_similarity(block, directions) for block in row_blocks(updates, block_rows)]
    )


def edc_matrix(embedding: np.ndarray) -> np.ndarray:
    """EDC(i, j) = (1/m) ||M_d[i] - M_d[j]||_2 (Eq. 8); O(P^2) memory, not O(P^2 m)."""
    embedding = np.asarray(embedding, np.float64)
    return cdist(embedding, embedding) / embedding.shape[1]


def edc_embedding(updates: np.ndarray, num_groups: int, seed: int = 0) -> np.ndarray:
    """M_d = K(DW, SVD(DW^T, m)): the decomposed cosine embedding EDC clusters (P x m)."""
    return decomposed_cosine(updates, svd_directions(updates, num_groups, seed))


def kmeans_edc(embedding: np.ndarray, num_groups: int, seed: int = 0) -> np.ndarray:
    """K-Means++ on the decomposed cosine embedding (Alg. 3 line 14)."""
    from sklearn.cluster import KMeans

    kmeans = KMeans(num_groups, init="k-means++", n_init=10, max_iter=20, random_state=seed)
    return kmeans.fit(embedding).labels_.astype(np.int32)


def cluster_edc(updates: np.ndarray, num_groups: int, seed: int = 0) -> np.ndarray:
    """EDC clustering: K-Means++ on the decomposed cosine embedding (Alg. 3 lines 11-14)."""
    return kmeans_edc(edc_embedding(updates, num_groups, seed), num_groups, seed)


def agglomerative_madc(madc: np.ndarray, num_groups: int) -> np.ndarray:
    """Complete-linkage agglomerative clustering on a MADC matrix (Alg. 3 line 15)."""
    from sklearn.cluster import AgglomerativeClustering

    model = AgglomerativeClustering(num_groups, metric="precomputed", linkage="complete")
    return model.fit(madc).labels_.astype(np.int32)


def cluster_madc(updates: np.ndarray, num_groups: int) -> np.ndarray:
    """MADC clustering: complete-linkage agglomerative on the MADC matrix (Alg. 3 line 15)."""
    return agglomerative_madc(madc_matrix(updates), num_groups)


def newcomer_dissimilarity(group_directions: np.ndarray, update: np.ndarray) -> np.ndarray:
    """d(i, g_j) = (1 - cos(Dw_0^(g_j), Dw_pre^(i))) / 2 for every group j (Eq. 9)."""
    return (1.0 - cosine_similarity(np.atleast_2d(update), group_directions)[0]) / 2.0


def assign_newcomers(group_directions: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """Group of least Eq. 9 dissimilarity for each update row; ties go to the lowest index."""
    dissimilarity = (1.0 - cosine_similarity(updates, group_directions)) / 2.0
    return np.argmin(dissimilarity, axis=1).astype(np.int32)


def inter_group_aggregation(models: np.ndarray, eta_g: float, mode: str = "additive") -> np.ndarray:
    """Alg. 2 line 5 on flattened group models (m x d); eta_g = 0 is the identity.

    additive (paper): w_j + eta_g sum_{l != j} w_l / ||w_l||
    normalized (authors' code): (w_j + sum_{l != j} c_l w_l) / (1 + sum_{l != j} c_l),
    c_l = eta_g / ||w_l||.
    """
    models = np.asarray(models, np.float64)
    if eta_g == 0:
        return models.copy()
    norms = np.maximum(np.linalg.norm(models, axis=1, keepdims=True), EPS)
    if mode == "additive":
        unit = models / norms
        return models + eta_g * (unit.sum(0, keepdims=True) - unit)
    if mode == "normalized":
        coef = eta_g / norms  # (m, 1)
        weighted = coef * models
        others = weighted.sum(0, keepdims=True) - weighted
        return (models + others) / (1.0 + coef.sum() - coef)
    raise ValueError(f"inter-group mode must be 'additive' or 'normalized', got {mode!r}")


def squared_center_distances(models: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """||W_i - W~_k||^2 of every model (row) to every center (column), FeSEM's Eq. 8 terms."""
    models = np.asarray(models, np.float64)
    centers = np.asarray(centers, np.float64)
    return (models**2).sum(1, keepdims=True) - 2 * models @ centers.T + (centers**2).sum(1)[None, :]


def nearest_centers(models: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """FeSEM E-step (Eq. 8): index of the center at least squared L2 distance."""
    return np.argmin(squared_center_distances(models, centers), axis=1).astype(np.int32)


def best_kmeans(
    points: np.ndarray, num_clusters: int, restarts: int, seed: int
) -> tuple[np.ndarray, float]:
    """FeSEM's center initialization: "pure" K-means on the points from `restarts` random
    initial centers (points drawn at random), keeping the run of least intra-cluster squared
    distance (inertia). Returns (labels, inertia)."""
    from sklearn.cluster import KMeans

    points = np.asarray(points, np.float64)
    if len(points) < num_clusters:
        raise ValueError(f"K-means needs at least {num_clusters} points, got {len(points)}")
    kmeans = KMeans(num_clusters, init="random", n_init=restarts, random_state=seed)
    labels = kmeans.fit_predict(points).astype(np.int32)
    return labels, float(kmeans.inertia_)
