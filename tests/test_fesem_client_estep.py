"""FeSEM's E-step on the client (`--fesem_estep=client`): each client joins the centre nearest
its trained model and sends its update against that centre into the round's aggregate, which
with the plain mean is the server-side M-step (Long et al. 2023, Eq. 9); only that mode takes a
private aggregator. Both executions with `--aggregator=dp`: tests/test_cluster_dp_runs.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ari_with_plant, mlp_experiment
from sklearn.metrics import adjusted_rand_score

from tff_clustered.algorithms import make_algorithm, make_options
from tff_clustered.algorithms.base import RoundResult
from tff_clustered.algorithms.fedgroup import discrepancy
from tff_clustered.data import load_digits_clusters
from tff_clustered.federated.distributions import NearestCentreAfterTraining, OwnCluster
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.runs import checkpoint
from tff_clustered.runs.run_spec import RunSpec

pytestmark = pytest.mark.usefixtures("tff_context")
CONFIG = TrainingConfig(rounds=3, clients_per_round=8, local_epochs=3, learning_rate=0.1, seed=2)


def fesem(estep: str, weighting: str = "uniform", round_metrics: tuple = ()) -> Experiment:
    data = load_digits_clusters(num_clients=12, num_groups=3, seed=CONFIG.seed)
    return mlp_experiment(
        "fesem",
        data,
        CONFIG,
        round_metrics,
        num_clusters=3,
        fesem_init_epochs=3,
        fesem_estep=estep,
        fesem_weighting=weighting,
    )


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
def test_the_client_estep_gives_the_server_steps_centres_and_assignments(weighting: str) -> None:
    """One round from a state where the clients must move: every sampled client starts from
    centre 0, set to the untrained w0, the other two centres K-means'. With the mean, centre_k
    + mean(W_i - centre_k) over the clients nearest it is the server's M-step over the same
    E-step, weighted as asked; and the picks recover the planted groups. Each client's model
    delta is taken against the centre it is reported in (its pick), so Eq. 4's discrepancy
    reads its trained model."""
    results = {}

    def keep(run: object, view: object, result: RoundResult) -> dict[str, float]:
        results[len(results)] = result
        return discrepancy(run, view, result)

    runs = {estep: fesem(estep, weighting, (keep,)) for estep in ("server", "client")}
    sampled = runs["server"].sample_clients(1)
    rows = {}
    for estep, exp in runs.items():
        for client in sampled:
            exp.state.assignment[client] = 0
        exp.state.cluster_models = exp.state.cluster_models.copy()
        exp.state.cluster_models[0] = exp.run.initial_model
        rows[estep] = exp.train_round(1)
    server, client = runs["server"].state, runs["client"].state
    assert client.assignment == server.assignment
    np.testing.assert_allclose(client.cluster_models, server.cluster_models, atol=1e-5)
    assert rows["client"]["clients_changed_cluster"] == rows["server"]["clients_changed_cluster"]
    assert rows["client"]["clients_changed_cluster"] > 0  # the delta taken against another row
    picks = [client.assignment[c] for c in sampled]
    assert len(set(picks)) == 3, picks
    truth = [runs["client"].data.true_clusters[c] for c in sampled]
    assert adjusted_rand_score(truth, picks) == 1.0
    # The trained models W_i: the server's from centre 0, the client's from its pick.
    on_server, on_client = results[0], results[1]
    trained = on_server.cluster_models_before[0] + on_server.model_deltas
    np.testing.assert_allclose(
        on_client.cluster_models_before[on_client.clusters] + on_client.model_deltas,
        trained,
        atol=1e-5,
    )
    gaps = np.linalg.norm(trained - client.cluster_models[on_client.clusters], axis=1)
    assert rows["client"]["discrepancy"] == pytest.approx(gaps.mean(), rel=1e-4)


def test_client_estep_rounds_keep_the_planted_clusters() -> None:
    """Rounds of the client-side E-step keep the digits' planted groups apart (a pick that
    ignored the trained model, or a centre moved by other clusters' updates, would merge
    them) and learn."""
    exp = fesem("client")
    list(exp.rounds())
    sizes = np.bincount(list(exp.state.assignment.values()), minlength=3)
    assert (sizes > 0).sum() == 3, sizes
    assert ari_with_plant(exp) > 0.9, sizes
    assert exp.state.history[-1]["accuracy"] > exp.state.history[0]["accuracy"] + 0.2


def test_only_the_client_estep_takes_a_private_aggregator() -> None:
    """The server-side steps read every client's model: refused with dp, naming the mode that
    is not; the client-side mode is accepted, its round weighted as its M-step asks."""
    dp = TrainingConfig(aggregator=AggregatorConfig("dp", noise_multiplier=1.0))
    with pytest.raises(ValueError, match="fesem reads individual.*--fesem_estep=client"):
        RunSpec("fesem", training=dp)
    RunSpec("fesem", algorithm_options=make_options("fesem", fesem_estep="client"), training=dp)
    server, client = make_algorithm("fesem"), make_algorithm("fesem", fesem_estep="client")
    assert (server.distribution, server.models_from_aggregate, server.needs_model_deltas) == (
        OwnCluster(),
        False,
        True,
    )
    assert (client.distribution, client.models_from_aggregate, client.needs_model_deltas) == (
        NearestCentreAfterTraining(),
        True,
        False,
    )
    assert client.client_weighting == "uniform"
    weighted = make_algorithm("fesem", fesem_estep="client", fesem_weighting="num_examples")
    assert weighted.client_weighting == "num_examples"
    with pytest.raises(ValueError, match="fesem_estep=both is not one of server, client"):
        make_algorithm("fesem", fesem_estep="both")


def test_a_fesem_checkpoint_older_than_the_option_resumes_with_the_server_estep() -> None:
    """FeSEM's settings from before `--fesem_estep` existed are the server-side E-step's."""
    now = RunSpec("fesem").settings()
    before = dict(now, algorithm_options=dict(now["algorithm_options"]))
    del before["algorithm_options"]["fesem_estep"]
    assert checkpoint.same_settings(before, now)
    client = RunSpec("fesem", algorithm_options=make_options("fesem", fesem_estep="client"))
    assert not checkpoint.same_settings(before, client.settings())
