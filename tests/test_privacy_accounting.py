"""Client sampling and its privacy accounting (`loop.sampling`, `loop.dp_events`,
`loop.privacy_ledger`, `loop.noise_calibration`): the ledger's
epsilon is dp_accounting's for the same events, the draw is the sampling docs/privacy.md
states, calibration meets its target, and a ledger survives a checkpoint. No TensorFlow: the
loop's own use of the draw is checked in test_orchestration.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from scipy import stats

from tff_clustered.loop.dp_events import event_of_key, sampling_event
from tff_clustered.loop.noise_calibration import calibrated_noise_multiplier
from tff_clustered.loop.privacy_ledger import PrivacyLedger
from tff_clustered.loop.sampling import SAMPLINGS, describe_sampling, sampled_positions
from tff_clustered.runs.state_encoding import decode_tree, encode_tree
from tff_clustered.seeds import SAMPLING, derived_seed

DOCS = Path(__file__).resolve().parents[1] / "docs" / "privacy.md"
DELTA = 1e-5
Relation = dpa.NeighboringRelation


def accountant_epsilon(relation: Relation, *events: dpa.DpEvent) -> float:
    accountant = RdpAccountant(neighboring_relation=relation)
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(DELTA)


def warm_up_ledger(sampling: str, inner: dpa.DpEvent) -> tuple[PrivacyLedger, list]:
    """1000 clients, 20 a round: a warm-up block of the first 20 trains alone for 5 rounds
    (each of them sampled, q = 1, as in FedAC's warm-up), then 150 rounds draw from all 1000.
    Returns the ledger and its two events."""
    warm_up = sampling_event(sampling, 20, 20, inner)
    full = sampling_event(sampling, 1000, 20, inner)
    ledger = PrivacyLedger.for_population(1000)
    block = np.arange(1000) < 20
    for _ in range(5):
        ledger.record(block, warm_up)
    for _ in range(150):
        ledger.record(None, full)
    return ledger, [warm_up, full]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_ledger_epsilon_equals_dp_accountings_for_the_same_events(sampling: str) -> None:
    """Mixed eligibility: the warm-up block composes both events, the other clients only the
    second; each equals `RdpAccountant` composing the same events, exactly."""
    z = 1.5
    ledger, (warm_up, full) = warm_up_ledger(sampling, dpa.GaussianDpEvent(z))
    if sampling == "fixed":  # replace-one: the noise against the sum's sensitivity 2C
        assert full == dpa.SampledWithoutReplacementDpEvent(1000, 20, dpa.GaussianDpEvent(z / 2))
        relation = Relation.REPLACE_ONE
    else:
        assert full == dpa.PoissonSampledDpEvent(20 / 1000, dpa.GaussianDpEvent(z))
        relation = Relation.ADD_OR_REMOVE_ONE
    assert ledger.neighboring_relation == relation
    assert len(ledger.classes) == 2
    epsilons = ledger.class_epsilons(DELTA)[ledger.client_class]
    both = accountant_epsilon(
        relation, dpa.SelfComposedDpEvent(warm_up, 5), dpa.SelfComposedDpEvent(full, 150)
    )
    later = accountant_epsilon(relation, dpa.SelfComposedDpEvent(full, 150))
    assert set(epsilons[:20]) == {both} and set(epsilons[20:]) == {later}
    assert ledger.epsilon(DELTA) == both > later


def test_ledger_equals_composing_round_by_round() -> None:
    """Rounds composed one at a time in the order they ran: the same epsilon up to the order
    of the float sums (the ledger adds count x vector, the accountant vector by vector)."""
    inner = dpa.GaussianDpEvent(2.0)
    schedule = [sampling_event("poisson", n, 10, inner) for n in (100, 100, 50, 100, 50)]
    ledger = PrivacyLedger.for_population(100)
    for event in schedule:
        ledger.record(None, event)
    assert ledger.epsilon(DELTA) == pytest.approx(
        accountant_epsilon(Relation.ADD_OR_REMOVE_ONE, *schedule), rel=1e-12
    )


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_adaptive_clipping_composed_event_is_accounted_as_its_combined_gaussian(
    sampling: str,
) -> None:
    """Adaptive clipping noises the clipped sum (z_v) and the count under the clip (sigma_b,
    sensitivity 1/2 add-or-remove, so multiplier 2 sigma_b), split so that the two compose to
    z: z_v = (z^-2 - (2 sigma_b)^-2)^-1/2. Sampled, the composed round is the plain Gaussian
    round of z; under replace-one both sensitivities double, so both multipliers halve."""
    z = sigma_b = 1.5
    z_v = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    composed = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_v), dpa.GaussianDpEvent(2 * sigma_b)])
    event = sampling_event(sampling, 1000, 20, composed)
    if sampling == "fixed":
        halved = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_v / 2), dpa.GaussianDpEvent(sigma_b)])
        assert event == dpa.SampledWithoutReplacementDpEvent(1000, 20, halved)
    ledger = PrivacyLedger.for_population(1000)
    for _ in range(200):
        ledger.record(None, event)
    relation = ledger.neighboring_relation
    plain = sampling_event(sampling, 1000, 20, dpa.GaussianDpEvent(z))
    assert ledger.epsilon(DELTA) == pytest.approx(
        accountant_epsilon(relation, dpa.SelfComposedDpEvent(plain, 200)), rel=1e-9
    )


def chi_square_p(statistic: float, dof: int) -> float:
    """Two-sided: too uneven (a bias) or too even (a schedule, not a random draw)."""
    return 2 * min(stats.chi2.sf(statistic, dof), stats.chi2.cdf(statistic, dof))


def test_loop_sampling_is_the_model_docs_privacy_md_states() -> None:
    """`sampled_positions` is what `Experiment.sample_clients` draws from the eligible clients.
    Over 3000 seeded rounds of N = 40 eligible and m = 8 (q = 0.2):
    * fixed: every round exactly m distinct clients; each client's count of rounds has the
      fixed-size design's covariance R q (1 - q) N/(N - 1) (I - 11'/N), so
      sum (O_i - R q)^2 (N - 1) / (R q (1 - q) N) is chi-square with N - 1 degrees of freedom;
    * poisson: counts are independent Binomial(R, q), sum (O_i - R q)^2 / (R q (1 - q)) is
      chi-square with N degrees of freedom; each round's size is Binomial(N, q), checked by a
      chi-square goodness of fit (tails pooled to expected counts >= 5).
    Each statistic is two-sided at p >= 0.001. The fixed draw is the one the loop always made
    (same seed stream and calls), and docs/privacy.md states each sampling's sentence."""
    n, m, rounds, seed = 40, 8, 3000, 11
    q = m / n
    for sampling in SAMPLINGS:
        draws = [sampled_positions(sampling, n, m, seed, r) for r in range(1, rounds + 1)]
        counts = np.bincount(np.concatenate(draws), minlength=n)
        deviation = ((counts - rounds * q) ** 2).sum() / (rounds * q * (1 - q))
        if sampling == "fixed":
            assert all(len(d) == m == len(set(d.tolist())) and 0 <= d.min() < n for d in draws)
            assert chi_square_p(deviation * (n - 1) / n, n - 1) > 1e-3
            for r in (1, 7):
                rng = np.random.default_rng(derived_seed(seed, SAMPLING, r))
                np.testing.assert_array_equal(
                    draws[r - 1], np.sort(rng.choice(n, m, replace=False))
                )
        else:
            assert chi_square_p(deviation, n) > 1e-3
            sizes = np.bincount([len(d) for d in draws], minlength=n + 1)
            expected = stats.binom.pmf(np.arange(n + 1), n, q) * rounds
            low, high = np.flatnonzero(expected >= 5)[[0, -1]]
            observed = [sizes[: low + 1].sum(), *sizes[low + 1 : high], sizes[high:].sum()]
            wanted = [expected[: low + 1].sum(), *expected[low + 1 : high], expected[high:].sum()]
            fit = sum((o - e) ** 2 / e for o, e in zip(observed, wanted))
            assert chi_square_p(fit, len(observed) - 1) > 1e-3
        documented = " ".join(DOCS.read_text().split())
        assert describe_sampling(sampling) in documented
    assert sampled_positions("fixed", 3, 8, seed, 1).tolist() == [0, 1, 2]
    assert sampled_positions("poisson", 3, 8, seed, 1).tolist() == [0, 1, 2]  # q = 1
    assert len(sampled_positions("poisson", 0, 8, seed, 1)) == 0


