"""Two baselines of FedAC's comparison on the shared core: FL+HC (Briggs et al., IJCNN 2020)
and CGPFL (Tang et al., IJCAI 2022). The hierarchical clustering math is tested alone; the
algorithms on digits in planted label-permutation groups, against FedAvg."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from absl import flags
from conftest import (
    EXECUTION,
    ari_with_plant,
    checkpoint_round_trip,
    history_rows,
    mlp_experiment,
)

from tff_clustered.algorithms import define_all_flags, make_algorithm
from tff_clustered.algorithms.cgpfl import context_step
from tff_clustered.clustering import hierarchical
from tff_clustered.data import load_digits_clusters
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment

pytestmark = pytest.mark.usefixtures("tff_context")
# 24 clients in 3 label-permutation groups, half of them per round.
PLANTED = TrainingConfig(
    rounds=10, clients_per_round=12, local_epochs=3, learning_rate=0.2, seed=0, eval_every=5
)
SMALL = TrainingConfig(rounds=2, clients_per_round=6, local_epochs=1, learning_rate=0.1, seed=1)
CLUSTER_ROUND = 3


def experiment(
    algorithm: str,
    config: TrainingConfig = PLANTED,
    clients: int = 24,
    groups: int = 3,
    **options: object,
) -> Experiment:
    data = load_digits_clusters(num_clients=clients, num_groups=groups, seed=config.seed)
    return mlp_experiment(algorithm, data, config, **options)


def trained(exp: Experiment) -> Experiment:
    list(exp.rounds())
    return exp


@pytest.fixture(scope="module")
def fedavg_run() -> Experiment:
    return trained(experiment("fedavg"))


@pytest.fixture(scope="module")
def flhc_run() -> Experiment:
    return trained(experiment("flhc", num_clusters=3, flhc_cluster_round=CLUSTER_ROUND))


@pytest.fixture(scope="module")
def cgpfl_run() -> Experiment:
    return trained(experiment("cgpfl", num_clusters=3, cgpfl_lambda=0.5))


# -- FL+HC: the hierarchical clustering alone ----------------------------------------------------


def two_groups(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten points in 3-D: five within 0.1 of the origin, five within 0.1 of (10, 10, 0),
    interleaved."""
    rng = np.random.default_rng(seed)
    truth = np.array([0, 1, 1, 0, 1, 0, 0, 1, 0, 1])
    centers = np.array([[0.0, 0.0, 0.0], [10.0, 10.0, 0.0]])
    return centers[truth] + rng.uniform(-0.1, 0.1, size=(10, 3)), truth


@pytest.mark.parametrize("linkage", hierarchical.LINKAGES)
def test_hierarchical_clustering_finds_two_obvious_groups(linkage: str) -> None:
    points, truth = two_groups()
    by_count = hierarchical.hierarchical_clusters(points, linkage, num_clusters=2)
    np.testing.assert_array_equal(by_count, truth)  # labelled in order of first appearance
    by_threshold = hierarchical.hierarchical_clusters(points, linkage, distance_threshold=3.0)
    np.testing.assert_array_equal(by_threshold, by_count)
    heights = hierarchical.merge_heights(points, linkage)
    assert len(heights) == 9 and (heights[:-1] < 3.0).all() and heights[-1] > 3.0
    # Far past the last merge: one cluster; below the first: every point alone.
    one = hierarchical.hierarchical_clusters(points, linkage, distance_threshold=1e3)
    assert set(one.tolist()) == {0}
    alone = hierarchical.hierarchical_clusters(points, linkage, distance_threshold=1e-6)
    np.testing.assert_array_equal(alone, np.arange(10))
    four = hierarchical.hierarchical_clusters(points, linkage, num_clusters=4)
    assert len(set(four.tolist())) == 4
    for k in set(four.tolist()):  # a finer cut only splits the two groups
        assert len(set(truth[four == k].tolist())) == 1


