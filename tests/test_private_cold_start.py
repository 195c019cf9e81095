"""The private cold start (`loop/update_release.py`): under `--aggregator=dp`, FedGroup's and
FeSEM's pre-training updates are clipped and noised before the server clusters them, each
client that sent one is charged one Gaussian release in the ledger (recomputed here with
dp_accounting from the event alone), huge noise leaves the clusters no better than chance on
the digits' planted groups, and a cold start read raw is the mean run's, bit for bit."""

from __future__ import annotations

import dataclasses
import functools

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from sklearn.metrics import adjusted_rand_score

from tff_clustered.algorithms import make_algorithm
from tff_clustered.data import load_dataset
from tff_clustered.loop import accounting
from tff_clustered.loop.config import AggregatorConfig, TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.loop.update_release import UpdateRelease
from tff_clustered.models import model_spec

DELTA = 1e-5
CONFIG = TrainingConfig(
    rounds=2,
    clients_per_round=10,
    local_epochs=1,
    learning_rate=0.1,
    seed=0,
    eval_every=100,
    client_sampling="poisson",
)
DP = AggregatorConfig("dp", noise_multiplier=1.0)
# FedGroup on the 40 digits clients (4 planted groups): 20 clustered at the cold start, a
# quarter held back until round 2, the others placed as eager newcomers before round 1.
FEDGROUP = dict(num_clusters=4, pretrain_scale=5, newcomer_fraction=0.25, newcomer_round=2)
OPTIONS = {"fedgroup": FEDGROUP, "fesem": dict(num_clusters=4, fesem_estep="client")}


def started(algorithm: str, aggregator: AggregatorConfig = DP, **options: object) -> Experiment:
    """`algorithm` on the digits with `aggregator`, in process, its cold start done."""
    data = load_dataset("digits", seed=CONFIG.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    config = dataclasses.replace(CONFIG, aggregator=aggregator)
    chosen = make_algorithm(algorithm, **{**OPTIONS[algorithm], **options})
    exp = Experiment(data, model, chosen, config, execution=RunExecution.of("in_process"))
    exp.start()
    return exp


def client_epsilons(exp: Experiment) -> dict[str, float]:
    ledger = exp.state.privacy
    by_class = ledger.class_epsilons(DELTA)
    index = exp.data.client_index
    return {c: float(by_class[ledger.client_class[index[c]]]) for c in exp.data.client_ids}


@functools.cache
def recomputed(*events: dpa.DpEvent) -> float:
    """The epsilon dp_accounting's own accountant gives `events` composed (each composition
    computed once: a Poisson-sampled release takes the accountant about half a second)."""
    return rdp.RdpAccountant().compose(dpa.ComposedDpEvent(list(events))).get_epsilon(DELTA)


def planted_ari(exp: Experiment) -> float:
    assigned = [c for c, k in exp.state.assignment.items() if k >= 0]
    planted = [exp.data.true_clusters[c] for c in assigned]
    return adjusted_rand_score(planted, [exp.state.assignment[c] for c in assigned])


@pytest.fixture(scope="module")
def fedgroup_private() -> Experiment:
    return started("fedgroup")


def test_senders_charged_one_release_newcomers_when_placed(fedgroup_private: Experiment) -> None:
    exp = fedgroup_private
    z_cold = exp.config.aggregator.options.cold_start_noise_multiplier
    cold = dpa.GaussianDpEvent(z_cold)
    late = exp.view().state.late_clients
    assert len(late) == 10
    before = client_epsilons(exp)
    assert {before[c] for c in late} == {0.0}  # not placed yet: nothing read of them
    for c in set(exp.data.client_ids) - late:
        assert before[c] == pytest.approx(recomputed(cold), rel=1e-9)
    # Its multiplier is the rule's: one release costs a tenth of the rounds' epsilon.
    q = CONFIG.clients_per_round / 40
    round_event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(1.0))
    rounds_epsilon = recomputed(dpa.SelfComposedDpEvent(round_event, CONFIG.rounds))
    assert recomputed(cold) == pytest.approx(0.1 * rounds_epsilon, rel=1e-3)
    assert recomputed(cold) <= 0.1 * rounds_epsilon

    list(exp.rounds())  # round 2 places the late clients, each charged as it sends
    after = client_epsilons(exp)
    first = dpa.PoissonSampledDpEvent(10 / 30, dpa.GaussianDpEvent(1.0))  # 30 eligible
    for c in exp.data.client_ids:
        rounds = [round_event] if c in late else [first, round_event]
        assert after[c] == pytest.approx(recomputed(cold, *rounds), rel=1e-9), c
    assert exp.state.history[-1]["epsilon"] == pytest.approx(max(after.values()), rel=1e-12)


