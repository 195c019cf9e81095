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
from conftest import held_exclusively, run_binary

import tff_clustered
from tff_clustered.data import (
    DataError,
    FederatedData,
    load_dataset,
    sql_clients,
    sqlite_files,
    tff_sql,
    vector_records,
)
from tff_clustered.data.client_source import LazyClients
from tff_clustered.data.federated_data import chosen_clients
from tff_clustered.data.given_clients import federated_data
from tff_clustered.data.registry import source_fingerprint
from tff_clustered.data.tff_datasets import emnist_parsing
from tff_clustered.data.validation import validation_view
from tff_clustered.seeds import DataStream, data_rng

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
    held = tff_sql.load_tff_sql(population_file, None, lazy=False)
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


@pytest.mark.parametrize("record", [0, 2])
def test_an_undecodable_record_is_named_with_its_client(
    population_file: str, tmp_path: object, record: int
) -> None:
    """A record of bytes that are neither an Example nor UTF-8, first or later among its
    client's, read alone or with other clients: one line naming the client, the file and what
    the record is not (the parser's own error would quote the bytes, and fail to)."""
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE examples SET serialized_example_proto = x'0a03ffffff' WHERE rowid = (SELECT "
        f"min(rowid) + {record} FROM examples WHERE client_id = 'c05' AND split_name = 'train')",
    )
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    with pytest.raises(DataError) as error:
        data.arrays_of("train", data.client_ids)
    floats = "4 floats" if record else "floats"
    assert str(error.value) == (
        f"client 'c05' (train) in {copy}: its examples cannot be read (ValueError: a record is "
        f"not a tf.train.Example of x ({floats}) and y (an int64 label)); regenerate the file"
    )


@pytest.mark.parametrize("split", ["train", "test"])
def test_an_undecodable_record_found_by_the_label_scan_is_named_with_its_client(
    population_file: str, tmp_path: object, split: str
) -> None:
    """Without --num_classes the file's labels are scanned at start: a record that cannot be
    parsed there is named as a client's read names it (with its client, split and file), not
    as the parser's bare error."""
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE examples SET serialized_example_proto = x'0a03ffffff' WHERE rowid = (SELECT "
        f"min(rowid) + 1 FROM examples WHERE client_id = 'c07' AND split_name = '{split}')",
    )
    with pytest.raises(DataError) as error:
        load_dataset("tff_sql", data_dir=copy)
    assert str(error.value) == (
        f"client 'c07' ({split}) in {copy}: its examples cannot be read (ValueError: a record "
        "is not a tf.train.Example of x (4 floats) and y (an int64 label)); regenerate the file"
    )


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


def test_a_negative_count_is_named_with_its_client(population_file: str, tmp_path: object) -> None:
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE client_metadata SET num_examples = -3 WHERE "
        "client_id = 'c06' AND split_name = 'test'",
    )
    with pytest.raises(DataError) as refused:
        load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    assert str(refused.value) == (
        f"{copy}: client_metadata lists -3 examples for client 'c06' (test); a number of "
        "examples is >= 0: regenerate the file or correct that row"
    )


