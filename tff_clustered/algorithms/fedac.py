"""FedAC: clustering over every client's stored model, with cluster number tuning (Alg. 1).

FedAC (Zhang et al., "FedAC: A Adaptive Clustered Federated Learning Framework for
Heterogeneous Data", arXiv:2403.16460), Algorithm 1.

Every client keeps its own model omega_i = (phi_i, h_i): the embedding phi (every layer but the
last) and the decision head h (the last Dense layer). The server keeps the global embedding
Phi, K cluster centres Omega_k (whole models) and every client's latest uploaded model.

Round t (Alg. 1):
  [4-6]  each sampled client receives its centre Omega_k and Phi and runs LocalUpdate (Alg. 1,
         Sec. 4.2) from its OWN model: SGD on CE + mu/2 ||omega - Omega_k||^2
         + lambda/2 ||phi - Phi||^2, then uploads omega_i (kept in the store);
  [9]    Phi <- the mean of the sampled clients' embeddings (the paper writes a sum);
  [10]   the PCA map (UpdateMap, Alg. 2) is refit on all stored models every
         `--fedac_pca_period` rounds (see below);
  [11]   E-step (Eq. 4): every client joins the centre of highest LrCos (cosine of the reduced
         vectors; the paper prints argmin, Eq. 3 argmax); clusters left empty are removed;
  [12]   M-step (Eq. 5): Omega_k <- the unweighted mean of its members' stored models;
  [13]   cluster number tuning (CNT, Alg. 3): by default our relative rule (below); the
         paper's, merge clusters with G_c < a and split those with G_c > b ((a, b) =
         (0.2, 0.8), Sec. 5.5), with `--fedac_cnt=paper`.

The paper initialises R^0, Omega^0 and Phi^0 without saying how (Alg. 1 line 1); from a common
initial model every LrCos would tie. So the run starts with a warm-up: `--fedac_warmup_rounds`
rounds (default ceil(m / |S_t|)) in which the sampled sets are the blocks of one random
permutation of the clients (each trains once), with a single cluster whose centre is the mean
of all stored models. At the end of the warm-up the PCA map is fit and spherical k-means
(k-means++ seeding, `--num_clusters` = K_init) on the reduced models gives R^0 and the centres.

Values the paper leaves open or that we replace, each a rule of the run, with the paper's
literal value kept as an option:

* PCA refit period (line 10; the paper: every 100 of its 1,000 rounds). `--fedac_pca_period=0`
  (ours, the default): every max(ceil(m / |S_t|), ceil(T / 10)) rounds for a run of T rounds,
  the paper's ten refits per run, but no more often than once per full pass over the clients
  (in fewer rounds most stored models have not changed, and a refit costs O(m^2 d)). T is
  `RunInfo.total_rounds`; unknown (0): the full pass. `--fedac_pca_period=100` is the paper's.
* CNT's decisions (Alg. 3). The paper's test G_c = Dist_intra / Dist_inter < a merges a
  cluster whose members sit close to their centre compared with the other centres. The mu
  pull brings every client toward its centre, so Dist_intra, and G_c, falls for distinct
  groups as much as for fragments of one, and the paper's rule merges planted groups
  (docs/fedac.md, "Cluster number tuning"). `--fedac_cnt=relative` (ours, the default)
  compares clusters with their own members' spread instead
  (clustering.cluster_number.tune_cluster_number): merge a cluster into its nearest when their
  means are not clearly apart (`separation` < 2, a trace two-sample statistic that is ~1 for
  two halves of one group), split one whose two sides are clearly apart (separation > 4) and
  two-sided (`bimodality` > 3/4, more than a cut of any symmetric unimodal group explains)
  in every round of a full pass over the clients (the clients that trained in a round stand
  out from the stale ones until others train). A pull toward the centres can only raise a
  separation, so it never makes CNT merge groups it kept apart. The bounds come from the
  statistics' own scale (random halves, unimodal cuts), not from a dataset:
  `--fedac_merge_separation`, `--fedac_split_separation`, `--fedac_bimodality`.
  `--fedac_cnt=paper` with `--gc_lower`/`--gc_upper` (0.2, 0.8) is the paper's rule. Every
  CNT bound is checked once, by clustering.cnt_settings.CntSettings.
* mu and lambda (LocalUpdate's pulls) are not given by the paper; ours are 0.1 and 0.1.
  With the relative rule CNT does not depend on them. A pull of 0.1 moves a client ~2.5 % of
  the way to its centre per round it trains at 5 local steps of learning rate 0.05. A pull
  tied to the local step budget, mu = (1 - 2^(-1/s)) / eta (half-way to the centre over s
  steps at learning rate eta), helps where clusters are true groups and hurts where a
  cluster's members do not share a distribution (docs/fedac.md), so it is not the default:
  set it by hand (`--fedac_mu`).

Clients are scored with their own model (the personal kind): the paper reports the unweighted
mean over clients (`client_accuracy_mean`); the example-weighted `accuracy` is logged beside it.
Cluster models are computed from the stored models, not from the round's aggregate. The server
computes P omega_i from the uploaded omega_i (the paper has clients upload it: same numbers).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
    check_cluster_count,
    layers_to_tensors,
)
from tff_clustered.clustering import cnt_settings, low_rank_cosine
from tff_clustered.clustering import fedac as fedac_clustering
from tff_clustered.federated import client_work
from tff_clustered.federated.signature import CLIENT_WEIGHTINGS
from tff_clustered.options import option
from tff_clustered.search_space import LogUniform, Uniform
from tff_clustered.seeds import ALGORITHM, derived_seed

DEFAULT_INITIAL_CLUSTERS = 10  # K_init; Fig. 4(c) finds K = 10 best in the paper's setting
# The paper refits the PCA map every 100 of its 1,000 rounds: 10 refits per run.
PCA_REFITS_PER_RUN = 10


def full_pass_rounds(run: RunInfo) -> int:
    """Rounds in which |S_t| sampled clients add up to every client once: ceil(m / |S_t|)."""
    return math.ceil(len(run.client_ids) / run.clients_per_round)


def pca_period(full_pass: int, total_rounds: int) -> int:
    """The automatic refit period of the PCA map (ours; the paper's is 100 rounds): the
    paper's 10 refits per run, max(1, ceil(T / 10)) for a run of T rounds, but never more
    often than once per `full_pass` rounds (ceil(m / |S_t|): in fewer rounds most stored
    models have not changed since the last fit, and a fit costs O(m^2 d)). T unknown (0):
    the full pass alone."""
    by_length = math.ceil(total_rounds / PCA_REFITS_PER_RUN) if total_rounds > 0 else 1
    return max(1, full_pass, by_length)


@dataclasses.dataclass(frozen=True)
class FedACState:
    """`warmup_order`: the client permutation whose blocks are the warm-up cohorts; the PCA map
    (UpdateMap, Alg. 2) once fit, and the round it was fit in (-1: not yet); the splits the
    relative CNT rule allowed in each of the last ceil(m / |S_t|) - 1 rounds
    (`CntResult.split_candidates`, one row per round, oldest first; None: not yet clustering),
    which a split must repeat to go ahead."""

    warmup_order: np.ndarray
    pca_offset: Optional[np.ndarray] = None
    pca_axes: Optional[np.ndarray] = None
    pca_variances: Optional[np.ndarray] = None
    pca_round: int = -1
    split_candidates: Optional[np.ndarray] = None

    @property
    def pca_map(self) -> low_rank_cosine.PcaMap:
        return low_rank_cosine.PcaMap(self.pca_offset, self.pca_axes, self.pca_variances)

    def with_map(self, pca_map: low_rank_cosine.PcaMap, round_num: int) -> FedACState:
        return dataclasses.replace(
            self,
            pca_offset=pca_map.offset,
            pca_axes=pca_map.axes,
            pca_variances=pca_map.variances,
            pca_round=round_num,
        )


class FedAC(Algorithm):
    """Own models pulled to their cluster centre; LrCos clustering, cluster number tuning."""

    name = "fedac"
    models_from_aggregate = (
        False  # it clusters every client's stored model, and its M-step averages them
    )
    model_kinds = ("personal", "cluster")
    paper = (
        "Zhang et al., FedAC: A Adaptive Clustered Federated Learning Framework for "
        "Heterogeneous Data, arXiv:2403.16460"
    )
    keep_client_models = True
    refused = {
        **Algorithm.refused,
        "mu": "FedAC's pull toward the cluster centre is --fedac_mu",
    }

    @dataclasses.dataclass(frozen=True)
    class Options:
        num_clusters: int = option(
            DEFAULT_INITIAL_CLUSTERS, "FedAC: clusters K_init after warm-up."
        )
        fedac_mu: float = option(
            0.1,
            "FedAC mu: pull of the whole model toward its centre.",
            search=LogUniform(0.01, 1.0),
        )
        fedac_lambda: float = option(
            0.1,
            "FedAC lambda: pull of the embedding toward the global embedding Phi.",
            search=LogUniform(0.01, 1.0),
        )
        fedac_components: int = option(
            low_rank_cosine.NUM_COMPONENTS, "FedAC reduced dimension D of the PCA map."
        )
        fedac_pca_period: int = option(
            0,
            "FedAC: refit the PCA map every this many rounds (0: max(ceil(clients / "
            "clients_per_round), ceil(rounds / 10)); the paper's value is 100).",
        )
        fedac_pca_center: bool = option(
            True, "FedAC: subtract the PCA mean before projecting (Alg. 2 literal: false)."
        )
        fedac_warmup_rounds: int = option(
            0, "FedAC warm-up rounds with one cluster (0: ceil(clients / clients_per_round))."
        )
        fedac_init: str = option(
            "kmeans", "FedAC initial clusters after warm-up.", ("kmeans", "random")
        )
        fedac_similarity: str = option(
            "lrcos",
            "FedAC E-step similarity (l2: the ablation of Sec. 5.4, Fig. 3(c,d)).",
            fedac_clustering.SIMILARITIES,
        )
        fedac_cnt: str = option(
            "relative",
            "FedAC cluster number tuning: relative (ours: bounds on the separation of two "
            "member sets) or paper (Alg. 3: bounds on G_c).",
            cnt_settings.CNT_RULES,
        )
        fedac_merge_separation: float = option(
            cnt_settings.MERGE_SEPARATION,
            "FedAC CNT (relative): merge a cluster separated from its nearest by less.",
            search=Uniform(1.0, 3.0, limits=(0.0, 3.0)),
        )
        fedac_split_separation: float = option(
            cnt_settings.SPLIT_SEPARATION,
            "FedAC CNT (relative): split a cluster whose two sides are separated by more.",
            search=Uniform(3.0, 6.0, limits=(3.0, math.inf)),
        )
        fedac_bimodality: float = option(
            cnt_settings.UNIMODAL_BIMODALITY,
            "FedAC CNT (relative): split only a cluster whose two sides are more two-sided.",
        )
        gc_lower: float = option(
            cnt_settings.GC_LOWER,
            "FedAC CNT (paper): merge clusters with G_c below this (a).",
        )
        gc_upper: float = option(
            cnt_settings.GC_UPPER,
            "FedAC CNT (paper): split clusters with G_c above this (b).",
        )
        fedac_min_clusters: int = option(
            cnt_settings.MIN_CLUSTERS, "FedAC CNT: never fewer clusters (K_min)."
        )
        fedac_max_clusters: int = option(
            cnt_settings.MAX_CLUSTERS, "FedAC CNT: never more clusters (K_max)."
        )
        fedac_min_split_size: int = option(
            cnt_settings.MIN_SPLIT_SIZE, "FedAC CNT: members of each side of a split."
        )
        fedac_weighting: str = option(
            "uniform",
            "FedAC means (Phi, centres): uniform as in the paper, or by training examples.",
            CLIENT_WEIGHTINGS,
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        o = self.options
        check(
            [
                (o.fedac_mu >= 0 and o.fedac_lambda >= 0, "fedac_mu and fedac_lambda: >= 0"),
                (self.initial_clusters >= 1, "fedac: num_clusters must be >= 1"),
                (o.fedac_components >= 1, "fedac_components must be >= 1"),
                (o.fedac_pca_period >= 0, "fedac_pca_period must be >= 0 (0: automatic)"),
                (o.fedac_warmup_rounds >= 0, "fedac_warmup_rounds must be >= 0 (0: automatic)"),
                (
                    o.fedac_cnt == "paper"
                    or (o.gc_lower, o.gc_upper) == (cnt_settings.GC_LOWER, cnt_settings.GC_UPPER),
                    "fedac: --gc_lower/--gc_upper bound the paper's G_c; add --fedac_cnt=paper "
                    "(the relative rule's bounds are --fedac_merge_separation and "
                    "--fedac_split_separation)",
                ),
            ]
        )
        try:  # cluster number tuning's bounds, checked once, where they are defined
            self.cnt_settings = cnt_settings.CntSettings(
                o.gc_lower, o.gc_upper, o.fedac_min_clusters, o.fedac_max_clusters,
                o.fedac_min_split_size, o.fedac_cnt, o.fedac_merge_separation,
                o.fedac_split_separation, o.fedac_bimodality,
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"fedac: {e}") from e

    @property
    def initial_clusters(self) -> int:
        return int(self.options.num_clusters)

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        """LocalUpdate: from the client's own model, pulled toward Omega_k (mu, every tensor)
        and Phi (lambda, the embedding's tensors)."""
        o = self.options
        return client_work.LocalSGD(
            prox_mu=float(o.fedac_mu),
            momentum=float(momentum),
            anchor_lambda=float(o.fedac_lambda),
            from_own_model=True,
        )

    def anchor_tensors(self, run: RunInfo) -> tuple[int, ...]:
        """Phi: the embedding, every layer but the last (Sec. 5.1)."""
        embedding = layers_to_tensors(run.layer_sizes, 1)
        if not embedding and self.options.fedac_lambda:
            raise ValueError(
                "fedac pulls the embedding (every layer but the last) toward the global one with "
                f"--fedac_lambda={self.options.fedac_lambda:g}, and this model has one layer, so "
                "no embedding: use a model with hidden layers (e.g. --model=mlp) or "
                "--fedac_lambda=0"
            )
        return embedding

    def warmup_rounds(self, run: RunInfo) -> int:
        return self.options.fedac_warmup_rounds or full_pass_rounds(run)

    def pca_period(self, run: RunInfo) -> int:
        """Rounds between refits of the PCA map: `--fedac_pca_period`, or the rule of
        `pca_period` when it is 0."""
        return self.options.fedac_pca_period or pca_period(full_pass_rounds(run), run.total_rounds)

    # -- decisions ------------------------------------------------------------------------------
    def init(self, run: RunInfo, queries: Queries) -> Decision:
        check_cluster_count(self.name, self.initial_clusters, run)
        order = np.random.default_rng(derived_seed(run.seed, ALGORITHM)).permutation(
            len(run.client_ids)
        )
        return Decision(
            assignment={c: 0 for c in run.client_ids}, state=FedACState(order.astype(np.int64))
        )

    def eligible(self, run: RunInfo, view: ServerView) -> Sequence[str]:
        """During warm-up, round r's cohort is block r of the permutation (everyone trains
        once); afterwards every client."""
        r = view.round_num + 1
        if r > self.warmup_rounds(run):
            return run.client_ids
        block = view.state.warmup_order[(r - 1) * run.clients_per_round :][: run.clients_per_round]
        return [run.client_ids[i] for i in sorted(block)] or run.client_ids

    def first_clusters(
        self,
        run: RunInfo,
        models: np.ndarray,
        z: np.ndarray,
        weights: Optional[np.ndarray],
        round_num: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """R^0 and Omega^0 (Alg. 1 line 1): the warmed-up models' assignment (spherical
        k-means of their reduced form `z`, or random: `--fedac_init`) and its centres."""
        seed = derived_seed(run.seed, ALGORITHM, round_num)
        if self.options.fedac_init == "kmeans":
            labels = fedac_clustering.spherical_kmeans(z, self.initial_clusters, seed)
        else:
            labels = fedac_clustering.random_assignment(
                len(run.client_ids), self.initial_clusters, seed
            )
        return labels, fedac_clustering.m_step(models, labels, self.initial_clusters, weights)

    def clustering_round(
        self,
        run: RunInfo,
        models: np.ndarray,
        centers_before: np.ndarray,
        state: FedACState,
        z: np.ndarray,
        weights: Optional[np.ndarray],
    ) -> tuple[fedac_clustering.ClusteringStep, FedACState]:
        """A round of FedAC's clustering (Alg. 2 with CNT) from `centers_before`, the centres
        before this round's M-step, and the state keeping the round's split candidates."""
        # a split must be allowed in every round of a full pass over the clients: the
        # clients that trained in a round stand out from the rest until others train
        previous = state.split_candidates
        if previous is None or len(previous) != full_pass_rounds(run) - 1:
            previous = np.full((full_pass_rounds(run) - 1, len(run.client_ids)), -1, np.int32)
        step = fedac_clustering.clustering_step(
            models,
            centers_before,
            state.pca_map,
            z,
            self.cnt_settings,
            weights,
            self.options.fedac_similarity,
            previous_splits=previous,
        )
        kept = np.concatenate([previous, step.cnt.split_candidates[None, :]])[1:]
        return step, dataclasses.replace(state, split_candidates=kept)

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        ids = list(run.client_ids)
        models = queries.client_models(ids)  # omega_i of every client, stale ones included
        sizes = np.array([run.train_sizes[c] for c in ids], np.float64)
        weights = None if self.options.fedac_weighting == "uniform" else sizes
        index = {c: i for i, c in enumerate(ids)}
        sampled = np.array([index[c] for c in result.client_ids])
        anchor = np.average(
            models[sampled], axis=0, weights=None if weights is None else sizes[sampled]
        ).astype(np.float32)  # line 9: Phi (only its embedding tensors are read)
        r, warmup = result.round_num, self.warmup_rounds(run)
        if r < warmup:
            center = np.average(models, axis=0, weights=weights)[None, :]
            return Decision(cluster_models=center, anchor=anchor, metrics={"num_clusters": 1.0})
        state: FedACState = view.state
        o = self.options
        period = self.pca_period(run)
        refit = state.pca_round < 0 or r - state.pca_round >= period
        if refit:
            state = state.with_map(
                low_rank_cosine.fit_pca_map(models, o.fedac_components, o.fedac_pca_center), r
            )
        z = low_rank_cosine.project(state.pca_map, models)
        metrics = {
            "pca_refit": float(refit),
            "pca_period": float(period),
            "pca_components": float(len(state.pca_axes)),
        }
        if r == warmup:  # R^0 and Omega^0 from the warmed-up models (Alg. 1 line 1)
            labels, centers = self.first_clusters(run, models, z, weights, r)
            reduced_centers = low_rank_cosine.project(state.pca_map, centers)
        else:
            step, state = self.clustering_round(
                run, models, result.cluster_models_before, state, z, weights
            )
            labels, centers, reduced_centers = step.assign, step.centers, step.reduced_centers
            metrics.update(step.cnt.metrics())
        metrics["num_clusters"] = float(len(centers))
        return Decision(
            assignment=dict(zip(ids, labels.tolist())),
            cluster_models=centers.astype(np.float32),
            anchor=anchor,
            state=state,
            metrics=metrics,
            similarity=Similarity.to_centers(
                "LrCos of client models to the centres (Alg. 2)",
                ids,
                low_rank_cosine.lrcos(z, reduced_centers),
                labels,
                r,
            ),
        )
