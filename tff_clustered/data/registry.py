"""Datasets by name, as the binaries select them (`--dataset`, `--data_dir`)."""

from __future__ import annotations

import os
from typing import Optional

from tff_clustered.data.digits import load_digits_clusters
from tff_clustered.data.federated_data import DataError, FederatedData
from tff_clustered.data.leaf import load_leaf
from tff_clustered.data.synthetic import load_synthetic

DATASET_NAMES = ("digits", "synthetic", "leaf")


def load_dataset(
    name: str,
    data_dir: Optional[str] = None,
    seed: int = 0,
    num_clients: Optional[int] = None,
    num_classes: Optional[int] = None,
) -> FederatedData:
    """`digits` (embedded default), `synthetic` (Synthetic(1,1)), or `leaf` (LEAF JSON under
    `data_dir/train` and `data_dir/test`)."""
    if name == "digits":
        return load_digits_clusters(num_clients=num_clients or 40, seed=seed)
    if name == "synthetic":
        return load_synthetic(num_clients=num_clients or 100, seed=seed)
    if name == "leaf":
        if not data_dir:
            raise DataError(
                "--dataset=leaf needs --data_dir pointing at a LEAF data/ folder with train/ "
                "and test/ subfolders of *.json files"
            )
        return load_leaf(
            os.path.join(data_dir, "train"),
            os.path.join(data_dir, "test"),
            num_classes=num_classes,
            name=f"leaf:{os.path.basename(os.path.normpath(data_dir))}",
        )
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
