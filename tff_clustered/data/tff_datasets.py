"""TFF's own federated EMNIST (`tff.simulation.datasets.emnist`), read from the SQLite file
TFF keeps in its cache folder; nothing is downloaded.

TFF 0.87 stores federated EMNIST as `emnist_all.sqlite` (3,383 writers, each with a train and
a test split; `digits_only_*` splits hold their digits, `all_*` splits all 62 classes) in the
`cache_dir` of `tff.simulation.datasets.emnist.load_data` (default `~/.tff`). Point
`--data_dir` at that folder. Images are 28x28 floats in [0, 1] (white background: 1).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_clustered.data.federated_data import DataError, FederatedData, client_arrays, from_arrays

EMNIST_FILE = "emnist_all.sqlite"
EMNIST_URL = "https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma"
EMNIST_CLASSES = (10, 62)  # digits only, or digits and letters


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
    path = os.path.join(data_dir or "", EMNIST_FILE)
    if not data_dir or not os.path.isfile(path):
        raise DataError(
            f"--dataset=tff_emnist needs {EMNIST_FILE} in --data_dir (TFF's cache folder, "
            f"~/.tff after tff.simulation.datasets.emnist.load_data()); "
            f"{'no --data_dir given' if not data_dir else f'{path} does not exist'}. Get it on "
            f"a machine with network access ({EMNIST_URL}, then unxz it) and copy it there"
        )
    split = "digits_only" if classes == 10 else "all"
    try:
        train = tff.simulation.datasets.SqlClientData(path, f"{split}_train")
        test = tff.simulation.datasets.SqlClientData(path, f"{split}_test")
        train_ids = set(train.client_ids)
    except Exception as e:  # a truncated or foreign file: sqlite3 or TFF's format check
        raise DataError(
            f"{path} is not TFF's federated EMNIST database ({type(e).__name__}: {e}); "
            "download it again"
        ) from None
    writers = sorted(train_ids & set(test.client_ids))
    if not writers:
        raise DataError(f"{path} has no writer with both {split}_train and {split}_test examples")
    if num_clients is not None:
        if not 1 <= num_clients <= len(writers):
            raise ValueError(
                f"--num_clients={num_clients}: {path} has {len(writers)} writers in {split}"
            )
        chosen = np.random.default_rng([seed, 11]).choice(len(writers), num_clients, replace=False)
        writers = [writers[i] for i in sorted(chosen)]
    parsed = {
        name: tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
            writers,
            lambda client, data=data: emnist_parsing(data.serializable_dataset_fn(client)),
        )
        for name, data in (("train", train), ("test", test))
    }
    arrays = {
        name: {
            client: (x.reshape(len(x), -1).astype(np.float32), y)
            for client, (x, y) in client_arrays(data, "pixels", "label", name).items()
        }
        for name, data in parsed.items()
    }
    return from_arrays(
        f"tff_emnist{'' if classes == 10 else '_62'}",
        arrays["train"],
        arrays["test"],
        classes,
        image_shape=(28, 28, 1),
        source=path,
    )


def emnist_parsing(dataset: object) -> object:
    """TFF's own parser of its EMNIST records (`tf.train.Example`: pixels 28x28, label)."""
    from tensorflow_federated.python.simulation.datasets import emnist

    return emnist._add_proto_parsing(dataset)  # noqa: SLF001 - TFF's format, kept in one place
