"""TFF's own federated EMNIST, CIFAR-100 and Shakespeare, read from TFF's SQLite files.

TFF's own federated EMNIST (`tff.simulation.datasets.emnist`), CIFAR-100
(`tff.simulation.datasets.cifar100`) and Shakespeare (`tff.simulation.datasets.shakespeare`),
read from the SQLite files TFF keeps in its cache folder; nothing is downloaded.

TFF 0.87 stores federated EMNIST as `emnist_all.sqlite` (3,383 writers, each with a train and
a test split; `digits_only_*` splits hold their digits, `all_*` splits all 62 classes) in the
`cache_dir` of `tff.simulation.datasets.emnist.load_data` (default `~/.tff`). Point
`--data_dir` at that folder. Writers are read by id when a round first needs them
(`sql_clients.SqlClients`); the ids and sizes come from `client_metadata`. Images are 28x28
floats in [0, 1] (white background: 1).

Federated CIFAR-100 is `cifar100.sqlite` in the same folder: split `train` holds 500 clients
(ids "0".."499") of 100 images each, split `test` 100 *other* clients (ids "0".."99", the same
strings for other people) of 100 images; each record is `image` 32x32x3 (0..255), `label` (fine,
0-99) and `coarse_label` (0-19). TFF dealt the images by Pachinko allocation (a Dirichlet(0.1)
mixture of coarse labels per client). Since no client has both splits, `tff_cifar100` keeps the
train clients only, each with a seeded 20 % of its own images as its local test set (as UA-PDFL
and the `pathmnist` peers hold out 20 % per client); TFF's test split is not read.

Federated Shakespeare is `shakespeare.sqlite`: 715 speaking parts of Shakespeare's plays (LEAF's
clients), each record one `snippets` string of contiguous lines, split `train` and `test` for
the same clients. `tff_shakespeare` is LEAF's next-character task (Caldas et al., "LEAF: A
Benchmark for Federated Settings", 2018; McMahan et al., AISTATS 2017): a client's snippets are
joined into one text (newlines and runs of spaces become one space, as LEAF's preprocessing
does), and every window of 80 characters is an example whose label is the character after it
(stride 1, as LEAF). Characters are ids in TFF's 86-character vocabulary
(`char_prediction_preprocessing.CHAR_VOCAB`), any other character id 86: 87 classes, and the
inputs are those ids (`FederatedData.vocabulary_size`), for a model that embeds them
(`--model=char_lstm`). A part whose train or test text is shorter than 81 characters has no
example and is left out.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.data.client_source import federated_data
from tff_clustered.data.federated_data import (
    ClientArrays,
    DataError,
    FederatedData,
    chosen_clients,
    first_line,
    from_arrays,
    from_checked_arrays,
)
from tff_clustered.data.given_clients import client_arrays
from tff_clustered.data.images import standardise
from tff_clustered.data.partitions import HOLDOUT_FRACTION, holdout_split
from tff_clustered.data.sql_clients import SqlClients
from tff_clustered.data.sqlite_files import is_locked, locked_database
from tff_clustered.frameworks import tff
from tff_clustered.seeds import DataStream, data_rng

EMNIST_FILE = "emnist_all.sqlite"
EMNIST_URL = "https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma"
EMNIST_CLASSES = (10, 62)  # digits only, or digits and letters
CIFAR100_FILE = "cifar100.sqlite"
CIFAR100_URL = "https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma"
CIFAR100_LABELS = {100: "label", 20: "coarse_label"}  # --num_classes: the record's label key
CIFAR100_SHAPE = (32, 32, 3)
SHAKESPEARE_FILE = "shakespeare.sqlite"
SHAKESPEARE_URL = "https://storage.googleapis.com/tff-datasets-public/shakespeare.sqlite.lzma"
SHAKESPEARE_WINDOW = 80  # characters read before the one predicted (LEAF; TFF's baseline)


def tff_database(
    data_dir: Optional[str], dataset: str, file_name: str, url: str, title: str
) -> tuple[str, Callable[[str], DataError]]:
    """The path of TFF's database `file_name` in `data_dir` (a clear `DataError` naming the
    file and where to get it when it is absent), and the error for a file that is not that
    database (`title`, e.g. "federated CIFAR-100"), given the detail found (or the file
    locked by another process, when the detail says so)."""
    module = dataset.removeprefix("tff_")
    path = os.path.join(data_dir or "", file_name)
    fetch = (
        f"download {url} on a machine with network access and unxz it (or run "
        f"tff.simulation.datasets.{module}.load_data() there, which leaves it in ~/.tff), then "
        "copy it into --data_dir"
    )
    if not data_dir or not os.path.isfile(path):
        raise DataError(
            f"--dataset={dataset} needs {file_name} in --data_dir (TFF's cache folder, ~/.tff "
            f"after tff.simulation.datasets.{module}.load_data()); "
            f"{'no --data_dir given' if not data_dir else f'{path} does not exist'}; {fetch}"
        )

    def not_ours(detail: str) -> DataError:
        if is_locked(detail):  # TFF's database, held by another process
            return locked_database(path)
        return DataError(
            f"{path} is not TFF's {title} database ({detail}); get a fresh copy: {fetch}"
        )

    return path, not_ours


def load_tff_emnist(
    data_dir: Optional[str],
    num_clients: Optional[int] = None,
    num_classes: Optional[int] = None,
    seed: int = 0,
) -> FederatedData:
    """TFF's federated EMNIST: `num_classes` 10 (default: the digits-only splits) or 62 (all),
    every writer or `num_clients` of them drawn from `seed` (each with its own train and test
    examples, as TFF splits them)."""
    classes = num_classes or 10
    if classes not in EMNIST_CLASSES:
        raise ValueError(
            f"--dataset=tff_emnist has 10 (digits) or 62 (digits and letters) classes, got "
            f"--num_classes={classes}"
        )
    path, not_emnist = tff_database(
        data_dir, "tff_emnist", EMNIST_FILE, EMNIST_URL, "federated EMNIST"
    )
    split = "digits_only" if classes == 10 else "all"
    reader = SqlClients(path, emnist_records, {s: f"{split}_{s}" for s in ("train", "test")})
    try:
        sizes = reader.sizes()
    except Exception as e:  # a truncated or foreign file: sqlite3 or the format check
        raise not_emnist(f"{type(e).__name__}: {reason(e)}") from None
    writers = sorted(set(sizes["train"]) & set(sizes["test"]))
    if not writers:
        raise not_emnist(f"no writer with both {split}_train and {split}_test examples")
    chosen = chosen_clients(
        len(writers),
        num_clients,
        data_rng(seed, DataStream.TFF_CLIENTS),
        f"{path} has {len(writers)} writers in {split}",
    )
    return federated_data(
        f"tff_emnist{'' if classes == 10 else '_62'}",
        reader.lazy(classes, [writers[i] for i in chosen]),
        image_shape=(28, 28, 1),
    )


def emnist_records(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Flat 784-pixel images (float32) and labels of serialized EMNIST records."""
    if not blobs:
        return np.zeros((0, 784), np.float32), np.zeros((0,), np.int64)
    parsed = emnist_parsing(tf.data.Dataset.from_tensor_slices(tf.constant(blobs)))
    batch = next(iter(parsed.batch(len(blobs)).as_numpy_iterator()))
    return batch["pixels"].reshape(len(blobs), -1).astype(np.float32), batch["label"]


