"""`--eval_clients=K` (`TrainingConfig.eval_clients`): each evaluation scores a seeded sample of
K clients, a function of the seed and the client ids only (the same for every algorithm of a
table and every round); K = 0 scores every client. And the pooled scoring in chunks of clients
(`RoundCalls.pooled_chunks`) gives each client what one call over all of them gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import mlp_experiment

from tff_clustered.data import load_digits_clusters
from tff_clustered.data.federated_data import FederatedData
from tff_clustered.loop import scoring_calls
from tff_clustered.loop.config import TrainingConfig
from tff_clustered.loop.evaluation import server_models
from tff_clustered.loop.orchestration import Experiment

pytestmark = pytest.mark.usefixtures("tff_context")
CONFIG = TrainingConfig(rounds=2, clients_per_round=4, learning_rate=0.1, batch_size=8, seed=3)
NUM_CLIENTS = 12


def digits(seed: int = 3) -> FederatedData:
    return load_digits_clusters(num_clients=NUM_CLIENTS, num_groups=2, seed=seed)


def trained(algorithm: str, config: TrainingConfig, **options: object) -> Experiment:
    exp = mlp_experiment(algorithm, digits(), config, **options)
    list(exp.rounds())
    return exp


def evaluated_clients(exp: Experiment) -> list[str]:
    return [row["client"] for row in exp.client_rows]


def test_the_sample_depends_on_the_seed_and_the_ids_only() -> None:
    ids = [f"client_{i:03d}" for i in range(50)]
    config = TrainingConfig(eval_clients=10, seed=1)
    sample = config.evaluation_sample(ids)
    assert len(sample) == len(set(sample)) == 10 and set(sample) <= set(ids)
    assert [c for c in ids if c in sample] == sample  # in the order of the ids given
    shuffled = list(np.random.default_rng(0).permutation(ids))
    assert set(config.evaluation_sample(shuffled)) == set(sample)  # not their order
    assert set(dataclasses.replace(config, seed=2).evaluation_sample(ids)) != set(sample)
    for every in (0, 50, 80):  # 0, or at least the number of clients: every client
        assert dataclasses.replace(config, eval_clients=every).evaluation_sample(ids) == ids


def test_a_negative_eval_clients_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="^eval_clients must be >= 0 .*--eval_clients=0"):
        TrainingConfig(eval_clients=-1)


def test_every_algorithm_of_a_seed_scores_the_same_clients_in_every_round() -> None:
    config = dataclasses.replace(CONFIG, eval_clients=5)
    fedavg, fedper = trained("fedavg", config), trained("fedper", config)
    sample = evaluated_clients(fedavg)
    assert len(sample) == 5
    assert evaluated_clients(fedper) == sample
    assert fedavg.calls.scored_clients == sample  # every round's evaluation: one sample per run
    assert all(row["num_eval_clients"] == 5 for row in fedavg.state.history)
    other_seed = trained("fedavg", dataclasses.replace(config, seed=4))
    assert set(evaluated_clients(other_seed)) != set(sample)


def test_without_eval_clients_every_client_is_scored_as_with_k_at_least_the_population() -> None:
    every = trained("ifca", CONFIG, num_clusters=2)
    assert evaluated_clients(every) == every.data.client_ids
    assert every.calls.scored_clients == every.data.client_ids
    more = trained(
        "ifca", dataclasses.replace(CONFIG, eval_clients=NUM_CLIENTS + 5), num_clusters=2
    )

    def results(exp: Experiment) -> list[dict]:
        return [  # NaN (no client assigned yet) as None, to compare equal
            {k: None if v != v else v for k, v in r.items() if not k.endswith("_seconds")}
            for r in exp.state.history
        ]

    assert results(more) == results(every)


@pytest.mark.parametrize("algorithm, kind", [("ifca", "cluster"), ("fedper", "personal")])
def test_a_sampled_evaluation_is_the_pooled_score_of_its_clients(algorithm: str, kind: str) -> None:
    options = {"num_clusters": 2} if algorithm == "ifca" else {}
    exp = trained(algorithm, dataclasses.replace(CONFIG, eval_clients=7), **options)
    row = exp.evaluate()
    sample = exp.calls.scored_clients
    assert len(sample) == 7 and evaluated_clients(exp) == sample
    clusters = exp.algorithm.evaluation_clusters(exp.run, exp.view(), sample, exp.queries)
    models, keys = server_models(exp.state.cluster_models, "cluster", clusters)
    fed_round = exp.current_round() if kind == "personal" else exp.calls.whole_model_round(2)
    by_hand = exp.calls.score(fed_round, models, keys, sample, exp.store)
    correct = sum(r["num_correct"] for r in by_hand.values())
    total = sum(r["num_examples"] for r in by_hand.values())
    assert total == sum(exp.data.test_sizes[c] for c in sample)
    assert row[f"accuracy_{kind}"] == pytest.approx(correct / total, abs=1e-12)
    assigned = [c for c in sample if exp.state.assignment.get(c, -1) >= 0]
    assert row["num_eval_clients"] == len(assigned)
    sizes = [row[f"cluster_size_{k}"] for k in range(exp.num_clusters)]
    assert sum(sizes) == len(exp.state.assigned(exp.data.client_ids))  # the whole population's


def test_the_kept_examples_are_the_sampled_clients_only() -> None:
    exp = trained("fedavg", dataclasses.replace(CONFIG, eval_clients=4))
    kept = exp.calls._pooled_splits["test"]
    assert kept is not None and set(kept.start) == set(exp.calls.scored_clients)
    x, _ = kept.examples()
    assert len(x) == sum(exp.data.test_sizes[c] for c in exp.calls.scored_clients)


def test_scoring_in_chunks_equals_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = trained("ifca", CONFIG, num_clusters=2)
    ids = exp.data.client_ids
    models, keys = server_models(exp.state.cluster_models, "cluster", np.arange(len(ids)) % 2)
    one_call = {
        split: exp.calls.score_pooled(models, keys, ids, split) for split in ("test", "train")
    }
    losses = exp.queries.cluster_losses(exp.state.cluster_models, ids)
    whole = exp.current_round()
    per_client = exp.calls.score(whole, models, keys, ids, exp.store)
    # No split kept, and a few clients' examples per call
    monkeypatch.setattr(scoring_calls, "POOLED_SPLIT_MAX_BYTES", 0)
    bytes_per_client = max(exp.data.test_sizes.values()) * exp.calls.example_bytes
    monkeypatch.setattr(scoring_calls, "POOLED_CHUNK_BYTES", 2 * bytes_per_client)
    monkeypatch.setattr(scoring_calls, "CLIENTS_PER_SCORE_CALL", 5)
    exp.calls._pooled_splits.clear()
    assert len(exp.calls.pooled_chunks("test", ids)) > 3
    for split, expected in one_call.items():
        chunked = exp.calls.score_pooled(models, keys, ids, split)
        assert list(chunked) == list(expected)
        for c in ids:
            assert chunked[c]["num_examples"] == expected[c]["num_examples"] > 0
            assert chunked[c]["num_correct"] == expected[c]["num_correct"]
            # float32 sums over other batches: equal up to the order of additions
            assert chunked[c]["loss_sum"] == pytest.approx(expected[c]["loss_sum"], rel=1e-6)
    np.testing.assert_allclose(
        exp.queries.cluster_losses(exp.state.cluster_models, ids), losses, rtol=1e-6
    )
    assert exp.calls.score(whole, models, keys, ids, exp.store) == per_client
    assert exp.calls._pooled_splits["test"] is None


def test_a_large_split_is_never_read_whole_to_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    exp = mlp_experiment("fedavg", digits(), CONFIG)
    monkeypatch.setattr(scoring_calls, "POOLED_SPLIT_MAX_BYTES", 0)
    read: list[str] = []
    arrays = FederatedData.arrays

    def counted(data: FederatedData, split: str, client_id: str) -> dict:
        read.append(client_id)
        return arrays(data, split, client_id)

    monkeypatch.setattr(FederatedData, "arrays", counted)
    ids = exp.data.client_ids[:3]
    exp.calls.score_pooled(exp.state.cluster_models, np.zeros(3, np.int32), ids)
    assert read == ids  # the clients scored, nothing else


def test_the_flag_reaches_the_training_config() -> None:
    from absl import flags

    from tff_clustered.cli import run_flags

    assert flags.FLAGS["eval_clients"].default == TrainingConfig().eval_clients == 0
    try:
        flags.FLAGS(["train.py", "--eval_clients=5"])
        assert run_flags.run_spec_from_flags("fedavg").training.eval_clients == 5
    finally:
        flags.FLAGS.unparse_flags()
