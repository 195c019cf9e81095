"""A Keras model as a pure function of explicit tensors, for local training inside TFF.

A Keras model as a pure function of explicit tensors, for local training inside TFF
computations: `apply(trainable, state, x, training, seed) -> (logits, new_state)`.

`trainable` are the model's trainable tensors (`model.trainable_weights` order), `state` its
non-trainable ones (BatchNorm moving statistics, `model.non_trainable_weights` order), `seed` a
stateless `[2]` int32/int64 seed for dropout. Every model the interpreter runs goes through it:
it orders the layer calls (Keras nodes) so each comes after the calls whose outputs it reads,
and runs each with the TF ops of `layer_ops`. It is needed rather than TFF's
`tff.learning.models.functional_model_from_keras` for

* BatchNorm (Ioffe & Szegedy, 2015) in the CNN and ResNet18 of Zhu et al., "Federated Two Stage
  Decoupling With Adaptive Personalization Layers" (2023): its statistics are an input and an
  output, so each client keeps its own; TFF's builder rejects the layer;
* Dropout (Srivastava et al., 2014): masks come from the given seed (same seed, same run),
  where TFF's builder would draw unseeded random numbers;
* LSTMs: one loop over time (`tf.scan`), where TFF's builder needs the Keras LSTM unrolled,
  one copy of the cell per time step;
* the feature extractor's output (`features`, UA-PDFL's I^Aux), which TFF's builder does not
  expose.

On the models both run, the interpreter's outputs and gradients equal TFF's builder's bit for
bit, the LSTM's to rounding (Keras's unrolled cell adds the bias last;
tests/test_functional_models.py). TFF's builder remains for the models the interpreter does
not run and TFF's does, without BatchNorm or Dropout (`tff_built`): a model of the Python API
with other layer kinds, nested models or no `tf.keras.Input`. No registry model (`MODEL_NAMES`)
goes there.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.frameworks import tff
from tff_clustered.models.layer_ops import (
    SUPPORTED,
    WEIGHTED,
    NotInterpretable,
    batch_norm,
    check_layer,
    dropout,
    parameter_free_ops,
    weighted_layer,
)
from tff_clustered.models.split import trainable_layer_sizes

ApplyFn = Callable[
    [Sequence[tf.Tensor], Sequence[tf.Tensor], tf.Tensor, bool, Optional[tf.Tensor]],
    tuple[tf.Tensor, tuple[tf.Tensor, ...]],
]
# (trainable, state, x, head_start) -> the input of the layer that owns trainable tensor
# `head_start`, flattened per example, in inference mode: the output of the feature extractor
# g when the head h starts there (UA-PDFL's auxiliary representation, Eq. 11).
FeaturesFn = Callable[[Sequence[tf.Tensor], Sequence[tf.Tensor], tf.Tensor, int], tf.Tensor]
# (head tensors row by row, features, head_start) -> logits: the head that starts at trainable
# tensor `head_start` (one of `FunctionalModel.row_heads`) on `features` (`FeaturesFn`'s), in
# inference mode, row r with its own head tensors `[t[r] for t in head]` (trainable tensors
# `head_start` on, each with a leading row axis): many clients' heads in one call.
RowHeadsFn = Callable[[Sequence[tf.Tensor], tf.Tensor, int], tf.Tensor]
BatchNorm, Dropout = tf.keras.layers.BatchNormalization, tf.keras.layers.Dropout


@dataclasses.dataclass(frozen=True)
class FunctionalModel:
    """A model as shapes, initial state and a pure `apply` function."""

    trainable_shapes: tuple[tuple[int, ...], ...]  # model.trainable_weights order
    state_shapes: tuple[tuple[int, ...], ...]  # model.non_trainable_weights order
    state_owner: tuple[int, ...]  # per state tensor: the trainable tensor it follows (BN gamma)
    layer_sizes: tuple[int, ...]  # trainable tensors per layer with weights, bottom to top
    initial_state: tuple[np.ndarray, ...]
    apply: ApplyFn  # (trainable, state, x, training, seed) -> (logits, new_state)
    features: Optional[FeaturesFn]  # None: built by TFF's builder, which exposes no features
    # Each example's output depends on that example alone (no BatchNorm statistics, no
    # dropout draw shaped by the batch): extra rows in a batch change no other row's output.
    rows_independent: bool = False
    # The trainable tensors a head run row by row (`row_heads`) may start at: those whose
    # layer and every layer after it are Dense (on one vector per example) or parameter-free,
    # one after the other.
    row_head_starts: tuple[int, ...] = ()
    row_heads: Optional[RowHeadsFn] = None


def _shapes(variables: Sequence[tf.Variable]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in v.shape) for v in variables)


@dataclasses.dataclass(frozen=True)
class _Step:
    """One call of one layer: where its weights are and which values it reads and writes."""

    layer: tf.keras.layers.Layer
    trainable: tuple[int, ...]  # indices into the trainable tensors
    state: tuple[int, ...]  # indices into the state tensors
    inputs: tuple[int, ...]  # ids of the Keras tensors it reads
    outputs: tuple[int, ...]  # ids of the Keras tensors it writes
    position: int  # index of the layer in model.layers (dropout seeds)
    call: int  # which call of this layer in the model (0 unless the layer is shared)
    fused: bool = False  # BatchNorm: Keras runs the fused kernel (its variance update differs)
    momentum: float = 0.0  # BatchNorm: the moving statistics' momentum (Keras convention)


def _nodes_in_order(model: tf.keras.Model) -> list:
    """The model's layer calls (Keras nodes), each after the calls whose outputs it reads."""
    if not model.inputs or not model.outputs:
        raise NotInterpretable(
            f"model {model.name} has no symbolic inputs/outputs; build it with tf.keras.Input"
        )
    order, done, visiting = [], set(), set()
    stack = [(t.node, False) for t in reversed(tf.nest.flatten(model.outputs))]
    while stack:  # iterative depth-first post-order
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            visiting.discard(id(node))
            done.add(id(node))
            order.append(node)
            continue
        if id(node) in visiting:
            raise ValueError(f"model {model.name} has a cycle at layer {node.layer.name}")
        visiting.add(id(node))
        stack.append((node, True))
        if not node.is_input:
            for tensor in reversed(node.keras_inputs):
                stack.append((tensor.node, False))
    return order