def emnist_parsing(dataset: object) -> object:
    """TFF's own parser of its EMNIST records (`tf.train.Example`: pixels 28x28, label)."""
    from tensorflow_federated.python.simulation.datasets import emnist

    return emnist._add_proto_parsing(dataset)  # noqa: SLF001 - TFF's format, kept in one place


def client_holdout(
    client: str,
    k: int,
    arrays: dict[str, ClientArrays],
    test_fraction: float,
    seed: int,
    not_cifar100: Callable[[str], DataError],
) -> tuple[np.ndarray, np.ndarray]:
    """The training and held-out indices of `client`, the k-th of the file: `test_fraction` of
    its images drawn from `DataStream.TFF_CLIENT_HOLDOUT` part k (`partitions.holdout_split`)."""
    y = arrays[client][1]
    if len(y) < 2:
        raise not_cifar100(
            f"train client {client!r} has 1 image, TFF's have 100; a local test set needs 2"
        )
    return holdout_split(
        np.arange(len(y)), test_fraction, data_rng(seed, DataStream.TFF_CLIENT_HOLDOUT, k)
    )


def standardised_holdouts(
    arrays: dict[str, ClientArrays], splits: dict[str, tuple[np.ndarray, np.ndarray]]
) -> tuple[dict[str, ClientArrays], dict[str, ClientArrays]]:
    """Each client's training and held-out images (`splits`: its training and test indices)
    standardised per channel with the statistics of every client's training images
    (`images.standardise`)."""
    x_train, x_test = standardise(
        np.concatenate([arrays[c][0][tr] for c, (tr, _) in splits.items()]),
        np.concatenate([arrays[c][0][te] for c, (_, te) in splits.items()]),
    )
    train_arrays, test_arrays = {}, {}
    start_train = start_test = 0
    for client, (tr, te) in splits.items():
        y = arrays[client][1]
        train_arrays[client] = (x_train[start_train : start_train + len(tr)], y[tr])
        test_arrays[client] = (x_test[start_test : start_test + len(te)], y[te])
        start_train, start_test = start_train + len(tr), start_test + len(te)
    return train_arrays, test_arrays


