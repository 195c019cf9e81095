"""Datasets by name, as the binaries select them (`--dataset`, `--data_dir`, `--glove_path`)."""

from __future__ import annotations

import os
from typing import Optional

from tff_clustered.data.digits import load_digits_clusters, load_digits_partitioned
from tff_clustered.data.federated_data import DataError, FederatedData
from tff_clustered.data.fingerprint import SourceFingerprint
from tff_clustered.data.images import TFDS_NAMES, image_files, load_image_federation
from tff_clustered.data.leaf import leaf_split_files, load_leaf
from tff_clustered.data.medmnist import PATHMNIST_PEERS, load_pathmnist, pathmnist_path
from tff_clustered.data.mnist import MNIST, load_mnist, mnist_paths
from tff_clustered.data.mnist_writers import WRITERS_FILE, load_mnist_writers
from tff_clustered.data.sent140 import load_sent140
from tff_clustered.data.stackoverflow import load_tff_stackoverflow, stackoverflow_files
from tff_clustered.data.synthetic import load_synthetic
from tff_clustered.data.tff_datasets import (
    CIFAR100_FILE,
    EMNIST_FILE,
    SHAKESPEARE_FILE,
    load_tff_cifar100,
    load_tff_emnist,
    load_tff_shakespeare,
)

DATASET_NAMES = (
    "digits",
    "digits_dirichlet",
    "digits_iid",
    "digits_pathological",
    "synthetic",
    "mnist",
    "mnist_partitioned",
    "mnist_writers",
    "fashion_mnist",
    "femnist",
    "femnist_leaf",
    "sent140",
    "leaf",
    "cifar10",
    "cifar100",
    "svhn",
    "pathmnist",
    "tff_emnist",
    "tff_cifar100",
    "tff_shakespeare",
    "tff_stackoverflow",
)
# FedTSDP's datasets, and the 28x28 grey ones in MNIST's formats: dealt to clients by a partition
# (default Dirichlet(0.5)), public set = the official test split without labels.
IMAGE_DATASETS = ("cifar10", "cifar100", "svhn", "fashion_mnist", "mnist_partitioned")
# FEMNIST: FedProx/FedGroup subset (200 writers, 10 letters, 26-way head: Table II counts) or
# the full LEAF FEMNIST (62 classes by writer).
FEMNIST_CLASSES = {"femnist": 26, "femnist_leaf": 62}
LEAF_HELP = {
    "femnist": "the FedProx EMNIST subset (FedProx repository, data/nist, generated with its "
    "scripts) or LEAF's femnist preprocessing",
    "femnist_leaf": "LEAF's femnist (./preprocess.sh -s niid --sf 1.0 -k 0 -t sample)",
    "sent140": "LEAF's sent140 (./preprocess.sh -s niid --sf 0.3 -k 30 -t sample)",
    "leaf": "any LEAF dataset",
}


# TFF's database file of each `tff_*` dataset, in --data_dir.
TFF_DATABASES = {
    "tff_emnist": EMNIST_FILE,
    "tff_cifar100": CIFAR100_FILE,
    "tff_shakespeare": SHAKESPEARE_FILE,
}
# Generated from the settings (parameters and seed): no files.
GENERATED_DATASETS = (
    "digits",
    "digits_dirichlet",
    "digits_iid",
    "digits_pathological",
    "synthetic",
)


def _leaf_dirs(name: str, data_dir: Optional[str]) -> tuple[str, str]:
    if not data_dir:
        raise DataError(
            f"--dataset={name} needs --data_dir pointing at a LEAF data/ folder with train/ and "
            f"test/ subfolders of *.json files: {LEAF_HELP[name]}"
        )
    return os.path.join(data_dir, "train"), os.path.join(data_dir, "test")


def image_beta(partition: Optional[str], dirichlet_beta: Optional[float]) -> float:
    """The Dirichlet concentration of an image federation: as given, else FedAC's 0.1 for its
    partition and FedTSDP's 0.5 otherwise."""
    if dirichlet_beta is not None:
        return dirichlet_beta
    return 0.1 if partition == "fedac_dirichlet" else 0.5


