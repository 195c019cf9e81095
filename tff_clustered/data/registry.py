"""Datasets by name: the loader of each `DataSpec`, and the files it reads.

A `DataSpec` is what `--dataset` and the data flags select.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from tff_clustered.data.digits import load_digits_clusters, load_digits_partitioned
from tff_clustered.data.federated_data import DataError, FederatedData
from tff_clustered.data.fingerprint import SourceFingerprint, sampled_digest
from tff_clustered.data.images import TFDS_NAMES, image_files, load_image_federation
from tff_clustered.data.leaf import leaf_split_files, load_leaf
from tff_clustered.data.medmnist import PATHMNIST_PEERS, load_pathmnist, pathmnist_path
from tff_clustered.data.mnist import MNIST, load_mnist, mnist_paths
from tff_clustered.data.mnist_writers import WRITERS_FILE, load_mnist_writers
from tff_clustered.data.sent140 import load_sent140
from tff_clustered.data.spec import IMAGE_DATASETS, DataSpec, data_spec
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
from tff_clustered.data.tff_sql import load_tff_sql, tff_sql_path
from tff_clustered.data.validation import validation_view

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
    """The Dirichlet concentration of an image federation dealt by `partition`: as given, else
    FedAC's 0.1 for its partition and FedTSDP's 0.5 otherwise."""
    if dirichlet_beta is not None:
        return dirichlet_beta
    return 0.1 if partition == "fedac_dirichlet" else 0.5


def load_dataset(
    spec: Union[DataSpec, str], *fields: Any, seed: int = 0, **named: Any
) -> FederatedData:
    """The federation `spec` describes (a `DataSpec`, or a dataset's name and `DataSpec`'s other
    fields: `data_spec`), every random choice seeded by `seed`; with `split="validation"`, as a
    validation run sees it (`validation.validation_view`: its test examples never read)."""
    spec = data_spec(spec, *fields, **named)
    data = load_federation(spec, seed)
    return validation_view(data, seed) if spec.split == "validation" else data


# Long: the registry's dispatch table, one branch per dataset, and its docstring the list of
# what each dataset name loads; cut apart, neither would read as the one place to look.
def load_federation(spec: DataSpec, seed: int) -> FederatedData:
    """The federation `spec` describes with its train and test examples, every random choice
    seeded by `seed`.

    `digits` (embedded default: planted label-permutation groups), `digits_dirichlet` /
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
    database in `data_dir`, read by client id: every client with train and test posts, each
    read when a round first needs it, or `num_clients` of them drawn and read at start; TFF's
    tag prediction as single-label over the `num_classes` (default 500) most frequent tags, a
    bag of words over 10,000 words),
    `tff_sql` (any population of `x`/`y` examples in TFF's SqlClientData format, `data_dir`
    the file or its folder: every client, or a seeded choice of `num_clients` of them, each
    read when a round first needs it; `num_classes` as given, else the file's largest label
    + 1).
    `train_examples` (the five image federations only): deal that many training images, a
    seeded uniform choice, instead of all."""
    name, data_dir = spec.dataset, spec.data_dir
    num_clients, num_classes = spec.num_clients, spec.num_classes
    partition = spec.partition_used()
    if name == "digits":
        return load_digits_clusters(num_clients=num_clients or 40, seed=seed)
    if name.startswith("digits_"):
        return load_digits_partitioned(
            partition=partition,
            num_clients=num_clients or 20,
            dirichlet_beta=0.2 if spec.dirichlet_beta is None else spec.dirichlet_beta,
            classes_per_client=spec.classes_per_client,
            seed=seed,
        )
    if name in IMAGE_DATASETS:
        return load_image_federation(
            name,
            data_dir,
            partition=partition,
            num_clients=num_clients or 20,
            dirichlet_beta=image_beta(partition, spec.dirichlet_beta),
            classes_per_client=spec.classes_per_client,
            seed=seed,
            tfds_dir=spec.tfds_dir,
            train_examples=spec.train_examples,
        )
    if name == "pathmnist":
        return load_pathmnist(
            data_dir,
            partition=partition,
            num_clients=num_clients or PATHMNIST_PEERS,
            dirichlet_beta=image_beta(partition, spec.dirichlet_beta),
            seed=seed,
            classes_per_client=spec.classes_per_client,
        )
    if name == "tff_emnist":
        return load_tff_emnist(data_dir, num_clients, num_classes, seed)
    if name == "tff_cifar100":
        return load_tff_cifar100(data_dir, num_clients, num_classes, seed)
    if name == "tff_shakespeare":
        return load_tff_shakespeare(data_dir, num_clients, seed)
    if name == "tff_stackoverflow":
        return load_tff_stackoverflow(data_dir, num_clients, num_classes, seed)
    if name == "tff_sql":
        return load_tff_sql(data_dir, num_classes, num_clients=num_clients, seed=seed)
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
        return load_sent140(data_dir, spec.glove_path or "")
    train, test = _leaf_dirs(name, data_dir)  # leaf: any LEAF dataset
    return load_leaf(
        train,
        test,
        num_classes=num_classes,
        name=f"leaf:{os.path.basename(os.path.normpath(data_dir))}",
    )


def data_files(spec: Union[DataSpec, str], *fields: Any, **named: Any) -> list[str]:
    """The files `load_dataset(spec)` reads (`spec` as `load_dataset` takes it), found as its
    loader finds them (a missing folder gives the loader's error; a file the loader would miss
    is listed, and fingerprinted as absent); none for the datasets generated from the settings
    (their parameters and seed are settings)."""
    spec = data_spec(spec, *fields, **named)
    name, data_dir = spec.dataset, spec.data_dir
    if name in GENERATED_DATASETS:
        return []
    if name in IMAGE_DATASETS:
        return image_files(name, data_dir, spec.tfds_dir)
    if name == "pathmnist":
        return [pathmnist_path(data_dir)] if data_dir else []
    if name in TFF_DATABASES:
        return [os.path.join(data_dir, TFF_DATABASES[name])] if data_dir else []
    if name == "tff_sql":
        return [tff_sql_path(data_dir)]
    if name == "tff_stackoverflow":  # the database and its two vocabulary files
        return stackoverflow_files(data_dir) if data_dir else []
    if name == "mnist":
        return mnist_paths(data_dir or "", MNIST)
    if name == "mnist_writers":
        if not data_dir:
            return []
        return [*mnist_paths(data_dir, MNIST), os.path.join(data_dir, WRITERS_FILE)]
    _leaf_dirs(name, data_dir)  # the LEAF datasets: femnist, femnist_leaf, sent140, leaf
    texts = leaf_split_files(data_dir or "")
    return [*texts, spec.glove_path] if name == "sent140" and spec.glove_path else texts


def source_fingerprint(spec: Union[DataSpec, str], *fields: Any, **named: Any) -> SourceFingerprint:
    """What a checkpoint of a run on `spec` (as `load_dataset` takes it) records of its data,
    without loading it: each file of `data_files` by its path relative to the data folder
    (`tfds_dir` when the data is read from there, else `data_dir`) and a digest of its bytes
    (`fingerprint.file_digest`)."""
    spec = data_spec(spec, *fields, **named)
    read_from_tfds = spec.tfds_dir and spec.dataset in TFDS_NAMES
    root = spec.tfds_dir if read_from_tfds else spec.data_dir
    if spec.dataset == "tff_sql":  # read lazily: never hashed whole
        path = tff_sql_path(root)
        return SourceFingerprint.of_files(os.path.dirname(path), [path], sampled_digest)
    if spec.dataset == "tff_stackoverflow" and spec.num_clients is None and root:
        database, *vocabularies = data_files(spec)  # the database read lazily: never hashed whole
        files = {
            **SourceFingerprint.of_files(root, [database], sampled_digest).files,
            **SourceFingerprint.of_files(root, vocabularies).files,
        }
        return SourceFingerprint(root, files)
    return SourceFingerprint.of_files(root or "", data_files(spec))
