"""DisPFL: decentralized peers with personalized sparse masks (Dai et al., ICML 2022).

DisPFL (Dai, Shen, He, Tian, Tao, "DisPFL: Towards Communication-Efficient Personalized
Federated Learning via Decentralized Sparse Training", ICML 2022), on the decentralized loop of
`dfl.py`: each peer keeps a personalized sparse mask m_i and a sparse model w_i = w_i * m_i.

Each round every peer i (inside its own client computation, `SparsePeerStep`):
  1. updates its mask from its last model (done at the end of the previous round in the
     paper's Alg. 1; here at the start of this one, which is the same sequence; round 1
     keeps the initial mask):
     prune: drop the ceil(alpha_t * |m_i|) active weights of smallest magnitude, with
            alpha_t = alpha/2 (1 + cos(pi t / T)), t = r - 2 for this round r (1-based): the
            0-based index of the round just finished, the reference's `round_idx`, of T
            rounds (cosine annealing, --dispfl_anneal);
     regrow: reactivate as many inactive weights, drawn uniformly at random (the authors'
            published runs, `--dis_gradient_check`; the gradient-magnitude regrowth of the
            paper's text is not built);
  2. aggregates over itself and its N_com neighbours, weight by weight over the models
     whose mask holds it: w = (sum_j m_j * w_j) / (sum_j m_j), then w * m_i(new) (the
     reference's count average; a weight no one holds is 0);
  3. trains E local epochs of SGD, putting the weights back on m_i after every step.
A peer publishes its trained sparse model; the mask it trained with is the non-zero pattern
of that model, so the mailbox carries the masks and nothing else is needed. A trained active
weight is exactly zero only when it was regrown at 0 (no neighbour held it) and its gradient
is always 0 (an input that is always 0, a dead unit): it then drops out of the pattern, is not
counted by the neighbours' averages (the reference counts it, at value 0), its prune count is
taken from the non-zero count, and the peer regrows its count at its next mask update.
Densities: the Erdos-Renyi-Kernel rule over every trainable tensor at overall density
--dispfl_density (0.5), as the reference computes them; the kernels (rank >= 2) carry masks,
and biases and normalisation parameters stay dense (ERK makes them dense in practice: a
rank-1 tensor has the largest ERK weight, 1). BatchNorm moving statistics, which the
reference's GroupNorm ResNet does not have, are averaged plainly over the received models
(or kept, --dfl_local_statistics).
Masks start random and different per peer (the authors' `--different_initial`).

Communication (`floats_communicated`): the non-zero values of the received kernels and every
value of their other tensors (the mask indices are not counted). Not built: gradient clipping
(norm 10) and weight decay (5e-4) of the reference trainer; its learning-rate decay is
--lr_schedule=exponential --lr_decay=0.998.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_clustered.algorithms.base import Decision, Queries, RunInfo, check
from tff_clustered.algorithms.dfl import Decentralized
from tff_clustered.federated import client_work, local_training
from tff_clustered.federated.peer_work import received_rows, train_mixed
from tff_clustered.options import option
from tff_clustered.seeds import ALGORITHM, derived_seed

MASK_STREAM = 1  # the initial masks' seed stream, apart from the queues' (seed, ALGORITHM, r, i)


def masked_tensors(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The trainable tensors that carry a mask: kernels (rank >= 2)."""
    return tuple(i for i, s in enumerate(shapes) if len(s) >= 2)


def erk_densities(shapes: Sequence[Sequence[int]], density: float) -> tuple[float, ...]:
    """Erdos-Renyi-Kernel densities (Evci et al., RigL), as DisPFL's reference computes them:
    density_l = eps * sum(shape_l) / prod(shape_l), eps chosen so the tensors together keep
    `density` of their values; a tensor whose density would pass 1 is made dense and eps is
    solved again over the rest."""
    sizes = [float(np.prod(s)) for s in shapes]
    raw = [float(np.sum(s)) / n for s, n in zip(shapes, sizes)]
    dense: set[int] = set()
    while True:
        sparse = [i for i in range(len(shapes)) if i not in dense]
        if not sparse:
            return tuple(1.0 for _ in shapes)
        budget = density * sum(sizes) - sum(sizes[i] for i in dense)
        eps = budget / sum(raw[i] * sizes[i] for i in sparse)
        top = max(sparse, key=lambda i: raw[i])
        if eps * raw[top] <= 1:
            return tuple(1.0 if i in dense else eps * raw[i] for i in range(len(shapes)))
        dense.add(top)


