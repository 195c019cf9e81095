"""FedTSDP's re-clustering trigger (Algorithm 1 line 17) calibrated to the run's own reference:
the rotated reference outputs, H against them with common random numbers, the decision on
synthetic outputs, and whole runs (IID clients never trigger and stay FedAvg bit for bit;
planted groups trigger within a few rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ari_with_plant

from tff_clustered import clustering
from tff_clustered.algorithms import make_algorithm
from tff_clustered.algorithms.fedtsdp import FedTSDP
from tff_clustered.data import load_dataset, load_digits_clusters
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.execution import RunExecution
from tff_clustered.loop.orchestration import Experiment
from tff_clustered.models import model_spec
from tff_clustered.report import figures


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def client_outputs(rng: np.random.Generator, groups: int, m: int = 10) -> np.ndarray:
    """m clients' softmax outputs on B = 20 samples of C = 5 classes: a shared model's logits,
    each client's own deviation along a few shared directions (correlated across all
    coordinates, as trained models' are) and, with groups > 1, a per-group offset."""
    shared = rng.normal(size=(20, 5)) * 3
    directions = rng.normal(size=(3, 20, 5))
    own = np.einsum("mk,kbc->mbc", rng.normal(size=(m, 3)), directions) * 0.3
    offsets = rng.normal(size=(groups, 20, 5)) * 3 if groups > 1 else np.zeros((1, 20, 5))
    return softmax(shared + own + offsets[np.arange(m) % groups])


def standard_score(metrics: dict[str, float]) -> float:
    return (metrics["hopkins"] - metrics["hopkins_reference"]) / metrics["hopkins_reference_std"]


def test_rotated_outputs_keep_the_clients_spread_and_move_the_clients() -> None:
    probs = client_outputs(np.random.default_rng(0), groups=2)
    references = clustering.rotated_outputs(probs, np.random.default_rng(1), 4)
    assert references.shape == (4, 10, 100)
    by_sample = references.reshape(4, 10, 20, 5)
    np.testing.assert_allclose(by_sample.sum(-1), 1.0, rtol=1e-12)

    def centred_logs(p: np.ndarray) -> np.ndarray:
        logs = np.log(p)
        logs = (logs - logs.mean(-1, keepdims=True)).reshape(len(p), -1)
        return logs - logs.mean(0)

    gram = np.linalg.eigvalsh(centred_logs(probs) @ centred_logs(probs).T)
    for reference in by_sample:
        moved = centred_logs(reference)
        np.testing.assert_allclose(np.linalg.eigvalsh(moved @ moved.T), gram, atol=1e-8)
        np.testing.assert_allclose(  # the clients' mean log-output is kept
            np.log(reference).mean(0) - np.log(reference).mean((0, 2))[:, None],
            np.log(probs).mean(0) - np.log(probs).mean((0, 2))[:, None],
            atol=1e-9,
        )
        assert np.abs(reference - probs.reshape(10, 20, 5)).max() > 0.05
    with pytest.raises(ValueError, match="models, samples, classes"):
        clustering.rotated_outputs(probs[0], np.random.default_rng(0), 1)


def test_hopkins_against_references_uses_the_same_draws_for_every_set() -> None:
    points = client_outputs(np.random.default_rng(2), groups=1).reshape(10, -1)
    h, same = clustering.hopkins_against_references(
        points, np.stack([points, points]), np.random.default_rng(3), draws=64
    )
    assert same == pytest.approx([h, h], abs=1e-12) and 0.3 < h < 0.9  # the same draws
    with pytest.raises(ValueError, match="references must be"):
        clustering.hopkins_against_references(points, points, np.random.default_rng(3))


def test_calibrated_statistic_is_low_without_groups_and_high_with_them() -> None:
    """The decision on synthetic outputs: clients that differ only along directions they
    share (no groups) stay below H's level, whatever H's own level; three groups clear it."""
    tsdp = FedTSDP()
    level = tsdp.options.tsdp_trigger_z
    rng = np.random.default_rng(4)
    scores = {
        groups: [
            standard_score(tsdp.trigger_metrics(client_outputs(rng, groups), 0, r))
            for r in range(8)
        ]
        for groups in (1, 3)
    }
    assert max(scores[1]) < level - 1, scores[1]
    assert min(scores[3]) > level + 1, scores[3]


def test_calibrated_trigger_of_two_clients_never_fires() -> None:
    tsdp = FedTSDP()
    assert tsdp.min_clients == 3 and FedTSDP(FedTSDP.Options(tsdp_trigger="paper")).min_clients == 2
    metrics = tsdp.trigger_metrics(client_outputs(np.random.default_rng(5), 2, m=2), 0, 1)
    assert metrics["hopkins_reference_std"] == pytest.approx(0.0, abs=1e-12)


