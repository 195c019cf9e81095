"""The run's records: `DataSpec` and `ModelChoice` are the dataset's and the model's flags
field by field, checked when made, and `RunSpec.settings()` records them flat beside the
algorithm's as checkpoints always have."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from absl import flags

from tff_clustered.cli import run_flags
from tff_clustered.data import DataSpec, load_dataset
from tff_clustered.data.registry import data_files, source_fingerprint
from tff_clustered.data.spec import data_spec
from tff_clustered.runs.run_spec import ModelChoice, RunSpec


@pytest.mark.parametrize("record", [DataSpec, ModelChoice])
def test_each_field_is_the_flag_of_its_name_with_its_default(record: type) -> None:
    for field in dataclasses.fields(record):
        assert field.name in flags.FLAGS, field.name
        assert flags.FLAGS[field.name].default == field.default, field.name
    assert run_flags.record_from_flags(record) == record()  # the flags' defaults, unparsed


def test_the_settings_stay_flat_with_the_keys_checkpoints_hold() -> None:
    settings = RunSpec(algorithm="fedavg").settings()
    assert set(settings) == {
        "algorithm",
        "dataset",
        "data_dir",
        "model",
        "hidden_units",
        "cnn_dense_units",
        "num_clients",
        "num_classes",
        "glove_path",
        "partition",
        "dirichlet_beta",
        "classes_per_client",
        "tfds_dir",
        "train_examples",
        "resnet_width",
        "algorithm_options",
        "training",
    }
    assert settings["dataset"] == "digits" and settings["model"] == "mlp"
    assert settings["training"]["rounds"] == 50 and isinstance(settings["algorithm_options"], dict)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dataset": "mnist2"}, "unknown dataset 'mnist2'"),
        ({"dataset": "digits", "partition": "iid"}, "--dataset=digits has its own clients"),
        ({"dataset": "synthetic", "dirichlet_beta": 0.5}, "draw no Dirichlet proportions"),
        ({"dataset": "digits_iid", "dirichlet_beta": 0.5}, "the iid clients draw no"),
        ({"dataset": "digits_dirichlet", "dirichlet_beta": 0.0}, "give a concentration > 0"),
        ({"dataset": "digits", "train_examples": 10}, "--train_examples applies to"),
        ({"dataset": "tff_shakespeare", "num_classes": 80}, "leave --num_classes unset"),
        ({"dataset": "femnist_leaf", "num_clients": 100}, "--num_clients=100: --dataset=femnist_l"),
        ({"dataset": "sent140", "num_clients": 5}, "leave --num_clients unset"),
    ],
)
def test_a_data_spec_refuses_values_its_dataset_does_not_use(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataSpec(**fields)


def test_a_data_spec_checks_types_and_takes_paths() -> None:
    with pytest.raises(TypeError, match="DataSpec: num_clients must be an int"):
        DataSpec(num_clients=2.5)
    spec = DataSpec("leaf", data_dir=pathlib.Path("/data/leaf"))
    assert spec.data_dir == "/data/leaf"
    assert DataSpec("cifar10").partition_used() == "dirichlet"
    assert DataSpec("digits_iid", partition="pathological").partition_used() == "pathological"
    assert DataSpec("leaf").partition_used() is None


def test_a_model_choice_checks_its_sizes() -> None:
    with pytest.raises(ValueError, match="--hidden_units=0: give at least 1"):
        ModelChoice(hidden_units=0)
    with pytest.raises(TypeError, match="ModelChoice: resnet_width must be an int"):
        ModelChoice(resnet_width=True)


def test_the_registry_takes_the_record_or_a_name_and_its_fields() -> None:
    spec = DataSpec("digits_dirichlet", num_clients=6, dirichlet_beta=0.3)
    assert data_spec("digits_dirichlet", num_clients=6, dirichlet_beta=0.3) == spec
    assert data_spec(spec) is spec
    with pytest.raises(TypeError, match="a DataSpec alone"):
        data_spec(spec, num_clients=3)
    by_record, by_name = (
        load_dataset(spec, seed=2),
        load_dataset("digits_dirichlet", num_clients=6, dirichlet_beta=0.3, seed=2),
    )
    assert by_record.client_ids == by_name.client_ids
    for client in by_record.client_ids:
        for split in ("train", "test"):
            ours, theirs = by_record.arrays(split, client), by_name.arrays(split, client)
            assert all((ours[k] == theirs[k]).all() for k in ours)
    assert data_files(spec) == [] and source_fingerprint(spec).files == {}
