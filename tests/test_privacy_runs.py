"""A private run's account, end to end through `binaries/train.py`: each round's epsilon is
dp-accounting's for the rounds run, --target_epsilon stops the run before the round that
would pass it (and a resumed run stays stopped), and without --dp_noise_multiplier the noise
multiplier is the one whose rounds reach the target."""

from __future__ import annotations

import csv
import functools
import json
import os

import dp_accounting as dpa
import pytest
from conftest import DP_POISSON_DIGITS, runs_in_one_process
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from tff_clustered.loop import accounting

RUN = [*DP_POISSON_DIGITS, "--eval_every=100"]
Q = 10 / 40
# The target stops it after round 24 of 29 (a run of 30 rounds or more would first vectorise its
# clients' training, seconds of graph conversion that this account has nothing to do with).
STOPPED = [*RUN, "--rounds=29", "--dp_noise_multiplier=1.0", "--target_epsilon=10"]
SECURE = [*RUN, "--rounds=2", "--dp_noise_multiplier=1.0", "--dp_noise=secure"]
# The module's runs of train.py, by name: (flags, output folder), in this order ("resumed"
# continues "stopped" in its folder).
RUNS = {
    "stopped": (STOPPED, "stopped"),
    "resumed": ([*STOPPED, "--resume"], "stopped"),
    "calibrated": ([*RUN, "--rounds=6", "--target_epsilon=8"], "calibrated"),
    # one round costs 3.08 at z = 1 (q = 1/4): a target of 3 is refused, not a run of nothing
    "below_one_round": (
        [*RUN, "--rounds=40", "--dp_noise_multiplier=1.0", "--target_epsilon=3"],
        "below",
    ),
    "secure": (SECURE, "secure"),
    "secure_resumed": ([*SECURE, "--resume"], "secure"),
    # Ditto's personal models in the disk store's file: state a deployment keeps on devices
    "ditto": ([*SECURE, "--algorithm=ditto", "--client_store=disk"], "ditto"),
    "no_noise_nor_target": ([*RUN, "--rounds=2"], "refused"),
    "clipped": (
        [
            *[f for f in RUN if f != "--client_sampling=poisson"],
            "--rounds=2",
            "--dp_noise_multiplier=0",
        ],
        "clipped",
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, object]]:
    """Each of `RUNS` by name, all in one process of train.py's main (TensorFlow imported
    once): (its output folder, its finished run as a CompletedProcess)."""
    root = tmp_path_factory.mktemp("privacy_runs")
    folders = {name: str(root / folder) for name, (_, folder) in RUNS.items()}
    argvs = [[*flags, f"--output_dir={folders[name]}"] for name, (flags, _) in RUNS.items()]
    return {name: (folders[name], done) for name, done in zip(RUNS, runs_in_one_process(argvs))}


@functools.cache
def one_round(z: float) -> rdp.RdpAccountant:
    """dp-accounting's accountant holding one round at noise multiplier `z` (its RDP takes
    about a third of a second to compute, the same for every count of rounds)."""
    return rdp.RdpAccountant().compose(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(z)))


def poisson_epsilon(z: float, rounds: int, delta: float = 1e-5) -> float:
    """The accountant's epsilon for `rounds` rounds: what it gives `SelfComposedDpEvent(round,
    rounds)`, whose RDP is `rounds` times one round's, at each of its orders."""
    accountant = one_round(z)
    return rdp.compute_epsilon(accountant._orders, rounds * accountant._rdp, delta)[0]


def finished(folder: str) -> tuple[list[dict], dict]:
    with open(os.path.join(folder, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(folder, "summary.json")) as f:
        return rows, json.load(f)


def test_a_run_stops_before_the_round_that_would_pass_the_target_epsilon(runs: dict) -> None:
    out, done = runs["stopped"]
    assert done.returncode == 0, done.stderr[-3000:]
    rows, summary = finished(out)
    last = int(rows[-1]["round"])
    assert 1 < last < 29, last  # stopped early, after some rounds
    for row in rows[1:]:  # each round's epsilon is dp-accounting's for the rounds so far
        assert float(row["epsilon"]) == pytest.approx(poisson_epsilon(1.0, int(row["round"])))
    assert float(rows[-1]["epsilon"]) <= 10 < poisson_epsilon(1.0, last + 1)
    assert rows[-1]["accuracy"] != ""  # the last round run is evaluated
    privacy = summary["privacy"]
    assert privacy["stopped_at_target_epsilon"] is True
    assert privacy["epsilon"] == pytest.approx(float(rows[-1]["epsilon"]), rel=1e-5)
    assert privacy["neighboring_relation"] == "ADD_OR_REMOVE_ONE"
    assert f"stopped after round {last}/29" in done.stderr + done.stdout
    # a resumed run is already where the target stops it: nothing more is trained
    _, again = runs["resumed"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["round"] for r in finished(out)[0]] == [r["round"] for r in rows]


def test_a_private_run_ends_with_its_epsilon_and_what_it_does_not_cover(runs: dict) -> None:
    """One stdout line: epsilon at delta, the noise, what is not covered; summary.json's
    privacy block lists it in full. Seeded noise is named as recomputable, secure is not."""
    out, done = runs["stopped"]
    privacy = finished(out)[1]["privacy"]
    line = [x for x in done.stdout.splitlines() if x.startswith("privacy: epsilon")]
    assert line == [
        f"privacy: epsilon {privacy['epsilon']:.4g} at delta 1e-05, seeded noise; not covered "
        "(summary.json's privacy.not_covered): exact training metrics; evaluation; the sample; "
        "the clients' data sizes and labels; the noise"
    ]
    assert privacy["device_side"] == []  # FedAvg keeps no client's model
    assert privacy["covers"][0].startswith("the cluster models")
    assert "recomputable from --seed" in privacy["not_covered"][-1]
    secure_out, secure = runs["secure"]
    assert secure.returncode == 0, secure.stderr[-3000:]
    privacy = finished(secure_out)[1]["privacy"]
    assert privacy["noise"] == "secure" and len(privacy["not_covered"]) == 4
    assert "secure noise; not covered" in secure.stdout


def test_a_private_run_names_the_client_models_it_keeps_as_device_side_state(
    runs: dict,
) -> None:
    """Ditto's personal models, trained without noise and kept in the run's client store, are
    named as what a deployment keeps on the devices: summary.json's `privacy.device_side` and
    the end of the `privacy:` line (FedAvg, keeping none, names none: above)."""
    out, done = runs["ditto"]
    assert done.returncode == 0, done.stderr[-3000:]
    privacy = finished(out)[1]["privacy"]
    assert privacy["device_side"] == [accounting.CLIENT_MODELS]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("privacy: epsilon")]
    assert line.endswith("; kept on the devices, not released: each client's own model"), line