def functional_model(
    model: tf.keras.Model,
    input_spec: Optional[dict] = None,
    bn_momentum: Optional[float] = None,
) -> FunctionalModel:
    """The Keras `model` as a `FunctionalModel`: the interpreter's, or TFF's builder's for a
    model with a layer the interpreter does not run (`NotInterpretable`) and neither BatchNorm
    nor Dropout, which TFF's builder cannot run as ours must.

    `input_spec` (a batched element spec with `x` and `y`) is needed by TFF's builder only.
    `bn_momentum` overrides every BatchNorm layer's momentum, in Keras's convention
    (new = momentum * old + (1 - momentum) * batch; PyTorch's momentum 0.1 is Keras's 0.9).
    """
    if bn_momentum is not None and not 0.0 <= bn_momentum <= 1.0:
        raise ValueError(f"bn_momentum must be in [0, 1], got {bn_momentum}")
    try:
        return interpreted(model, bn_momentum)
    except NotInterpretable as refusal:
        held = sorted(
            {type(x).__name__ for x in model.layers if isinstance(x, (BatchNorm, Dropout))}
        )
        if held:  # TFF's builder, the other way, cannot train them as the interpreter must
            raise NotInterpretable(
                f"{str(refusal).rstrip('.')}; a model with {' and '.join(held)} is run by the "
                "interpreter only: replace that layer with a supported one, or remove the "
                f"{' and '.join(held)}"
            ) from None
        if input_spec is None:
            raise ValueError(
                f"model {model.name} goes through TFF's functional_model_from_keras, which "
                f"needs input_spec: the interpreter does not run it ({refusal})"
            ) from None
        return tff_built(model, input_spec, str(refusal))


