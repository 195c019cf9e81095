"""A user's own per-cluster aggregator, one file, through `tff_clustered.run`.

`examples/norm_bounded_mean.py` drops each client whose update's norm exceeds its bound,
records its settings, and resumes only with them."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT

import tff_clustered
from tff_clustered.data import DataSpec
from tff_clustered.loop.config import AggregatorConfig
from tff_clustered.runs.checkpoint import CheckpointError


def load_example() -> ModuleType:
    """examples/norm_bounded_mean.py as a module (an example is no package)."""
    path = os.path.join(ROOT, "examples", "norm_bounded_mean.py")
    spec = importlib.util.spec_from_file_location("norm_bounded_mean", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses read the module of their class
    spec.loader.exec_module(module)
    return module


EXAMPLE = load_example()
NormBoundedMean = EXAMPLE.NormBoundedMean
CLIENTS = 6


def test_a_client_beyond_the_bound_is_dropped_from_its_clusters_mean() -> None:
    """Two clients of cluster 0 (norms 1 and 10) and one of cluster 1 (norm 10), bound 2: the
    mean of cluster 0 is the first client's update, cluster 1 does not step, and the dropped
    count is each cluster's."""
    aggregator = NormBoundedMean(max_norm=2.0)
    updates = [(np.float32([0.6, 0.8]), 0, 3.0), (np.float32([6, 8]), 0, 1.0), ((6, 8), 1, 2.0)]
    sums = np.zeros([2, 2], np.float32)
    total_weight = np.zeros([2], np.float32)
    stats = np.zeros([2, 1], np.float32)
    for delta, cluster, weight in updates:
        (kept,), w, row = aggregator.preprocess(
            {}, (tf.constant(delta, tf.float32),), tf.constant(cluster), tf.constant(weight), None
        )
        sums[cluster] += w.numpy() * kept.numpy()
        total_weight[cluster] += w.numpy()
        stats[cluster] += row.numpy()
    inputs = aggregator.initial_slot(2)["inputs"]
    (mean,), stepped, _, measured = aggregator.finalize(
        (tf.constant(sums),), tf.constant(total_weight), tf.constant(stats), {}, inputs
    )
    np.testing.assert_allclose(mean.numpy()[0], [0.6, 0.8], rtol=1e-6)
    assert stepped.numpy().tolist() == [True, False]
    assert measured["dropped_count"].numpy().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        NormBoundedMean(max_norm=0.0)
    with pytest.raises(TypeError, match="max_norm must be a number.*write 1.0"):
        NormBoundedMean(max_norm="1")


def test_its_settings_are_its_fields_and_its_name_must_be_its_own() -> None:
    """`AggregatorConfig.of` takes a user's subclass: its settings are its fields, recorded
    after every run's; one without a name of its own is refused."""
    config = AggregatorConfig.of(NormBoundedMean(max_norm=0.5))
    assert config.build() == NormBoundedMean(max_norm=0.5)
    record = config.settings()
    assert record["name"] == "norm_bounded_mean" and record["max_norm"] == 0.5
    assert list(record)[-1] == "max_norm" and record["noise_multiplier"] is None

    class Nameless(NormBoundedMean):
        name = ""

    class Taken(NormBoundedMean):
        name = "dp"

    with pytest.raises(ValueError, match="needs a name of its own"):
        AggregatorConfig.of(Nameless())
    with pytest.raises(ValueError, match="'dp' is ClusterDP's"):
        AggregatorConfig.of(Taken())


def digits_model() -> tf.keras.Model:
    return EXAMPLE.digits_model()


def run_with(
    max_norm: float, output_dir: str, aggregator: object = None, **more: object
) -> tff_clustered.RunResult:
    return tff_clustered.run(
        "fedavg",
        DataSpec("digits", num_clients=CLIENTS),
        digits_model,
        output_dir=output_dir,
        training=tff_clustered.TrainingConfig(rounds=2, clients_per_round=CLIENTS),
        aggregator=aggregator or NormBoundedMean(max_norm=max_norm),
        execution="in_process",
        log=lambda _: None,
        **more,
    )


