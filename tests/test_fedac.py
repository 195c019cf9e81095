"""FedAC on the shared core: LocalUpdate, the warm-up, the global embedding, and what the
algorithm must achieve on planted groups. (The NumPy clustering math is tested in
test_fedac_clustering.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import EXECUTION, checkpoint_round_trip, history_rows, mlp_experiment
from sklearn.metrics import adjusted_rand_score

from tff_clustered.algorithms import fedac, make_algorithm
from tff_clustered.data import load_digits_clusters
from tff_clustered.federated import client_work
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment

pytestmark = pytest.mark.usefixtures("tff_context")


def experiment(
    algorithm: str, config: TrainingConfig, clients: int, **options: object
) -> Experiment:
    data = load_digits_clusters(num_clients=clients, num_groups=4, seed=config.seed)
    return mlp_experiment(algorithm, data, config, **options)


def test_local_update_moves_by_the_two_pulls_only() -> None:
    """With a loss whose gradient is zero (a forward that ignores the weights), one step moves
    omega by -lr [mu (omega - Omega) + lambda pad(phi - Phi)]: the head gets no lambda term;
    the start is the client's own model."""
    own = (tf.constant([1.0, 2.0]), tf.constant([3.0]))
    center = (tf.constant([0.0, 0.0]), tf.constant([0.0]))
    phi = (tf.constant([10.0, 10.0]),)

    def forward(
        weights: tuple, state: tuple, x: tf.Tensor, training: bool, seed: object = None
    ) -> tuple:  # the loss does not depend on the weights
        return tf.zeros([tf.shape(x)[0], 2]) + 0.0 * sum(tf.reduce_sum(w) for w in weights), ()

    dataset = tf.data.Dataset.from_tensors({"x": tf.zeros([1, 1]), "y": tf.constant([0])})
    inputs = client_work.ClientInputs(
        center, (), own, (), dataset, tf.constant(0.1), tf.constant(1.0), tf.constant([0, 0]),
        phi, (0,),
    )  # fmt: skip
    work = client_work.LocalSGD(prox_mu=0.5, anchor_lambda=0.2, from_own_model=True)
    assert work.reads_own_model
    out = work(forward, inputs)
    pulls = 0.5 * np.array([1.0, 2.0]) + 0.2 * np.array([-9.0, -8.0])
    expected_0 = np.array([1.0, 2.0]) - 0.1 * pulls
    np.testing.assert_allclose(out.own_weights[0].numpy(), expected_0, rtol=1e-6)
    np.testing.assert_allclose(out.own_weights[1].numpy(), [3.0 - 0.1 * 0.5 * 3.0], rtol=1e-6)


def test_fedac_with_no_pulls_is_local() -> None:
    """mu = lambda = 0 and every client in every round: each client trains its own model on the
    same batches as Local does, so the personal models and accuracies are the same."""
    config = TrainingConfig(rounds=3, clients_per_round=12, local_epochs=1, seed=3)
    fedac = experiment(
        "fedac", config, 12, num_clusters=2, fedac_mu=0.0, fedac_lambda=0.0, fedac_components=5
    )
    local = experiment("local", config, 12)
    list(fedac.rounds()), list(local.rounds())
    ids = list(fedac.data.client_ids)
    np.testing.assert_allclose(
        fedac.queries.client_models(ids), local.queries.client_models(ids), atol=1e-6
    )
    for row_a, row_l in zip(fedac.state.history, local.state.history):
        assert row_a["client_accuracy_mean"] == pytest.approx(row_l["client_accuracy_mean"])


