"""DisPFL (Dai, Shen, He, Tian, Tao, "DisPFL: Towards Communication-Efficient Personalized
Federated Learning via Decentralized Sparse Training", ICML 2022), on the decentralized loop of
`dfl.py`: each peer keeps a personalized sparse mask m_i and a sparse model w_i = w_i * m_i.

Each round every peer i (inside its own client computation, `SparsePeerStep`):
  1. updates its mask from its last model (done at the end of the previous round in the
     paper's Alg. 1; here at the start of this one, which is the same sequence):
     prune: drop the ceil(alpha_t * |m_i|) active weights of smallest magnitude, with
            alpha_t = alpha/2 (1 + cos(pi t / T)) for the finished round t of T (cosine
            annealing, --dispfl_anneal);
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
counted by the neighbours' averages (the reference counts it, at value 0), and the peer regrows
its count at its next mask update. Masked: every trainable tensor of rank >= 2
(kernels), with per-tensor densities from the Erdos-Renyi-Kernel rule at overall density
--dispfl_density (0.5); biases and normalisation parameters stay dense (where ERK puts them in
practice). Masks start random and different per peer (the authors' `--different_initial`).

Communication (`floats_communicated`): the non-zero values of every received model (the mask
indices are not counted). Not built: gradient clipping (norm 10) and weight decay (5e-4) of
the reference trainer; its learning-rate decay is --lr_schedule=exponential --lr_decay=0.998.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_clustered.algorithms.base import Decision, Queries, RunInfo, check
from tff_clustered.algorithms.dfl import Decentralized, received_rows, update_norm
from tff_clustered.federated import client_work
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
    """Active weights of each masked tensor: int(density_l * size_l), at least 1."""
    return tuple(
        max(1, int(d * np.prod(s))) for s, d in zip(shapes, erk_densities(shapes, density))
    )


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

    @property
    def reads_own_model(self) -> bool:
        return False  # its own published model arrives as the first routed row

    def __call__(
        self, forward: client_work.ForwardFn, inputs: client_work.ClientInputs
    ) -> client_work.ClientOutputs:
        inbox, num_trainable = inputs.inbox, len(inputs.weights)
        rows = int(inbox[0].shape[0])
        present = received_rows(inputs.inbox_rows, rows)
        round_num = tf.constant(0, tf.int64) if inputs.round_num is None else inputs.round_num
        total = tf.constant(0, tf.int64) if inputs.total_rounds is None else inputs.total_rounds
        fraction = drop_fraction(self.anneal, round_num - 2, total)
        masks: dict[int, tf.Tensor] = {}
        changed = tf.constant(0.0)
        for k, (i, active) in enumerate(zip(self.masked, self.active)):
            own = inbox[i][0]
            old = tf.not_equal(own, 0.0)
            seed = tf.stack([inputs.seed[0], inputs.seed[1] + 104729 * (k + 1)])
            new = tf.cond(
                round_num >= 2,
                lambda own=own, old=old, active=active, seed=seed: next_mask(
                    own, old, active, fraction, seed
                ),
                lambda old=old: old,
            )
            masks[i] = new
            changed += tf.reduce_sum(tf.cast(tf.not_equal(new, old), tf.float32))
        mixed = []
        for i, v in enumerate(inbox):
            mean = sparse_mean(v, present, i in masks)
            mixed.append(mean * tf.cast(masks[i], mean.dtype) if i in masks else mean)

        def on_masks(weights: tuple) -> tuple:
            return tuple(
                w * tf.cast(masks[i], w.dtype) if i in masks else w for i, w in enumerate(weights)
            )

        result = client_work.train_client(
            forward,
            tuple(mixed[:num_trainable]),
            inputs.dataset,
            inputs.learning_rate,
            momentum=self.momentum,
            state=tuple(mixed[num_trainable:]),
            seed=inputs.seed,
            project=on_masks,
        )
        values = tf.constant(0.0)
        if rows > 1:  # the non-zero values of each received row
            received = tf.cast(present[1:], tf.float32)
            for v in inbox:
                nonzero = tf.cast(tf.not_equal(tf.reshape(v[1:], [rows - 1, -1]), 0.0), tf.float32)
                values += tf.reduce_sum(tf.reduce_sum(nonzero, 1) * received)
        return client_work.ClientOutputs(
            result.weights,
            result.state,
            result.weights,
            result.state,
            result.num_examples,
            result.loss_sum,
            metrics={
                "values_received": values,
                "neighbours_received": tf.reduce_sum(tf.cast(present[1:], tf.int32)),
                "mask_changes": changed,
                "update_norm": update_norm(mixed[:num_trainable], result.weights)
                / inputs.learning_rate,
            },
        )


class DisPFL(Decentralized):
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
        o = self.options
        check(
            [
                (0 < o.dispfl_density <= 1, "dispfl_density must be in (0, 1]"),
                (0 <= o.dispfl_anneal <= 1, "dispfl_anneal must be in [0, 1]"),
            ]
        )

    def sparse_layout(self, run: RunInfo) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if not run.trainable_shapes:
            raise ValueError("dispfl needs the trainable tensors' shapes (RunInfo)")
        masked = masked_tensors(run.trainable_shapes)
        shapes = [run.trainable_shapes[i] for i in masked]
        return masked, active_counts(shapes, float(self.options.dispfl_density))

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        masked, active = self.sparse_layout(run)
        return SparsePeerStep(masked, active, float(self.options.dispfl_anneal), float(momentum))

    def init(self, run: RunInfo, queries: Queries) -> Decision:
        """Every peer starts from the common initial model on its own random mask."""
        decision = super().init(run, queries)
        masked, active = self.sparse_layout(run)
        offsets = np.concatenate([[0], np.cumsum(run.tensor_sizes)])
        models = decision.cluster_models.copy()
        for i in range(len(run.client_ids)):
            rng = np.random.default_rng(derived_seed(run.seed, ALGORITHM, 0, i, MASK_STREAM))
            for t, count in zip(masked, active):
                start, size = int(offsets[t]), int(run.tensor_sizes[t])
                segment = models[i, start : start + size]
                if np.any(segment == 0):
                    raise ValueError(
                        "dispfl reads a peer's mask from the non-zero pattern of its model, but "
                        f"the initial model has exact zeros in trainable tensor {t}; use a "
                        "kernel initialiser without exact zeros"
                    )
                off = rng.permutation(size)[count:]
                segment[off] = 0.0
        return dataclasses.replace(decision, cluster_models=models)
