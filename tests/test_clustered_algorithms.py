"""FedGroup family, IFCA and FeSEM on the shared core: what each algorithm must achieve."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    EXECUTION,
    ari_with_plant,
    checkpoint_round_trip,
    history_rows,
    mlp_experiment,
)
from sklearn.metrics import adjusted_rand_score

from tff_clustered import clustering
from tff_clustered import options as options_lib
from tff_clustered import weights as flat
from tff_clustered.algorithms import algorithm_class, make_algorithm
from tff_clustered.data import load_digits_clusters
from tff_clustered.data.federated_data import FederatedData, from_arrays
from tff_clustered.federated.batching import batches
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.loop.training_call import LocalTraining, TrainRequest
from tff_clustered.report import figures

pytestmark = pytest.mark.usefixtures("tff_context")
QUICK = TrainingConfig(rounds=3, clients_per_round=6, local_epochs=1, learning_rate=0.1, seed=2)


def experiment(
    algorithm: str,
    config: TrainingConfig = QUICK,
    clients: int = 24,
    groups: int = 3,
    **options: object,
) -> Experiment:
    # Digits clients hold ~36 training images (4 batches): 3 pre-training epochs give the
    # cold start a usable signal (1 epoch, the paper's default, recovers the plant unreliably).
    options.setdefault("pretrain_epochs", 3)
    data = load_digits_clusters(num_clients=clients, num_groups=groups, seed=config.seed)
    # One option set serves every algorithm here: each takes the options it has.
    accepted = options_lib.names(algorithm_class(algorithm).Options)
    options = {k: v for k, v in options.items() if k in accepted}
    return mlp_experiment(algorithm, data, config, **options)


# The cold start's tests run no round; their run is 29 rounds, not the default 30, from which
# the pre-training would first convert the clients' training to its vectorised form (seconds
# of pfor; `grouping.VECTORISE_MIN_ROUNDS`). `--cold_start=auto` chooses as for 30 (eager).
COLD_START_ONLY = TrainingConfig(rounds=29, seed=0, learning_rate=0.1)


@pytest.mark.parametrize("algorithm", ["fedgroup", "fedgroup_madc"])
def test_group_cold_start_recovers_the_planted_groups(algorithm: str) -> None:
    # 40 clients in 4 label-permutation groups; alpha*m = 80 > 40, so all clients cluster.
    exp = experiment(algorithm, COLD_START_ONLY, 40, 4, num_clusters=4)
    assert ari_with_plant(exp) > 0.9


def test_newcomers_cold_start_into_the_planted_groups() -> None:
    # alpha*m = 2*3 = 6 of 36 clients cluster; the other 30 join by Eq. 9.
    exp = experiment(
        "fedgroup",
        dataclasses.replace(COLD_START_ONLY, seed=1),
        36,
        3,
        num_clusters=3,
        pretrain_scale=2,
    )
    assert all(exp.state.assignment[c] >= 0 for c in exp.data.client_ids)
    assert ari_with_plant(exp) > 0.9


def test_lazy_cold_start_assigns_clients_when_first_sampled() -> None:
    exp = experiment("fedgroup", num_clusters=3, pretrain_scale=2, cold_start="lazy")
    unassigned = {c for c in exp.data.client_ids if exp.state.assignment[c] < 0}
    assert len(unassigned) == len(exp.data.client_ids) - 6
    sampled = exp.sample_clients(1)
    list(exp.rounds())
    for c in sampled:
        assert exp.state.assignment[c] >= 0
    assert exp.state.history[0]["num_eval_clients"] == 6  # only assigned clients count


def test_clients_joining_mid_run_are_held_back_then_assigned() -> None:
    exp = experiment(
        "fedgroup",
        TrainingConfig(rounds=4, clients_per_round=6, local_epochs=1, seed=3),
        num_clusters=3,
        newcomer_fraction=0.25,
        newcomer_round=3,
    )
    late = exp.state.algorithm_state.late_clients
    assert len(late) == 6 and all(exp.state.assignment[c] < 0 for c in late)
    for r in (1, 2):
        assert not late & set(exp.sample_clients(r))
    list(exp.rounds())
    assert all(exp.state.assignment[c] >= 0 for c in late)
    assert exp.state.history[2]["num_eval_clients"] == 18
    assert exp.state.history[-1]["num_eval_clients"] == 24


def test_ablations_run_and_rcc_starts_from_single_clients() -> None:
    rcc = experiment("fedgroup_rcc", num_clusters=3)
    assert sum(1 for c in rcc.data.client_ids if rcc.state.assignment[c] >= 0) == 24
    rac = experiment("fedgroup_rac", num_clusters=3, pretrain_scale=2)
    assert all(rac.state.assignment[c] >= 0 for c in rac.data.client_ids)


def test_fedgrouprox_with_mu_zero_is_fedgroup() -> None:
    a = experiment("fedgrouprox", num_clusters=3, mu=0.0)
    b = experiment("fedgroup", num_clusters=3)
    list(a.rounds()), list(b.rounds())
    assert history_rows(a) == history_rows(b)


def test_empty_groups_keep_their_models_across_a_round() -> None:
    exp = experiment("fedgroup", num_clusters=3)
    before = exp.state.cluster_models
    clusters = exp.algorithm.plan(exp.run, exp.view(), exp.sample_clients(1), exp.queries).clusters
    exp.train_round(1)
    after = exp.state.cluster_models
    for k in set(range(3)) - set(clusters.tolist()):
        assert np.array_equal(before[k], after[k])


def test_ifca_clients_join_the_lowest_loss_model() -> None:
    """The round's clients pick (every cluster model is sent): a model scaled 50x is far worse
    than the initial one, so all sampled clients join the other, and the loop records it."""
    exp = experiment("ifca", num_clusters=2)
    models = exp.state.cluster_models
    for good in (0, 1):
        exp.state.cluster_models = np.stack([models[0] * (1 if k == good else 50) for k in (0, 1)])
        assert exp.algorithm.plan(exp.run, exp.view(), [], exp.queries).clusters is None
        row = exp.train_round(1)
        sampled = exp.sample_clients(1)
        assert row[f"sampled_cluster_{good}"] == len(sampled)
        assert {exp.state.assignment[c] for c in sampled} == {good}
    ids = exp.data.client_ids[:5]
    losses = exp.queries.cluster_losses(np.stack([models[0], models[0] * 50]), ids)
    keras_model = exp.model.build()
    keras_model.set_weights(flat.unflatten(models[0], exp.layout.shapes))
    batch = next(iter(exp.data.train.create_tf_dataset_for_client(ids[0]).batch(1000)))
    expected = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        batch["y"], keras_model(batch["x"])
    )
    assert losses[0, 0] == pytest.approx(float(expected), rel=1e-4)
    assert (losses[:, 1] > losses[:, 0]).all()


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
def test_fesem_m_step_with_one_cluster_is_fedavg_weighted_as_asked(weighting: str) -> None:
    """M-step (Eq. 9): the plain mean of members' new models by default (the paper), the
    example-weighted one (the authors' code) with --fesem_weighting=num_examples."""
    exp = experiment("fesem", num_clusters=1, clients=12, fesem_weighting=weighting)
    ids = exp.sample_clients(1)
    sizes = [exp.data.train_sizes[c] for c in ids]
    assert len(set(sizes)) > 1  # weighted and unweighted means differ here
    before = exp.state.cluster_models[0]
    request = TrainRequest(
        exp.current_round(),
        1,
        ids,
        np.zeros(len(ids), np.int32),
        exp.state.cluster_models,
        LocalTraining(1, 0.1),
    )
    outputs = exp.calls.train(request, exp.store).outputs
    deltas = np.stack([o["model_delta"] for o in outputs])
    row = exp.train_round(1)
    after = exp.state.cluster_models[0]
    uniform = before + deltas.mean(0)
    weighted = before + (np.array(sizes)[:, None] * deltas).sum(0) / sum(sizes)
    expected, other = (uniform, weighted) if weighting == "uniform" else (weighted, uniform)
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(after, other, rtol=1e-5, atol=1e-6)
    assert row["clients_changed_cluster"] == 0


def test_fesem_starts_from_kmeans_on_locally_trained_models() -> None:
    """The first clustering is K-means on every client's local update from w0 (its direction,
    by default; never w0 itself), and each center is the mean of its members' models."""
    exp = experiment("fesem", num_clusters=3, fesem_init_epochs=2)
    ids = exp.data.client_ids
    w0 = exp.run.initial_model
    models = w0[None, :] + exp.queries.local_updates(ids, w0, 2, 0)
    labels = np.array([exp.state.assignment[c] for c in ids])
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_allclose(
            exp.state.cluster_models[k], models[labels == k].mean(0), rtol=1e-5, atol=1e-6
        )
    truth = [exp.data.true_clusters[c] for c in ids]
    assert adjusted_rand_score(truth, labels) > 0.9


def test_fesem_recovers_planted_clusters_and_beats_fedavg() -> None:
    """Digits in 4 label-permutation groups. Fails if the clusters never form (one cluster
    holding everybody gives ARI 0 and FedAvg's accuracy)."""
    config = TrainingConfig(
        rounds=12, clients_per_round=10, local_epochs=3, learning_rate=0.1, seed=0, eval_every=12
    )
    fesem = experiment("fesem", config, 40, 4, num_clusters=4, fesem_init_epochs=3)
    fedavg = experiment("fedavg", config, 40, 4)
    list(fesem.rounds()), list(fedavg.rounds())
    sizes = np.bincount(list(fesem.state.assignment.values()), minlength=4)
    assert (sizes > 0).sum() >= 2, sizes
    assert ari_with_plant(fesem) > 0.9, sizes
    assert_similarity_shows_the_clusters(fesem)
    fs, fa = fesem.state.history[-1]["accuracy"], fedavg.state.history[-1]["accuracy"]
    assert fs >= fa + 0.3, (fs, fa)


def uneven_planted_digits(heavy: int = 6) -> FederatedData:
    """Digits in 3 label-permutation groups of 8 clients, where every fourth client holds its
    training images `heavy` times over: `heavy` times the local steps and an update that
    long, as Synthetic(1,1)'s lognormal sizes give a few clients."""
    base = load_digits_clusters(num_clients=24, num_groups=3, seed=0)
    train, test = {}, {}
    for i, c in enumerate(base.client_ids):
        own, held_out = base.arrays("train", c), base.arrays("test", c)
        copies = heavy if i % 4 == 0 else 1
        train[c] = (np.tile(own["x"], (copies, 1)), np.tile(own["y"], copies))
        test[c] = (held_out["x"], held_out["y"])
    return from_arrays("digits_uneven", train, test, 10, true_clusters=base.true_clusters)


@pytest.fixture(scope="module")
def uneven_digits() -> FederatedData:
    return uneven_planted_digits()


def largest_share(exp: Experiment) -> float:
    """The largest cluster's share of the clients, over its planted share (1: balanced)."""
    sizes = np.bincount(list(exp.state.assignment.values()), minlength=3)
    return sizes.max() / (len(exp.state.assignment) / 3)


def test_fesem_clusters_do_not_collapse_on_planted_groups(uneven_digits: FederatedData) -> None:
    """No cluster holds more than twice its planted share, after the cold start and at the end,
    where a quarter of the clients move six times as far in their first update. Fails with the
    paper's K-means of the models (`--fesem_init=models`), which the next test pins."""
    config = TrainingConfig(
        rounds=6, clients_per_round=12, local_epochs=2, learning_rate=0.1, seed=2, eval_every=6
    )
    fesem = mlp_experiment("fesem", uneven_digits, config, num_clusters=3)
    assert largest_share(fesem) <= 2, fesem.state.assignment
    list(fesem.rounds())
    assert largest_share(fesem) <= 2, fesem.state.assignment
    assert ari_with_plant(fesem) > 0.9


def test_fesem_paper_init_collapses_on_uneven_clients(uneven_digits: FederatedData) -> None:
    """The paper's K-means of the locally trained models (`--fesem_init=models`) on the same
    clients: the long updates decide the clusters, one holds more than twice its share. Why
    the default clusters the updates' directions (docs/fesem.md)."""
    config = TrainingConfig(rounds=1, clients_per_round=12, learning_rate=0.1, seed=2)
    paper = mlp_experiment("fesem", uneven_digits, config, num_clusters=3, fesem_init="models")
    assert largest_share(paper) > 2, paper.state.assignment


def test_fesem_authors_variant_joins_the_center_nearest_the_previous_model() -> None:
    """`--fesem_init=random --fesem_estep_on=previous` (the FedGroup authors' FeSEM): K random
    centers and nobody assigned; a sampled client joins the center nearest the model it last
    trained (w0 before its first round), trains from it and keeps its trained model, and
    that center becomes its members' mean; the others are kept."""
    config = dataclasses.replace(QUICK, rounds=1)
    exp = experiment(
        "fesem", config, num_clusters=3, fesem_init="random", fesem_estep_on="previous"
    )
    assert set(exp.state.assignment.values()) == {-1}
    width = exp.run.num_trainable_values
    centers = exp.state.cluster_models.copy()
    nearest_w0 = clustering.nearest_centers(exp.run.initial_model[None, :width], centers[:, :width])
    list(exp.rounds())
    sampled = [c for c, k in exp.state.assignment.items() if k >= 0]
    assert len(sampled) == QUICK.clients_per_round
    assert {exp.state.assignment[c] for c in sampled} == {int(nearest_w0[0])}
    trained = exp.queries.client_models(sampled)
    for k in range(3):
        expected = trained.mean(0) if k == nearest_w0[0] else centers[k]
        np.testing.assert_allclose(exp.state.cluster_models[k], expected, rtol=1e-5, atol=1e-6)


def assert_similarity_shows_the_clusters(exp: Experiment) -> None:
    """The distance matrix the clustering step used (the run's similarity picture) agrees with
    the clusters it gave: own-cluster entries are the smaller ones."""
    similarity = exp.state.similarity
    assert similarity is not None
    labels, matrix = np.asarray(similarity.labels), np.asarray(similarity.matrix)
    assert matrix.shape[0] == len(labels) == len(similarity.client_ids)
    if similarity.columns is not None:  # distances to centers: each client's is the least
        np.testing.assert_array_equal(np.argmin(matrix, axis=1), labels)
        return
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    within, between = matrix[same & off_diagonal].mean(), matrix[~same].mean()
    assert within < 0.5 * between, (within, between)


def test_fesem_options_are_checked() -> None:
    with pytest.raises(ValueError, match="fesem_weighting=median is not one of"):
        make_algorithm("fesem", fesem_weighting="median")
    with pytest.raises(ValueError, match="fesem_restarts must be >= 1"):
        make_algorithm("fesem", fesem_restarts=0)


@pytest.mark.parametrize("algorithm", ["fedgroup", "ifca", "fesem"])
def test_checkpoint_round_trip_continues_identically(algorithm: str, tmp_path: Path) -> None:
    config = TrainingConfig(rounds=4, clients_per_round=6, local_epochs=1, seed=4)
    straight = experiment(algorithm, config, num_clusters=3, pretrain_scale=2)
    list(straight.rounds())
    first = experiment(algorithm, config, num_clusters=3, pretrain_scale=2)
    rounds = first.rounds()
    for _ in range(3):  # rounds 0, 1, 2
        next(rounds)
    saved = checkpoint_round_trip(first.snapshot(), tmp_path)
    resumed = Experiment(
        first.data, first.model, straight.algorithm, config, execution=RunExecution.of(EXECUTION)
    )
    resumed.restore(saved)
    list(resumed.rounds())
    assert history_rows(resumed) == history_rows(straight)


def test_fedgroup_beats_fedavg_on_planted_clusters(tmp_path: Path) -> None:
    """Digits in 4 label-permutation groups: one model per recovered group must win clearly."""
    config = TrainingConfig(
        rounds=15, clients_per_round=10, local_epochs=3, learning_rate=0.1, seed=0, eval_every=15
    )
    fedgroup = experiment("fedgroup", config, 40, 4, num_clusters=4)
    fedavg = experiment("fedavg", config, 40, 4)
    list(fedgroup.rounds()), list(fedavg.rounds())
    fg, fa = fedgroup.state.history[-1]["accuracy"], fedavg.state.history[-1]["accuracy"]
    assert fg >= fa + 0.35, (fg, fa)
    assert_similarity_shows_the_clusters(fedgroup)
    assert fedgroup.state.similarity.measure.startswith("EDC")
    picture = tmp_path / "similarity.png"
    figures.write_similarity_png(str(picture), fedgroup.state.similarity, "fedgroup")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fesem_paper_mode_gives_smaller_clients_a_stronger_pull() -> None:
    exp = experiment("fesem", num_clusters=2, fesem_reg="paper", fesem_lambda=0.5)
    assert exp.algorithm.prox_mu == 1.0  # 2 * lambda
    ids = exp.data.client_ids
    sizes = exp.data.train_sizes
    scales = exp.algorithm.prox_scales(exp.run, ids)
    n_avg = sum(sizes.values()) / len(sizes)
    assert scales == pytest.approx([n_avg / sizes[c] for c in ids])
    list(exp.rounds())  # trains with per-client mu_i
    assert experiment("fesem", num_clusters=2).algorithm.prox_scales(exp.run, ids).tolist() == [
        1.0
    ] * len(ids)


def test_pretraining_by_steps_matches_epochs_where_they_coincide() -> None:
    """--pretrain_steps: exactly that many minibatches, passes repeated as needed; as many
    steps as one (two) passes have batches is one (two) epochs, bit for bit."""
    exp = experiment("fedgroup", num_clusters=3)
    client = exp.data.client_ids[0]
    per_epoch = -(-exp.data.train_sizes[client] // exp.config.batch_size)
    w0 = exp.run.initial_model
    for epochs in (1, 2):
        by_epochs = exp.queries.local_updates([client], w0, epochs, 0)
        by_steps = exp.queries.local_updates([client], w0, 99, 0, steps=epochs * per_epoch)
        np.testing.assert_array_equal(by_steps, by_epochs)
    for cid in exp.data.client_ids[:3]:  # passes repeated as needed, cut at the step count
        dataset = batches(
            exp.data.arrays("train", cid), exp.config.batch_size, -1, 0, max_steps=3 * per_epoch + 1
        )
        assert sum(1 for _ in dataset) == 3 * per_epoch + 1
    steps = experiment("fedgroup", num_clusters=3, pretrain_steps=50)
    assert steps.algorithm.pretrain(steps.run, [client], 0, steps.queries).updates.shape == (
        1,
        w0.size,
    )
    assert not np.array_equal(steps.state.cluster_models, exp.state.cluster_models)


@pytest.mark.parametrize("draw", ["static", "resample"])
def test_rac_cold_clients_groups_are_drawn_once_or_at_every_sample(draw: str) -> None:
    exp = experiment("fedgroup_rac", num_clusters=3, pretrain_scale=2, rac_draw=draw)
    cold = set(exp.data.client_ids) - exp.state.algorithm_state.clustered_clients
    assert cold and all(exp.state.assignment[c] >= 0 for c in cold)
    seen: dict[str, set] = {}
    for round_num in range(1, 9):
        view = dataclasses.replace(exp.view(), round_num=round_num - 1)
        ids = exp.sample_clients(round_num)
        plan = exp.algorithm.plan(exp.run, view, ids, exp.queries)
        for c, k in zip(ids, plan.clusters):
            if c in cold:
                seen.setdefault(c, set()).add(int(k))
            else:
                assert k == exp.state.assignment[c]  # clustered clients keep their group
    changed = [c for c, groups in seen.items() if len(groups) > 1]
    assert bool(changed) == (draw == "resample"), seen


def test_fine_tuned_kind_adapts_the_global_model_to_each_group() -> None:
    """Digits in 3 label-permutation groups: FedAvg's single global model cannot fit them all;
    a few local steps from it on each client's own data must gain a clear margin. Scoring the
    fine-tuned models changes nothing in the run, and repeats exactly."""
    config = dataclasses.replace(
        QUICK, rounds=4, fine_tune_steps=60, learning_rate=0.1, eval_every=4
    )
    fedavg = experiment("fedavg", config)
    list(fedavg.rounds())
    last = fedavg.state.history[-1]
    assert last["accuracy_finetuned"] >= last["accuracy_global"] + 0.2, last
    models = fedavg.state.cluster_models.copy()
    again = fedavg.evaluate(config.rounds)
    np.testing.assert_array_equal(fedavg.state.cluster_models, models)
    assert again["accuracy_finetuned"] == last["accuracy_finetuned"]
    assert {f"accuracy_{k}" for k in ("global", "finetuned")} <= set(fedavg.client_rows[0])
    # Personal-only algorithms have no server model to fine-tune from.
    fedper = experiment("fedper", dataclasses.replace(config, rounds=1))
    assert "accuracy_finetuned" not in fedper.evaluate(0)


@pytest.mark.parametrize("name", ["ifca", "fedgroup", "fesem", "cgpfl", "fedac", "flhc"])
def test_zero_clusters_is_refused_not_read_as_the_default(name: str) -> None:
    with pytest.raises(ValueError, match="num_clusters must be >= 1"):
        make_algorithm(name, num_clusters=0)
