"""Experiment-level properties: determinism, FedProx(mu=0) == FedAvg, Local, schedules."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from conftest import EXECUTION, checkpoint_round_trip

from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.base import (
    Algorithm,
    Decision,
    Queries,
    RoundResult,
    RunInfo,
    ServerView,
)
from tff_clustered.data import load_digits_clusters
from tff_clustered.federated import client_work
from tff_clustered.federated.server_optimizers import ServerOptimizer
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.divergence import DivergenceError, check_finite
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.loop.sampling import sampled_positions
from tff_clustered.loop.state import RunState, apply_decision
from tff_clustered.models import model_spec

pytestmark = pytest.mark.usefixtures("tff_context")
CONFIG = TrainingConfig(rounds=3, clients_per_round=4, local_epochs=1, learning_rate=0.1, seed=5)


def run(algorithm: str, config: TrainingConfig = CONFIG, **options: object) -> Experiment:
    data = load_digits_clusters(num_clients=12, num_groups=2, seed=config.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    experiment = Experiment(
        data,
        model,
        make_algorithm(algorithm, **options),
        config,
        execution=RunExecution.of(EXECUTION),
    )
    experiment.start()
    list(experiment.rounds())
    return experiment


def metrics(experiment: Experiment) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.endswith("_seconds")} for r in experiment.state.history
    ]


def test_same_seed_same_metrics_and_other_seed_differs() -> None:
    a, b = run("fedper"), run("fedper")
    assert metrics(a) == metrics(b)
    c = run("fedper", TrainingConfig(**{**CONFIG.__dict__, "seed": 6}))
    assert metrics(a) != metrics(c)


def test_fedprox_with_mu_zero_is_fedavg_exactly() -> None:
    assert metrics(run("fedprox", mu=0.0)) == metrics(run("fedavg"))
    assert metrics(run("fedprox", mu=1.0)) != metrics(run("fedavg"))


def test_local_training_never_changes_the_server_models() -> None:
    experiment = run("local")
    initial = experiment.run.initial_model
    final = experiment.state.cluster_models
    assert (final == initial[None, :]).all()
    assert len(experiment.store.models) > 0


def test_history_has_an_evaluated_row_per_round_and_round_zero() -> None:
    history = run("fedavg").state.history
    assert [r["round"] for r in history] == [0, 1, 2, 3]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in history)
    assert history[1]["num_sampled"] == 4 and history[1]["sampled_cluster_0"] == 4


def test_sampling_is_a_function_of_seed_and_round() -> None:
    experiment = run("fedavg", TrainingConfig(rounds=1, clients_per_round=4, seed=5))
    assert experiment.sample_clients(7) == experiment.sample_clients(7)
    assert len(set(experiment.sample_clients(7))) == 4
    assert any(experiment.sample_clients(r) != experiment.sample_clients(7) for r in range(1, 7))


def test_a_poisson_round_without_clients_trains_nothing_and_changes_nothing() -> None:
    """--client_sampling=poisson with q = 1/12: seed 5 draws no client in round 3 (the draw is
    checked first). That round's row says so with the columns of any other, and the models,
    the server optimizer's state and the assignment after it are bit for bit those before it,
    while the rounds around it train. Each round's clients are `sampled_positions`' draw, for
    either sampling."""
    assert [len(sampled_positions("poisson", 12, 1, 5, r)) for r in (1, 2, 3, 4)] == [1, 1, 0, 3]
    sgdm = ServerOptimizer("sgdm", learning_rate=1.0, momentum=0.9)
    config = TrainingConfig(
        rounds=4, clients_per_round=1, learning_rate=0.1, seed=5, client_sampling="poisson",
        server_optimizer=sgdm,
    )  # fmt: skip
    data = load_digits_clusters(num_clients=12, num_groups=2, seed=5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    experiment = Experiment(
        data, model, make_algorithm("fedavg"), config, execution=RunExecution.of(EXECUTION)
    )
    experiment.start()
    after = []
    for _ in experiment.rounds():
        state = experiment.state
        optimizer = {k: v.copy() for k, v in (state.server_optimizer_state or {}).items()}
        after.append((state.cluster_models.copy(), optimizer, dict(state.assignment)))
    history = experiment.state.history
    assert [row["num_sampled"] for row in history[1:]] == [1, 1, 0, 3]
    assert math.isnan(history[3]["train_loss"]) and history[3]["floats_communicated"] == 0
    assert set(history[3]) == set(history[2])
    models, optimizer, assignment = after[3]
    np.testing.assert_array_equal(models, after[2][0])
    assert optimizer.keys() == after[2][1].keys() and len(optimizer) > 0
    for key, value in optimizer.items():
        np.testing.assert_array_equal(value, after[2][1][key])
    assert assignment == after[2][2]
    assert not np.array_equal(after[2][0], after[1][0])
    assert not np.array_equal(after[4][0], after[3][0])
    ids = list(data.client_ids)
    for sampling in ("poisson", "fixed"):
        experiment.config = dataclasses.replace(config, client_sampling=sampling)
        for r in (1, 3, 4):
            drawn = sampled_positions(sampling, 12, 1, 5, r)
            assert experiment.sample_clients(r) == [ids[i] for i in drawn]


def test_learning_rate_schedules() -> None:
    exp = TrainingConfig(learning_rate=0.1, lr_schedule="exponential", lr_decay=0.5)
    assert [exp.learning_rate_at(r) for r in (1, 2, 3)] == [0.1, 0.05, 0.025]
    cos = TrainingConfig(rounds=4, learning_rate=0.2, lr_schedule="cosine")
    assert cos.learning_rate_at(1) == pytest.approx(0.2)
    assert cos.learning_rate_at(3) == pytest.approx(0.1)
    assert TrainingConfig(learning_rate=0.3).learning_rate_at(9) == 0.3


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rounds", 0, "rounds"),
        ("learning_rate", -1.0, "learning_rate"),
        ("learning_rate", math.nan, "learning_rate"),
        ("lr_schedule", "warm", "lr_schedule"),
        ("momentum", 1.0, "momentum"),
        ("client_sampling", "bernoulli", "client_sampling"),
    ],
)
def test_invalid_training_config_is_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**{field: value})


def test_algorithm_options_are_checked() -> None:
    with pytest.raises(ValueError, match="one model"):
        make_algorithm("fedavg", num_clusters=3)
    with pytest.raises(ValueError, match="fedprox"):
        make_algorithm("fedavg", mu=0.5)
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_algorithm("fedsomething")
    assert make_algorithm("fedprox").prox_mu == 0.01
    assert make_algorithm("fedper", personal_layers=2).options.personal_layers == 2


def test_fedper_personalises_the_classifier_head_by_default() -> None:
    """Unset --personal_layers: the dense layers after the last convolution (FedTSDP's FedPer on
    its CNN: 2 of 4 weighted layers), the top layer of an MLP; a given count wins."""
    fedper = make_algorithm("fedper")
    for model, personal in (("tsdp_cnn", 2), ("lenet", 3), ("mlp", 1)):
        spec = model_spec(model, (8, 8, 1), 10, hidden_units=8)
        exp = Experiment(
            load_digits_clusters(num_clients=4, num_groups=1),
            spec,
            fedper,
            TrainingConfig(clients_per_round=4),
        )
        assert fedper.personal_layers(exp.run) == personal, model
        assert make_algorithm("fedper", personal_layers=1).personal_layers(exp.run) == 1


class AnchoredFedAvg(Algorithm):
    """A paper written against the core as a newcomer would: FedAvg whose clients are also
    pulled toward a server anchor over the first layer, the anchor being the previous round's
    model (a two-anchor client like FedAC's)."""

    name = "anchored_fedavg"

    def __init__(self, anchor_lambda: float) -> None:
        super().__init__()
        self.anchor_lambda = anchor_lambda

    def client_work(self, momentum: float, run: RunInfo) -> client_work.ClientWork:
        return client_work.LocalSGD(momentum=momentum, anchor_lambda=self.anchor_lambda)

    def anchor_tensors(self, run: RunInfo) -> tuple[int, ...]:
        return (0, 1)

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        return Decision(anchor=result.cluster_models_before[0])


def test_an_algorithm_can_broadcast_an_anchor_and_move_it() -> None:
    data = load_digits_clusters(num_clients=12, num_groups=2, seed=CONFIG.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    runs = {}
    for strength in (0.0, 5.0):  # lr * lambda = 0.5: a stable pull
        experiment = Experiment(
            data, model, AnchoredFedAvg(strength), CONFIG, execution=RunExecution.of(EXECUTION)
        )
        experiment.start()
        np.testing.assert_array_equal(experiment.state.anchor, experiment.run.initial_model)
        rows = list(experiment.rounds())
        runs[strength] = experiment
        # the anchor moved to the model before the last round
        assert not np.array_equal(experiment.state.anchor, experiment.run.initial_model)
    assert metrics(runs[0.0]) != metrics(runs[5.0])
    fedavg = run("fedavg")
    assert [r["accuracy"] for r in metrics(runs[0.0])] == [r["accuracy"] for r in metrics(fedavg)]
    first_layer = sum(runs[0.0].run.tensor_sizes[:2])
    assert rows[1]["floats_communicated"] == metrics(fedavg)[1]["floats_communicated"] + 4 * (
        first_layer
    )
    # the pulled layer stays much closer to its anchor than without the pull
    for_each = {
        s: np.linalg.norm((e.state.cluster_models[0] - e.state.anchor)[:first_layer])
        for s, e in runs.items()
    }
    assert for_each[5.0] < 0.5 * for_each[0.0]


def test_a_non_finite_cluster_model_stops_the_run_naming_round_clients_and_fix() -> None:
    models = np.zeros((3, 4), np.float32)
    check_finite(models, 7, "aggregation", np.array([0, 2]), ["a", "b"])  # all finite: fine
    models[2, 1] = np.inf
    with pytest.raises(DivergenceError) as raised:
        check_finite(models, 7, "aggregation", np.array([0, 2, 2]), ["a", "b", "c"])
    message = str(raised.value)
    assert "round 7" in message and "cluster model(s) 2" in message
    assert "clients: b, c" in message and "lower --learning_rate" in message


class ExamplesRecorder(Algorithm):
    """FedAvg that records how many examples each sampled client trained on."""

    name = "examples_recorder"

    def __init__(self) -> None:
        super().__init__()
        self.examples: list[np.ndarray] = []

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        self.examples.append(result.num_examples.copy())
        return Decision()


def test_local_steps_cut_local_training_to_that_many_minibatches() -> None:
    """--local_steps (FedAC's 5 local steps): each client takes exactly that many minibatches,
    its epochs repeated as needed; 0 keeps --local_epochs passes."""
    data = load_digits_clusters(num_clients=12, num_groups=2, seed=5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    for steps, epochs in ((40, 1), (0, 2)):
        recorder = ExamplesRecorder()
        config = TrainingConfig(
            rounds=1, clients_per_round=4, local_epochs=epochs, local_steps=steps,
            batch_size=5, learning_rate=0.1, seed=5,
        )  # fmt: skip
        experiment = Experiment(data, model, recorder, config, execution=RunExecution.of(EXECUTION))
        experiment.start()
        list(experiment.rounds())
        (examples,) = recorder.examples
        sampled = experiment.sample_clients(1)
        if steps:  # 40 x 5 examples: more than a client holds, so its data repeats
            assert max(data.train_sizes[c] for c in sampled) < 200
            np.testing.assert_array_equal(examples, 200.0)
        else:
            np.testing.assert_array_equal(examples, [2 * data.train_sizes[c] for c in sampled])


def test_an_algorithm_is_given_the_five_queries_and_not_the_loop() -> None:
    """Decisions get `Queries` (local updates, cluster losses, client models, inference, an
    initial model): the loop's state and its other methods are out of their reach."""
    seen: list = []

    class Peek(Algorithm):
        def init(self, run: RunInfo, queries: Queries) -> Decision:
            seen.append(queries)
            return super().init(run, queries)

    data = load_digits_clusters(num_clients=4, num_groups=2, seed=0)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=4)
    Experiment(data, model, Peek(), CONFIG, execution=RunExecution.of(EXECUTION)).start()
    (queries,) = seen
    assert not isinstance(queries, Experiment)
    assert not hasattr(queries, "state") and not hasattr(queries, "apply")
    names = ("local_updates", "cluster_losses", "client_models", "predict_probabilities")
    for name in (*names, "initial_model"):
        assert callable(getattr(queries, name))
    assert queries.initial_model(3).shape == queries.initial_model(4).shape


def test_a_round_counts_the_net_moves_of_the_clients_its_decisions_assigned() -> None:
    """`clients_changed_cluster` from the clients the round's decisions touched (no scan of
    every client): a client moved and moved back has not moved, a first assignment is no move."""
    from tff_clustered.algorithms.base import Decision
    from tff_clustered.loop.state import clients_moved

    state = RunState(
        cluster_models=np.zeros((3, 2), np.float32), assignment={"a": 0, "b": 1, "c": -1, "d": 2}
    )
    before = apply_decision(state, Decision(assignment={"a": 1, "c": 2}), "plan", ())
    later = apply_decision(state, Decision(assignment={"a": 0, "b": 2, "d": -1}), "after", ())
    assert clients_moved(state.assignment, before, later) == 1  # b only
    assert clients_moved(state.assignment, later, before) == 2  # a read from the wrong start
    assert state.view().assignment["b"] == 2
    with pytest.raises(TypeError):
        state.view().assignment["b"] = 0  # type: ignore[index]  # an algorithm only reads


def recounted(state: RunState) -> list[int]:
    """Clients per cluster counted afresh from every client's cluster."""
    held = np.array(list(state.assignment.values()), np.int64)
    return np.bincount(held[held >= 0], minlength=state.num_clusters).tolist()


def random_decision(state: RunState, rng: np.random.Generator, step: int) -> Decision:
    """A decision that creates clusters (clients moved into the new ones), removes one (its
    clients moved or unassigned, the later clusters renumbered) or moves and unassigns
    clients, in turn."""
    num, clients = state.num_clusters, list(state.assignment)
    chosen = [str(c) for c in rng.choice(clients, 8, replace=False)]
    if step % 3 == 0:
        new_num = num + int(rng.integers(1, 3))
        changes = {c: int(rng.integers(num, new_num)) for c in chosen}
    elif step % 3 == 1 and num > 1:
        removed, new_num = int(rng.integers(num)), num - 1
        changes = {
            c: (int(rng.integers(-1, new_num)) if k == removed else k - (k > removed))
            for c, k in state.assignment.items()
            if k >= removed
        }
    else:
        new_num = num
        changes = {c: int(rng.integers(-1, num)) for c in chosen}
    return Decision(assignment=changes, cluster_models=np.zeros((new_num, 3), np.float32))


def test_cluster_sizes_equal_a_recount_after_every_decision_and_a_checkpoint(
    tmp_path: object,
) -> None:
    """The counts the state keeps (`RunState.cluster_sizes`, what evaluation reports) are what
    counting every client gives, after decisions that move and unassign clients, create and
    remove clusters, and after a checkpoint's round trip (counted again on load)."""
    rng = np.random.default_rng(0)
    clients = [f"c{i}" for i in range(40)]
    state = RunState(cluster_models=np.zeros((2, 3), np.float32))
    apply_decision(state, Decision(assignment={c: -1 for c in clients[:30]}), "init", ())
    assert state.cluster_sizes.tolist() == [0, 0]
    apply_decision(state, Decision(assignment={c: i % 2 for i, c in enumerate(clients)}), "a", ())
    assert state.cluster_sizes.tolist() == [20, 20] == recounted(state)
    sizes_seen = set()
    for step in range(60):
        apply_decision(state, random_decision(state, rng, step), "random", ())
        assert state.cluster_sizes.tolist() == recounted(state), step
        sizes_seen.add(state.num_clusters)
        if step % 10 == 9:
            state = checkpoint_round_trip(state, tmp_path)
            assert state.cluster_sizes.tolist() == recounted(state), step
    assert len(sizes_seen) > 3  # clusters were created and removed
    # Clients left in a cluster past the last one are counted, as a recount counts them.
    state.cluster_models = state.cluster_models[:1]
    assert state.cluster_sizes.tolist() == recounted(state)
    with pytest.raises(TypeError, match="a client's cluster is not a cluster number"):
        RunState(assignment={"a": 0, "b": "one"})  # a damaged checkpoint's: refused on load


class Reshuffle(Algorithm):
    """Moves the sampled clients to random clusters of a count that changes every round
    (1, 2 or 3 clusters), the clients of removed clusters to cluster 0."""

    name = "reshuffle"

    def after_round(
        self, run: RunInfo, view: ServerView, result: RoundResult, queries: Queries
    ) -> Decision:
        rng = np.random.default_rng(result.round_num)
        num = 1 + result.round_num % 3
        changes = {c: 0 for c, k in view.assignment.items() if k >= num}
        changes.update({c: int(rng.integers(num)) for c in result.client_ids})
        models = np.resize(view.cluster_models, (num, view.cluster_models.shape[1]))
        return Decision(assignment=changes, cluster_models=models)


def test_evaluation_reports_cluster_sizes_that_equal_a_recount() -> None:
    data = load_digits_clusters(num_clients=12, num_groups=2, seed=5)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=8)
    config = TrainingConfig(rounds=4, clients_per_round=6, learning_rate=0.1, seed=5)
    experiment = Experiment(data, model, Reshuffle(), config, execution=RunExecution.of(EXECUTION))
    experiment.start()
    for row in experiment.rounds():
        sizes = [row[f"cluster_size_{k}"] for k in range(experiment.num_clusters)]
        assert sizes == recounted(experiment.state), row["round"]
        assert f"cluster_size_{experiment.num_clusters}" not in row
    assert sum(sizes) == 12