def test_a_real_run_drops_every_client_beyond_the_bound_and_keeps_the_others(
    tmp_path: object,
) -> None:
    """On the digits: a bound no update reaches keeps every client (the plain weighted mean's
    models); a bound every update passes drops every client (the model never moves). The
    run records the aggregator by its name and bound, and resumes only with them."""
    kept_all = run_with(1e9, str(tmp_path / "kept"))
    assert [row["dropped_count_cluster_0"] for row in kept_all.history[1:]] == [0.0, 0.0]
    mean = tff_clustered.run(
        "fedavg",
        DataSpec("digits", num_clients=CLIENTS),
        digits_model,
        output_dir=str(tmp_path / "mean"),
        training=tff_clustered.TrainingConfig(rounds=2, clients_per_round=CLIENTS),
        execution="in_process",
        log=lambda _: None,
    )
    np.testing.assert_allclose(kept_all.cluster_models, mean.cluster_models, rtol=1e-5, atol=1e-6)
    dropped_all = run_with(1e-9, str(tmp_path / "dropped"))
    assert [row["dropped_count_cluster_0"] for row in dropped_all.history[1:]] == [
        float(CLIENTS)
    ] * 2
    accuracy = [row["accuracy"] for row in dropped_all.history]
    assert accuracy == [accuracy[0]] * 3  # the initial model, never stepped
    recorded = dropped_all.summary["config"]["training"]["aggregator"]
    assert (recorded["name"], recorded["max_norm"]) == ("norm_bounded_mean", 1e-9)
    again = run_with(1e-9, str(tmp_path / "dropped"), resume=True)
    assert [row["accuracy"] for row in again.history] == accuracy  # finished: the same run
    with pytest.raises(CheckpointError, match="max_norm"):
        run_with(0.5, str(tmp_path / "dropped"), resume=True)


@dataclasses.dataclass(frozen=True)
class Mistaken(NormBoundedMean):
    """The example with one `mistake` of a user's in what it returns."""

    mistake: str = ""
    name: ClassVar[str] = "mistaken"

    def preprocess(self, *args: Any) -> tuple:
        delta, weight, stats = super().preprocess(*args)
        if self.mistake == "shape":  # the model's first tensor is (64, 16)
            delta = (tf.zeros([8, 128]), *delta[1:])
        return delta[:-1] if self.mistake == "fewer" else delta, weight, stats

    def finalize(self, *args: Any) -> tuple:
        means, stepped, state, measured = super().finalize(*args)
        if self.mistake == "updated":
            stepped = tf.cast(stepped, tf.float32)
        if self.mistake == "measured":
            measured = {"dropped_count": [0.0]}
        return means, stepped, state, measured


def test_a_users_aggregator_returning_other_values_is_named_once_traced(tmp_path: object) -> None:
    """Issue 64: a wrong shape was TF's "Dimensions must be equal, but are 8 and 128", a
    tensor fewer a 107-line nest error, a list field "unhashable type: 'list'": each is now
    one line naming the class, the method and what differs, before any round runs."""
    for mistake, message in (
        ("shape", "Mistaken.preprocess returned delta[0] of shape (8, 128) float32, expected "
         "shape (64, 16) float32"),
        ("fewer", "Mistaken.preprocess returned delta of 3 values, expected 4 values"),
        ("updated", "Mistaken.finalize returned updated of shape (1,) float32, expected shape "
         "(1,) bool"),
        ("measured", "Mistaken.finalize returned measurements[dropped_count] = [0.0] (a list), "
         "expected a tensor of shape (1,) (one value per cluster)"),
    ):  # fmt: skip
        with pytest.raises(ValueError) as refused:
            run_with(1.0, str(tmp_path / mistake), Mistaken(mistake=mistake))
        assert str(refused.value) == message
    with pytest.raises(TypeError, match=r"^Listed: field bounds is \[1.0, 2.0\] \(a list\), wh"):
        Listed()


@dataclasses.dataclass(frozen=True)
class Listed(NormBoundedMean):
    bounds: Any = dataclasses.field(default_factory=lambda: [1.0, 2.0])
    name: ClassVar[str] = "listed"
