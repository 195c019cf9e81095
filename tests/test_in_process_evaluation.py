"""The in-process `evaluate` scores clients together (same-size clients in one vectorised call,
clients of other sizes padded with masked batches when the model's rows are independent),
with the counts and, within float32 rounding, the loss sums of scoring each client alone."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tff_clustered.federated import client_work, graphs, in_process
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import evaluation_input
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model

pytestmark = pytest.mark.usefixtures("tff_context")
SIZES = (10, 10, 7, 10, 3, 10, 70, 7)  # same sizes, padded ones, more than a batch


def personal_scores(work: object, **round_options: object) -> tuple[list[dict], list[str]]:
    """Each client's scores with a personal model (the cluster's shared body joined with the
    client's stored head, or its whole stored model for Ditto's work) of a two-cluster round,
    and the names of the graphs the round traced."""
    spec = model_spec("mlp", (6,), 3, hidden_units=5)
    functional = functional_model(spec.build(), spec.input_spec())
    w0 = [np.asarray(w) for w in initial_weights(spec, 0)]
    shared = tuple(range(len(w0) - 2))  # the body; each client's own head (FedPer)
    signature = RoundSignature(2, shared, work)
    fns = round_functions(functional, spec.input_spec(), signature, w0)
    names: list[str] = []
    original = graphs.GraphFunction

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, fn: object, specs: list, *args: object) -> None:
            names.append(fn.__name__)
            super().__init__(fn, specs, *args)

    rng = np.random.default_rng(2)
    models = tuple(
        np.stack([np.asarray(w, np.float32) + np.float32(0.1 * k) for k in range(2)]) for w in w0
    )
    clients = []
    for i, n in enumerate(SIZES):
        data = collections.OrderedDict(
            x=rng.normal(size=(n, 6)).astype(np.float32),
            y=rng.integers(0, 3, size=n).astype(np.int32),
        )
        stored = tuple(
            (np.asarray(w0[j]) * (1.0 + 0.05 * i)).astype(np.float32) for j in fns.io.store_in
        )
        clients.append(evaluation_input(data, np.array([i % 2], np.int32), stored))
    graphs.GraphFunction = Recorded
    try:
        fed_round = in_process.in_process_round(fns, **round_options)
        return fed_round.evaluate(models, clients, np.int64(64)), names
    finally:
        graphs.GraphFunction = original


@pytest.mark.parametrize(
    "work",
    [client_work.LocalSGD(), client_work.DittoSGD(ditto_lambda=0.5)],
    ids=["fedper", "ditto"],
)
@pytest.mark.parametrize("pad", [True, False])
def test_clients_scored_together_give_the_scores_of_each_alone(work: object, pad: bool) -> None:
    alone, alone_names = personal_scores(work, vectorise=False)
    together, names = personal_scores(work, pad_unequal_clients=pad)
    assert "evaluate_stacked" not in alone_names
    assert "evaluate_stacked" in names
    assert [s["num_examples"] for s in alone] == list(map(float, SIZES))
    for a, b in zip(alone, together, strict=True):
        assert a.keys() == b.keys()
        assert b["num_examples"] == a["num_examples"]
        assert b["num_correct"] == a["num_correct"]
        np.testing.assert_allclose(b["loss_sum"], a["loss_sum"], rtol=1e-6)
