"""Federated datasets; every loader returns a `FederatedData` of `ClientData` splits."""

from tff_clustered.data.digits import load_digits_clusters, load_digits_partitioned
from tff_clustered.data.federated_data import DataError, FederatedData, from_arrays
from tff_clustered.data.image_formats import read_cifar, read_svhn, read_tfds
from tff_clustered.data.images import load_image_federation
from tff_clustered.data.leaf import load_leaf, read_leaf_file, read_leaf_split
from tff_clustered.data.partitions import PARTITIONS, dirichlet_partition, federate, iid_partition
from tff_clustered.data.registry import load_dataset
from tff_clustered.data.shard_partitions import pathological_partition
from tff_clustered.data.spec import DATASET_NAMES, DataSpec
from tff_clustered.data.synthetic import load_synthetic

__all__ = [
    "DATASET_NAMES",
    "PARTITIONS",
    "DataError",
    "DataSpec",
    "FederatedData",
    "dirichlet_partition",
    "federate",
    "from_arrays",
    "iid_partition",
    "load_dataset",
    "load_digits_clusters",
    "load_digits_partitioned",
    "load_image_federation",
    "load_leaf",
    "load_synthetic",
    "pathological_partition",
    "read_cifar",
    "read_leaf_file",
    "read_leaf_split",
    "read_svhn",
    "read_tfds",
]