def tff_built(model: tf.keras.Model, input_spec: dict, refusal: str = "") -> FunctionalModel:
    """`model` through TFF's `functional_model_from_keras`, for the layers the interpreter does
    not run (a Conv1D, a GRU, a nested model, a model without `tf.keras.Input`): no
    state, no `features` (TFF's builder exposes no intermediate values). TFF's builder takes
    some models it cannot run (an LSTM with `dropout` captures a Keras placeholder, which
    fails in round 1 in TFF's worker): one trial step in a graph, as TFF runs it, refuses
    them here with the interpreter's `refusal` (the layer) and TFF's error. A model that draws
    unseeded random numbers is refused as such (`refuse_unseeded_randomness`), also where
    TFF's builder fails on it (a `tf.random.Generator` in a Lambda: a variable no weight
    holds), from Keras's own trace made before the build (a failed build leaves the model
    untraceable)."""
    traced = keras_step_graph(model, input_spec)
    try:
        functional = tff.learning.models.functional_model_from_keras(
            model,
            loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=collections.OrderedDict(input_spec),
        )
    except Exception as e:  # TFF's errors
        if traced is not None:
            refuse_unseeded_randomness(model, traced)
        raise untrainable(model, refusal, e) from None
    try:
        graph = trial_step(functional, input_spec)
    except Exception as e:  # TF's errors: what TFF's worker would fail with
        raise untrainable(model, refusal, e) from None
    refuse_unseeded_randomness(model, graph)
    non_trainable = tuple(functional.initial_weights[1])

    def apply(
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        logits = functional.predict_on_batch((tuple(weights), non_trainable), x, training)
        return logits, tuple(state)

    return FunctionalModel(
        trainable_shapes=_shapes(model.trainable_weights),
        state_shapes=(),
        state_owner=(),
        layer_sizes=tuple(trainable_layer_sizes(model)),
        initial_state=(),
        apply=apply,
        features=None,
        rows_independent=True,
    )


def untrainable(model: tf.keras.Model, refusal: str, error: Exception) -> ValueError:
    """The error of a model neither the interpreter (its `refusal`) nor TFF's builder (its
    `error`) can train."""
    lines = [line.strip() for line in getattr(error, "message", str(error)).splitlines()]
    reason = next((line for line in lines if line and not line.endswith(":")), "")
    return ValueError(
        f"model {model.name} cannot be trained: the interpreter does not run it "
        f"({refusal.rstrip('.')}) and TFF's functional_model_from_keras, which runs the "
        f"other models, fails on it ({type(error).__name__}: {reason}); change that layer "
        "(an LSTM's dropout: a Dropout layer after the LSTM)"
    )


def trial_step(functional: tff.learning.models.FunctionalModel, input_spec: dict) -> tf.Graph:
    """`functional`'s logits (training and inference) and gradients on one batch of zeros of
    `input_spec`'s `x` (its unknown sizes 1), run in a graph as TFF's computations run them;
    returns the graph."""
    spec = input_spec["x"]
    shape = [1 if size is None else size for size in spec.shape]
    with tf.Graph().as_default() as graph:
        trainable, state = (
            tuple(tf.constant(np.asarray(w)) for w in weights)
            for weights in functional.initial_weights
        )
        x = tf.zeros(shape, spec.dtype)
        logits = [functional.predict_on_batch((trainable, state), x, t) for t in (False, True)]
        gradients = tf.gradients(tf.reduce_sum(logits[1]), trainable)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run([logits, [g for g in gradients if g is not None]])
    return graph


def keras_step_graph(model: tf.keras.Model, input_spec: dict) -> Optional[tf.Graph]:
    """The graph of `model` called in training on a batch of `input_spec`'s `x` (a
    `tf.function`'s, its functions included), or None when Keras cannot trace it either."""
    spec = input_spec["x"]
    try:
        step = tf.function(lambda x: model(x, training=True))
        return step.get_concrete_function(tf.TensorSpec(spec.shape, spec.dtype)).graph
    except Exception:  # the caller's error is the one to report
        return None


# TF 2.14's ops that draw random numbers from a state of their own (the kernel's generator, a
# `tf.random.Generator`'s variable), whatever seed a run passes: `tf.random.normal` and the
# like, Keras's GaussianNoise, GaussianDropout, AlphaDropout and random preprocessing layers.
# A model holding one trains differently from the same seed. (The interpreter's Dropout draws
# with stateless ops from the run's seed: `layer_ops.dropout`.)
UNSEEDED_RANDOM_OPS = frozenset(
    {
        "Multinomial",
        "NonDeterministicInts",
        "ParameterizedTruncatedNormal",
        "RandomCrop",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "RandomStandardNormal",
        "RandomUniform",
        "RandomUniformInt",
        "RngReadAndSkip",
        "RngSkip",
        "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2",
        "StatefulRandomBinomial",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulUniform",
        "StatefulUniformFullInt",
        "StatefulUniformInt",
        "TruncatedNormal",
    }
)


def refuse_unseeded_randomness(
    model: tf.keras.Model, graph: tf.Graph, suspects: Sequence[str] = ()
) -> None:
    """ValueError naming the layers of `model` whose ops in `graph` (a trace of the model's
    training step, its functions included) draw unseeded random numbers
    (`UNSEEDED_RANDOM_OPS`), and the fix. Layers are found by the name scopes of their ops
    (Keras's), else are the `suspects` (the interpreter's ops have no layer scopes)."""
    graph_def = graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    drawing = [node for node in nodes if node.op in UNSEEDED_RANDOM_OPS]
    if not drawing:
        return
    layers = {layer.name for layer in model.submodules if isinstance(layer, tf.keras.layers.Layer)}
    named = sorted({part for n in drawing for part in n.name.split("/") if part in layers})
    named = named or sorted(suspects)
    where = f"layer {', '.join(named)} of model {model.name}" if named else f"model {model.name}"
    ops = ", ".join(sorted({node.op for node in drawing}))
    raise ValueError(
        f"{where} draws random numbers ({ops}) that the run's seed does not seed: the same "
        "seed would train differently each time; remove it, or use a Dropout layer, whose "
        "masks follow the run's seed"
    )


def _calling_user_functions(steps: Sequence[_Step]) -> list[str]:
    """The layers among `steps` that call a function from outside Keras and TensorFlow (an
    activation of the user's): the only code of the user the interpreter runs."""
    names = []
    for step in steps:
        functions = [getattr(step.layer, a, None) for a in ("activation", "recurrent_activation")]
        modules = [getattr(f, "__module__", None) or "" for f in functions if f is not None]
        if any(m.split(".")[0] not in ("keras", "tensorflow") for m in modules):
            names.append(step.layer.name)
    return names


def _training_step_graph(model: tf.keras.Model, functional: FunctionalModel) -> tf.Graph:
    """`functional.apply` in training mode, traced into a graph (not run)."""
    with tf.Graph().as_default() as graph:
        trainable, state = (
            [tf.compat.v1.placeholder(tf.float32, shape) for shape in shapes]
            for shapes in (functional.trainable_shapes, functional.state_shapes)
        )
        x = tf.compat.v1.placeholder(model.inputs[0].dtype, model.inputs[0].shape)
        functional.apply(trainable, state, x, True, tf.constant([0, 0]))
    return graph


def _interpreted_steps(
    model: tf.keras.Model,
    trainable_of: dict,
    state_of: dict,
    bn_momentum: Optional[float],
) -> tuple[list[_Step], list[int]]:
    """The model's layer calls in order, each a `_Step` naming its tensors by their positions
    (`trainable_of`, `state_of`: a variable's ref to its position), and each state tensor's
    owner (its BatchNorm layer's gamma, or beta); `NotInterpretable` for a layer it cannot run
    or weights outside the layers the model calls."""
    nodes = [node for node in _nodes_in_order(model) if not node.is_input]
    position_of = {id(layer): i for i, layer in enumerate(model.layers)}
    owner = [-1] * len(state_of)
    steps: list[_Step] = []
    calls: dict[int, int] = collections.Counter()
    for node in nodes:
        layer = node.layer
        t_idx = [trainable_of[v.ref()] for v in layer.trainable_weights if v.ref() in trainable_of]
        s_idx = [state_of[v.ref()] for v in layer.non_trainable_weights if v.ref() in state_of]
        check_layer(layer, len(t_idx), len(s_idx))
        if type(layer) is BatchNorm:
            for j in s_idx:
                owner[j] = t_idx[0]  # gamma (beta when the layer has no scale)
        steps.append(
            _Step(
                layer=layer,
                trainable=tuple(t_idx),
                state=tuple(s_idx),
                inputs=tuple(id(t) for t in node.keras_inputs),
                outputs=tuple(id(t) for t in tf.nest.flatten(node.outputs)),
                position=position_of.get(id(layer), len(position_of)),
                call=calls[id(layer)],
                fused=bool(getattr(layer, "fused", False)),
                momentum=float(
                    getattr(layer, "momentum", 0.0) if bn_momentum is None else bn_momentum
                ),
            )
        )
        calls[id(layer)] += 1
    used = {i for s in steps for i in s.trainable}
    if len(used) != len(trainable_of) or -1 in owner:
        raise NotInterpretable(
            f"model {model.name} has weights outside the layers it calls; {SUPPORTED}"
        )
    return steps, owner


def _run_step(
    step: _Step,
    x: object,
    weights: Sequence[tf.Tensor],
    stats: list,
    training: bool,
    seed: Optional[tf.Tensor],
) -> tf.Tensor:
    """One layer call on explicit tensors; a BatchNorm call writes its new statistics into
    `stats`."""
    layer = step.layer
    kind = type(layer)
    if kind is BatchNorm:
        it = iter(step.trainable)
        gamma = weights[next(it)] if layer.scale else None
        beta = weights[next(it)] if layer.center else None
        mean_i, var_i = step.state
        y, stats[mean_i], stats[var_i] = batch_norm(
            layer,
            x,
            gamma,
            beta,
            stats[mean_i],
            stats[var_i],
            training,
            step.momentum,
            step.fused,
        )
        return y
    if kind in WEIGHTED:
        return weighted_layer(layer, x, [weights[i] for i in step.trainable])
    if kind is Dropout:
        return dropout(layer, x, training, seed, step.position, step.call)
    return parameter_free_ops(layer, x)


@dataclasses.dataclass(frozen=True, eq=False)
class _Interpreter:
    """A model's layer calls (`steps`) run in order on explicit tensors: the `apply` and
    `features` of `interpreted`. Tensors are named by `id` of their Keras tensors."""

    model_name: str
    steps: tuple[_Step, ...]
    model_input: int
    model_output: int
    num_trainable: int
    num_state: int

    def run(
        self,
        weights: Sequence[tf.Tensor],
        stats: list,
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor],
        head_start: Optional[int] = None,
    ) -> tuple[tf.Tensor, bool]:
        """The layers in order; with `head_start`, stops at the layer owning that trainable
        tensor and returns its (flattened) input. (value, whether it stopped there)."""
        values = {self.model_input: x}
        for step in self.steps:
            inputs = [values[i] for i in step.inputs]
            if head_start is not None and head_start in step.trainable:
                if len(inputs) != 1:
                    raise ValueError(f"the head starts at layer {step.layer.name}, which merges")
                return tf.reshape(inputs[0], [tf.shape(x)[0], -1]), True
            value = _run_step(
                step, inputs[0] if len(inputs) == 1 else inputs, weights, stats, training, seed
            )
            for out_id, out in zip(step.outputs, tf.nest.flatten(value)):
                values[out_id] = out
        return values[self.model_output], False

    def apply(
        self,
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        training: bool,
        seed: Optional[tf.Tensor] = None,
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        if len(weights) != self.num_trainable or len(state) != self.num_state:
            raise ValueError(
                f"model {self.model_name} takes {self.num_trainable} trainable and "
                f"{self.num_state} state tensors, got {len(weights)} and {len(state)}"
            )
        if seed is not None:
            seed = tf.convert_to_tensor(seed)
        stats = list(state)
        output, _ = self.run(weights, stats, x, training, seed)
        return output, tuple(stats)

    def features(
        self,
        weights: Sequence[tf.Tensor],
        state: Sequence[tf.Tensor],
        x: tf.Tensor,
        head_start: int,
    ) -> tf.Tensor:
        value, reached = self.run(weights, list(state), x, False, None, head_start)
        if not reached:
            raise ValueError(
                f"no layer of model {self.model_name} owns trainable tensor {head_start}"
            )
        return value

    def head_steps(self, head_start: int) -> tuple[_Step, ...]:
        """The steps from the layer owning trainable tensor `head_start` to the output."""
        for i, step in enumerate(self.steps):
            if head_start in step.trainable:
                return self.steps[i:]
        raise ValueError(f"no layer of model {self.model_name} owns trainable tensor {head_start}")

    def row_head_starts(self) -> tuple[int, ...]:
        """The trainable tensors from whose layer on the model is a chain of Dense layers on
        one vector per example and parameter-free layers (`row_heads` runs those)."""
        starts = []
        for i, step in enumerate(self.steps):
            chain = self.steps[i:]
            if step.trainable and all(_row_step(s, i == 0) for i, s in enumerate(chain)):
                connected = all(a.outputs == b.inputs for a, b in zip(chain, chain[1:]))
                if connected and chain[-1].outputs == (self.model_output,):
                    starts.append(step.trainable[0])
        return tuple(starts)

    def row_heads(
        self, head: Sequence[tf.Tensor], features: tf.Tensor, head_start: int
    ) -> tf.Tensor:
        """The head from `head_start` on `features`, row r with `[t[r] for t in head]` (see
        `RowHeadsFn`): each Dense layer's matmul is one per row, the row's vector times its
        own kernel, which gives the rows of the one matmul of a client's batch bit for bit
        (tests/test_in_process_evaluation.py)."""
        if head_start not in self.row_head_starts():
            raise ValueError(f"model {self.model_name} has no head of Dense layers at {head_start}")
        value = features
        for step in self.head_steps(head_start):
            if not step.trainable:
                value = parameter_free_ops(step.layer, value)
                continue
            kernel = head[step.trainable[0] - head_start]
            value = tf.matmul(value[:, None, :], kernel)[:, 0, :]
            if step.layer.use_bias:
                value = value + head[step.trainable[1] - head_start]
            if step.layer.activation is not None:
                value = step.layer.activation(value)
        return value


def _row_step(step: _Step, first: bool) -> bool:
    """Whether `row_heads` runs `step`: a Dense layer called once on one vector per example,
    or a parameter-free layer of one input after the head's first layer."""
    layer = step.layer
    if type(layer) is tf.keras.layers.Dense:
        try:
            rank = len(layer.input_shape)  # a shared layer has no one input shape: refused
        except (AttributeError, RuntimeError):
            return False
        return rank == 2 and not step.state
    parameter_free = type(layer) in (tf.keras.layers.Activation, tf.keras.layers.ReLU)
    return not first and parameter_free and len(step.inputs) == 1


def interpreted(model: tf.keras.Model, bn_momentum: Optional[float] = None) -> FunctionalModel:
    """The Keras `model` run by the interpreter (`bn_momentum` as in `functional_model`);
    `NotInterpretable` for a layer or model shape it does not run."""
    trainable_of = {v.ref(): i for i, v in enumerate(model.trainable_weights)}
    state_of = {v.ref(): i for i, v in enumerate(model.non_trainable_weights)}
    steps, owner = _interpreted_steps(model, trainable_of, state_of, bn_momentum)
    model_inputs = [id(t) for t in tf.nest.flatten(model.inputs)]
    if len(model_inputs) != 1 or len(tf.nest.flatten(model.outputs)) != 1:
        raise NotInterpretable(f"model {model.name} must have exactly one input and one output")
    interpreter = _Interpreter(
        model_name=model.name,
        steps=tuple(steps),
        model_input=model_inputs[0],
        model_output=id(tf.nest.flatten(model.outputs)[0]),
        num_trainable=len(trainable_of),
        num_state=len(state_of),
    )
    functional = FunctionalModel(
        trainable_shapes=_shapes(model.trainable_weights),
        state_shapes=_shapes(model.non_trainable_weights),
        state_owner=tuple(owner),
        layer_sizes=tuple(trainable_layer_sizes(model)),
        initial_state=tuple(v.numpy() for v in model.non_trainable_weights),
        apply=interpreter.apply,
        features=interpreter.features,
        rows_independent=not any(type(step.layer) in (BatchNorm, Dropout) for step in steps),
        row_head_starts=interpreter.row_head_starts(),
        row_heads=interpreter.row_heads,
    )
    suspects = _calling_user_functions(steps)
    if suspects:  # traced only then: Keras's and TensorFlow's functions draw nothing unseeded
        refuse_unseeded_randomness(model, _training_step_graph(model, functional), suspects)
    return functional
