"""A built round carries no array literal as large as its models: TFF serializes a literal value
by value (a Python list), which made building a round of 16 clusters of a 0.6 MB model take
seconds, and `next` sends its computation, literals included, to the worker at every call."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from google.protobuf.message import Message
from tensorflow_federated.python.core.impl.computation.computation_impl import (
    ConcreteComputation,
)

from tff_clustered.federated import client_work
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.federated.tff_execution import tff_round_parts
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model


def literal_sizes(message: Message) -> Iterator[int]:
    """The number of values of every array literal in a computation proto."""
    for field, value in message.ListFields():
        if field.name == "literal":
            array = value.value
            yield int(np.prod([int(d) for d in array.shape.dim])) if array.shape.dim else 1
        children = value if field.label == field.LABEL_REPEATED else [value]
        for child in children:
            if isinstance(child, Message):
                yield from literal_sizes(child)


def test_round_computations_hold_no_model_sized_literal() -> None:
    spec = model_spec("mlp", (20,), 3, hidden_units=16)
    w0 = initial_weights(spec, 0)
    signature = RoundSignature(
        8,
        tuple(range(len(w0))),
        client_work.LocalSGD(),
        keep_client_models=True,
        server_optimizer=ServerOptimizer("sgdm", learning_rate=1.0, momentum=0.9),
    )
    model = functional_model(spec.build(), spec.input_spec())
    parts = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0))
    smallest_tensor = min(int(np.size(w)) for w in w0)
    for name in ("initialize", "next", "partial_next", "finalize"):
        proto = ConcreteComputation.get_proto(getattr(parts, name))
        largest = max(literal_sizes(proto), default=0)
        assert largest < smallest_tensor, (name, largest)


@pytest.mark.usefixtures("tff_context")
def test_initialize_gives_every_cluster_the_initial_model() -> None:
    spec = model_spec("mlp", (20,), 3, hidden_units=16)
    w0 = initial_weights(spec, 0)
    model = functional_model(spec.build(), spec.input_spec())
    signature = RoundSignature(
        3,
        tuple(range(len(w0))),
        server_optimizer=ServerOptimizer("sgdm", learning_rate=1.0, momentum=0.9),
    )
    state = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0)).initialize()
    for got, want in zip(state.cluster_models, w0):
        np.testing.assert_array_equal(got, np.repeat(np.asarray(want)[None], 3, axis=0))
    assert all(not np.any(v) for v in state.optimizer.values())


def test_computations_a_round_may_not_use_are_built_when_first_used() -> None:
    """One worker never calls `partial_next` or `finalize`, and a round FedTSDP builds for a
    split it soon leaves may never be evaluated: they are traced on first use only."""
    spec = model_spec("mlp", (20,), 3, hidden_units=16)
    w0 = initial_weights(spec, 0)
    model = functional_model(spec.build(), spec.input_spec())
    signature = RoundSignature(4, tuple(range(len(w0))))
    parts = tff_round_parts(round_functions(model, spec.input_spec(), signature, w0))
    lazy = ("partial_next", "finalize", "evaluate")
    assert not any(name in vars(parts) for name in lazy)
    assert parts.evaluate is parts.evaluate  # built once, then kept
    assert "evaluate" in vars(parts) and "partial_next" not in vars(parts)
