"""Reader for LEAF / FedProx JSON: `{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`, one or many files per split.

LEAF writes `data/train/*.json` and `data/test/*.json`; a user's examples may be spread over
several files of one split (they are concatenated in file-name order).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Callable, Optional, Union

import numpy as np

from tff_clustered.data.federated_data import ClientArrays, DataError, FederatedData, from_arrays

PathLike = Union[str, os.PathLike]


def leaf_json_files(path: PathLike) -> list[str]:
    """The JSON files of one split: `path` itself, or every `*.json` in the directory."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
        if files:
            return files
        raise DataError(
            f"no *.json file in {path}; LEAF writes them to data/train/ and data/test/ "
            "(run LEAF's preprocess.sh, then point --data_dir at the folder holding train/ "
            "and test/)"
        )
    raise DataError(
        f"{path} does not exist; download and preprocess the dataset with LEAF "
        "(https://github.com/TalwalkarLab/leaf) and point --data_dir at its data/ folder"
    )


def numeric_inputs(x: list) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def read_leaf_file(
    path: str, convert_inputs: Callable[[list], np.ndarray] = numeric_inputs
) -> dict[str, ClientArrays]:
    """One LEAF JSON file -> {user: (x, y)}, checking the file's own bookkeeping.
    `convert_inputs` turns a user's raw `x` list into an array (default: numeric features)."""
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
            "the file is truncated or corrupt, re-run LEAF's preprocessing"
        ) from e
    if not isinstance(blob, dict) or "user_data" not in blob or "users" not in blob:
        raise DataError(
            f"{path} is not a LEAF file: it needs the keys 'users', 'num_samples' and 'user_data'"
        )
    users, user_data = blob["users"], blob["user_data"]
    num_samples = blob.get("num_samples")
    if num_samples is not None and len(num_samples) != len(users):
        raise DataError(
            f"{path}: {len(users)} users but {len(num_samples)} num_samples entries; the lists "
            "must align (re-run LEAF's preprocessing)"
        )
    clients: dict[str, ClientArrays] = {}
    for i, user in enumerate(users):
        if user not in user_data:
            raise DataError(
                f"{path}: user {user!r} is listed in 'users' but has no entry in 'user_data'; "
                "remove it from 'users' or restore its data"
            )
        record = user_data[user]
        if not isinstance(record, dict) or "x" not in record or "y" not in record:
            raise DataError(f"{path}: user {user!r} needs both 'x' and 'y' in 'user_data'")
        x, y = record["x"], record["y"]
        if len(x) != len(y):
            raise DataError(
                f"{path}: user {user!r} has {len(x)} inputs but {len(y)} labels; "
                "every example needs exactly one label"
            )
        if num_samples is not None and num_samples[i] != len(y):
            raise DataError(
                f"{path}: user {user!r} has num_samples={num_samples[i]} but {len(y)} examples; "
                "fix num_samples or the data"
            )
        try:
            clients[user] = (convert_inputs(x), np.asarray(y, dtype=np.float64))
        except ValueError as e:
            raise DataError(
                f"{path}: user {user!r} has inputs of unequal lengths or non-numbers ({e}); "
                "this reader takes numeric feature vectors"
            ) from e
    return clients


def read_leaf_split(
    paths: Union[PathLike, Sequence[PathLike]],
    convert_inputs: Callable[[list], np.ndarray] = numeric_inputs,
) -> dict[str, ClientArrays]:
    """All files of one split, users merged (a user's parts concatenated in file order)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    merged: dict[str, list[ClientArrays]] = {}
    for path in paths:
        for file in leaf_json_files(path):
            for user, arrays in read_leaf_file(file, convert_inputs).items():
                merged.setdefault(user, []).append(arrays)
    return {
        user: (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        for user, parts in merged.items()
    }


def load_leaf(
    train: Union[PathLike, Sequence[PathLike]],
    test: Union[PathLike, Sequence[PathLike]],
    num_classes: Optional[int] = None,
    name: str = "leaf",
    image_shape: Optional[tuple[int, ...]] = None,
) -> FederatedData:
    """LEAF train and test splits as `FederatedData`.

    `num_classes` defaults to 1 + the largest label seen; give it explicitly when a split may
    miss the top classes (labels are then checked against it).
    """
    train_clients, test_clients = read_leaf_split(train), read_leaf_split(test)
    if num_classes is None:
        labels = [y for _, y in list(train_clients.values()) + list(test_clients.values())]
        num_classes = int(max(float(np.max(y)) for y in labels if len(y))) + 1
    return from_arrays(
        name,
        train_clients,
        test_clients,
        num_classes,
        image_shape=image_shape,
        source=f"LEAF files {train!s} / {test!s}",
    )