def test_the_server_clusters_clipped_and_noised_updates(fedgroup_private: Experiment) -> None:
    exp = fedgroup_private
    ids = list(exp.data.client_ids[:8])
    w0 = exp.run.initial_model
    raw = exp.queries.local_updates(ids, w0, 1, 0)
    released = exp.queries.released_updates(ids, w0, 1, 0)
    z_cold = exp.config.aggregator.options.cold_start_noise_multiplier
    assert released.noise_multiplier == z_cold and released.client_ids == tuple(ids)
    clip = DP.options.clip
    norms = np.linalg.norm(raw.astype(np.float64), axis=1, keepdims=True)
    clipped = raw * (clip / np.maximum(norms, clip))
    noise = released.updates - clipped
    assert noise.std() == pytest.approx(z_cold * clip, rel=0.02)  # about 14,000 values
    assert abs(noise.mean()) < 3 * z_cold * clip / np.sqrt(noise.size)
    # Seeded: the same client, round and seed draw the same noise; another round, other noise.
    again = exp.queries.released_updates(ids, w0, 1, 0).updates
    np.testing.assert_array_equal(again, released.updates)
    assert not np.allclose(exp.queries.released_updates(ids, w0, 1, 1).updates, again)


def test_huge_noise_clusters_no_better_than_chance_and_raw_is_the_mean_run() -> None:
    everyone = dict(newcomer_fraction=0.0, pretrain_epochs=3)  # the digits table's pre-training
    mean_run = started("fedgroup", AggregatorConfig("mean"), **everyone)
    raw = started("fedgroup", DP.with_settings(cold_start_release="raw"), **everyone)
    assert planted_ari(mean_run) > 0.9  # the raw cold start recovers the planted groups
    assert raw.state.assignment == mean_run.state.assignment
    np.testing.assert_array_equal(raw.state.cluster_models, mean_run.state.cluster_models)
    assert set(client_epsilons(raw).values()) == {0.0}  # read raw: nothing charged
    assert raw.config.aggregator.options.cold_start_noise_multiplier is None
    drowned = started("fedgroup", DP.with_settings(cold_start_noise_multiplier=1e4), **everyone)
    assert abs(planted_ari(drowned)) < 0.15
    # Group means that are all noise are shrunk toward w0, within the clip of it (James-Stein,
    # then the clip ball every clipped update's mean lies in).
    moved = np.linalg.norm(drowned.state.cluster_models - drowned.run.initial_model, axis=1)
    assert np.all(moved <= DP.options.clip * (1 + 1e-6))


