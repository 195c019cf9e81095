"""PathMNIST from the `pathmnist.npz` file the user has, dealt to peers as UA-PDFL deals it.

PathMNIST (MedMNIST v2) from the `pathmnist.npz` file the user already has (nothing is
downloaded), dealt to decentralized peers as in UA-PDFL (Zhu, Fan and Xie, "UA-PDFL: A
Personalized Approach for Decentralized Federated Learning", arXiv:2412.11674): the official
training split partitioned over the peers (Dirichlet(beta) with >= 10 examples per peer,
McMahan et al.'s two label-sorted shards per peer, or IID), each peer holding out a random 20 %
of its allocation as its local test set.

PathMNIST: Yang et al., "MedMNIST v2: A large-scale lightweight benchmark for 2D and 3D
biomedical image classification", Scientific Data 10, 41 (2023); 28x28 RGB patches of colorectal
cancer histology (NCT-CRC-HE-100K, test split CRC-VAL-HE-7K), 9 tissue classes. The file holds
`train_images` (N, 28, 28, 3) uint8, `train_labels` (N, 1), and the same for `val_` and `test_`.
The validation split is not used. Images are scaled to [0, 1] and standardised per channel with
the training split's mean and standard deviation, as the CIFAR images are (`images.standardise`);
the official test split, without labels, is the public set for algorithms that use one.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tff_clustered.data import partitions
from tff_clustered.data.federated_data import DataError, FederatedData, first_line
from tff_clustered.data.image_formats import Arrays, refuse_labels_outside
from tff_clustered.data.images import standardise
from tff_clustered.seeds import DataStream, data_rng

PATHMNIST_FILE = "pathmnist.npz"
PATHMNIST_CLASSES = 9
PATHMNIST_SHAPE = (28, 28, 3)
PATHMNIST_URL = "https://zenodo.org/records/10519652"
PATHMNIST_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
# UA-PDFL's setup: 30 peers, Dirichlet(0.5) by default, >= 10 training images per peer.
PATHMNIST_PEERS = 30
GET_IT = (
    f"get MedMNIST v2's {PATHMNIST_FILE} (28x28) from {PATHMNIST_URL}, or `pip install "
    "medmnist` and run `python -c \"import medmnist; medmnist.PathMNIST(split='train', "
    "download=True, size=28, root='DIR')\"`, then pass --data_dir=DIR (the folder or the file "
    "itself); nothing is downloaded at run time"
)


def pathmnist_path(data_dir: str) -> str:
    """The `.npz` file: `data_dir` itself if it is a file, else `data_dir/pathmnist.npz`."""
    path = os.path.expanduser(data_dir)
    return path if os.path.isfile(path) else os.path.join(path, PATHMNIST_FILE)


def _split(npz: np.lib.npyio.NpzFile, path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's (n, 28, 28, 3) uint8 images and (n,) int64 labels, checked."""
    try:
        x = npz[f"{split}_images"]
        y = npz[f"{split}_labels"]
    except Exception as e:  # noqa: BLE001 - a damaged member or an object (pickled) array
        raise DataError(
            f"pathmnist: the {split} arrays of {path} cannot be read ({first_line(e)}); {GET_IT}"
        ) from e
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != PATHMNIST_SHAPE or not len(x):
        hint = (
            "; the larger MedMNIST+ files (pathmnist_64/128/224.npz) are not supported"
            if x.ndim == 4 and x.shape[1:3] != PATHMNIST_SHAPE[:2]
            else ""
        )
        raise DataError(
            f"pathmnist: {split}_images in {path} is {x.dtype} of shape {x.shape}, expected uint8 "
            f"of shape (n>0, 28, 28, 3){hint}; {GET_IT}"
        )
    if y.reshape(-1).shape != (len(x),) or y.ndim > 2 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(
            f"pathmnist: {split}_labels in {path} is {y.dtype} of shape {y.shape}, expected "
            f"integers of shape ({len(x)}, 1), one per image; {GET_IT}"
        )
    y = y.reshape(-1).astype(np.int64)
    refuse_labels_outside(y, PATHMNIST_CLASSES, f"pathmnist: {split}_labels in {path}", GET_IT)
    return x, y


def read_pathmnist(data_dir: str) -> Arrays:
    """(x_train, y_train, x_test, y_test) from `pathmnist.npz` in `data_dir` (or the file
    `data_dir`): uint8 (n, 28, 28, 3) images, int64 labels in 0..8. The val split is not read.
    A missing file, a file that is not an .npz archive, a missing key, or arrays of the wrong
    dtype or shape raise `DataError` naming the problem and where to get the file."""
    path = pathmnist_path(data_dir)
    if not os.path.isfile(path):
        raise DataError(f"pathmnist: {path} not found; {GET_IT}")
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any failure to open is a bad file
        raise DataError(
            f"pathmnist: {path} cannot be read as a NumPy .npz archive ({first_line(e)}); {GET_IT}"
        ) from e
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataError(
            f"pathmnist: {path} holds a single {type(npz).__name__}, not an .npz archive of "
            f"{', '.join(PATHMNIST_KEYS)}; {GET_IT}"
        )
    with npz:
        missing = [k for k in PATHMNIST_KEYS if k not in npz.files]
        if missing:
            raise DataError(
                f"pathmnist: {path} lacks {', '.join(missing)} (it holds "
                f"{', '.join(sorted(npz.files)) or 'nothing'}); {GET_IT}"
            )
        return (*_split(npz, path, "train"), *_split(npz, path, "test"))


def load_pathmnist(
    data_dir: Optional[str],
    partition: str = "dirichlet",
    num_clients: int = PATHMNIST_PEERS,
    dirichlet_beta: float = 0.5,
    seed: int = 0,
    classes_per_client: int = 2,
    shards_per_client: int = 2,
    min_size: int = 10,
    test_fraction: float = partitions.HOLDOUT_FRACTION,
) -> FederatedData:
    """PathMNIST dealt to `num_clients` decentralized peers as in UA-PDFL (arXiv:2412.11674):
    the official training split, scaled to [0, 1] and standardised per channel, partitioned by
    `partition` (`dirichlet`: per class p_c ~ Dir_M(`dirichlet_beta`), redrawn until every peer
    has >= `min_size` examples; `shards`: `shards_per_client` label-sorted shards per peer;
    `iid`; or `pathological`); each peer's allocation split by `holdout_split` into its training
    set and a random `test_fraction` (20 %) local test set. The official test split, without
    labels, is the public set. The partition draws from `DataStream.CLIENT_EXAMPLES`, the
    holdouts from `DataStream.CLIENT_TEST_SETS`."""
    if not data_dir:
        raise DataError(f"--dataset=pathmnist reads a file you already have: {GET_IT}")
    x_train, y_train, x_test, _ = read_pathmnist(data_dir)
    train, public = standardise(x_train, x_test)  # the same as scaled to [0, 1] first
    parts = partitions.partition(
        y_train,
        num_clients,
        partition,
        data_rng(seed, DataStream.CLIENT_EXAMPLES),
        dirichlet_beta=dirichlet_beta,
        classes_per_client=classes_per_client,
        min_size=min_size,
        shards_per_client=shards_per_client,
    )
    return partitions.federate_holdout(
        "pathmnist",
        train,
        y_train,
        parts,
        PATHMNIST_CLASSES,
        data_rng(seed, DataStream.CLIENT_TEST_SETS),
        test_fraction=test_fraction,
        public_x=public,
        image_shape=PATHMNIST_SHAPE,
        source=pathmnist_path(data_dir),
    )
