"""Reader for LEAF / FedProx JSON: `{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`, one or many files per split.

LEAF writes `data/train/*.json` and `data/test/*.json`; a user's examples may be spread over
several files of one split (they are concatenated in file-name order).
"""

from __future__ import annotations

import collections
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


NUMBER_TYPES = frozenset({int, float})


def non_number_types(values: list) -> list[str]:
    """Names of the types in `values` other than JSON numbers (bool is not a number here)."""
    return sorted(t.__name__ for t in set(map(type, values)) - NUMBER_TYPES)


def numeric_inputs(x: list) -> np.ndarray:
    """A user's `x`: a list of equally long lists of JSON numbers (no strings, booleans or
    nulls, which NumPy would silently convert) -> float32 array."""
    if not isinstance(x, list):
        raise ValueError(f"'x' must be a list of examples, got {type(x).__name__}")
    length = None
    for i, row in enumerate(x):
        if not isinstance(row, list):
            raise ValueError(f"example {i} must be a list of numbers, got {type(row).__name__}")
        bad = non_number_types(row)
        if bad:
            raise ValueError(f"example {i} holds {', '.join(bad)} values where numbers belong")
        if length is None:
            length = len(row)
        elif len(row) != length:
            raise ValueError(f"example {i} has {len(row)} features, example 0 has {length}")
    return np.asarray(x, dtype=np.float32).reshape(len(x), length or 0)


def check_labels(y: object, num_classes: Optional[int]) -> np.ndarray:
    """A user's `y`: a list of whole, non-negative JSON numbers below `num_classes` if given."""
    if not isinstance(y, list):
        raise ValueError(f"'y' must be a list of labels, got {type(y).__name__}")
    bad = non_number_types(y)
    if bad:
        raise ValueError(f"labels hold {', '.join(bad)} values where class indices belong")
    labels = np.asarray(y, dtype=np.float64)
    if not np.all(np.isfinite(labels)) or np.any(np.mod(labels, 1) != 0) or np.any(labels < 0):
        raise ValueError("labels must be whole non-negative numbers (class indices)")
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise ValueError(
            f"label {int(labels.max())} is outside the {num_classes} classes 0..{num_classes - 1}"
            " (raise --num_classes if the dataset has more)"
        )
    return labels


def leaf_error(path: str, problem: str, fix: str = "re-run LEAF's preprocessing") -> DataError:
    return DataError(f"{path}: {problem}; {fix}".replace("\n", " "))


def read_leaf_file(
    path: str,
    convert_inputs: Callable[[list], np.ndarray] = numeric_inputs,
    num_classes: Optional[int] = None,
) -> dict[str, ClientArrays]:
    """One LEAF JSON file -> {user: (x, y)}, checking the file's own bookkeeping and types.
    `convert_inputs` turns a user's raw `x` list into an array (default: numeric features) and
    raises ValueError on a bad one; labels are checked against `num_classes` when given."""
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except json.JSONDecodeError as e:
        raise leaf_error(
            path,
            f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}): truncated or corrupt",
        ) from e
    except (UnicodeDecodeError, OSError) as e:
        raise leaf_error(path, f"cannot be read as UTF-8 JSON ({e})") from e
    except RecursionError as e:
        raise leaf_error(path, "nested too deeply to be a LEAF file") from e
    if not isinstance(blob, dict) or "user_data" not in blob or "users" not in blob:
        raise leaf_error(
            path, "not a LEAF file: it needs the keys 'users', 'num_samples' and 'user_data'"
        )
    users, user_data = blob["users"], blob["user_data"]
    num_samples = blob.get("num_samples")
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise leaf_error(path, "'users' must be a list of user-name strings")
    if not isinstance(user_data, dict):
        raise leaf_error(
            path, f"'user_data' must be an object by user, got {type(user_data).__name__}"
        )
    duplicates = sorted(u for u, n in collections.Counter(users).items() if n > 1)
    if duplicates:
        raise leaf_error(path, f"user {duplicates[0]!r} is listed twice in 'users'")
    if num_samples is not None:
        if not isinstance(num_samples, list) or not all(
            type(n) is int and n >= 0 for n in num_samples
        ):
            raise leaf_error(path, "'num_samples' must be a list of non-negative whole numbers")
        if len(num_samples) != len(users):
            raise leaf_error(
                path,
                f"{len(users)} users but {len(num_samples)} num_samples entries; the lists must "
                "align",
            )
    clients: dict[str, ClientArrays] = {}
    for i, user in enumerate(users):
        if user not in user_data:
            raise leaf_error(
                path,
                f"user {user!r} is listed in 'users' but has no entry in 'user_data'",
                "remove it from 'users' or restore its data",
            )
        record = user_data[user]
        if not isinstance(record, dict) or "x" not in record or "y" not in record:
            raise leaf_error(path, f"user {user!r} needs both 'x' and 'y' in 'user_data'")
        x, y = record["x"], record["y"]
        try:
            labels = check_labels(y, num_classes)
            inputs = convert_inputs(x)
        except ValueError as e:
            raise leaf_error(path, f"user {user!r}: {e}", "fix or drop this user's examples") from e
        if len(inputs) != len(labels):
            raise leaf_error(
                path,
                f"user {user!r} has {len(inputs)} inputs but {len(labels)} labels",
                "every example needs exactly one label",
            )
        if num_samples is not None and num_samples[i] != len(labels):
            raise leaf_error(
                path,
                f"user {user!r} has num_samples={num_samples[i]} but {len(labels)} examples",
                "fix num_samples or the data",
            )
        if inputs.dtype.kind == "f" and not np.all(np.isfinite(inputs)):
            raise leaf_error(path, f"user {user!r} has NaN or infinite inputs", "clean the data")
        clients[user] = (inputs, labels)
    return clients


def read_leaf_split(
    paths: Union[PathLike, Sequence[PathLike]],
    convert_inputs: Callable[[list], np.ndarray] = numeric_inputs,
    num_classes: Optional[int] = None,
) -> dict[str, ClientArrays]:
    """All files of one split, users merged (a user's parts concatenated in file order)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    merged: dict[str, list[ClientArrays]] = {}
    for path in paths:
        for file in leaf_json_files(path):
            for user, arrays in read_leaf_file(file, convert_inputs, num_classes).items():
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
    train_clients = read_leaf_split(train, num_classes=num_classes)
    test_clients = read_leaf_split(test, num_classes=num_classes)
    if num_classes is None:
        labels = [y for _, y in list(train_clients.values()) + list(test_clients.values())]
        if not any(len(y) for y in labels):
            raise DataError(f"LEAF files {train!s} / {test!s} hold no examples; check --data_dir")
        num_classes = int(max(float(np.max(y)) for y in labels if len(y))) + 1
    return from_arrays(
        name,
        train_clients,
        test_clients,
        num_classes,
        image_shape=image_shape,
        source=f"LEAF files {train!s} / {test!s}",
    )
