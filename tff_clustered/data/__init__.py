"""Federated datasets; every loader returns a `FederatedData` of `ClientData` splits."""

from tff_clustered.data.digits import load_digits_clusters, load_digits_partitioned
from tff_clustered.data.federated_data import DataError, FederatedData, from_arrays
from tff_clustered.data.leaf import load_leaf, read_leaf_file, read_leaf_split
from tff_clustered.data.registry import DATASET_NAMES, load_dataset
from tff_clustered.data.synthetic import load_synthetic

__all__ = [
    "DATASET_NAMES",
    "DataError",
    "FederatedData",
    "from_arrays",
    "load_dataset",
    "load_digits_clusters",
    "load_digits_partitioned",
    "load_leaf",
    "load_synthetic",
    "read_leaf_file",
    "read_leaf_split",
]