def load_tff_cifar100(
    data_dir: Optional[str],
    num_clients: Optional[int] = None,
    num_classes: Optional[int] = None,
    seed: int = 0,
    test_fraction: float = HOLDOUT_FRACTION,
) -> FederatedData:
    """TFF's federated CIFAR-100: its train clients (all 500, or `num_clients` of them drawn from
    `DataStream.TFF_CLIENTS`), labelled by `num_classes` 100 (default: the fine labels) or 20 (the
    coarse ones). TFF's test clients are other people, so each client holds out a random
    `test_fraction` (20 %, `partitions.holdout_split`) of its own images as its local test set,
    drawn from `DataStream.TFF_CLIENT_HOLDOUT` with part k for the k-th client of the file: the
    same split whichever other clients are chosen. Images are (32, 32, 3) float32 standardised
    per channel with the mean and standard deviation of the clients' training images
    (`images.standardise`), as the `cifar100` federation's are; no public set."""
    classes = num_classes or 100
    if classes not in CIFAR100_LABELS:
        raise ValueError(
            f"--dataset=tff_cifar100 has 100 (fine labels) or 20 (coarse labels) classes, got "
            f"--num_classes={classes}"
        )
    path, not_cifar100 = tff_database(
        data_dir, "tff_cifar100", CIFAR100_FILE, CIFAR100_URL, "federated CIFAR-100"
    )
    try:
        train = tff.simulation.datasets.SqlClientData(path, "train")
        clients = list(train.client_ids)
    except Exception as e:  # a truncated or foreign file: sqlite3 or TFF's format check
        raise not_cifar100(f"{type(e).__name__}: {reason(e)}") from None
    if not clients:
        raise not_cifar100("no clients in its train split")
    chosen = chosen_clients(  # indices into the file's sorted client ids
        len(clients),
        num_clients,
        data_rng(seed, DataStream.TFF_CLIENTS),
        f"{path} has {len(clients)} train clients",
    )
    parsed = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
        [clients[k] for k in chosen],
        lambda client: cifar100_parsing(train.serializable_dataset_fn(client)),
    )
    try:
        arrays = client_arrays(parsed, "image", CIFAR100_LABELS[classes], "train").by_client()
    except DataError as e:  # a client listed in client_metadata without examples
        raise not_cifar100(str(e).split(";")[0]) from None
    except Exception as e:  # damaged pages or records: sqlite3 inside tf.data, TFF's parser
        raise not_cifar100(f"{type(e).__name__}: {reason(e)}") from None
    splits = {
        clients[k]: client_holdout(clients[k], k, arrays, test_fraction, seed, not_cifar100)
        for k in chosen
    }
    train_arrays, test_arrays = standardised_holdouts(arrays, splits)
    return from_checked_arrays(
        f"tff_cifar100{'' if classes == 100 else '_20'}",
        train_arrays,
        test_arrays,
        classes,
        image_shape=CIFAR100_SHAPE,
        source=path,
    )


def reason(error: BaseException, limit: int = 200) -> str:
    """An error's first line without TF's op decorations (`{{function_node ...}}`,
    `[Op:...] name:`), cut to `limit` characters (a bad record's bytes may follow)."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", first_line(error))
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cifar100_parsing(dataset: object) -> object:
    """TFF's own parser of its CIFAR-100 records (`tf.train.Example`: image 32x32x3 as uint8,
    label, coarse_label)."""
    from tensorflow_federated.python.simulation.datasets import cifar100

    return cifar100._add_proto_parsing(dataset)  # noqa: SLF001 - TFF's format, kept in one place


def shakespeare_vocabulary() -> str:
    """TFF's character vocabulary of its Shakespeare baseline (86 characters, in its order)."""
    from tensorflow_federated.python.simulation.baselines.shakespeare import (
        char_prediction_preprocessing,
    )

    return "".join(char_prediction_preprocessing.CHAR_VOCAB)


