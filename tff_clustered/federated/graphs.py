"""TF functions run as graphs in this process, on a named device.

Running TF functions as graphs in this process, the way TFF's TensorFlow executor does
(`GraphFunction`), on a named device or TensorFlow's choice (a GPU when it sees one), and
whether one client's training graph can be vectorised along a client axis (`vectorisable`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.python.eager import context


def placed_on(device: Optional[str]) -> contextlib.AbstractContextManager:
    """Ops created inside go to `device` (e.g. "/GPU:1"); None leaves TensorFlow's choice."""
    return tf.device(device) if device else contextlib.nullcontext()


def check_device(device: Optional[str]) -> None:
    """A named device must be one TensorFlow sees: soft placement (needed for the dataset ops,
    which have CPU kernels only) would otherwise move everything to the CPU in silence."""
    if not device:
        return
    seen = [d.name for d in tf.config.list_logical_devices()]
    wanted = tf.DeviceSpec.from_string(device)
    for name in seen:
        spec = tf.DeviceSpec.from_string(name)
        if spec.device_type == (wanted.device_type or "").upper() and spec.device_index == (
            wanted.device_index or 0
        ):
            return
    raise ValueError(
        f"device {device!r} is not one TensorFlow sees ({', '.join(seen)}); name one of them, "
        "or leave --device out (TensorFlow's choice). For a GPU see docs/gpu.md."
    )


VECTORISE_MAX_OPS = 2_000  # ops of one client's training graph (see `in_process.in_process_round`)


def graph_op_types(graph: tf.Graph) -> list[str]:
    """The type of every op in `graph`, those of the functions it calls (its library)
    included."""
    graph_def = graph.as_graph_def()
    return [n.op for n in graph_def.node] + [
        n.op for f in graph_def.library.function for n in f.node_def
    ]


def vectorisable(graph: tf.Graph) -> bool:
    """Whether converting one client's training graph `graph` with pfor pays and works: at most
    `VECTORISE_MAX_OPS` ops, and no gradient of a loop inside the model (an LSTM's loop over
    time keeps its steps in TensorLists, whose gradient pfor cannot convert)."""
    ops = graph_op_types(graph)
    return len(ops) <= VECTORISE_MAX_OPS and "EmptyTensorList" not in ops


# Ops whose kernel cannot run twice at once. A session keeps one kernel object per op of its
# graph and shares it between the calls it runs at the same time, and between the iterations
# of a loop it runs in parallel; TF 2.14's oneDNN FusedBatchNorm kernels (oneDNN is TF's
# default on CPUs with AVX-512) keep one run's sizes and buffers in that object (`depth_`,
# `mean_values_`, `variance_values_`: tensorflow/tensorflow PR #99852 moves them into
# `Compute`), so two threads running the same graph at once, or two iterations of a loop on
# batches of other sizes (scoring clients of other sizes), corrupt the heap ("corrupted size
# vs. prev_size", exit 134) or the results. Keras's LayerNormalization uses these kernels (TFF's
# builder runs it: `models/functional.py`; the interpreter's BatchNorm does not).
ONE_CALL_AT_A_TIME_OPS = frozenset(
    f"FusedBatchNorm{grad}{version}" for grad in ("", "Grad") for version in ("", "V2", "V3")
)


class GraphFunction:
    """`fn` traced once into its own graph from `specs` and run by a session.

    TFF's Keras functional models only trace inside a graph (they refuse an eager outer
    context, which a `tf.function` called eagerly has), as inside a TFF computation: this runs
    the functions the way TFF's own TensorFlow executor does, as graphs, in this process. Ops go
    to `device` or to TensorFlow's choice (a GPU when it sees one); ops with CPU kernels only
    (tf.data) stay on the CPU.

    Calls from several threads run at once, except on a graph holding an op of
    `ONE_CALL_AT_A_TIME_OPS` (`one_call_at_a_time`), whose calls run one after another and whose
    loops run one iteration after another: each call's results are the same either way, so the
    run's are too."""

    def __init__(self, fn: Callable[..., Any], specs: Sequence[Any], device: Optional[str]):
        self.graph = tf.Graph()
        with self.graph.as_default(), placed_on(device):
            self.inputs = tf.nest.map_structure(
                lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), tuple(specs)
            )
            self.outputs = fn(*self.inputs)
        self.one_call_at_a_time = not ONE_CALL_AT_A_TIME_OPS.isdisjoint(graph_op_types(self.graph))
        if self.one_call_at_a_time:
            self._loops_one_iteration_at_a_time()
        self.placeholders = tf.nest.flatten(self.inputs)
        logical_cpus = len(tf.config.list_logical_devices("CPU"))
        config = tf.compat.v1.ConfigProto(
            allow_soft_placement=True,
            log_device_placement=context.context().log_device_placement,
            device_count={"CPU": max(logical_cpus, 1)},
        )
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        # Held by a call that must run alone: every call of a `one_call_at_a_time` graph, and
        # the first call of any graph (a session optimizes its graph on its first run, long for
        # a large graph such as the Sent140 LSTM's client work: calls from other threads wait
        # for it rather than each optimizing it again).
        self._alone = threading.Lock()
        self._ran = False

    def _loops_one_iteration_at_a_time(self) -> None:
        """The graph made again with every loop's `parallel_iterations` 1 (its functions'
        loops too), and the inputs and outputs its own."""
        graph_def = self.graph.as_graph_def()
        for node in [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]:
            if "parallel_iterations" in node.attr:
                node.attr["parallel_iterations"].i = 1
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")

        def imported(element: Any) -> Any:
            return self.graph.as_graph_element(element.name)

        self.inputs = tf.nest.map_structure(imported, self.inputs)
        self.outputs = tf.nest.map_structure(imported, self.outputs)

    def __call__(self, *args: Any) -> Any:
        tf.nest.assert_same_structure(self.inputs, tuple(args), check_types=False)
        feed = dict(zip(self.placeholders, tf.nest.flatten(tuple(args))))
        concurrent = self._ran and not self.one_call_at_a_time
        with contextlib.nullcontext() if concurrent else self._alone:
            outputs = self.session.run(self.outputs, feed_dict=feed)
            self._ran = True
        return outputs