def active_counts(shapes: Sequence[Sequence[int]], density: float) -> tuple[int, ...]:
    """Active weights of each masked tensor (`masked_tensors`): int(density_l * size_l), at
    least 1, with the ERK densities of all of `shapes` (every trainable tensor)."""
    densities = erk_densities(shapes, density)
    return tuple(max(1, int(densities[t] * np.prod(shapes[t]))) for t in masked_tensors(shapes))


def drop_fraction(anneal: float, finished_round: tf.Tensor, total_rounds: tf.Tensor) -> tf.Tensor:
    """alpha_t = alpha/2 (1 + cos(pi t / T)) for the finished round t (0-based) of T."""
    t = tf.cast(finished_round, tf.float32)
    total = tf.maximum(tf.cast(total_rounds, tf.float32), 1.0)
    return anneal / 2 * (1 + tf.cos(math.pi * t / total))


def next_mask(
    weights: tf.Tensor, mask: tf.Tensor, active: int, fraction: tf.Tensor, seed: tf.Tensor
) -> tf.Tensor:
    """Prune the ceil(fraction * |mask|) active entries of smallest |weights|, then activate
    inactive entries (the pruned ones included) drawn uniformly by `seed` until `active` are
    active. Shapes as `weights`; `mask` boolean."""
    flat_w, flat_m = tf.reshape(weights, [-1]), tf.reshape(mask, [-1])
    count = tf.reduce_sum(tf.cast(flat_m, tf.float32))
    remove = tf.cast(tf.math.ceil(fraction * count), tf.int32)
    magnitude = tf.where(flat_m, tf.abs(flat_w), np.inf)
    kept = flat_m & (tf.math.invert_permutation(tf.argsort(magnitude, stable=True)) >= remove)
    need = active - tf.reduce_sum(tf.cast(kept, tf.int32))
    draw = tf.random.stateless_uniform(tf.shape(flat_w), seed)
    score = tf.where(kept, -1.0, draw)
    order = tf.argsort(score, direction="DESCENDING", stable=True)
    grown = ~kept & (tf.math.invert_permutation(order) < need)
    return tf.reshape(kept | grown, tf.shape(weights))


def sparse_mean(rows: tf.Tensor, present: tf.Tensor, masked: bool) -> tf.Tensor:
    """Weight-by-weight mean over the present rows [R, ...] whose mask holds the weight (every
    present row for a dense tensor); 0 where none does."""
    shape = [-1] + [1] * (len(rows.shape) - 1)
    holds = tf.reshape(tf.cast(present, tf.float32), shape)
    if masked:
        holds = holds * tf.cast(tf.not_equal(rows, 0.0), tf.float32)
    else:
        holds = holds * tf.ones_like(rows)
    return tf.math.divide_no_nan(tf.reduce_sum(holds * rows, 0), tf.reduce_sum(holds, 0))