def test_a_locked_file_is_named_as_locked_with_the_fix(
    population_file: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file another process holds (`BEGIN EXCLUSIVE`): at start, and at a client's read
    once the run has started, one line naming the file as locked (not as unreadable or
    damaged) and the fix."""
    monkeypatch.setattr(sqlite_files, "BUSY_TIMEOUT_SECONDS", 0.05)
    copy = str(tmp_path / "held.sqlite")
    shutil.copy(population_file, copy)
    locked = f"{copy} is locked by another process (database is locked: a program is writing"
    with held_exclusively(copy):
        with pytest.raises(DataError) as at_start:
            load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    assert str(at_start.value).startswith(locked) and "run again" in str(at_start.value)
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    with held_exclusively(copy):
        with pytest.raises(DataError) as at_read:
            data.arrays_of("train", ["c03", "c04"])
    assert str(at_read.value).startswith(locked) and "\n" not in str(at_read.value)


def test_num_clients_keeps_a_seeded_choice_of_the_files_clients(population_file: str) -> None:
    """`--num_clients` on tff_sql, as on TFF's own files: a choice drawn from the run's seed
    (`DataStream.TFF_CLIENTS`), the same read lazily or whole; out of range, one line."""
    every = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES).client_ids
    drawn = load_dataset(
        "tff_sql", data_dir=population_file, num_classes=CLASSES, num_clients=5, seed=3
    )
    expected = [
        every[i] for i in chosen_clients(NUM_CLIENTS, 5, data_rng(3, DataStream.TFF_CLIENTS), "")
    ]
    assert drawn.client_ids == expected and len(set(expected)) == 5
    assert set(drawn.train_sizes) == set(drawn.test_sizes) == set(expected)
    other_seed = load_dataset(
        "tff_sql", data_dir=population_file, num_classes=CLASSES, num_clients=5, seed=4
    )
    assert other_seed.client_ids != expected
    whole = tff_sql.load_tff_sql(population_file, CLASSES, lazy=False, num_clients=5, seed=3)
    assert_same_clients(drawn, whole)
    with pytest.raises(DataError, match="has 30 clients; use --num_clients between 1 and 30"):
        load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES, num_clients=31)


# A binary's logging (`logs.quiet_python_logs` after its imports, then absl's `app.run`)
# around a tff_sql load: the warnings the user sees on stderr.
LOAD_AS_A_BINARY = """
import sys
from absl import app
from tff_clustered.cli import logs
from tff_clustered.data import load_dataset
logs.quiet_python_logs(sys.argv)
load = lambda argv: load_dataset("tff_sql", data_dir=argv[1], num_classes=3)
app.run(lambda argv: print(len(load(argv).client_ids)))
"""


def test_the_missing_index_warning_reaches_the_user_of_a_binary(
    population_file: str, tmp_path: object
) -> None:
    copy = damaged_copy(population_file, str(tmp_path), "DROP INDEX examples_by_client")
    done = run_binary(["-c", LOAD_AS_A_BINARY, copy])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(NUM_CLIENTS)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {copy} has no index of examples on client_id: each client read scans the "
        f"table; add one with: sqlite3 {copy} '{sql_clients.CLIENT_INDEX}'"
    ]


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
    held = tff_sql.load_tff_sql(population_file, CLASSES, lazy=False)
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


def counted_reads(data: FederatedData) -> tuple[list[str], list[list[str]]]:
    """The clients `data`'s source reads one at a time from now on, and the lists of clients it
    reads together (`read_many`)."""
    source, alone, together = data.source, [], []
    read, read_many = source.read, source.read_many
    source.read = lambda split, client: alone.append(client) or read(split, client)
    source.read_many = lambda split, ids: together.append(list(ids)) or read_many(split, ids)
    return alone, together


def test_clients_read_together_equal_clients_read_one_by_one(
    population_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_clients, "IDS_PER_QUERY", 4)  # three queries for ten clients
    one_by_one = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    together = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    alone, read_together = counted_reads(together)
    clients = [f"c{i:02d}" for i in (17, 3, 0, 29, 3, 12, 8, 21, 5, 26, 14)]  # c03 twice
    examples = population()
    for split in ("train", "test"):
        arrays = together.arrays_of(split, clients)
        for client, a in zip(clients, arrays):
            b = one_by_one.arrays(split, client)
            for key in ("x", "y"):
                assert (a[key].dtype, a[key].shape) == (b[key].dtype, b[key].shape)
                np.testing.assert_array_equal(a[key], b[key])
            np.testing.assert_array_equal(a["x"], examples[(split, client)][0])
    # c00's train split is cached at start-up; every other client's split read once, together
    assert alone == []
    expected = [c for c in dict.fromkeys(clients) if c != "c00"]
    assert read_together == [expected, list(dict.fromkeys(clients))]
    assert together.source.reads == 1 + len(expected) + len(set(clients))
    # the cached ones are not read again
    together.arrays_of("train", clients)
    assert len(read_together) == 2 and alone == []
    # a client asked for twice, in two queries, has its examples once
    reader = sql_clients.SqlClients(
        population_file, vector_records.vector_records, {"train": "train", "test": "test"}
    )
    asked = ["c01", "c02", "c03", "c04", "c05", "c01"]
    for (x, y), client in zip(reader.read_many("test", asked), asked):
        np.testing.assert_array_equal(x, reader.read("test", client)[0])
        np.testing.assert_array_equal(y, reader.read("test", client)[1])


def test_reading_together_never_evicts_a_client_before_its_use(population_file: str) -> None:
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=CLASSES)
    alone, together = counted_reads(data)
    data.source.cache_clients = 4
    clients = [f"c{i:02d}" for i in range(1, 11)]  # more than the cache holds
    arrays = data.arrays_of("train", clients)
    assert [len(ids) for ids in together] == [4, 4, 2] and alone == []
    assert data.source.reads == 1 + len(clients)  # none read twice
    assert data.source.cached == 4
    assert [len(a["y"]) for a in arrays] == [data.train_sizes[c] for c in clients]
    # a round's cached clients are kept while its missing ones are read: c09 and c10 are the
    # least recently used of the cache, ahead of c07 and c08
    data.arrays("train", "c07")
    data.arrays("train", "c08")
    data.arrays_of("train", ["c09", "c11", "c10", "c12"])
    assert together[-1] == ["c11", "c12"] and alone == []
    # the bytes bound: one client's arrays are 5 to 7 examples of 4 + 1 values (100-140 bytes)
    data.source.cache_clients, data.source.cache_bytes = 100, 300
    clients = [f"c{i:02d}" for i in range(13, 19)]
    data.arrays_of("test", clients)
    assert together[-3:] == [clients[0:2], clients[2:4], clients[4:6]] and alone == []
    assert data.source.reads == 1 + 12 + len(clients)


def test_a_bad_client_read_with_others_is_named_as_when_read_alone(
    population_file: str, tmp_path: object
) -> None:
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE examples SET serialized_example_proto = x'0a03ffffff' WHERE rowid = "
        "(SELECT min(rowid) FROM examples WHERE client_id = 'c05' AND split_name = 'train')",
    )
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    with pytest.raises(DataError, match=r"client 'c05' \(train\) in .*damaged.sqlite") as error:
        data.arrays_of("train", ["c03", "c05", "c07"])
    assert "\n" not in str(error.value)
    assert data.arrays_of("train", ["c03", "c07"])  # the others read
    copy = damaged_copy(
        population_file,
        str(tmp_path),
        "UPDATE client_metadata SET num_examples = 9 WHERE "
        "client_id = 'c06' AND split_name = 'test'",
    )
    data = load_dataset("tff_sql", data_dir=copy, num_classes=CLASSES)
    alone, together = counted_reads(data)
    with pytest.raises(DataError, match=r"client 'c06' \(test\).* 5 examples, but .* lists 9"):
        data.arrays_of("test", ["c02", "c06", "c04"])
    assert together == [["c02", "c06", "c04"]] and alone == []  # checked as read together
    data = load_dataset("tff_sql", data_dir=population_file, num_classes=2)  # c00's labels: 0, 1
    with pytest.raises(DataError, match=r"client 'c01' \(train\).*label 2 is outside the model"):
        data.arrays_of("train", ["c02", "c01"])


def test_reading_together_refuses_a_parser_that_is_not_one_example_per_record(
    population_file: str,
) -> None:
    """`read_many` splits one parse by each client's record count: a parser that drops
    records (e.g. Stack Overflow's posts without a top tag) would hand one client's examples
    to another, so it is refused, and the lazy source then reads each client alone."""

    def every_other(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        x, y = vector_records.vector_records(blobs)
        return x[::2], y[::2]

    reader = sql_clients.SqlClients(
        population_file, every_other, {"train": "train", "test": "test"}
    )
    with pytest.raises(ValueError, match="one example per record"):
        reader.read_many("train", ["c01", "c02"])
    source = LazyClients(
        client_ids=[f"c{i:02d}" for i in range(NUM_CLIENTS)],
        sizes=None,
        read=reader.read,
        read_many=reader.read_many,
        num_classes=CLASSES,
        digest=lambda: "",
    )
    for client, arrays in zip(["c01", "c02"], source.arrays_of("train", ["c01", "c02"])):
        np.testing.assert_array_equal(arrays["x"], reader.read("train", client)[0])


def test_a_lazy_populations_validation_split_is_the_one_of_the_file_read_whole(
    population_file: str,
) -> None:
    """`split="validation"` on a lazily read population carves each client's training rows as
    the same file read whole is carved, and reads no test row."""
    lazy = load_dataset("tff_sql", data_dir=population_file, split="validation")
    held = validation_view(tff_sql.load_tff_sql(population_file, None, lazy=False), seed=0)
    assert lazy.evaluated_split == held.evaluated_split == "validation"
    assert_same_clients(lazy, held)
    assert {split for split, _ in lazy.source.base._cache} == {"train"}
