"""Clients read when a round needs them: `--dataset=tff_sql` (TFF's SqlClientData format, read
by client id) and the API's lazily read `ClientData`, against the same data held in memory."""

from __future__ import annotations

import collections
import os
import shutil
import sqlite3

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_clustered
from tff_clustered.data import DataError, FederatedData, load_dataset, sql_clients
from tff_clustered.data.given_clients import federated_data
from tff_clustered.data.registry import source_fingerprint
from tff_clustered.data.tff_datasets import emnist_parsing

NUM_CLIENTS = 30
CLASSES = 3


def population(seed: int = 0) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(split, client) -> (x float32 (n, 4), y int64 (n,)): 30 clients of 5 to 7 examples."""
    rng = np.random.default_rng(seed)
    examples = {}
    for split in ("train", "test"):
        for i in range(NUM_CLIENTS):
            n = 5 + i % 3
            x = rng.normal(size=(n, 4)).astype(np.float32)
            examples[(split, f"c{i:02d}")] = (x, (x[:, 0] > 0).astype(np.int64) + (i % 2))
    return examples


def dataset_of(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))


@pytest.fixture(scope="module")
def population_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The population written by TFF's writer (`sql_clients.save_population`)."""
    examples = population()
    path = str(tmp_path_factory.mktemp("population") / "population.sqlite")
    sql_clients.save_population(
        path,
        [f"c{i:02d}" for i in range(NUM_CLIENTS)],
        lambda split, client: dataset_of(*examples[(split, client)]),
    )
    return path


def assert_same_clients(lazy: FederatedData, held: FederatedData) -> None:
    assert lazy.client_ids == held.client_ids
    assert (lazy.num_classes, lazy.input_shape) == (held.num_classes, held.input_shape)
    assert dict(lazy.train_sizes) == dict(held.train_sizes)
    assert dict(lazy.test_sizes) == dict(held.test_sizes)
    for client in held.client_ids:
        for split in ("train", "test"):
            a, b = lazy.arrays(split, client), held.arrays(split, client)
            for key in ("x", "y"):
                assert a[key].dtype == b[key].dtype
                np.testing.assert_array_equal(a[key], b[key])


def test_tff_sql_read_lazily_equals_the_same_file_read_whole(population_file: str) -> None:
    lazy = load_dataset("tff_sql", data_dir=population_file)
    held = sql_clients.load_tff_sql(population_file, None, lazy=False)
    assert lazy.source is not None and held.source is None
    assert lazy.num_classes == CLASSES  # the file's largest label + 1
    assert_same_clients(lazy, held)
    examples = population()
    x, y = examples[("test", "c07")]
    np.testing.assert_array_equal(lazy.arrays("test", "c07")["x"], x)
    np.testing.assert_array_equal(lazy.arrays("test", "c07")["y"], y)
    first = next(iter(lazy.train.create_tf_dataset_for_client("c07").batch(100)))
    np.testing.assert_array_equal(first["x"].numpy(), examples[("train", "c07")][0])
    # the folder names the file too
    folder = load_dataset("tff_sql", data_dir=os.path.dirname(population_file), num_classes=3)
    assert folder.client_ids == lazy.client_ids


def test_start_up_reads_only_the_first_client(population_file: str) -> None:
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    assert len(data.client_ids) == NUM_CLIENTS
    assert data.train_sizes["c04"] == 6 and len(data.train_sizes) == NUM_CLIENTS
    assert data.source.reads == 1  # the whole-file check: the first client parses
    # compact sizes: one index of the sorted clients, shared with the run's random streams
    assert data.client_ids == sorted(data.client_ids)
    assert dict(data.client_index) == {c: i for i, c in enumerate(data.client_ids)}
    assert data.client_index is data.test_sizes.index
    assert "c04" in data.test_sizes and "nobody" not in data.train_sizes
    data.arrays("train", "c04")
    data.arrays("train", "c04")  # from the cache
    assert data.source.reads == 2


def test_the_cache_stays_within_its_bounds(population_file: str) -> None:
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    data.source.cache_clients = 5
    for client in data.client_ids:
        for split in ("train", "test"):
            data.arrays(split, client)
            assert data.source.cached <= 5
    data.source.cache_bytes = 200  # one client's arrays are ~100 bytes: two at most
    data.arrays("train", "c00")
    data.arrays("train", "c01")
    assert data.source.cached <= 2


def damaged_copy(path: str, folder: str, update: str) -> str:
    copy = os.path.join(folder, "damaged.sqlite")
    shutil.copy(path, copy)
    with sqlite3.connect(copy) as db:
        db.execute(update)
    return copy


