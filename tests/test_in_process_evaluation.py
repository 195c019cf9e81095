"""The in-process round's ways of scoring clients with personal models
(`in_process_scoring.py`): looped in one call, the scores of each client alone bit for bit;
vectorised (same-size clients in one call, clients of other sizes padded with masked batches when
the model's rows are independent), the counts exactly and the loss sums within float32
rounding; each call's way chosen by its own work; and decisions scored alone whatever would
pay."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import mlp_experiment

from tff_clustered.data import load_digits_clusters
from tff_clustered.federated import client_work, graphs, in_process, in_process_scoring
from tff_clustered.federated.round_functions import round_functions
from tff_clustered.federated.round_inputs import evaluation_input
from tff_clustered.federated.signature import RoundSignature
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.state import cluster_capacity
from tff_clustered.models import initial_weights, model_spec
from tff_clustered.models.functional import functional_model

pytestmark = pytest.mark.usefixtures("tff_context")
SIZES = (10, 10, 7, 10, 3, 10, 70, 7)  # same sizes, padded ones, more than a batch
BATCH_SIZE = np.int64(64)


@contextlib.contextmanager
def traced_names() -> Iterator[list[str]]:
    """The names of the functions traced into graphs (`graphs.GraphFunction`) inside."""
    names: list[str] = []
    original = graphs.GraphFunction

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, fn: Callable[..., Any], specs: list, *args: object) -> None:
            names.append(fn.__name__)
            super().__init__(fn, specs, *args)

    graphs.GraphFunction = Recorded
    try:
        yield names
    finally:
        graphs.GraphFunction = original


class PersonalRound:
    """A two-cluster in-process round whose clients join the cluster's shared body with their
    stored head (`work`: FedPer's), or use their whole stored model (Ditto's), or (without
    `head`) use the cluster's whole model, and its clients of `SIZES` examples."""

    def __init__(self, work: object, pad: bool = True, head: bool = True) -> None:
        spec = model_spec("mlp", (6,), 3, hidden_units=5)
        functional = functional_model(spec.build(), spec.input_spec())
        w0 = [np.asarray(w) for w in initial_weights(spec, 0)]
        # the body, each client's own head (FedPer); without `head`, whole models, none stored
        shared = tuple(range(len(w0) - 2 if head else len(w0)))
        fns = round_functions(functional, spec.input_spec(), RoundSignature(2, shared, work), w0)
        self.round = in_process.in_process_round(fns, pad_unequal_clients=pad)
        self.scoring = self.round.evaluate.__self__  # its `ClientScoring`
        rng = np.random.default_rng(2)
        self.models = tuple(
            np.stack([np.asarray(w, np.float32) + np.float32(0.1 * k) for k in range(2)])
            for w in w0
        )
        self.clients = []
        for i, n in enumerate(SIZES):
            data = collections.OrderedDict(
                x=rng.normal(size=(n, 6)).astype(np.float32),
                y=rng.integers(0, 3, size=n).astype(np.int32),
            )
            stored = tuple(
                (np.asarray(w0[j]) * (1.0 + 0.05 * i)).astype(np.float32) for j in fns.io.store_in
            )
            self.clients.append(evaluation_input(data, np.array([i % 2], np.int32), stored))

    def traced(self, run: Callable[[], list]) -> tuple[list[dict], list[str]]:
        """What `run()` returns, and the graphs traced while it ran."""
        with traced_names() as names:
            return run(), names

    def scored(self, way: str) -> tuple[list[dict], list[str]]:
        """The clients' scores computed `way`, and the graphs traced for it."""
        return self.traced(lambda: self.scoring.score(way, self.models, self.clients, BATCH_SIZE))

    def evaluated(self) -> tuple[list[dict], list[str]]:
        """The round's `evaluate` of its clients, and the graphs traced for it."""
        return self.traced(lambda: self.round.evaluate(self.models, self.clients, BATCH_SIZE))


WORKS = pytest.mark.parametrize(
    "work",
    [client_work.LocalSGD(), client_work.DittoSGD(ditto_lambda=0.5)],
    ids=["fedper", "ditto"],
)


def as_floats(scores: list[dict]) -> list[dict]:
    return [{k: float(v) for k, v in s.items()} for s in scores]