def test_fesem_charges_every_client_one_release() -> None:
    exp = started("fesem", DP.with_settings(cold_start_noise_multiplier=2.0))
    expected = recomputed(dpa.GaussianDpEvent(2.0))
    assert client_epsilons(exp) == {
        c: pytest.approx(expected, rel=1e-9) for c in exp.data.client_ids
    }


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_a_target_is_shared_between_the_cold_start_and_the_rounds(sampling: str) -> None:
    config = dataclasses.replace(
        CONFIG,
        rounds=20,
        client_sampling=sampling,
        aggregator=AggregatorConfig("dp", target_epsilon=8.0),
    )
    chosen, z = accounting.calibrated(config, 40, cold_start=True)
    z_cold = chosen.aggregator.options.cold_start_noise_multiplier
    # Fixed-size sampling is replace-one: a replaced client moves its release by twice the clip.
    cold = dpa.GaussianDpEvent(z_cold / 2 if sampling == "fixed" else z_cold)
    assert 0.79 < recomputed(cold) <= 0.8
    if sampling == "poisson":
        round_event = dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(z))
        total = rdp.RdpAccountant()
    else:
        round_event = dpa.SampledWithoutReplacementDpEvent(40, 10, dpa.GaussianDpEvent(z / 2))
        total = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    total.compose(dpa.ComposedDpEvent([cold, dpa.SelfComposedDpEvent(round_event, 20)]))
    assert 7.99 < total.get_epsilon(DELTA) <= 8.0
    # Without a cold start the rounds take the whole target: a smaller noise multiplier.
    _, z_alone = accounting.calibrated(config, 40)
    assert z_alone < z


def test_late_newcomers_are_calibrated_for_and_the_run_trains_every_round() -> None:
    """Half of FedGroup's clients joining at round 4: rounds 1-3 sample 10 of 20 (q = 0.5),
    the rest 10 of 40. The calibration composes them as the ledger does, so the target is
    reached at the last round, not passed by round 3 (issue 63: such a run stopped after round
    2 of 6, every client taken as eligible in every round); round 1 is checked on the 20."""
    late = dict(num_clusters=4, pretrain_scale=5, newcomer_fraction=0.5, newcomer_round=4)
    algorithm = make_algorithm("fedgroup", **late)
    assert algorithm.early_eligible(40) == (20, 20, 20)
    config = dataclasses.replace(
        CONFIG, rounds=6, aggregator=AggregatorConfig("dp", target_epsilon=8.0)
    )
    _, z = accounting.calibrated(config, 40, early=algorithm.early_eligible(40))
    early = dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(z))
    later = dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(z))
    assert 7.99 < recomputed(early, early, early, later, later, later) <= 8.0
    data = load_dataset("digits", seed=CONFIG.seed)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=16)
    private = AggregatorConfig("dp", target_epsilon=8.0, cold_start_release="raw")
    config = dataclasses.replace(config, aggregator=private)
    exp = Experiment(data, model, algorithm, config, execution=RunExecution.of("in_process"))
    exp.start()
    list(exp.rounds())
    assert exp.state.round_num == 6 and not exp.stopped_at_target
    assert 7.9 < float(exp.state.history[-1]["epsilon"]) <= 8.0


def test_seeded_noise_repeats_and_secure_noise_does_not() -> None:
    updates = np.zeros((2, 1000), np.float32)
    seeded = UpdateRelease(clip=1.0, noise_multiplier=1.0, seed=2**40 + 1)
    np.testing.assert_array_equal(
        seeded.apply(updates, [0, 1], 0), seeded.apply(updates, [0, 1], 0)
    )
    other_seed = dataclasses.replace(seeded, seed=1)  # the seed's full width: 2^40 + 1 is not 1
    assert not np.allclose(other_seed.apply(updates, [0, 1], 0), seeded.apply(updates, [0, 1], 0))
    secure = dataclasses.replace(seeded, secure=True)
    first, second = secure.apply(updates, [0, 1], 0), secure.apply(updates, [0, 1], 0)
    assert not np.allclose(first, second)
    assert first.std() == pytest.approx(1.0, rel=0.05)


def test_a_cold_start_that_alone_passes_the_target_is_refused() -> None:
    aggregator = AggregatorConfig("dp", target_epsilon=8.0, cold_start_noise_multiplier=0.5)
    config = dataclasses.replace(CONFIG, aggregator=aggregator)
    with pytest.raises(ValueError, match=r"cold start alone costs epsilon .* at least"):
        accounting.calibrated(config, 40, cold_start=True)
    accounting.calibrated(config, 40)  # an algorithm without a cold start runs