@pytest.mark.parametrize(("sampling", "target"), [("poisson", 1.0), ("fixed", 8.0)])
def test_calibrated_noise_reaches_the_target_epsilon(sampling: str, target: float) -> None:
    """The calibrated multiplier's 200 rounds (1000 clients, 20 a round), recorded round by
    round, reach the target without passing it: within 2% below it at a tolerance of 0.01."""
    z = calibrated_noise_multiplier(target, DELTA, 200, sampling, 1000, 20, tol=0.01)
    ledger = PrivacyLedger.for_population(1000)
    for _ in range(200):
        ledger.record(None, sampling_event(sampling, 1000, 20, dpa.GaussianDpEvent(z)))
    assert 0.98 * target < ledger.epsilon(DELTA) <= target


def test_ledger_round_trips_through_its_checkpoint_encoding() -> None:
    """As a checkpoint stores it (`state_encoding`: JSON text and .npz arrays): the same
    classes, clients and epsilon; a key naming anything but a dp_accounting event is refused."""
    ledger = PrivacyLedger.for_population(300)
    for n in (200, 300, 300):
        ledger.record(np.arange(n), sampling_event("poisson", n, 10, dpa.GaussianDpEvent(1.1)))
    arrays: dict[str, np.ndarray] = {}
    text = json.dumps(encode_tree(ledger, arrays))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    loaded = decode_tree(json.loads(text), dict(np.load(buffer, allow_pickle=False)))
    assert isinstance(loaded, PrivacyLedger) and loaded.classes == ledger.classes
    np.testing.assert_array_equal(loaded.client_class, ledger.client_class)
    assert loaded.client_class.dtype == np.int32 and len(loaded.classes) == 2
    assert loaded.epsilon(DELTA) == ledger.epsilon(DELTA) > 0
    loaded.record(None, sampling_event("poisson", 300, 10, dpa.GaussianDpEvent(1.1)))
    assert loaded.classes[0] != ledger.classes[0]  # the loaded copy is its own
    with pytest.raises(ValueError, match="not a dp_accounting event"):
        event_of_key('{"class":"RdpAccountant"}')
    with pytest.raises(ValueError, match="outside"):
        PrivacyLedger(np.array([0, 3]), [{}])