@dataclasses.dataclass(frozen=True)
class SparsePeerStep:
    """One DisPFL peer's round (see the module docstring). `masked`: the trainable tensors with
    a mask, `active`: their active-weight counts, `anneal`: alpha."""

    masked: tuple[int, ...]
    active: tuple[int, ...]
    anneal: float = 0.5
    momentum: float = 0.0
    local_statistics: bool = False

    @property
    def reads_own_model(self) -> bool:
        return False  # its own published model arrives as the first routed row

    def __call__(
        self, forward: local_training.ForwardFn, inputs: client_work.ClientInputs
    ) -> client_work.ClientOutputs:
        inbox, num_trainable = inputs.routed.rows, len(inputs.weights)
        rows = int(inbox[0].shape[0])
        present = received_rows(inputs.routed.row_ids, rows)
        round_num = tf.constant(0, tf.int64) if inputs.round_num is None else inputs.round_num
        total = tf.constant(0, tf.int64) if inputs.total_rounds is None else inputs.total_rounds
        fraction = drop_fraction(self.anneal, round_num - 2, total)
        masks: dict[int, tf.Tensor] = {}  # trainable tensor index -> this round's mask
        mask_changes = tf.constant(0.0)
        for order, (tensor, active) in enumerate(zip(self.masked, self.active)):
            published = inbox[tensor][0]
            last_mask = tf.not_equal(published, 0.0)
            seed = tf.random.experimental.stateless_fold_in(inputs.seed, order + 1)
            mask = tf.cond(
                round_num >= 2,
                lambda w=published, m=last_mask, n=active, s=seed: next_mask(w, m, n, fraction, s),
                lambda m=last_mask: m,
            )
            masks[tensor] = mask
            mask_changes += tf.reduce_sum(tf.cast(tf.not_equal(mask, last_mask), tf.float32))
        mixed = []
        for tensor, received in enumerate(inbox):
            if tensor >= num_trainable and self.local_statistics:
                mixed.append(received[0])  # its own BatchNorm statistics
                continue
            mean = sparse_mean(received, present, tensor in masks)
            mixed.append(mean * tf.cast(masks[tensor], mean.dtype) if tensor in masks else mean)

        def onto_masks(weights: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, ...]:
            return tuple(
                w * tf.cast(masks[t], w.dtype) if t in masks else w for t, w in enumerate(weights)
            )

        values = tf.constant(0.0)
        if rows > 1:  # per received row: its kernels' non-zero values, its other tensors whole
            received = tf.cast(present[1:], tf.float32)
            for tensor, rows_of in enumerate(inbox):
                if tensor in masks:
                    flat = tf.reshape(rows_of[1:], [rows - 1, -1])
                    nonzero = tf.reduce_sum(tf.cast(tf.not_equal(flat, 0.0), tf.float32), 1)
                    values += tf.reduce_sum(nonzero * received)
                else:
                    values += tf.reduce_sum(received) * float(np.prod(rows_of.shape[1:]))
        metrics = {"values_received": values, "mask_changes": mask_changes}
        return train_mixed(
            forward, inputs, mixed, present, metrics, self.momentum, project=onto_masks
        )


class DisPFL(Decentralized):
    """Sparse peers, each on its own mask, pruned and regrown every round; masked averaging.

    DisPFL on the decentralized loop: sparse peers (`SparsePeerStep`) starting from the
    common initial model on their own random ERK masks."""

    name = "dispfl"
    paper = "Dai et al., DisPFL, ICML 2022"

    @dataclasses.dataclass(frozen=True)
    class Options(Decentralized.Options):
        dispfl_density: float = option(
            0.5, "DisPFL: the fraction of kernel weights a peer's mask keeps (ERK per layer)."
        )
        dispfl_anneal: float = option(
            0.5, "DisPFL alpha: the first round's prune fraction, cosine-annealed to 0."
        )

    def __init__(self, options: Optional[Options] = None) -> None:
        super().__init__(options)
        options = self.options
        check(
            [
                (0 < options.dispfl_density <= 1, "dispfl_density must be in (0, 1]"),
                (0 <= options.dispfl_anneal <= 1, "dispfl_anneal must be in [0, 1]"),
            ]
        )

    def sparse_layout(self, run: RunInfo) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The trainable tensors carrying masks, and each one's active-weight count."""
        if not run.trainable_shapes:
            raise ValueError("dispfl needs the trainable tensors' shapes (RunInfo)")
        shapes = run.trainable_shapes
        return masked_tensors(shapes), active_counts(shapes, float(self.options.dispfl_density))

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        masked, active = self.sparse_layout(run)
        return SparsePeerStep(
            masked,
            active,
            float(self.options.dispfl_anneal),
            float(momentum),
            bool(self.options.dfl_local_statistics),
        )

    def round_log(self, client_metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The decentralized log plus the mean number of mask entries a peer changed."""
        return {
            **super().round_log(client_metrics),
            "mask_changes_mean": float(np.mean(client_metrics["mask_changes"])),
        }

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Every peer starts from the common initial model on its own random mask."""
        decision = super().init(run, queries)
        masked, active = self.sparse_layout(run)
        offsets = np.concatenate([[0], np.cumsum(run.tensor_sizes)])
        models = decision.cluster_models.copy()
        for i in range(len(run.client_ids)):
            rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, 0, i, MASK_STREAM))
            for tensor, count in zip(masked, active):
                start, size = int(offsets[tensor]), int(run.tensor_sizes[tensor])
                segment = models[i, start : start + size]
                if np.any(segment == 0):
                    raise ValueError(
                        "dispfl reads a peer's mask from the non-zero pattern of its model, but "
                        f"the initial model has exact zeros in trainable tensor {tensor}; use a "
                        "kernel initialiser without exact zeros"
                    )
                inactive = rng.permutation(size)[count:]
                segment[inactive] = 0.0
        return dataclasses.replace(decision, cluster_models=models)