def character_ids(text: str, vocabulary: str) -> np.ndarray:
    """Each character's index in `vocabulary`; characters outside it get len(vocabulary)."""
    index = {c: i for i, c in enumerate(vocabulary)}
    return np.fromiter((index.get(c, len(vocabulary)) for c in text), np.int32, len(text))


def joined_text(snippets: list[str]) -> str:
    """A part's snippets as LEAF joins a user's lines: one text, newlines and runs of spaces
    turned into single spaces."""
    return re.sub(r" {2,}", " ", " ".join(snippets).replace("\n", " "))


def next_character_examples(
    text: str, vocabulary: str, window: int = SHAKESPEARE_WINDOW, stride: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Every `stride`-th window of `window` characters of `text` as ids (float32, x) and the id
    of the character after it (int32, y); empty when the text has no character after a
    window."""
    ids = character_ids(text, vocabulary)
    if len(ids) <= window:
        return np.zeros((0, window), np.float32), np.zeros((0,), np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(ids, window + 1)[::stride]
    return windows[:, :window].astype(np.float32), windows[:, window].copy()


def shakespeare_texts(
    path: str, not_shakespeare: Callable[[str], DataError]
) -> dict[str, dict[str, str]]:
    """Each split's speaking parts of TFF's Shakespeare database `path`, each part's snippets
    joined into one text (`joined_text`); a file that is not that database is
    `not_shakespeare`'s error."""
    texts: dict[str, dict[str, str]] = {}
    for split in ("train", "test"):
        try:
            clients = tff.simulation.datasets.SqlClientData(path, split)
            parsed = clients.preprocess(shakespeare_parsing)
            texts[split] = {
                client: joined_text(
                    [
                        b.decode("utf-8", errors="replace")
                        for b in parsed.create_tf_dataset_for_client(client)
                        .map(lambda record: record["snippets"])
                        .as_numpy_iterator()
                    ]
                )
                for client in clients.client_ids
            }
        except Exception as e:  # a truncated or foreign file: sqlite3, TFF's format, the parser
            raise not_shakespeare(f"{type(e).__name__}: {reason(e)}") from None
    return texts


def load_tff_shakespeare(
    data_dir: Optional[str],
    num_clients: Optional[int] = None,
    seed: int = 0,
    stride: int = 1,
) -> FederatedData:
    """TFF's federated Shakespeare as LEAF's next-character task (see the module docstring):
    every part with an example in both splits, or `num_clients` of them drawn from
    `DataStream.TFF_CLIENTS`; `stride` > 1 keeps every stride-th window (fewer, overlapping
    less)."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    path, not_shakespeare = tff_database(
        data_dir, "tff_shakespeare", SHAKESPEARE_FILE, SHAKESPEARE_URL, "federated Shakespeare"
    )

    vocabulary = shakespeare_vocabulary()
    texts = shakespeare_texts(path, not_shakespeare)
    usable = sorted(
        client
        for client in set(texts["train"]) & set(texts["test"])
        if min(len(texts["train"][client]), len(texts["test"][client])) > SHAKESPEARE_WINDOW
    )
    if not usable:
        raise not_shakespeare(
            f"no part has more than {SHAKESPEARE_WINDOW} characters in both train and test"
        )
    chosen = chosen_clients(
        len(usable),
        num_clients,
        data_rng(seed, DataStream.TFF_CLIENTS),
        f"{path} has {len(usable)} parts with more than {SHAKESPEARE_WINDOW} characters in "
        "both splits",
    )
    usable = [usable[i] for i in chosen]
    arrays = {
        split: {
            client: next_character_examples(texts[split][client], vocabulary, stride=stride)
            for client in usable
        }
        for split in ("train", "test")
    }
    return from_arrays(
        "tff_shakespeare",
        arrays["train"],
        arrays["test"],
        len(vocabulary) + 1,
        source=path,
        vocabulary_size=len(vocabulary) + 1,
    )


def shakespeare_parsing(dataset: object) -> object:
    """TFF's own parser of its Shakespeare records (`tf.train.Example`: a `snippets` string)."""
    from tensorflow_federated.python.simulation.datasets import shakespeare

    return shakespeare._add_parsing(dataset)  # noqa: SLF001 - TFF's format, kept in one place