def test_a_damaged_client_is_one_line_naming_it_at_its_first_read(
    population_file: str, tmp_path: object
) -> None:
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE examples SET serialized_example_proto = x'0a03ffffff' WHERE rowid = "
        "(SELECT min(rowid) FROM examples WHERE client_id = 'c05' AND split_name = 'train')",
    )
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)  # start-up is fine
    with pytest.raises(DataError, match=r"client 'c05' \(train\) in .*damaged.sqlite") as error:
        data.arrays("train", "c05")
    assert "\n" not in str(error.value)
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE client_metadata SET num_examples = 9 WHERE "
        "client_id = 'c06' AND split_name = 'test'",
    )
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    with pytest.raises(DataError, match=r"client 'c06' \(test\).* 5 examples, but .* lists 9"):
        data.arrays("test", "c06")
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=2)  # c00's labels: 0, 1
    with pytest.raises(DataError, match=r"client 'c01' \(train\).*label 2 is outside the model"):
        data.arrays("train", "c01")


def test_bad_files_are_one_line(tmp_path: object) -> None:
    with pytest.raises(DataError, match="needs --data_dir"):
        load_dataset("tff_sql")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("tff_sql", data_dir=str(tmp_path / "none.sqlite"))
    other = str(tmp_path / "other.sqlite")
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (a)")
    with pytest.raises(DataError, match="not a SQLite file of TFF's SqlClientData format"):
        load_dataset("tff_sql", data_dir=other, num_classes=2)


def test_the_fingerprint_samples_the_file_and_sees_a_changed_row(
    population_file: str, tmp_path: object
) -> None:
    before = source_fingerprint("tff_sql", data_dir=population_file)
    (digest,) = before.files.values()
    assert "sampled-" in digest
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE client_metadata SET num_examples = 9 WHERE "
        "client_id = 'c06' AND split_name = 'test'",
    )
    after = source_fingerprint("tff_sql", data_dir=copy)
    assert list(after.files.values()) != [digest]


def test_the_api_reads_a_client_data_lazily_as_the_same_arrays() -> None:
    examples = population()
    splits = {
        split: tff.simulation.datasets.TestClientData(
            {
                c: collections.OrderedDict(x=x, y=y)
                for (s, c), (x, y) in examples.items()
                if s == split
            }
        )
        for split in ("train", "test")
    }
    lazy = federated_data(splits["train"], splits["test"], num_classes=CLASSES)
    held = federated_data(
        {c: xy for (s, c), xy in examples.items() if s == "train"},
        {c: xy for (s, c), xy in examples.items() if s == "test"},
        num_classes=CLASSES,
    )
    assert lazy.source is not None and lazy.source.reads == 1
    assert_same_clients(lazy, held)


def run_history(data: FederatedData, folder: str) -> list[dict]:
    def model() -> tf.keras.Model:
        return tf.keras.Sequential(
            [
                tf.keras.layers.InputLayer(input_shape=(4,)),
                tf.keras.layers.Dense(8, activation="relu"),
                tf.keras.layers.Dense(CLASSES),
            ]
        )

    result = tff_clustered.run(
        "fedper",
        data,
        model,
        output_dir=folder,
        training=tff_clustered.TrainingConfig(
            rounds=2, clients_per_round=6, batch_size=4, eval_every=1
        ),
        execution="in_process",
        log=lambda line: None,
    )
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in result.history]


def test_a_run_on_lazy_clients_equals_the_run_in_memory(
    population_file: str, tmp_path: object
) -> None:
    lazy = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    held = sql_clients.load_tff_sql(population_file, CLASSES, lazy=False)
    assert run_history(lazy, str(tmp_path / "lazy")) == run_history(held, str(tmp_path / "held"))


def test_tff_emnist_is_read_lazily_as_tffs_own_reader_reads_it() -> None:
    folder = os.path.join(os.path.dirname(__file__), "..", "testdata", "tff_emnist_tiny")
    data = load_dataset("tff_emnist", data_dir=folder)
    assert data.source is not None and data.source.reads == 1
    path = os.path.join(folder, "emnist_all.sqlite")
    for split in ("train", "test"):
        tffs = tff.simulation.datasets.SqlClientData(path, f"digits_only_{split}")
        for client in data.client_ids:
            parsed = emnist_parsing(tffs.create_tf_dataset_for_client(client))
            batch = next(iter(parsed.batch(1000).as_numpy_iterator()))
            arrays = data.arrays(split, client)
            np.testing.assert_array_equal(arrays["x"], batch["pixels"].reshape(-1, 784))
            np.testing.assert_array_equal(arrays["y"], batch["label"])


def test_compact_counts_behave_as_the_dicts_they_replace() -> None:
    """`ClientCounts`: a split's sizes over one shared index; a client without that split is
    absent from it, and one listed in a single split is found without a set of every client."""
    from tff_clustered.data.client_source import ClientCounts, only_in_one_split

    ids = ["a", "b", "c"]
    index = {c: i for i, c in enumerate(ids)}
    train = ClientCounts(ids, index, np.array([3, 0, 5]))
    test = ClientCounts(ids, index, np.array([1, 2, -1]))
    assert dict(train) == {"a": 3, "b": 0, "c": 5} and dict(test) == {"a": 1, "b": 2}
    assert "c" not in test and "z" not in train and len(test) == 2
    with pytest.raises(KeyError):
        test["c"]
    assert only_in_one_split(train, test) == ["c"]
    assert only_in_one_split(dict(train), dict(test)) == ["c"]
