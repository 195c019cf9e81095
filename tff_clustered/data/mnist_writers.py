"""MNIST with one client per NIST writer: natural feature skew rather than label skew.

MNIST with one client per NIST writer: natural feature skew (each writer's handwriting) rather
than the label skew a partition adds.

MNIST's images (LeCun et al., "Gradient-based learning applied to document recognition", Proc.
IEEE 86(11), 1998) come from forms of NIST Special Database 19, each filled in by one writer.
QMNIST (Yadav and Bottou, "Cold Case: The Lost MNIST Digits", NeurIPS 2019) recovered the writer
of every MNIST image: in its extended label files (`qmnist-train-labels.tsv.gz`, whose 60,000
rows follow MNIST's training order, and `qmnist-test-labels.tsv.gz`, whose first 10,000 rows are
MNIST's test images) the second and third columns are the NIST HSF series and the writer id, a
pair that names one writer. `writers.npz` holds them aligned with the MNIST files:

* `train_writer_key`: (60,000,) integers, hsf * 10000 + writer, of the training images;
* `test_writer_key`: (10,000,) the same for the test images.

MNIST's 539 training writers and 297 test writers are disjoint. The clients are the training
writers only: each one's own images are split at random 80/20 into its local train and test
sets (`split_train_test`), and the official test split, written by other people, is the
server's unlabelled public set (FedTSDP runs uploaded models on it), so no client ever tests on
an image of someone else's. Images are standardised with the training split's statistics, as
the other 28x28 image datasets are (`images.standardise`).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import (
    DataError,
    FederatedData,
    chosen_clients,
    first_line,
    from_arrays,
    split_train_test,
)
from tff_clustered.data.images import standardise
from tff_clustered.data.mnist import MNIST, read_mnist_splits
from tff_clustered.seeds import DataStream, data_rng

WRITERS_FILE = "writers.npz"
WRITER_KEYS = ("train_writer_key", "test_writer_key")
QMNIST_URL = "https://github.com/facebookresearch/qmnist"
WRITERS_HELP = (
    f"--dataset=mnist_writers needs {WRITERS_FILE} next to the MNIST files in --data_dir: "
    "train_writer_key (one integer per training image) and test_writer_key (one per test image), "
    "aligned with the MNIST files, each hsf * 10000 + writer from QMNIST's extended labels "
    "(the second and third columns, HSF series and writer id, of qmnist-train-labels.tsv.gz and "
    f"of the first 10,000 rows of qmnist-test-labels.tsv.gz, {QMNIST_URL})"
)
MIN_WRITER_IMAGES = 2  # one local training and one local test image


def read_writer_keys(data_dir: str, num_train: int, num_test: int) -> np.ndarray:
    """`train_writer_key` of `writers.npz` in `data_dir` as int64, checked to hold one writer per
    image of both MNIST splits (`num_train`, `num_test` images)."""
    path = os.path.join(data_dir, WRITERS_FILE)
    if not os.path.isfile(path):
        raise DataError(f"{path} not found; {WRITERS_HELP}")
    try:
        with np.load(path, allow_pickle=False) as blob:
            missing = [k for k in WRITER_KEYS if k not in blob.files]
            if missing:
                raise DataError(f"{path} lacks {', '.join(missing)}; {WRITERS_HELP}")
            keys = {k: blob[k] for k in WRITER_KEYS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(
            f"{path} cannot be read as an .npz of arrays ({first_line(e)}); {WRITERS_HELP}"
        ) from e
    for key, images in zip(WRITER_KEYS, (num_train, num_test)):
        array = keys[key]
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise DataError(
                f"{path}: {key} is {array.dtype} of shape {array.shape}, expected one integer "
                f"per image; {WRITERS_HELP}"
            )
        if len(array) != images:
            raise DataError(
                f"{path}: {key} names the writers of {len(array)} images but the MNIST "
                f"{key.split('_')[0]} split in {data_dir} holds {images}: the files do not "
                f"align; {WRITERS_HELP}"
            )
    return keys["train_writer_key"].astype(np.int64)


def writer_parts(keys: np.ndarray) -> dict[int, np.ndarray]:
    """The indices of each writer's images (ascending), by writer key (ascending)."""
    order = np.argsort(keys, kind="stable")
    writers, starts = np.unique(keys[order], return_index=True)
    return {int(w): part for w, part in zip(writers, np.split(order, starts[1:]))}


def load_mnist_writers(
    data_dir: Optional[str],
    num_clients: Optional[int] = None,
    seed: int = 0,
    train_fraction: float = 0.8,
) -> FederatedData:
    """One client per training writer of MNIST (module docstring), id `writer_{key:05d}`, in key
    order: the writer's own images split at random into `train_fraction` (80 %) local training
    and the rest local test images. `num_clients` keeps that many writers, a uniform random
    choice without replacement (`DataStream.CLIENT_EXAMPLES`; the writers' natural sizes, 19 to
    131 images on MNIST, stay as they are); None keeps all 539. Writers with fewer than 2 images
    (none in MNIST) are left out. The splits draw from `DataStream.CLIENT_TEST_SETS`, writer by
    writer.
    The official test split without labels is the public set."""
    if not data_dir:
        raise DataError(f"--dataset=mnist_writers reads files you already have: {WRITERS_HELP}")
    x_train, y_train, x_test, _ = read_mnist_splits(data_dir, MNIST)
    keys = read_writer_keys(data_dir, len(x_train), len(x_test))
    parts = {k: p for k, p in writer_parts(keys).items() if len(p) >= MIN_WRITER_IMAGES}
    writers = np.array(sorted(parts))
    writers = writers[
        chosen_clients(
            len(writers),
            num_clients,
            data_rng(seed, DataStream.CLIENT_EXAMPLES),
            f"mnist_writers: {data_dir} holds {len(writers)} training writers with "
            f"{MIN_WRITER_IMAGES}+ images",
        )
    ]
    train, public = standardise(x_train[..., None], x_test[..., None])
    rng = data_rng(seed, DataStream.CLIENT_TEST_SETS)
    train_arrays, test_arrays = {}, {}
    for key in writers:
        idx = parts[int(key)]
        cid = f"writer_{int(key):05d}"
        train_arrays[cid], test_arrays[cid] = split_train_test(
            train[idx], y_train[idx], train_fraction, rng
        )
    return from_arrays(
        "mnist_writers",
        train_arrays,
        test_arrays,
        10,
        image_shape=(28, 28, 1),
        source=data_dir,
        public_x=public,
    )