def test_bad_trigger_options_are_refused() -> None:
    for options, message in (
        ({"tsdp_trigger": "always"}, "tsdp_trigger"),
        ({"tsdp_trigger_z": 0.0}, "tsdp_trigger_z must be > 0"),
        ({"tsdp_reference_sets": 1}, "tsdp_reference_sets must be >= 2"),
        ({"hopkins_draws": 0}, "hopkins_draws must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            make_algorithm("fedtsdp", **options)


def test_hopkins_png_shows_h_its_reference_and_the_triggers(tmp_path: object) -> None:
    calibrated = [
        {"round": 0},
        {"round": 1, "hopkins": 0.6, "hopkins_reference": 0.55, "hopkins_reference_std": 0.01,
         "hopkins_threshold": 0.59, "clustered": 1.0},
        {"round": 2, "hopkins": 0.56, "hopkins_reference": 0.55, "hopkins_reference_std": 0.01,
         "hopkins_threshold": 0.59, "clustered": 0.0},
    ]  # fmt: skip
    paper = [{"round": 1, "hopkins": 0.6, "hopkins_threshold": 0.65, "clustered": 0.0}]
    for name, history in (("calibrated", calibrated), ("paper", paper)):
        path = str(tmp_path / f"{name}.png")
        assert figures.write_hopkins_png(path, history, name)
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert not figures.write_hopkins_png(str(tmp_path / "none.png"), [{"round": 1}], "fedavg")
    assert not (tmp_path / "none.png").exists()


IID_ROUNDS = 200


def iid_client_outputs(seed: int, rounds: int, clients: int = 4) -> list[np.ndarray]:
    """Each round's softmax outputs (clients, B = 50, 10) on a fresh public batch of IID
    digits clients' softmax-regression models, each trained one epoch of minibatch SGD (batch
    20, lr 0.1) from the mean of the previous round's: FedAvg's uploads, in NumPy."""
    data = load_dataset("digits_iid", seed=seed, num_clients=clients)
    rng = np.random.default_rng(seed)
    shape = (data.input_shape[0] + 1, data.num_classes)  # weights and bias
    model = rng.normal(size=shape) * 0.01
    arrays = [data.arrays("train", c) for c in data.client_ids]
    public = np.hstack([data.public_x, np.ones((len(data.public_x), 1), np.float32)])
    outputs = []
    for _ in range(rounds):
        uploads = []
        for client in arrays:
            x = np.hstack([client["x"], np.ones((len(client["x"]), 1), np.float32)])
            onehot = np.eye(data.num_classes)[client["y"]]
            local = model.copy()
            order = rng.permutation(len(x))
            for start in range(0, len(x), 20):
                batch = order[start : start + 20]
                error = softmax(x[batch] @ local) - onehot[batch]
                local -= 0.1 * x[batch].T @ error / len(batch)
            uploads.append(local)
        batch = rng.choice(len(public), 50, replace=False)
        outputs.append(np.stack([softmax(public[batch] @ w) for w in uploads]))
        model = np.mean(uploads, axis=0)
    return outputs


@pytest.mark.parametrize("seed", range(3))
def test_iid_clients_outputs_never_trigger(seed: int) -> None:
    """200 rounds of 4 IID digits clients' uploads: the calibrated trigger never fires,
    whatever H's level (it rises as the models sharpen)."""
    tsdp = FedTSDP()
    rows = [
        tsdp.trigger_metrics(probs, seed, r)
        for r, probs in enumerate(iid_client_outputs(seed, IID_ROUNDS), 1)
    ]
    assert not any(r["hopkins"] > r["hopkins_threshold"] for r in rows), max(
        map(standard_score, rows)
    )


@pytest.mark.usefixtures("tff_context")
def test_iid_fedtsdp_run_never_triggers_and_is_fedavg_bit_for_bit() -> None:
    """200 rounds of 3 IID digits clients (MCLR, one local epoch of batch 64) through the
    whole round: no trigger, and FedTSDP's models and accuracy are FedAvg's."""
    data = load_dataset("digits_iid", seed=0, num_clients=3)
    model = model_spec("mclr", data.input_shape, data.num_classes)
    config = TrainingConfig(
        rounds=IID_ROUNDS, clients_per_round=3, batch_size=64, learning_rate=0.1,
        eval_every=IID_ROUNDS,
    )  # fmt: skip
    runs = {}
    for name in ("fedtsdp", "fedavg"):
        runs[name] = Experiment(
            data, model, make_algorithm(name), config, execution=RunExecution.of("in_process")
        )
        runs[name].start()
        list(runs[name].rounds())
    history = runs["fedtsdp"].state.history[1:]
    assert len(history) == IID_ROUNDS
    assert sum(r["clustered"] for r in history) == 0, max(map(standard_score, history))
    np.testing.assert_array_equal(
        runs["fedtsdp"].state.cluster_models, runs["fedavg"].state.cluster_models
    )
    assert (
        runs["fedtsdp"].state.history[-1]["accuracy"]
        == (runs["fedavg"].state.history[-1]["accuracy"])
    )


PLANTED_TRIGGER_BY = 4  # the first trigger's round, at the latest
PLANTED_ROUNDS = 6  # the JS divergences pass eps1 (two clusters) from round 6


@pytest.mark.usefixtures("tff_context")
def test_planted_groups_trigger_within_a_few_rounds_and_are_recovered() -> None:
    """Two label-permutation groups of digits clients: the calibrated trigger fires by round
    PLANTED_TRIGGER_BY (fails if it never fires) and, once the clients' outputs are apart
    by eps1, the two stages recover the groups."""
    data = load_digits_clusters(num_clients=10, num_groups=2, seed=0)
    model = model_spec("mlp", data.input_shape, data.num_classes, hidden_units=32)
    config = TrainingConfig(
        rounds=PLANTED_ROUNDS, clients_per_round=10, local_epochs=2, learning_rate=0.05,
        momentum=0.5,
    )  # fmt: skip
    exp = Experiment(
        data, model, make_algorithm("fedtsdp"), config, execution=RunExecution.of("in_process")
    )
    exp.start()
    list(exp.rounds())
    history = exp.state.history[1:]
    scores = [round(standard_score(r), 2) for r in history]
    assert any(r["clustered"] for r in history[:PLANTED_TRIGGER_BY]), scores
    fired = next(r for r in history if r["clustered"])
    assert fired["hopkins"] > fired["hopkins_threshold"] > fired["hopkins_reference"]
    assert ari_with_plant(exp) == 1.0