@WORKS
@pytest.mark.parametrize("head", [True, False], ids=["stored", "whole_models"])
def test_looped_clients_get_the_scores_of_each_alone_bit_for_bit(
    work: object, head: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    personal = PersonalRound(work, head=head)
    alone, alone_names = personal.scored("alone")
    looped, looped_names = personal.scored("looped")
    assert alone_names == [] and looped_names == ["evaluate_looped"]
    assert [s["num_examples"] for s in alone] == list(map(float, SIZES))
    assert as_floats(looped) == as_floats(alone)
    # a few clients per looped call (28 bytes an example here)
    monkeypatch.setattr(in_process_scoring, "LOOPED_CALL_BYTES", 300)
    assert as_floats(personal.scored("looped")[0]) == as_floats(alone)


@WORKS
@pytest.mark.parametrize("pad", [True, False])
def test_vectorised_clients_get_the_scores_of_each_alone(work: object, pad: bool) -> None:
    personal = PersonalRound(work, pad)
    alone, _ = personal.scored("alone")
    together, names = personal.scored("vectorised")
    assert "evaluate_stacked" in names
    for a, b in zip(alone, together, strict=True):
        assert a.keys() == b.keys()
        assert b["num_examples"] == a["num_examples"]
        assert b["num_correct"] == a["num_correct"]
        np.testing.assert_allclose(b["loss_sum"], a["loss_sum"], rtol=1e-6)


def test_byte_runs_hold_at_most_the_bytes_or_one_larger_client() -> None:
    runs = in_process_scoring.byte_runs([3, 2, 9, 1, 1, 4], 10, 50)
    assert [list(r) for r in runs] == [[0, 1], [2], [3, 4], [5]]
    assert in_process_scoring.byte_runs([], 10, 50) == []


def test_a_call_vectorises_only_when_its_own_saving_clearly_exceeds_the_conversion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    personal = PersonalRound(client_work.LocalSGD())
    ops = personal.scoring.ops
    one_conversion = ops * in_process_scoring.CONVERSION_SECONDS_PER_OP
    break_even = in_process_scoring.CLEAR_MARGIN * one_conversion
    clients_to_pay = break_even / (ops * in_process_scoring.LOOPED_SECONDS_PER_OP)
    assert not in_process_scoring.vectorising_pays(int(clients_to_pay * 0.99), ops, 1)
    assert in_process_scoring.vectorising_pays(int(clients_to_pay * 1.01) + 1, ops, 1)
    assert not in_process_scoring.vectorising_pays(int(clients_to_pay * 1.01) + 1, ops, 2)

    _, names = personal.evaluated()  # 8 clients: far from paying for the conversion
    assert names == ["evaluate_looped"]
    monkeypatch.setattr(in_process_scoring, "CONVERSION_SECONDS_PER_OP", 0.0)
    _, names = personal.evaluated()
    assert "evaluate_stacked" in names


@WORKS
def test_exact_scores_are_each_clients_own_call_even_where_vectorising_pays(
    work: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(in_process_scoring, "CONVERSION_SECONDS_PER_OP", 0.0)
    personal = PersonalRound(work)
    exact, names = personal.traced(
        lambda: personal.round.evaluate_exactly(personal.models, personal.clients, BATCH_SIZE)
    )
    assert names == []
    each = [
        personal.round.evaluate_exactly(personal.models, [client], BATCH_SIZE)[0]
        for client in personal.clients
    ]
    assert as_floats(exact) == as_floats(each)


def test_decision_losses_are_those_of_each_client_scored_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cluster_losses` with stored tensors (FedPer's heads, three cluster bodies), where the
    metrics' `evaluate` would vectorise: each loss is that client's own call's, bit for bit."""
    monkeypatch.setattr(in_process_scoring, "CONVERSION_SECONDS_PER_OP", 0.0)
    config = TrainingConfig(rounds=1, clients_per_round=4, learning_rate=0.1, batch_size=8)
    data = load_digits_clusters(num_clients=12, num_groups=3, seed=1)
    exp = mlp_experiment("fedper", data, config)
    ids = exp.data.client_ids
    assert len({exp.data.train_sizes[c] for c in ids}) > 1  # padded groups in a vectorised call
    base = exp.state.cluster_models[0]
    models = np.stack([base, base * 1.5, base * -0.5]).astype(np.float32)
    losses = exp.queries.cluster_losses(models, ids)
    signature = dataclasses.replace(exp.current_round().signature, num_clusters=cluster_capacity(3))
    fed_round = exp.calls.rounds_cache.get(signature)  # the round cluster_losses scores with
    for k in range(3):
        for i, c in enumerate(ids):
            alone = exp.calls.score(
                fed_round, models, np.array([k]), [c], exp.store, "train", exact=True
            )
            assert losses[i, k] == alone[c]["loss_sum"] / alone[c]["num_examples"]
