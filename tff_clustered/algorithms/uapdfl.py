"""UA-PDFL: decentralized peers that compare unit representations, then copy or mix.

UA-PDFL (Zhu, Fan, Xie, "UA-PDFL: A Personalized Approach for Decentralized Federated
Learning"), Algorithm 2, on the decentralized loop of `dfl.py` (peers are TFF clients; the
server only routes their published models).

Each round every peer i (inside its own client computation, `UAPDFLPeerStep`):
  [6]     pulls from N_com peers Q_i drawn uniformly among the others (redrawn every round);
  [7-8]   computes the unit representation I = softmax(f(w; X_unit)) of its model and of each
          received one (X_unit: one all-ones input, Eq. 4; inference mode) and
          Div(i, j) = 1/2 KL(I_i||I_j) + 1/2 KL(I_j||I_i) (Eq. 6; the paper calls it
          Jensen-Shannon; `--uapdfl_divergence=js` gives the true JS);
  [9-11]  client-wise dropout: if every Div(i, j) <= th_I, it replaces its whole model by that
          of one random neighbour j';
  [12-16] otherwise layer-wise personalization: the feature extractor g is the |D|-weighted
          mean over {i} and Q_i, the classifier h over {i} and the neighbours with
          Div < th_I (its own h when there is none);
  [17-19] trains E local epochs on CE + mu ||g(w; X_unit) - I_bar^Aux||^2 (Eq. 12), I_bar^Aux
          the mean of its own and the received auxiliary representations g(X_unit).
Each peer's model is scored on its own test set (the unweighted mean over peers is the
paper's figure, `client_accuracy_mean`). Logged per round: peers in each regime
(`peers_dropout`, `peers_partial`, `peers_personal_head`), quantiles of Div
(`divergence_p0` .. `divergence_p100`) and the values received (`floats_communicated`).

With N_com = 0 a peer has no neighbourhood: nothing is mixed and there is nothing to align
with (the Eq. 12 term is dropped), so UA-PDFL is Local.

th_I: the paper gives no value. By default (`--uapdfl_threshold=0`) it is calibrated from the
run's own divergences (below); `--uapdfl_threshold=X` > 0 is the constant X. Div's scale depends
on the model, the classes, the seed and how far training has gone, so a constant decides which
regime the peers take (docs/uapdfl.md gives the measurements). The calibrated rule takes a
scale-free quantity from round 1, when every peer started from the same w0 and no regime has
acted yet, and carries it as a quantile, which follows Div's growth:
  * after round 1 the relay takes the fingerprints of w0 and of every peer's published model
    (the I each peer sends its neighbours) and calls a pair alike when
    Div(i, j) < Div(w0, i) + Div(w0, j). In the quadratic approximation of Div (a Fisher
    norm of the output change) this says the two updates have a positive inner product (CFL's
    criterion, seen through the fingerprint). Peers that move together (IID: a shared drift
    plus noise) are mostly alike; peers pulled to different label priors are not. The share
    of alike pairs is the level s (`uapdfl_alike_share`); it has no unit. The sum's factor,
    1 by default, is `--uapdfl_alike_ratio` r: a pair is alike when Div(i, j) < r (Div(w0, i)
    + Div(w0, j)), which for two updates of equal size says their cosine exceeds 1 - r (a
    knob a tuned comparison draws, docs/tuning.md).
  * th_I of round r + 1 is the s-quantile of the divergences the peers reported in round r
    (round 2: of all pairs after round 1; `uapdfl_threshold` in the log), so about a share s
    of the pairs a peer meets count as similar whatever Div's current scale is.
Its weak point: a quantile imposes the share, so on IID data the pairs judged unlike at round
1 (noise) keep about (1 - s) of the pairs above th_I in every round, and a peer needs all its
N_com pairs below for dropout (about s^N_com of the peers). Each peer's th_I reaches its client
computation as its `client_scalar` (`plan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.algorithms.base import (
    Decision,
    Plan,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
    check,
)
from tff_clustered.algorithms.dfl import Decentralized
from tff_clustered.federated import client_work, local_training
from tff_clustered.federated.peer_work import Inbox, train_mixed
from tff_clustered.options import option
from tff_clustered.search_space import LogUniform, Uniform

ABLATIONS = ("full", "without_cd", "without_lp")
DIVERGENCES = ("skl", "js")
# Regimes of a peer (Alg. 2): whole model copied from one neighbour (client-wise dropout), head
# shared with the similar neighbours (partial), head kept (personal head); none without
# neighbours.
DROPOUT, PARTIAL, PERSONAL_HEAD, NO_REGIME = 0, 1, 2, -1
REGIME_NAMES = {DROPOUT: "dropout", PARTIAL: "partial", PERSONAL_HEAD: "personal_head"}
PROBABILITY_FLOOR = 1e-10
UNIT_VALUE = 1.0  # every value of X_unit, the input the fingerprints are taken on (Eq. 4)


def divergence(p: tf.Tensor, q: tf.Tensor, kind: str = "skl") -> tf.Tensor:
    """Div (Eqs. 6-7) of distribution `p` [C] with each row of `q` [n, C]: the symmetrised KL
    1/2 KL(p||q) + 1/2 KL(q||p) the paper writes (it calls it Jensen-Shannon), or the true
    Jensen-Shannon divergence (`kind="js"`). Probabilities clipped to [1e-10, 1]."""
    p = tf.clip_by_value(p, PROBABILITY_FLOOR, 1.0)[None, :]
    q = tf.clip_by_value(q, PROBABILITY_FLOOR, 1.0)

    def kl(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(a * tf.math.log(a / b), axis=-1)

    if kind == "skl":
        return 0.5 * kl(p, q) + 0.5 * kl(q, p)
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def softmax_outputs(logits: tf.Tensor) -> tf.Tensor:
    """Class probabilities (a single logit: [1 - p, p])."""
    if logits.shape[-1] == 1:
        p = tf.sigmoid(logits)
        return tf.concat([1 - p, p], axis=-1)
    return tf.nn.softmax(logits)


@dataclasses.dataclass(frozen=True)
class UAPDFLPeerStep:
    """One peer's round, Alg. 2 lines 7-19 (see the module docstring), as client work.

    `threshold`: th_I, or None for each peer's `ClientInputs.client_scalar` (the calibrated
    rule). `allow_dropout=False` never takes the dropout branch and `layerwise=False` averages
    the whole model instead of deciding h separately (the paper's Fig. 13 ablations). Trainable
    tensors from `head_start` on are h; BatchNorm statistics go with g, or stay the peer's own
    with `local_statistics`. `aux_mu` > 0 adds mu ||g(w; X_unit) - mean of the received
    I^Aux||^2 (Eq. 12, not halved, inference mode) to the local loss of a peer that has
    neighbours. X_unit is one input of shape `input_shape` filled with `UNIT_VALUE` (Eq. 4)."""

    head_start: int
    input_shape: tuple[int, ...]
    threshold: Optional[float] = 0.1
    aux_mu: float = 0.0
    momentum: float = 0.0
    divergence: str = "skl"
    allow_dropout: bool = True
    layerwise: bool = True
    local_statistics: bool = False
    reads_own_model: ClassVar[bool] = False  # its own published model is the first row
    reads_features: ClassVar[bool] = True  # I^Aux and Eq. 12 read g's output

    # Long: Alg. 2 lines 7-19 written step by step under their line numbers, the form
    # docs/uapdfl.md's table cites line by line; its sub-steps share most of their tensors.
    def __call__(
        self, forward: local_training.ForwardFn, inputs: client_work.ClientInputs
    ) -> client_work.ClientOutputs:
        if inputs.routed is None or inputs.routed.features is None:
            raise ValueError("UA-PDFL's peer step needs the model's feature extractor")
        inbox = Inbox.of(inputs)
        n = inbox.num_rows - 1
        unit = tf.fill([1, *self.input_shape], tf.constant(UNIT_VALUE, tf.float32))

        # [7-8] the unit representations I and I^Aux of its model and each received one,
        # and Div(i, j) (Eq. 6).
        prints = [self.fingerprints(forward, inputs, unit, *inbox.model(r)) for r in range(n + 1)]
        unit_outputs = tf.stack([p for p, _ in prints])  # I, own first
        aux = tf.stack([a for _, a in prints])  # I^Aux
        div = divergence(unit_outputs[0], unit_outputs[1:], self.divergence)
        everyone = inbox.everyone
        threshold = (
            tf.cast(inputs.client_scalar, tf.float32) if self.threshold is None else self.threshold
        )
        similar = tf.concat([[True], div < threshold], axis=0) & inbox.present
        regime = tf.constant(NO_REGIME)
        base_weights = head_weights = everyone  # no neighbour: its own model
        if n:
            # [9-11] client-wise dropout: every Div <= th_I -> one random neighbour's model.
            dropout = (
                tf.reduce_all((div <= threshold) | ~inbox.present[1:])
                & tf.reduce_any(inbox.present[1:])
                & self.allow_dropout
            )
            pick = tf.random.stateless_uniform(
                [], tf.stack([inputs.seed[0], inputs.seed[1] + 7919]), 0, n, tf.int32
            )
            copy = tf.one_hot(pick + 1, n + 1)
            # [12-16] layer-wise personalization: g over everyone, h over the similar ones.
            if self.layerwise:
                similar_sizes = inbox.sizes * tf.cast(similar, tf.float32)
                head = similar_sizes / tf.reduce_sum(similar_sizes)
            else:
                head = everyone
            base_weights = tf.where(dropout, copy, everyone)
            head_weights = tf.where(dropout, copy, head)
            regime = tf.where(
                dropout,
                DROPOUT,
                tf.where(tf.reduce_any(similar[1:]), PARTIAL, PERSONAL_HEAD),
            )
        mixed = inbox.mixed(base_weights, head_weights, self.head_start, self.local_statistics)

        # [17-19] local training on CE + mu ||g(w; X_unit) - mean I^Aux||^2 (Eq. 12).
        penalty = None
        if self.aux_mu and n and self.layerwise:
            target = tf.stop_gradient(tf.reduce_mean(aux, axis=0))

            def penalty(weights: tuple, state: tuple) -> tf.Tensor:
                features = inputs.routed.features(weights, state, unit, self.head_start)[0]
                return self.aux_mu * tf.reduce_sum(tf.square(features - target))

        metrics = {
            "regime": regime,
            "divergence": tf.where(inbox.present[1:], div, np.nan),  # none for a padding row
            "similar_neighbours": tf.reduce_sum(tf.cast(similar[1:], tf.int32)),
            "values_received": self.values_received(inbox, regime, similar, unit_outputs, aux),
        }
        return train_mixed(
            forward, inputs, mixed, inbox.present, metrics, self.momentum, penalty=penalty
        )

    def fingerprints(
        self,
        forward: local_training.ForwardFn,
        inputs: client_work.ClientInputs,
        unit: tf.Tensor,
        weights: tuple,
        state: tuple,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """(I, I^Aux) of one model: its class probabilities and g's output on X_unit."""
        logits, _ = forward(weights, state, unit, False, None)
        aux = inputs.routed.features(weights, state, unit, self.head_start)[0]
        return softmax_outputs(logits)[0], aux

    def values_received(
        self,
        inbox: Inbox,
        regime: tf.Tensor,
        similar: tf.Tensor,
        unit_outputs: tf.Tensor,
        aux: tf.Tensor,
    ) -> tf.Tensor:
        """Model values this peer receives by the protocol's two phases (Sec. 3.5): N_com
        (C + d_aux + 1) fingerprint values, then the dropout neighbour's whole model, or every
        neighbour's g and the similar ones' h. Padding rows are not received."""
        if inbox.num_rows == 1:
            return tf.constant(0.0)
        n = inbox.neighbours_received
        whole, h = inbox.model_sizes(self.head_start)
        prints = n * (int(unit_outputs.shape[-1]) + int(aux.shape[-1]) + 1)
        similar_count = tf.reduce_sum(tf.cast(similar[1:], tf.float32))
        mixed = n * (whole - h) + similar_count * h if self.layerwise else n * whole
        return prints + tf.where(regime == DROPOUT, float(whole), mixed)


def divergence_matrix(p: np.ndarray, q: np.ndarray, kind: str = "skl") -> np.ndarray:
    """Div of every row of `p` [n, C] with every row of `q` [m, C], float64: the peers' own
    `divergence`, so the server's calibration measures exactly what the peers compare."""
    p_rows = tf.constant(np.asarray(p, np.float64)[:, None, :])  # [n, 1, C] against [m, C]
    return divergence(p_rows, tf.constant(np.asarray(q, np.float64)), kind).numpy()[0]


def alike_share(
    start: np.ndarray, ends: np.ndarray, kind: str = "skl", ratio: float = 1.0
) -> float:
    """The share of peer pairs whose first-round updates agree: `start` [C] the fingerprint of
    the common initial model, `ends` [n, C] the peers' after one round from it. A pair is
    alike when Div(i, j) < ratio (Div(w0, i) + Div(w0, j)) (in the quadratic approximation of
    Div, with ratio 1: when their updates have a positive inner product; with ratio r and
    updates of equal size: when their cosine exceeds 1 - r)."""
    between = divergence_matrix(ends, ends, kind)
    moved = divergence_matrix(start[None, :], ends, kind)[0]
    i, j = np.triu_indices(len(ends), 1)
    if not len(i):
        return 1.0
    scale = moved[i] + moved[j]
    alike = between[i, j] < ratio * scale
    return float(np.mean(np.where(scale > 0, alike, True)))


def quantile_threshold(divergences: np.ndarray, level: float) -> float:
    """th_I: the `level` quantile of the divergences (finite ones; inf when there are none)."""
    div = np.asarray(divergences, np.float64).ravel()
    div = div[np.isfinite(div)]
    if not div.size:
        return float("inf")
    return float(np.quantile(div, float(np.clip(level, 0.0, 1.0))))


class UAPDFL(Decentralized):
    """Decentralized: peers compare unit representations, then copy a neighbour or mix g and h."""

    name = "uapdfl"
    paper = "Zhu, Fan, Xie, UA-PDFL: A Personalized Approach for Decentralized Federated Learning"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        uapdfl_threshold: float = option(
            0.0,
            "UA-PDFL th_I, the divergence threshold (the paper gives none): 0 calibrates it "
            "from the run's own divergences (ours, see the file); X > 0 is the constant X.",
        )
        uapdfl_alike_ratio: float = option(
            1.0,
            "UA-PDFL calibrated th_I (--uapdfl_threshold=0): a pair of peers is alike after "
            "round 1 when Div(i, j) < r (Div(w0, i) + Div(w0, j)); 1 (ours): their updates "
            "agree in sign; larger: more pairs alike, a higher th_I.",
            search=Uniform(0.5, 1.5, limits=(0.0, 2.0)),
        )
        uapdfl_mu: float = option(
            0.01,
            "UA-PDFL mu of the auxiliary alignment term (Eq. 12).",
            search=LogUniform(1e-3, 0.1),
        )
        uapdfl_divergence: str = option(
            "skl", "UA-PDFL Div: symmetrised KL (Eq. 6) or Jensen-Shannon.", DIVERGENCES
        )
        uapdfl_ablation: str = option(
            "full",
            "UA-PDFL Fig. 13 ablation: without client-wise dropout, or without layer-wise "
            "personalization (dropout, else the whole model averaged, mu = 0).",
            ABLATIONS,
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        check(
            [
                (self.options.uapdfl_threshold >= 0, "uapdfl_threshold must be >= 0"),
                (self.options.uapdfl_mu >= 0, "uapdfl_mu must be >= 0"),
                (self.options.uapdfl_alike_ratio > 0, "uapdfl_alike_ratio must be > 0"),
            ]
        )

    def peer_step(self, run: RunInfo, momentum: float) -> client_work.ClientWork:
        o = self.options
        return UAPDFLPeerStep(
            self.head_start(run),
            run.input_shape,
            threshold=None,  # each round's th_I arrives as the peer's client scalar (`plan`)
            aux_mu=float(o.uapdfl_mu),
            momentum=momentum,
            divergence=o.uapdfl_divergence,
            allow_dropout=o.uapdfl_ablation != "without_cd",
            layerwise=o.uapdfl_ablation != "without_lp",
            local_statistics=bool(o.dfl_local_statistics),
        )

    def round_log(self, client_metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The decentralized log plus how many peers took each regime and the quantiles of
        the divergences they measured."""
        log = super().round_log(client_metrics)
        regimes = np.asarray(client_metrics["regime"])
        for code, name in REGIME_NAMES.items():
            log[f"peers_{name}"] = float(np.sum(regimes == code))
        div = np.asarray(client_metrics["divergence"], np.float64).ravel()
        div = div[np.isfinite(div)]
        for q in (0, 25, 50, 75, 100):
            log[f"divergence_p{q}"] = float(np.percentile(div, q)) if div.size else float("nan")
        return log

    @classmethod
    def run_figures(cls, trained: Sequence[Mapping[str, Any]]) -> dict[str, Optional[float]]:
        """The decentralized figures plus the share of peer-rounds in each regime, rounds after
        the first (when every model is still the common initial one)."""
        figures = super().run_figures(trained)
        names = REGIME_NAMES.values()
        counted = [r for r in trained[1:] if all(f"peers_{g}" in r for g in names)]
        totals = {g: sum(r[f"peers_{g}"] for r in counted) for g in names}
        everyone = sum(totals.values())
        for g in names:
            figures[f"regime_{g}"] = totals[g] / everyone if everyone else None
        return figures

    @classmethod
    def figures_text(cls, runs: Sequence[Mapping[str, Any]]) -> list[str]:
        """The decentralized text plus each seed's regime shares, e.g. `regimes
        dropout+partial+head (%) 63+21+16 / 60+25+15` (seeds separated by ` / `, as the
        table's other diagnostics are per seed)."""
        text = super().figures_text(runs)
        names = list(REGIME_NAMES.values())
        if runs and all(r.get(f"regime_{names[0]}") not in (None, "") for r in runs):
            per_seed = (
                "+".join(f"{100 * float(r[f'regime_{g}']):.0f}" for g in names) for r in runs
            )
            text.append(f"regimes dropout+partial+head (%) {' / '.join(per_seed)}")
        return text

    @property
    def calibrated(self) -> bool:
        return self.options.uapdfl_threshold == 0

    def plan(
        self, run: RunInfo, view: ServerView, client_ids: Sequence[str], queries: Queries
    ) -> Plan:
        threshold = float(self.options.uapdfl_threshold)
        if self.calibrated:
            # before round 1 every row is w0 (Div = 0: any th_I gives the no-op dropout)
            threshold = view.state["threshold"] if view.state else float("inf")
        scalars = np.full(len(client_ids), threshold)
        return dataclasses.replace(
            super().plan(run, view, client_ids, queries), client_scalars=scalars
        )

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        decision = super().after_round(run, view, result, queries)
        if not self.calibrated:
            return decision
        kind = self.options.uapdfl_divergence
        state = view.state
        if not state:  # round 1: every peer started from w0
            unit = np.full((1, *run.input_shape), UNIT_VALUE, np.float32)
            start = queries.predict_probabilities(run.initial_model[None, :], unit)[0, 0]
            ends = queries.predict_probabilities(decision.cluster_models, unit)[:, 0]
            level = alike_share(start, ends, kind, self.options.uapdfl_alike_ratio)
            between = divergence_matrix(ends, ends, kind)
            divs = between[np.triu_indices(len(ends), 1)]
        else:
            level = state["level"]
            divs = np.asarray(result.client_metrics.get("divergence", []))
        state = {"level": level, "threshold": quantile_threshold(divs, level)}
        metrics = {
            **decision.metrics,
            "uapdfl_alike_share": level,
            "uapdfl_threshold": state["threshold"],
        }
        return dataclasses.replace(decision, state=state, metrics=metrics)