@pytest.fixture(scope="module")
def planted_runs() -> tuple[Experiment, Experiment]:
    """FedAC (default CNT: the relative rule) and FedAvg on digits in 4 label-permutation
    groups, 40 clients, 10 per round. (With the paper's rule, gc_lower had to be 0.05 here: as
    the models converge each cluster's G_c falls below 0.2 and the paper's CNT merged two true
    groups at round 12, seed 0.) CNT's own behaviour is tested in test_fedac_clustering.py."""
    config = TrainingConfig(
        rounds=12, clients_per_round=10, local_epochs=3, learning_rate=0.3, seed=0, eval_every=4
    )
    fedac_run = experiment("fedac", config, 40, num_clusters=4, fedac_components=10)
    fedavg = experiment("fedavg", config, 40)
    list(fedac_run.rounds()), list(fedavg.rounds())
    return fedac_run, fedavg


def test_warm_up_trains_everyone_once_in_one_cluster(
    planted_runs: tuple[Experiment, Experiment],
) -> None:
    fedac, _ = planted_runs
    history = fedac.state.history
    assert fedac.algorithm.warmup_rounds(fedac.run) == 4
    assert [history[r]["num_clusters"] for r in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert history[4]["num_clusters"] == 4.0 and history[4]["pca_refit"] == 1.0
    # the PCA map is refit every max(full pass, ceil(12 rounds / 10)) = 4 rounds
    assert [history[r]["pca_period"] for r in range(4, 13)] == [4.0] * 9
    assert [r for r in range(4, 13) if history[r]["pca_refit"]] == [4, 8, 12]
    # each warm-up cohort is one block of the permutation: 4 x 10 distinct clients
    order = fedac.state.algorithm_state.warmup_order
    assert sorted(order.tolist()) == list(range(40))
    cohorts = [set(fedac.sample_clients(r)) for r in (1, 2, 3, 4)]  # what the loop sampled
    assert [len(c) for c in cohorts] == [10] * 4
    assert set().union(*cohorts) == set(fedac.data.client_ids)  # everyone trained once


def test_fedac_recovers_the_planted_groups_and_beats_fedavg(
    planted_runs: tuple[Experiment, Experiment],
) -> None:
    """Fails if the clusters never form: one cluster holding everybody has ARI 0 and mixes all
    groups; personal models pulled toward their group's centre must clearly beat FedAvg."""
    fedac, fedavg = planted_runs
    ids = list(fedac.data.client_ids)
    truth = [fedac.data.true_clusters[c] for c in ids]
    labels = [fedac.state.assignment[c] for c in ids]
    for k in set(labels):  # no cluster mixes two planted groups
        assert len({t for t, lab in zip(truth, labels) if lab == k}) == 1, (k, truth, labels)
    assert adjusted_rand_score(truth, labels) > 0.8
    assert 4 <= len(set(labels)) <= 6
    mine = fedac.state.history[-1]["client_accuracy_mean"]
    theirs = fedavg.state.history[-1]["client_accuracy_mean"]
    assert mine >= theirs + 0.1, (mine, theirs)
    similarity = fedac.state.similarity
    np.testing.assert_array_equal(np.argmax(similarity.matrix, axis=1), similarity.labels)


def test_pca_period_rule() -> None:
    """max(full pass, ceil(T / 10)): the paper's 100 rounds for its 1,000; T unknown (0): the
    full pass; an explicit --fedac_pca_period wins."""
    assert fedac.pca_period(4, 40) == 4  # the table's budget: 20 clients, 5 per round
    assert fedac.pca_period(10, 1000) == 100
    assert fedac.pca_period(2, 95) == 10
    assert fedac.pca_period(4, 0) == 4
    assert fedac.pca_period(1, 5) == 1
    config = TrainingConfig(rounds=1, clients_per_round=5, seed=1)
    exp = experiment("fedac", config, 20, num_clusters=2, fedac_pca_period=100)
    assert exp.algorithm.pca_period(exp.run) == 100
    assert make_algorithm("fedac").pca_period(dataclasses.replace(exp.run, total_rounds=40)) == 4
    assert make_algorithm("fedac").pca_period(dataclasses.replace(exp.run, total_rounds=200)) == 20


def test_the_run_length_reaches_the_pca_period() -> None:
    """6 clients, all in every round (a full pass is 1 round), 11 rounds: the server learns T
    from RunInfo.total_rounds and refits every ceil(11 / 10) = 2 rounds after the warm-up."""
    config = TrainingConfig(rounds=11, clients_per_round=6, local_epochs=1, seed=2, eval_every=11)
    exp = experiment("fedac", config, 6, num_clusters=2, fedac_components=3)
    list(exp.rounds())
    history = exp.state.history
    assert {history[r]["pca_period"] for r in range(1, 12)} == {2.0}
    assert [r for r in range(1, 12) if history[r]["pca_refit"]] == [1, 3, 5, 7, 9, 11]


def test_global_embedding_is_the_mean_of_the_sampled_embeddings() -> None:
    config = TrainingConfig(rounds=1, clients_per_round=5, local_epochs=1, seed=1)
    exp = experiment("fedac", config, 20, num_clusters=2)
    list(exp.rounds())
    sampled = exp.sample_clients(1)
    embedding = sum(exp.run.tensor_sizes[i] for i in exp.anchor_tensors)
    expected = exp.queries.client_models(sampled).mean(axis=0)[:embedding]
    np.testing.assert_allclose(exp.state.anchor[:embedding], expected, rtol=1e-6, atol=1e-7)
    assert exp.anchor_tensors == tuple(range(len(exp.run.tensor_sizes) - 2))  # all but the head


def test_checkpoint_round_trip_continues_identically(tmp_path: Path) -> None:
    config = TrainingConfig(rounds=5, clients_per_round=6, local_epochs=1, seed=4)
    options = dict(num_clusters=2, fedac_components=4, fedac_pca_period=2)
    straight = experiment("fedac", config, 12, **options)
    list(straight.rounds())
    first = experiment("fedac", config, 12, **options)
    rounds = first.rounds()
    for _ in range(4):  # rounds 0..3: past the warm-up (2 rounds) and one PCA refit
        next(rounds)
    resumed = Experiment(
        first.data, first.model, straight.algorithm, config, execution=RunExecution.of(EXECUTION)
    )
    resumed.restore(checkpoint_round_trip(first.snapshot(), tmp_path))
    list(resumed.rounds())
    assert history_rows(resumed) == history_rows(straight)


def test_fedac_options_are_checked() -> None:
    with pytest.raises(ValueError, match="fedac_mu and fedac_lambda"):
        make_algorithm("fedac", fedac_mu=-1.0)
    with pytest.raises(ValueError, match="set --gc_lower at most --gc_upper"):
        make_algorithm("fedac", fedac_cnt="paper", gc_lower=0.9, gc_upper=0.8)
    equal = make_algorithm("fedac", fedac_cnt="paper", gc_lower=0.5, gc_upper=0.5)
    assert (equal.cnt_settings.lower, equal.cnt_settings.upper) == (0.5, 0.5)  # a valid a = b
    with pytest.raises(ValueError, match="add --fedac_cnt=paper"):
        make_algorithm("fedac", gc_lower=0.05)
    with pytest.raises(ValueError, match="--fedac_merge_separation at most --fedac_split_sep"):
        make_algorithm("fedac", fedac_merge_separation=5.0)
    with pytest.raises(ValueError, match="fedac_pca_period must be >= 0"):
        make_algorithm("fedac", fedac_pca_period=-1)
    with pytest.raises(ValueError, match="set --fedac_bimodality in"):
        make_algorithm("fedac", fedac_bimodality=2.0)
    with pytest.raises(ValueError, match="fedac takes no --mu"):
        make_algorithm("fedac", mu=0.1)
    config = TrainingConfig(rounds=1, clients_per_round=5, seed=1)
    with pytest.raises(ValueError, match="exceeds the 8 clients"):
        experiment("fedac", config, 8, num_clusters=9)