def resolved_partition(
    name: str, partition: Optional[str], dirichlet_beta: Optional[float]
) -> Optional[str]:
    """The partition `name` is dealt by (`partition`, else the dataset's default; None for a
    dataset with its own clients). Refuses `partition` for a dataset with its own clients and
    `dirichlet_beta` where no Dirichlet draw reads it, instead of recording values the run
    ignores."""
    if name.startswith("digits_"):
        used = partition or name.split("_", 1)[1]
    elif name in IMAGE_DATASETS or name == "pathmnist":
        used = partition or "dirichlet"
    elif partition is not None:
        raise ValueError(
            f"--partition={partition}: --dataset={name} has its own clients; leave --partition "
            f"unset (it applies to the digits_*, {', '.join(IMAGE_DATASETS)} and pathmnist "
            "federations)"
        )
    else:
        used = None
    if dirichlet_beta is not None and used not in ("dirichlet", "fedac_dirichlet"):
        raise ValueError(
            f"--dirichlet_beta={dirichlet_beta}: the {used or name} clients draw no Dirichlet "
            "proportions; leave it unset or use --partition=dirichlet"
        )
    if dirichlet_beta is not None and not dirichlet_beta > 0:
        raise ValueError(f"--dirichlet_beta={dirichlet_beta}: give a concentration > 0")
    return used


