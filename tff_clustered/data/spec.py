"""A dataset of the registry and its parameters, as one record (`DataSpec`).

It is what `--dataset` and the data flags select, what a run's settings record, and what
`load_dataset` loads.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Union

from tff_clustered.options import checked_fields

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
    "tff_sql",
)
# FedTSDP's datasets, and the 28x28 grey ones in MNIST's formats: dealt to clients by a partition
# (default Dirichlet(0.5)), public set = the official test split without labels.
IMAGE_DATASETS = ("cifar10", "cifar100", "svhn", "fashion_mnist", "mnist_partitioned")
# The LEAF datasets: their clients are the writers or users in the LEAF files, all of them.
LEAF_DATASETS = ("femnist", "femnist_leaf", "sent140", "leaf")
# The fields of a `DataSpec` that name files or folders.
PATH_FIELDS = ("data_dir", "glove_path", "tfds_dir")
# What `--split` takes (`data/validation.py`): the test examples, or validation examples held
# out of each client's training examples.
SPLITS = ("test", "validation")
# The fewest classes a `--num_classes` may give: a classifier tells at least two apart (one
# class is every example's label, nothing to learn).
MIN_CLASSES = 2


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """A dataset by name (`DATASET_NAMES`) and the parameters its loader reads; each field is
    the command-line flag of the same name, with the flag's default. Checked when made: a
    value the dataset would not use is refused rather than recorded as if used.

    The files: `data_dir` (the dataset's folder), `glove_path` (sent140's GloVe vectors),
    `tfds_dir` (a TFDS directory for cifar10/cifar100/svhn). The clients: `num_clients` (None:
    the dataset's default), `num_classes` (None: from the labels), `partition` and
    `dirichlet_beta` (how an image or digits federation is dealt; None: the dataset's
    default), `classes_per_client` (of the pathological partition), `train_examples` (deal a
    seeded choice of that many training images of the five image federations). `split`: the
    examples a run scores, "test", or "validation" (held out of each client's training examples,
    `data/validation.py`: for tuning, never a reported test figure)."""

    dataset: str = "digits"
    data_dir: Optional[str] = None
    glove_path: Optional[str] = None
    tfds_dir: Optional[str] = None
    num_clients: Optional[int] = None
    num_classes: Optional[int] = None
    partition: Optional[str] = None
    dirichlet_beta: Optional[float] = None
    classes_per_client: int = 2
    train_examples: Optional[int] = None
    split: str = "test"

    def __post_init__(self) -> None:
        for name in PATH_FIELDS:  # a pathlib.Path is taken as the path it names
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        for name, value in checked_fields(self, "DataSpec").items():
            object.__setattr__(self, name, value)
        name = self.dataset
        if name not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
        if self.split not in SPLITS:
            raise ValueError(
                f"--split={self.split}: choose test (the reported figures) or validation (for "
                "tuning)"
            )
        self.partition_used()  # refuses a partition or a beta the dataset does not use
        if self.train_examples is not None and name not in IMAGE_DATASETS:
            raise ValueError(
                f"--train_examples applies to {', '.join(IMAGE_DATASETS)}, not --dataset={name}; "
                "leave it unset"
            )
        if name in LEAF_DATASETS and self.num_clients is not None:
            raise ValueError(
                f"--num_clients={self.num_clients}: --dataset={name} has the clients of its LEAF "
                "files, every one of them; leave --num_clients unset (fewer clients: sample the "
                "data with LEAF's preprocess.sh --sf)"
            )
        if name == "tff_shakespeare" and self.num_classes is not None:
            raise ValueError(
                f"--num_classes={self.num_classes}: tff_shakespeare predicts one of its 87 "
                "characters; leave --num_classes unset"
            )

    def partition_used(self) -> Optional[str]:
        """The partition the clients are dealt by (`partition`, else the dataset's default; None
        for a dataset with its own clients). Refuses `partition` for a dataset with its own
        clients and `dirichlet_beta` where no Dirichlet draw reads it."""
        name, partition, beta = self.dataset, self.partition, self.dirichlet_beta
        if name.startswith("digits_"):
            used = partition or name.split("_", 1)[1]
        elif name in IMAGE_DATASETS or name == "pathmnist":
            used = partition or "dirichlet"
        elif partition is not None:
            raise ValueError(
                f"--partition={partition}: --dataset={name} has its own clients; leave "
                f"--partition unset (it applies to the digits_*, {', '.join(IMAGE_DATASETS)} and "
                "pathmnist federations)"
            )
        else:
            used = None
        if beta is not None and used not in ("dirichlet", "fedac_dirichlet"):
            raise ValueError(
                f"--dirichlet_beta={beta}: the {used or name} clients draw no Dirichlet "
                "proportions; leave it unset or use --partition=dirichlet"
            )
        if beta is not None and not beta > 0:
            raise ValueError(f"--dirichlet_beta={beta}: give a concentration > 0")
        return used


def data_spec(spec: Union[DataSpec, str], *fields: Any, **named: Any) -> DataSpec:
    """`spec`, or the `DataSpec` of the dataset named `spec` with the other fields given in
    `DataSpec`'s order or by name."""
    if isinstance(spec, DataSpec):
        if fields or named:
            raise TypeError("give a DataSpec alone, or a dataset's name and its fields")
        return spec
    return DataSpec(spec, *fields, **named)