def test_a_ledger_checkpointed_before_its_module_moved_still_loads() -> None:
    """Checkpoints written before the ledger moved out of `loop/privacy.py` name it there
    (`state_encoding.RELOCATED`): such a run resumes with its ledger, while a name that was
    never a state class is still refused."""
    ledger = PrivacyLedger.for_population(5)
    ledger.record(np.arange(3), sampling_event("fixed", 5, 3, dpa.GaussianDpEvent(1.0)))
    arrays: dict[str, np.ndarray] = {}
    tree = encode_tree(ledger, arrays)
    assert tree["dataclass"] == "tff_clustered.loop.privacy_ledger:PrivacyLedger"
    old = dict(tree, dataclass="tff_clustered.loop.privacy:PrivacyLedger")
    loaded = decode_tree(old, arrays)
    assert isinstance(loaded, PrivacyLedger) and loaded.epsilon(DELTA) == ledger.epsilon(DELTA)
    with pytest.raises(ValueError, match="unknown state class"):
        decode_tree(dict(tree, dataclass="tff_clustered.loop.privacy:Ledger"), arrays)


def test_per_cluster_epsilon_is_the_largest_of_its_clients() -> None:
    """Six clients eligible in all 100 rounds, four only in the last 50: a cluster's epsilon
    is its most exposed member's, NaN without members, and every cluster's is the run's once
    each holds an always-eligible client (as under uniform sampling of every client)."""
    ledger = PrivacyLedger.for_population(10)
    always = np.arange(10) < 6
    for r in range(100):
        eligible = always if r < 50 else None
        n = 6 if r < 50 else 10
        ledger.record(eligible, sampling_event("poisson", n, 2, dpa.GaussianDpEvent(2.0)))
    assert len(ledger.classes) == 2
    per_client = ledger.class_epsilons(DELTA)[ledger.client_class]
    full, late = per_client[0], per_client[9]
    assert full == ledger.epsilon(DELTA) > late > 0
    assignment = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(
        ledger.epsilon_per_cluster(assignment, 4, DELTA), [full, full, late, np.nan]
    )
    assignment[0] = 2  # an always-eligible client joins cluster 2
    np.testing.assert_array_equal(
        ledger.epsilon_per_cluster(assignment, 3, DELTA), [full, full, full]
    )
    assignment[:6] = -1  # no cluster yet: only counted everywhere when clients pick clusters
    np.testing.assert_array_equal(
        ledger.epsilon_per_cluster(assignment, 3, DELTA), [np.nan, late, late]
    )
    np.testing.assert_array_equal(
        ledger.epsilon_per_cluster(assignment, 3, DELTA, unassigned_in_every_cluster=True),
        [full, full, full],
    )


def test_a_ledger_keeps_one_adjacency() -> None:
    """Replace-one and add-or-remove epsilons do not compose: a ledger refuses the mix."""
    ledger = PrivacyLedger.for_population(5)
    ledger.record(None, sampling_event("fixed", 5, 5, dpa.GaussianDpEvent(2.0)))  # q = 1
    with pytest.raises(ValueError, match="one adjacency"):
        ledger.record(None, sampling_event("poisson", 5, 2, dpa.GaussianDpEvent(2.0)))
    assert ledger.epsilon(DELTA) == accountant_epsilon(
        Relation.REPLACE_ONE, dpa.GaussianDpEvent(1.0)
    )
    unsampled = PrivacyLedger.for_population(5)  # an unsampled round: either adjacency
    unsampled.record(None, dpa.GaussianDpEvent(1.0))
    unsampled.record(None, sampling_event("fixed", 5, 5, dpa.GaussianDpEvent(2.0)))
    assert unsampled.neighboring_relation == Relation.REPLACE_ONE
