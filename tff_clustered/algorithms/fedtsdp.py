"""FedTSDP: stateful clients clustered in two stages, with adaptive personalization layers.

FedTSDP (Zhu, Fan, Xie, "Federated Two Stage Decoupling With Adaptive Personalization
Layers", Complex & Intelligent Systems 2024, arXiv:2308.15821), Algorithm 1.

Clients are stateful: each keeps its whole model, trains all of it (E epochs of SGD with
momentum, the learning rate decaying per round) and uploads it. Every round the server:

  [13] draws one batch of its unlabeled public data by the sampling weights W;
  [14] runs every uploaded model on it (softmax outputs p_i, inference mode);
  [16] computes the Hopkins statistic H of the flattened outputs (Eq. 6);
  [17] if H passes its threshold, re-clusters all participants from scratch in two stages:
  [19-20]  DBSCAN on the Jensen-Shannon divergences of the outputs (Eqs. 3-5, eps1),
  [21-24]  then DBSCAN inside each group on the weight distances (Eqs. 9-10, eps2);
  [27]     raises the sampling weight of the batch just used (Eqs. 7-8);
  [28-30]  averages each new cluster's uploaded models weighted by n_i;
  [31-32]  shrinks the shared-layer count L_s <- L_s * psi (Eq. 11), so the deepest shared
           tensors become personal from the next broadcast on.
Otherwise the previous clusters are kept and averaged as usual (the federated round's
per-cluster mean). Until the first trigger everyone is in one cluster with every tensor shared,
i.e. FedAvg; on IID data H stays below its threshold and FedTSDP stays FedAvg.

The threshold (`tsdp_trigger`): `paper` is the paper's constant h_th = 0.65. H's level depends on
the number of clients and on the dimension B * C of their outputs (it sits well above 0.5 on
clients without any groups, and by about as much on clients with groups), so a constant, not
the data, decides whether FedTSDP ever acts. `calibrated` (ours, the default) compares H with
the same statistic on reference sets of the same outputs with their client structure destroyed
(`clustering.rotated_outputs`), computed with common random numbers
(`clustering.hopkins_against_references`), and triggers when H exceeds the references' mean by
`tsdp_trigger_z` of their standard deviations.

Privacy note: clients upload whole models, personal tensors included, because the server runs
inference with them; that is inherent to the method as the paper describes it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from tff_clustered import clustering
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    Similarity,
    check,
    per_seed_text,
)
from tff_clustered.options import option
from tff_clustered.search_space import Choice, Uniform
from tff_clustered.seeds import ALGORITHM, PUBLIC_BATCH, derived_seed

TRIGGERS = ("calibrated", "paper")


@dataclasses.dataclass(frozen=True)
class TSDPState:
    sampling_weights: np.ndarray  # W over the public set (Eqs. 7-8)
    triggers: int  # rounds in which H passed its threshold so far (each shrinks L_s once)


class FedTSDP(Algorithm):
    """Two-stage DBSCAN re-clustering when Hopkins' H passes its threshold; shared layers shrink."""

    name = "fedtsdp"
    models_from_aggregate = False  # it reads the sampled clients' whole models and regroups by them
    model_kinds = ("personal",)  # its cluster's shared layers with the client's own deeper ones
    paper = (
        "Zhu et al., Federated Two Stage Decoupling With Adaptive Personalization Layers, "
        "arXiv:2308.15821"
    )
    keep_client_models = True  # stateful clients, whole models uploaded

    @dataclasses.dataclass(frozen=True)
    class Options:
        tsdp_trigger: str = option(
            "calibrated",
            "FedTSDP re-clustering trigger: calibrated (ours: H above its reference, H of the "
            "same outputs with the client structure destroyed, by tsdp_trigger_z standard "
            "deviations) or paper (H > hopkins_threshold).",
            TRIGGERS,
            search=Choice(TRIGGERS),
        )
        hopkins_threshold: float = option(
            0.65,
            "FedTSDP h_th: re-cluster when H > h_th (--tsdp_trigger=paper).",
            search=Uniform(0.55, 0.8, limits=(0.0, 1.0)),
        )
        tsdp_trigger_z: float = option(
            4.0,
            "FedTSDP calibrated trigger (ours): H must exceed the reference sets' mean H by this "
            "many of their standard deviations.",
            search=Uniform(2.0, 6.0, limits=(0.0, math.inf)),
        )
        tsdp_reference_sets: int = option(
            32, "FedTSDP calibrated trigger (ours): reference sets per round."
        )
        hopkins_draws: int = option(
            256,
            "FedTSDP calibrated trigger (ours): draws of m~ real and m~ synthetic points that "
            "H and each reference's H are pooled over.",
        )
        tsdp_eps1: float = option(0.15, "FedTSDP stage-1 DBSCAN radius on JS divergence.")
        tsdp_eps2: float = option(3.5, "FedTSDP stage-2 DBSCAN radius on weight distance.")
        tsdp_min_pts: int = option(2, "FedTSDP DBSCAN min_pts (the point itself included).")
        psi: float = option(0.98, "FedTSDP dampening ratio of the shared-layer count (Eq. 11).")
        public_batch_size: int = option(
            50, "FedTSDP public samples per round (B).", search=Choice((20, 50, 100))
        )
        hopkins_sample_size: int = option(
            0, "FedTSDP Hopkins m~ (0: max(1, round(0.1 m))).", search=Choice((0, 2, 4))
        )
        hopkins_target_std: float = option(
            0.005,
            "FedTSDP: repeat the Hopkins draw until H's standard error is at most this (ours; "
            "0: one draw, the paper's literal estimate).",
        )
        tsdp_sampling: str = option(
            "bounded",
            "FedTSDP public sampling weights (Eqs. 7-8): bounded (ours: each sample raised to "
            "1 + |D_pub|/B once) or literal (the increment added to normalised weights).",
            ("bounded", "literal"),
        )
        upsilon: float = option(1e-6, "FedTSDP small constant of the weight distance (Eq. 9).")
        stage2_weights: str = option(
            "full", "FedTSDP tensors of the Eq. 9 distance.", ("full", "shared_only")
        )
        shared_count_rounding: str = option(
            "floor_each_step",
            "FedTSDP rounding of L_s (Eq. 11).",
            ("floor_each_step", "floor_at_use"),
        )
        min_shared_tensors: int = option(0, "FedTSDP: L_s never drops below this.")
        sampling_increment: float = option(0.0, "FedTSDP Eq. 7 increment (0: |D_pub|/B).")
        tsdp_stages: str = option(
            "both", "FedTSDP clustering stages (ablation).", ("both", "js", "weights")
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        o = self.options
        check(
            [
                (0 < o.hopkins_threshold < 1, "hopkins_threshold must be in (0, 1)"),
                (o.tsdp_trigger_z > 0, "tsdp_trigger_z must be > 0"),
                (o.tsdp_reference_sets >= 2, "tsdp_reference_sets must be >= 2"),
                (o.hopkins_draws >= 1, "hopkins_draws must be >= 1"),
                (o.tsdp_eps1 > 0 and o.tsdp_eps2 > 0, "tsdp_eps1 and tsdp_eps2 must be > 0"),
                (o.tsdp_min_pts >= 1, "tsdp_min_pts must be >= 1"),
                (0 < o.psi <= 1, "psi must be in (0, 1]"),
                (o.public_batch_size >= 1, "public_batch_size must be >= 1"),
                (o.hopkins_sample_size >= 0, "hopkins_sample_size must be >= 0"),
                (o.hopkins_target_std >= 0, "hopkins_target_std must be >= 0 (0: one draw)"),
                (o.upsilon >= 0, "upsilon must be >= 0"),
                (o.min_shared_tensors >= 0, "min_shared_tensors must be >= 0"),
                (o.sampling_increment >= 0, "sampling_increment must be >= 0"),
            ]
        )

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        if run.public_x is None or not len(run.public_x):
            raise ValueError(
                "fedtsdp needs unlabeled public data on the server; use a dataset that has "
                "one (cifar10, cifar100, svhn, digits_dirichlet, digits_iid, ...)"
            )
        size = len(run.public_x)
        return Decision(
            assignment={c: 0 for c in run.client_ids},
            state=TSDPState(
                np.ones(size)
                if self.options.tsdp_sampling == "bounded"
                else np.full(size, 1 / size),
                triggers=0,
            ),
        )

    def shared_count(self, run: RunInfo, triggers: int) -> int:
        o = self.options
        return clustering.shared_tensor_count(
            run.num_tensors, o.psi, triggers, o.shared_count_rounding, o.min_shared_tensors
        )

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        o, state = self.options, view.state
        ids = list(result.client_ids)
        models = queries.client_models(ids)  # the uploaded whole models w_i
        batch = clustering.draw_public_batch(
            state.sampling_weights,
            o.public_batch_size,
            np.random.default_rng(derived_seed(run.seed, PUBLIC_BATCH, result.round_num)),
        )
        probs = queries.predict_probabilities(models, run.public_x[batch])
        metrics = self.trigger_metrics(probs, run.seed, result.round_num)
        metrics.update(clustered=0.0, shared_tensors=float(len(view.shared)))
        passed = metrics["hopkins"] > metrics["hopkins_threshold"]
        if not (len(ids) >= self.min_clients and passed):
            return Decision(metrics=metrics)
        js = clustering.js_divergence_matrix(probs)
        labels = clustering.two_stage_clusters(
            js,
            clustering.weight_distance_matrix(self.distance_part(run, view, models), o.upsilon),
            o.tsdp_eps1,
            o.tsdp_eps2,
            o.tsdp_min_pts,
            o.tsdp_stages,
        )
        sizes = np.array([run.train_sizes[c] for c in ids], np.float64)
        assignment, cluster_models = regroup(view, ids, labels, models, sizes)
        triggers = state.triggers + 1
        shared = tuple(range(self.shared_count(run, triggers)))
        if o.tsdp_sampling == "bounded":
            weights = clustering.raise_sampling_weights(state.sampling_weights, batch)
        else:
            increment = o.sampling_increment or None
            weights = clustering.amend_sampling_weights(state.sampling_weights, batch, increment)
        metrics.update(
            clustered=1.0,
            shared_tensors=float(len(shared)),
            num_clusters=float(len(cluster_models)),
        )
        return Decision(
            assignment=assignment,
            cluster_models=cluster_models,
            shared=shared,
            state=TSDPState(weights, triggers),
            metrics=metrics,
            similarity=Similarity(
                "Jensen-Shannon divergence of outputs (Eqs. 3-5)",
                tuple(ids),
                js,
                tuple(int(v) for v in labels),
                result.round_num,
            ),
        )

    @property
    def min_clients(self) -> int:
        """Clients a trigger needs: 2 (the paper's), 3 calibrated (the rotations of 2 clients'
        outputs about their mean only swap them: no reference)."""
        return 2 if self.options.tsdp_trigger == "paper" else 3

    def trigger_metrics(self, probs: np.ndarray, seed: int, round_num: int) -> dict[str, float]:
        """Algorithm 1 line 17's test on the m clients' outputs `probs` (m, B, C): H (Eq. 6),
        the level it must exceed (`hopkins_threshold`) and, calibrated, the reference it is
        compared with. Paper: h_th, H pooled to `hopkins_target_std`. Calibrated: H and the H
        of `tsdp_reference_sets` rotated copies of the outputs (`clustering.rotated_outputs`)
        with common random numbers; the level is their mean plus `tsdp_trigger_z` standard
        deviations."""
        o, m = self.options, len(probs)
        if o.tsdp_trigger == "paper":
            hopkins, draws = self.hopkins(probs.reshape(m, -1), seed, round_num)
            return {
                "hopkins": hopkins,
                "hopkins_draws": float(draws),
                "hopkins_threshold": o.hopkins_threshold,
            }
        rng = np.random.default_rng(derived_seed(seed, ALGORITHM, round_num))
        references = clustering.rotated_outputs(probs, rng, o.tsdp_reference_sets)
        hopkins, reference = clustering.hopkins_against_references(
            probs.reshape(m, -1), references, rng, o.hopkins_sample_size or None, o.hopkins_draws
        )
        mean, std = float(reference.mean()), float(reference.std(ddof=1))
        return {
            "hopkins": hopkins,
            "hopkins_draws": float(o.hopkins_draws),
            "hopkins_reference": mean,
            "hopkins_reference_std": std,
            "hopkins_threshold": mean + o.tsdp_trigger_z * std,
        }

    def hopkins(self, outputs: np.ndarray, seed: int, round_num: int) -> tuple[float, int]:
        """H of the flattened outputs (Eq. 6) and the draws it took: pooled over repeated draws
        until its standard error is at most `hopkins_target_std`, or one draw (the paper's)."""
        o = self.options
        rng = np.random.default_rng(derived_seed(seed, ALGORITHM, round_num))
        size = o.hopkins_sample_size or None
        if not o.hopkins_target_std:
            return clustering.hopkins_statistic(outputs, rng, size), 1
        return clustering.hopkins_estimate(outputs, rng, size, o.hopkins_target_std)

    def distance_part(self, run: RunInfo, view: ServerView, models: np.ndarray) -> np.ndarray:
        """The values of Eq. 9: all trainable tensors (BN statistics excluded), or only the
        shared ones."""
        if self.options.stage2_weights == "full":
            return models[:, : run.num_trainable_values]
        return models[:, : sum(run.tensor_sizes[: len(view.shared)])]

    @classmethod
    def run_figures(cls, trained: Sequence[Mapping[str, Any]]) -> dict[str, Optional[float]]:
        """The rounds whose H passed its threshold (re-clustering triggers)."""
        return {"triggers": float(sum(int(r.get("clustered", 0)) for r in trained))}

    @classmethod
    def figures_text(cls, runs: Sequence[Mapping[str, Any]]) -> list[str]:
        return per_seed_text(runs, "triggers", "triggers", "{:.0f}")


def regroup(
    view: ServerView,
    participants: Sequence[str],
    labels: np.ndarray,
    models: np.ndarray,
    sizes: np.ndarray,
) -> tuple[dict[str, int], np.ndarray]:
    """New clusters of the participants (labels 0..J'-1) with their n_i-weighted mean models
    (Algorithm 1 lines 28-30); clusters of clients that did not take part keep their model and
    their members (numbered after the new ones)."""
    new_models = [
        np.average(models[labels == j], axis=0, weights=sizes[labels == j])
        for j in range(int(labels.max()) + 1)
    ]
    taking_part = set(participants)
    assignment = {c: int(j) for c, j in zip(participants, labels)}
    kept: dict[int, int] = {}
    for client, old in view.assignment.items():
        if client in taking_part or old < 0:
            continue
        if old not in kept:
            kept[old] = len(new_models)
            new_models.append(view.cluster_models[old])
        assignment[client] = kept[old]
    return assignment, np.stack(new_models).astype(np.float32)