def load_dataset(
    name: str,
    data_dir: Optional[str] = None,
    seed: int = 0,
    num_clients: Optional[int] = None,
    num_classes: Optional[int] = None,
    glove_path: Optional[str] = None,
    partition: Optional[str] = None,
    dirichlet_beta: Optional[float] = None,
    classes_per_client: int = 2,
    tfds_dir: Optional[str] = None,
    train_examples: Optional[int] = None,
) -> FederatedData:
    """`digits` (embedded default: planted label-permutation groups), `digits_dirichlet` /
    `digits_iid` / `digits_pathological` (embedded, true labels, a public set; `partition`
    overrides the suffix), `synthetic` (Synthetic(1,1)), `mnist` (IDX/npz files, FedGroup's
    1,000 two-digit clients), `mnist_writers` (the same files and `writers.npz`: one client per
    NIST writer, all 539 training writers unless `num_clients`),
    `femnist`/`femnist_leaf`/`sent140`/`leaf` (LEAF JSON under `data_dir/{train,test}`),
    `cifar10`/`cifar100`/`svhn` (the official files under `data_dir`, or a TFDS directory),
    `fashion_mnist`/`mnist_partitioned` (Fashion-MNIST's or MNIST's IDX/npz files under
    `data_dir`), these five dealt by `partition` (default Dirichlet(0.5)) to 20 clients,
    `pathmnist` (MedMNIST v2's pathmnist.npz in `data_dir`, dealt to UA-PDFL's peers: 30 by
    default, `partition` dirichlet (default, beta 0.5) / shards / iid, 20 % local holdouts),
    `tff_emnist` (TFF's federated EMNIST database in `data_dir`: its writers, digits or all
    62 classes by `num_classes`), `tff_cifar100` (TFF's federated CIFAR-100 database in
    `data_dir`: its 500 train clients, each holding out a seeded 20 % of its images as its
    local test set; 100 fine or 20 coarse classes by `num_classes`), `tff_shakespeare` (TFF's
    federated Shakespeare database in `data_dir`: its speaking parts, LEAF's next-character
    task over 80-character windows), `tff_stackoverflow` (TFF's federated Stack Overflow
    database in `data_dir`, read by client id: `num_clients` (required) clients drawn from
    those with train and test posts, TFF's tag prediction as single-label over the
    `num_classes` (default 500) most frequent tags, a bag of words over 10,000 words).
    `train_examples` (the five image federations only): deal that many training images, a
    seeded uniform choice, instead of all."""
    partition = resolved_partition(name, partition, dirichlet_beta)
    if train_examples is not None and name not in IMAGE_DATASETS:
        raise ValueError(
            f"--train_examples applies to {', '.join(IMAGE_DATASETS)}, not --dataset={name}; "
            "leave it unset"
        )
    if name == "digits":
        return load_digits_clusters(num_clients=num_clients or 40, seed=seed)
    if name.startswith("digits_"):
        return load_digits_partitioned(
            partition=partition,
            num_clients=num_clients or 20,
            dirichlet_beta=0.2 if dirichlet_beta is None else dirichlet_beta,
            classes_per_client=classes_per_client,
            seed=seed,
        )
    if name in IMAGE_DATASETS:
        return load_image_federation(
            name,
            data_dir,
            partition=partition,
            num_clients=num_clients or 20,
            dirichlet_beta=image_beta(partition, dirichlet_beta),
            classes_per_client=classes_per_client,
            seed=seed,
            tfds_dir=tfds_dir,
            train_examples=train_examples,
        )
    if name == "pathmnist":
        return load_pathmnist(
            data_dir,
            partition=partition,
            num_clients=num_clients or PATHMNIST_PEERS,
            dirichlet_beta=image_beta(partition, dirichlet_beta),
            seed=seed,
            classes_per_client=classes_per_client,
        )
    if name == "tff_emnist":
        return load_tff_emnist(data_dir, num_clients, num_classes, seed)
    if name == "tff_cifar100":
        return load_tff_cifar100(data_dir, num_clients, num_classes, seed)
    if name == "tff_shakespeare":
        if num_classes is not None:
            raise ValueError(
                f"--num_classes={num_classes}: tff_shakespeare predicts one of its 87 "
                "characters; leave --num_classes unset"
            )
        return load_tff_shakespeare(data_dir, num_clients, seed)
    if name == "tff_stackoverflow":
        return load_tff_stackoverflow(data_dir, num_clients, num_classes, seed)
    if name == "synthetic":
        return load_synthetic(num_clients=num_clients or 100, seed=seed)
    if name == "mnist":
        return load_mnist(data_dir or "", num_clients=num_clients or 1000, seed=seed)
    if name == "mnist_writers":
        return load_mnist_writers(data_dir, num_clients=num_clients, seed=seed)
    if name in FEMNIST_CLASSES:
        train, test = _leaf_dirs(name, data_dir)
        return load_leaf(
            train, test, num_classes or FEMNIST_CLASSES[name], name=name, image_shape=(28, 28, 1)
        )
    if name == "sent140":
        _leaf_dirs(name, data_dir)
        return load_sent140(data_dir, glove_path or "")
    if name == "leaf":
        train, test = _leaf_dirs(name, data_dir)
        return load_leaf(
            train,
            test,
            num_classes=num_classes,
            name=f"leaf:{os.path.basename(os.path.normpath(data_dir))}",
        )
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def data_files(
    name: str,
    data_dir: Optional[str] = None,
    glove_path: Optional[str] = None,
    tfds_dir: Optional[str] = None,
) -> list[str]:
    """The files `load_dataset(name, ...)` reads, found as its loader finds them (a missing
    folder gives the loader's error; a file the loader would miss is listed, and
    fingerprinted as absent); none for the datasets generated from the settings (their
    parameters and seed are settings)."""
    if name in GENERATED_DATASETS:
        return []
    if name in IMAGE_DATASETS:
        return image_files(name, data_dir, tfds_dir)
    if name == "pathmnist":
        return [pathmnist_path(data_dir)] if data_dir else []
    if name in TFF_DATABASES:
        return [os.path.join(data_dir, TFF_DATABASES[name])] if data_dir else []
    if name == "tff_stackoverflow":  # the database and its two vocabulary files
        return stackoverflow_files(data_dir) if data_dir else []
    if name == "mnist":
        return mnist_paths(data_dir or "", MNIST)
    if name == "mnist_writers":
        if not data_dir:
            return []
        return [*mnist_paths(data_dir, MNIST), os.path.join(data_dir, WRITERS_FILE)]
    if name in (*FEMNIST_CLASSES, "sent140", "leaf"):
        _leaf_dirs(name, data_dir)
        texts = leaf_split_files(data_dir or "")
        return [*texts, glove_path] if name == "sent140" and glove_path else texts
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")


def source_fingerprint(
    name: str,
    data_dir: Optional[str] = None,
    glove_path: Optional[str] = None,
    tfds_dir: Optional[str] = None,
) -> SourceFingerprint:
    """What a checkpoint of a run on `name` records of its data, without loading it: each file
    of `data_files` by its path relative to the data folder (`tfds_dir` when the data is read
    from there, else `data_dir`) and a digest of its bytes (`fingerprint.file_digest`)."""
    root = tfds_dir if tfds_dir and name in TFDS_NAMES else data_dir
    return SourceFingerprint.of_files(root or "", data_files(name, data_dir, glove_path, tfds_dir))