def test_euclidean_distances_and_bad_cuts() -> None:
    points, _ = two_groups()
    expected = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    np.testing.assert_allclose(hierarchical.euclidean_distances(points), expected, atol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        hierarchical.hierarchical_clusters(points, num_clusters=2, distance_threshold=1.0)
    with pytest.raises(ValueError, match="not both"):
        hierarchical.hierarchical_clusters(points)
    with pytest.raises(ValueError, match="flhc_distance_threshold must be > 0"):
        hierarchical.hierarchical_clusters(points, distance_threshold=-1.0)
    with pytest.raises(ValueError, match="flhc_linkage=centroid"):
        hierarchical.hierarchical_clusters(points, "centroid", num_clusters=2)
    with pytest.raises(ValueError, match="11 clusters asked of 10 points"):
        hierarchical.hierarchical_clusters(points, num_clusters=11)
    with pytest.raises(ValueError, match="finite"):
        hierarchical.hierarchical_clusters(np.full((3, 2), np.nan), num_clusters=2)


def test_flhc_options_are_checked() -> None:
    with pytest.raises(ValueError, match="--num_clusters or --flhc_distance_threshold, not both"):
        make_algorithm("flhc", num_clusters=3, flhc_distance_threshold=1.0)
    with pytest.raises(ValueError, match="flhc_distance_threshold must be > 0"):
        make_algorithm("flhc", flhc_distance_threshold=0.0)
    with pytest.raises(ValueError, match="flhc: num_clusters must be >= 1"):
        make_algorithm("flhc", num_clusters=0)
    with pytest.raises(ValueError, match="flhc_linkage=centroid is not one of"):
        make_algorithm("flhc", flhc_linkage="centroid")
    with pytest.raises(ValueError, match="flhc_cluster_round must be >= 0"):
        make_algorithm("flhc", flhc_cluster_round=-1)
    with pytest.raises(ValueError, match="flhc_local_epochs must be >= 1"):
        make_algorithm("flhc", flhc_local_epochs=0)
    with pytest.raises(ValueError, match="flhc takes no --mu"):
        make_algorithm("flhc", mu=0.1)
    assert make_algorithm("flhc").cut == (3, None)  # neither given: 3 clusters
    assert make_algorithm("flhc", flhc_distance_threshold=2.5).cut == (None, 2.5)
    with pytest.raises(ValueError, match="exceeds the 12 clients"):
        experiment("flhc", SMALL, 12, num_clusters=13)
    # Every algorithm's options are flags side by side (shared num_clusters: one default).
    flag_values = flags.FlagValues()
    define_all_flags(flag_values)
    assert flag_values["flhc_distance_threshold"].default is None
    assert flag_values["flhc_linkage"].default == "ward"
    assert flag_values["cgpfl_lambda"].default > 0


# -- FL+HC on the shared core -------------------------------------------------------------------


def test_flhc_clusters_every_clients_update_from_the_global_model() -> None:
    """After round n every client (not only the sampled ones) trains the global model; the
    assignment is the hierarchical clustering of those updates, and every cluster model is the
    global model."""
    config = TrainingConfig(rounds=2, clients_per_round=4, local_epochs=1, seed=1)
    exp = experiment(
        "flhc", config, 12, flhc_cluster_round=2, flhc_linkage="average", flhc_local_epochs=2
    )
    exp.train_round(1)
    assert exp.num_clusters == 1
    assert set(exp.state.assignment.values()) == {0}
    before = exp.state.cluster_models.copy()
    exp.state.round_num = 1
    row = exp.train_round(2)
    ids = list(exp.data.client_ids)
    assert len(set(exp.sample_clients(2))) < len(ids)
    # the global model the clustering started from: FedAvg of round 2
    global_model = exp.state.cluster_models[0]
    updates = exp.queries.local_updates(ids, global_model, 2, 2)[:, : exp.run.num_trainable_values]
    labels = hierarchical.hierarchical_clusters(updates, "average", num_clusters=3)
    assert [exp.state.assignment[c] for c in ids] == labels.tolist()
    assert exp.num_clusters == 3 == row["num_clusters"]
    heights = hierarchical.merge_heights(updates, "average")
    assert row["flhc_top_merge_height"] == pytest.approx(heights[-1])
    np.testing.assert_array_equal(exp.state.cluster_models, np.stack([global_model] * 3))
    assert not np.array_equal(global_model, before[0])
    similarity = exp.state.similarity
    assert similarity.round_num == 2 and similarity.labels == tuple(labels.tolist())
    np.testing.assert_allclose(
        similarity.matrix, hierarchical.euclidean_distances(updates), rtol=1e-6
    )


def test_flhc_can_cluster_before_the_first_round() -> None:
    exp = experiment("flhc", SMALL, 12, flhc_cluster_round=0, num_clusters=2)
    w0 = exp.run.initial_model
    ids = list(exp.data.client_ids)
    updates = exp.queries.local_updates(ids, w0, 1, 0)[:, : exp.run.num_trainable_values]
    labels = hierarchical.hierarchical_clusters(updates, "ward", num_clusters=2)
    assert [exp.state.assignment[c] for c in ids] == labels.tolist()
    np.testing.assert_array_equal(exp.state.cluster_models, np.stack([w0, w0]))


def test_flhc_is_fedavg_until_the_clustering_round(
    flhc_run: Experiment, fedavg_run: Experiment
) -> None:
    """Before (and during) round n there is one cluster, trained exactly as FedAvg."""
    flhc, fedavg = history_rows(flhc_run), history_rows(fedavg_run)
    for r in range(1, CLUSTER_ROUND + 1):
        assert flhc[r]["train_loss"] == fedavg[r]["train_loss"], r
        assert flhc[r]["sampled_cluster_0"] == PLANTED.clients_per_round
        assert "sampled_cluster_1" not in flhc[r]
    assert [flhc[r]["num_clusters"] for r in range(1, CLUSTER_ROUND)] == [1.0, 1.0]
    assert flhc[0]["cluster_size_0"] == 24 and "cluster_size_1" not in flhc[0]
    assert flhc[CLUSTER_ROUND]["num_clusters"] == 3.0
    assert flhc[CLUSTER_ROUND + 1]["sampled_cluster_1"] > 0  # clusters train from then on


def test_flhc_recovers_the_planted_groups_and_beats_fedavg(
    flhc_run: Experiment, fedavg_run: Experiment
) -> None:
    """Fails if the clustering mixes the groups (ARI) or the cluster models do not pay off."""
    assert ari_with_plant(flhc_run) > 0.9
    last = flhc_run.state.history[-1]
    assert [last[f"cluster_size_{k}"] for k in range(3)] == [8, 8, 8]
    mine, theirs = last["accuracy"], fedavg_run.state.history[-1]["accuracy"]
    assert last["accuracy"] == last["accuracy_cluster"]
    assert mine >= theirs + 0.2, (mine, theirs)
    similarity = flhc_run.state.similarity
    labels, matrix = np.asarray(similarity.labels), np.asarray(similarity.matrix)
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    # the picture shows the clusters: every update nearer its own cluster's than any other's
    assert matrix[same & off_diagonal].max() < matrix[~same].min()


# -- CGPFL --------------------------------------------------------------------------------------


def test_cgpfl_options_are_checked() -> None:
    with pytest.raises(ValueError, match="cgpfl_lambda must be > 0"):
        make_algorithm("cgpfl", cgpfl_lambda=0.0)
    with pytest.raises(ValueError, match="cgpfl_beta must be > 0"):
        make_algorithm("cgpfl", cgpfl_beta=0.0)
    with pytest.raises(ValueError, match="cgpfl_init_epochs must be >= 1"):
        make_algorithm("cgpfl", cgpfl_init_epochs=0)
    with pytest.raises(ValueError, match="cgpfl takes no --mu: CGPFL's pull"):
        make_algorithm("cgpfl", mu=0.1)
    with pytest.raises(ValueError, match="exceeds the 12 clients"):
        experiment("cgpfl", SMALL, 12, num_clusters=13)


def test_context_step_mixes_member_means() -> None:
    previous = np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    personal = np.array([[2.0, 0.0], [4.0, 2.0], [1.0, 3.0]])
    labels = np.array([0, 0, 1])
    new = context_step(previous, personal, labels, 0.25)
    np.testing.assert_allclose(new[0], 0.75 * previous[0] + 0.25 * np.array([3.0, 1.0]))
    np.testing.assert_allclose(new[1], 0.75 * previous[1] + 0.25 * personal[2])
    np.testing.assert_array_equal(new[2], previous[2])  # no members: kept


def test_cgpfl_starts_from_kmeans_and_its_server_step_mixes_member_means() -> None:
    """Init: contexts are the member means of every client's model after a local update from
    w0. A round: sampled clients join the context nearest their new personal model and each
    context becomes (1 - beta) itself + beta the mean of its sampled members' personal models."""
    exp = experiment("cgpfl", SMALL, 12, num_clusters=3, cgpfl_beta=0.5, cgpfl_init_epochs=2)
    ids = list(exp.data.client_ids)
    w0 = exp.run.initial_model
    models = w0[None, :] + exp.queries.local_updates(ids, w0, 2, 0)
    labels = np.array([exp.state.assignment[c] for c in ids])
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_allclose(
            exp.state.cluster_models[k], models[labels == k].mean(0), rtol=1e-5, atol=1e-6
        )
    before = exp.state.cluster_models.astype(np.float64)
    sampled = exp.sample_clients(1)
    row = exp.train_round(1)
    personal = exp.queries.client_models(sampled).astype(np.float64)
    assert not np.allclose(personal, w0[None, :])  # trained and kept
    width = exp.run.num_trainable_values
    distances = ((personal[:, None, :width] - before[None, :, :width]) ** 2).sum(-1)
    nearest = distances.argmin(1)
    assert [exp.state.assignment[c] for c in sampled] == nearest.tolist()
    for k in range(3):
        members = personal[nearest == k]
        expected = 0.5 * before[k] + 0.5 * members.mean(0) if len(members) else before[k]
        np.testing.assert_allclose(exp.state.cluster_models[k], expected, rtol=1e-5, atol=1e-6)
    assert row["cgpfl_sampled_contexts"] == len(set(nearest.tolist()))
    assert np.argmin(exp.state.similarity.matrix, axis=1).tolist() == nearest.tolist()


def test_cgpfl_with_a_tiny_pull_is_local_training() -> None:
    """lambda -> 0: each personal model trains on its own data alone, exactly as Local's (same
    batches); a strong pull moves it toward its context model."""
    config = TrainingConfig(rounds=2, clients_per_round=12, local_epochs=1, seed=3)
    tiny = trained(experiment("cgpfl", config, 12, num_clusters=2, cgpfl_lambda=1e-6))
    local = trained(experiment("local", config, 12))
    strong = trained(experiment("cgpfl", config, 12, num_clusters=2, cgpfl_lambda=5.0))
    ids = list(tiny.data.client_ids)
    np.testing.assert_allclose(
        tiny.queries.client_models(ids), local.queries.client_models(ids), atol=1e-5
    )
    for a, b in zip(tiny.state.history, local.state.history):
        assert a["accuracy_personal"] == pytest.approx(b["accuracy_personal"], abs=1e-6)
    gap = np.abs(strong.queries.client_models(ids) - local.queries.client_models(ids)).max()
    assert gap > 1e-2, gap
    for exp in (tiny, strong):  # how far each personal model stays from its context
        distance = exp.state.history[-1]["cgpfl_personal_distance"]
        assert distance > 0
    assert (
        strong.state.history[-1]["cgpfl_personal_distance"]
        < (tiny.state.history[-1]["cgpfl_personal_distance"])
    )


def test_cgpfl_recovers_the_planted_groups_and_beats_fedavg(
    cgpfl_run: Experiment, fedavg_run: Experiment
) -> None:
    """Fails if the contexts mix the groups (ARI) or the personal models do not pay off."""
    assert ari_with_plant(cgpfl_run) > 0.9
    last = cgpfl_run.state.history[-1]
    assert last["accuracy"] == last["accuracy_personal"]
    mine, theirs = last["accuracy"], fedavg_run.state.history[-1]["accuracy"]
    assert mine >= theirs + 0.2, (mine, theirs)
    assert last["accuracy_cluster"] >= theirs + 0.2, (last["accuracy_cluster"], theirs)
    similarity = cgpfl_run.state.similarity
    np.testing.assert_array_equal(np.argmin(similarity.matrix, axis=1), similarity.labels)
    assignment = cgpfl_run.state.assignment  # the picture shows the assignment that was made
    assert similarity.labels == tuple(assignment[c] for c in similarity.client_ids)


# -- both ----------------------------------------------------------------------------------------


# CGPFL keeps no algorithm state beyond the (generic) client store and cluster models, whose
# round trip FedAC's and FeSEM's checkpoint tests cover; FL+HC's is saved at its clustering.
@pytest.mark.parametrize(
    "algorithm, options", [("flhc", {"num_clusters": 3, "flhc_cluster_round": 2})]
)
def test_checkpoint_round_trip_continues_identically(
    algorithm: str, options: dict, tmp_path: Path
) -> None:
    config = TrainingConfig(rounds=4, clients_per_round=6, local_epochs=1, seed=4)
    straight = trained(experiment(algorithm, config, 12, **options))
    first = experiment(algorithm, config, 12, **options)
    progress = first.rounds()
    for _ in range(3):  # rounds 0, 1, 2 (FL+HC clusters after round 2)
        next(progress)
    resumed = Experiment(
        first.data, first.model, straight.algorithm, config, execution=RunExecution.of(EXECUTION)
    )
    resumed.restore(checkpoint_round_trip(first.snapshot(), tmp_path))
    list(resumed.rounds())
    assert history_rows(resumed) == history_rows(straight)
    assert resumed.state.assignment == straight.state.assignment
    np.testing.assert_array_equal(resumed.state.cluster_models, straight.state.cluster_models)