def test_a_resumed_secure_run_says_its_noise_is_fresh(runs: dict) -> None:
    _, done = runs["secure_resumed"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming" in done.stdout and "draw fresh noise" in done.stdout


def test_a_target_epsilon_below_one_rounds_cost_is_refused(runs: dict) -> None:
    out, done = runs["below_one_round"]
    assert done.returncode == 2
    assert "one round costs epsilon 3.081" in done.stderr, done.stderr[-3000:]
    assert "--dp_noise_multiplier of at least 1.0" in done.stderr  # the z of one round
    assert not os.path.exists(os.path.join(out, "summary.json"))


def test_without_a_noise_multiplier_the_target_sets_it(runs: dict) -> None:
    out, done = runs["calibrated"]
    assert done.returncode == 0, done.stderr[-3000:]
    rows, summary = finished(out)
    z = summary["privacy"]["noise_multiplier"]
    assert int(rows[-1]["round"]) == 6  # every round fits in the target
    assert summary["privacy"]["stopped_at_target_epsilon"] is False
    assert 0.97 * 8 <= poisson_epsilon(z, 6) <= 8  # the least z that keeps 6 rounds within 8
    assert float(rows[-1]["epsilon"]) == pytest.approx(poisson_epsilon(z, 6))


def test_dp_needs_a_noise_multiplier_or_a_target(runs: dict) -> None:
    _, done = runs["no_noise_nor_target"]
    assert done.returncode != 0
    assert "--dp_noise_multiplier" in done.stderr and "--target_epsilon" in done.stderr


def test_clipping_only_runs_without_an_account(runs: dict) -> None:
    """z = 0 under the default fixed sampling: clipping, no noise, no epsilon claimed (the
    accountant has none to give), and the run finishes."""
    out, done = runs["clipped"]
    assert done.returncode == 0, done.stderr[-3000:]
    rows, summary = finished(out)
    assert "epsilon" not in rows[-1] and "privacy" not in summary
    assert summary["config"]["client_weighting"] == "uniform"


def test_settings_that_would_do_nothing_are_refused() -> None:
    from tff_clustered.loop.config import AggregatorConfig

    with pytest.raises(ValueError, match="--dp_target_quantile set with --dp_clipping=fixed"):
        AggregatorConfig("dp", noise_multiplier=1.0, target_quantile=0.7)
    with pytest.raises(ValueError, match="without noise no epsilon holds"):
        AggregatorConfig("dp", noise_multiplier=0.0, target_epsilon=4.0)
    AggregatorConfig("dp", noise_multiplier=1.0, clipping="adaptive", target_quantile=0.7)


def test_calibrating_adaptive_clipping_with_a_given_count_noise() -> None:
    """The target's z is calibrated as a Gaussian round (what an adaptive round costs), then
    checked against the count noise once: a count noise that allows it gives a run, one that
    does not is refused naming the calibrated z."""
    from tff_clustered.loop.accounting import calibrated
    from tff_clustered.loop.config import AggregatorConfig, TrainingConfig

    def config(count_stddev: float) -> TrainingConfig:
        dp = AggregatorConfig(
            "dp", clipping="adaptive", count_stddev=count_stddev, target_epsilon=4.0
        )
        return TrainingConfig(rounds=10, clients_per_round=10, aggregator=dp)

    tuned, z = calibrated(config(5.0), 1000)
    assert z is not None and tuned.aggregator.options.noise_multiplier == z < 10.0
    with pytest.raises(ValueError, match="count"):
        calibrated(config(0.05), 1000)
