"""Image datasets from files the user has, dealt to clients as FedTSDP deals them.

CIFAR-10, CIFAR-100, SVHN, Fashion-MNIST and MNIST from files the user already has (nothing
is downloaded), dealt to clients as in FedTSDP (Zhu et al., "Federated Two Stage Decoupling With
Adaptive Personalization Layers", 2023): a partition (IID, Dirichlet(beta), pathological,
shards), each client's share split 80/20 into train and test, and the official test split
without labels as the server's public set. Or dealt as in FedAC (Zhang et al.,
arXiv:2403.16460, Sec. 5.1): `fedac_dirichlet` / `fedac_pathological` give each client
n_i ~ UniformInt[50, 350] training images (a per-client Dirichlet(alpha) label mixture, or n
labels split equally) and a local test set drawn from the official test split in its training
proportions (round(0.25 n_i)); no public set then.

Sources: the official files the user already has (`image_formats.py` reads CIFAR-10,
CIFAR-100, SVHN and prepared TFDS directories), and for the grey 28x28 datasets MNIST's file
formats (`mnist.read_mnist_splits`):
* Fashion-MNIST (Xiao, Rasul and Vollgraf, arXiv:1708.07747, 2017), `fashion_mnist`: its four
  official IDX files (`train-images-idx3-ubyte.gz`, ..., the names MNIST's files have) or a
  Keras-style `fashion-mnist.npz`, https://github.com/zalandoresearch/fashion-mnist;
* MNIST (LeCun et al., "Gradient-based learning applied to document recognition", Proc. IEEE
  86(11), 1998), `mnist_partitioned`: the same formats (`mnist.npz`), dealt by the same
  partitions (FedGroup's own MNIST setup is `--dataset=mnist`, `data.mnist.load_mnist`).

Images are float32 NHWC (32x32x3, or 28x28x1 for Fashion-MNIST and MNIST), standardised per
channel with the training split's mean and standard deviation (no augmentation).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tff_clustered.data import fedac_partitions, partitions
from tff_clustered.data.federated_data import DataError, FederatedData, from_arrays
from tff_clustered.data.fingerprint import folder_files
from tff_clustered.data.image_formats import (
    CIFAR_FILES,
    CIFAR_URL,
    NUM_CLASSES,
    SVHN_URL,
    TFDS_NAMES,
    Arrays,
    cifar_root,
    read_cifar,
    read_svhn,
    read_tfds,
    svhn_path,
    tfds_root,
)
from tff_clustered.data.mnist import (
    FASHION_MNIST,
    MNIST,
    MnistFormat,
    mnist_paths,
    read_mnist_splits,
)
from tff_clustered.seeds import DataStream, data_rng

IMAGE_SHAPES = {
    "cifar10": (32, 32, 3),
    "cifar100": (32, 32, 3),
    "svhn": (32, 32, 3),
    "fashion_mnist": (28, 28, 1),
    "mnist_partitioned": (28, 28, 1),
}
# The grey 28x28 datasets in MNIST's file formats (`mnist.read_mnist_splits`).
MNIST_FORMATS: dict[str, MnistFormat] = {"fashion_mnist": FASHION_MNIST, "mnist_partitioned": MNIST}
# FedAC's partitions (`fedac_partitions.fedac_partition`) by the name `--partition` gives them.
FEDAC_SCHEMES = {"fedac_dirichlet": "dirichlet", "fedac_pathological": "pathological"}
FILES = {
    "cifar10": "cifar-10-batches-py/",
    "cifar100": "cifar-100-python/",
    "svhn": "train_32x32.mat and test_32x32.mat",
}


def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of NHWC images, accumulated in float64 over
    chunks of `chunk` images (two passes). NumPy's own float32 reduction over axes (0, 1, 2)
    is not pairwise and stalls once the running sum reaches about 2**32: on 50,000 CIFAR-sized
    images of uniform 0..255 noise it gives a mean of 84 instead of 127.5."""
    n = len(x)
    total = sum(x[i : i + chunk].sum(axis=(0, 1, 2), dtype=np.float64) for i in range(0, n, chunk))
    count = n * x.shape[1] * x.shape[2]
    mean = total / count
    squares = sum(
        np.square(x[i : i + chunk].astype(np.float64) - mean).sum(axis=(0, 1, 2))
        for i in range(0, n, chunk)
    )
    return mean, np.sqrt(squares / count)


def standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both splits as float32, standardised per channel with the training split's mean and
    standard deviation (`channel_stats`; in place: CIFAR's 50,000 training images take 600 MB
    as float32). A constant scale of the pixels (such as to [0, 1]) cancels out."""
    train = x_train.astype(np.float32)
    test = x_test.astype(np.float32)
    mean, std = channel_stats(train)
    mean, std = mean.astype(np.float32), np.maximum(std, 1e-3).astype(np.float32)
    for x in (train, test):
        x -= mean
        x /= std
    return train, test


def read_official(name: str, data_dir: str) -> Arrays:
    """`name`'s official files under `data_dir` as NHWC uint8 images and int64 labels (the grey
    28x28 datasets get a channel axis)."""
    if name in MNIST_FORMATS:
        x_train, y_train, x_test, y_test = read_mnist_splits(data_dir, MNIST_FORMATS[name])
        return x_train[..., None], y_train, x_test[..., None], y_test
    if name == "svhn":
        return read_svhn(data_dir)
    return read_cifar(name, data_dir)


def image_files(name: str, data_dir: Optional[str], tfds_dir: Optional[str]) -> list[str]:
    """The files `load_image_federation` reads for `name`: every file of the TFDS dataset's
    folder under `tfds_dir` when given, else the official files under `data_dir` (none when
    neither is given: the loader then refuses the run)."""
    if tfds_dir and name in TFDS_NAMES:
        tfds_name = TFDS_NAMES[name]
        return folder_files(os.path.join(tfds_root(tfds_name, tfds_dir), tfds_name))
    if not data_dir:
        return []
    if name in MNIST_FORMATS:
        return mnist_paths(data_dir, MNIST_FORMATS[name])
    if name == "svhn":
        return [svhn_path(data_dir, split) for split in ("train", "test")]
    root = cifar_root(name, data_dir)
    return [os.path.join(root, f) for split in CIFAR_FILES[name] for f in split]


def read_images(
    name: str, data_dir: Optional[str], tfds_dir: Optional[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """`name`'s official training and test splits (x_train, y_train, x_test, y_test) and where
    they were read (a prepared TFDS directory `tfds_dir`, else the official files under
    `data_dir`), their shapes and training labels checked."""
    if name not in NUM_CLASSES:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(NUM_CLASSES)}")
    if tfds_dir and name not in TFDS_NAMES:
        raise DataError(
            f"--dataset={name} is not read from --tfds_dir (that is for "
            f"{', '.join(TFDS_NAMES)}); {MNIST_FORMATS[name].missing_help}"
        )
    if tfds_dir:
        x_train, y_train, x_test, y_test = read_tfds(name, tfds_dir)
        source = f"TFDS {TFDS_NAMES[name]} in {tfds_dir}"
    elif data_dir:
        x_train, y_train, x_test, y_test = read_official(name, data_dir)
        source = data_dir
    elif name in MNIST_FORMATS:
        raise DataError(
            f"--dataset={name} reads files you already have: {MNIST_FORMATS[name].missing_help}"
        )
    else:
        url = SVHN_URL if name == "svhn" else CIFAR_URL
        raise DataError(
            f"--dataset={name} reads files you already have: give --data_dir (the folder with "
            f"{FILES[name]}, from {url}) or --tfds_dir (a prepared TFDS directory)"
        )
    shape = IMAGE_SHAPES[name]
    for split, x in (("train", x_train), ("test", x_test)):
        if x.shape[1:] != shape or not len(x):
            raise DataError(
                f"{name}: {split} images in {source} have shape {x.shape}, expected "
                f"(n>0, {', '.join(map(str, shape))}); check that the files are the official ones"
            )
    bad = y_train[(y_train < 0) | (y_train >= NUM_CLASSES[name])]
    if bad.size:
        raise DataError(
            f"{name}: label {int(bad[0])} outside 0..{NUM_CLASSES[name] - 1} in {source}; "
            "check that the files are the official ones"
        )
    return x_train, y_train, x_test, y_test, source


def training_subset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    train_examples: Optional[int],
    seed: int,
    source: str,
) -> tuple[np.ndarray, np.ndarray]:
    """A uniform choice of `train_examples` training images, in their order
    (`DataStream.TRAIN_SUBSET`), or all of them when `train_examples` is None."""
    if train_examples is None:
        return x_train, y_train
    if not 1 <= train_examples <= len(y_train):
        raise DataError(
            f"--train_examples={train_examples}: {name} has {len(y_train)} training images "
            f"in {source}; give a number in 1..{len(y_train)} or leave it unset"
        )
    chosen = np.sort(
        data_rng(seed, DataStream.TRAIN_SUBSET).permutation(len(y_train))[:train_examples]
    )
    return x_train[chosen], y_train[chosen]


def fedac_federation(
    name: str,
    drawn: fedac_partitions.FedACPartition,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    source: str,
) -> FederatedData:
    """FedAC's clients of `name`: client k's training examples `drawn.train[k]` of the
    (standardised) training split `train`, its test examples `drawn.test[k]` of `test`."""
    (x_train, y_train), (x_test, y_test) = train, test
    return from_arrays(
        name,
        {f"{name}_{k:03d}": (x_train[i], y_train[i]) for k, i in enumerate(drawn.train)},
        {f"{name}_{k:03d}": (x_test[i], y_test[i]) for k, i in enumerate(drawn.test)},
        NUM_CLASSES[name],
        image_shape=IMAGE_SHAPES[name],
        source=source,
    )


def load_image_federation(
    name: str,
    data_dir: Optional[str],
    partition: str = "dirichlet",
    num_clients: int = 20,
    dirichlet_beta: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    tfds_dir: Optional[str] = None,
    train_examples: Optional[int] = None,
) -> FederatedData:
    """`name` (cifar10, cifar100, svhn, fashion_mnist, mnist_partitioned) as FedTSDP deals it:
    the official training split standardised and dealt to `num_clients` clients by `partition`
    (`iid`, `dirichlet` with `dirichlet_beta`, `pathological` with `classes_per_client`, or
    McMahan et al.'s two label-sorted `shards` per client), each client's share split 80/20 into
    train and test; the official test split, without labels, is the server's public set
    (`public_x`). `fedac_dirichlet` (alpha = `dirichlet_beta`) and `fedac_pathological`
    (`classes_per_client` labels) deal FedAC's clients instead (module docstring). Reads `tfds_dir`
    (a prepared TFDS directory; cifar10, cifar100, svhn) when given, else the official files under
    `data_dir`. `train_examples`: deal a uniform choice of that many training images instead
    of all (`DataStream.TRAIN_SUBSET`; a smaller run on the same distribution). The partition
    draws from `DataStream.CLIENT_EXAMPLES`, the per-client splits from
    `DataStream.CLIENT_TEST_SETS`."""
    x_train, y_train, x_test, y_test, source = read_images(name, data_dir, tfds_dir)
    x_train, y_train = training_subset(name, x_train, y_train, train_examples, seed, source)
    shape = IMAGE_SHAPES[name]
    train, public = standardise(x_train, x_test)
    if partition in FEDAC_SCHEMES:
        drawn = fedac_partitions.fedac_partition(
            y_train,
            y_test,
            num_clients,
            FEDAC_SCHEMES[partition],
            data_rng(seed, DataStream.CLIENT_EXAMPLES),
            data_rng(seed, DataStream.CLIENT_TEST_SETS),
            alpha=dirichlet_beta,
            labels_per_client=classes_per_client,
        )
        return fedac_federation(name, drawn, (train, y_train), (public, y_test), source)
    parts = partitions.partition(
        y_train,
        num_clients,
        partition,
        data_rng(seed, DataStream.CLIENT_EXAMPLES),
        dirichlet_beta=dirichlet_beta,
        classes_per_client=classes_per_client,
    )
    return partitions.federate(
        name,
        train,
        y_train,
        parts,
        NUM_CLASSES[name],
        data_rng(seed, DataStream.CLIENT_TEST_SETS),
        public_x=public,
        image_shape=shape,
        source=source,
    )
