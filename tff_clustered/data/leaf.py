"""Reader for LEAF / FedProx JSON files: each user's examples, the files' bookkeeping checked.

Reader for LEAF / FedProx JSON: `{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`, one or many files per split.

LEAF writes `data/train/*.json` and `data/test/*.json`; a user's examples may be spread over
several files of one split (they are concatenated in file-name order; a part without examples
adds nothing).

What the examples are (numeric features, Shakespeare character windows or Sent140 tweet rows)
is read from the data, one kind per dataset (`leaf_examples.py`).

`num_samples` is LEAF's own count of a user's examples in the file, checked against the
examples present, except that LEAF's Shakespeare split (`data/utils/split_data.py`) counts the
79 windows it skips between a user's train and test text in the test file: for character
windows a `num_samples` above the examples present is accepted, and the examples present are
used.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import stat
from collections.abc import Iterable, Sequence
from typing import Callable, Optional, Union

import numpy as np
import orjson

from tff_clustered.data import leaf_cache
from tff_clustered.data.federated_data import ClientArrays, DataError, FederatedData, from_arrays
from tff_clustered.data.leaf_examples import (
    LEAF_CHARACTERS,
    ExampleKind,
    check_labels,
    converted_examples,
    example_kind,
    finite_inputs,
    word_ids,
    word_vocabulary,
)
from tff_clustered.data.leaf_numeric_json import NotNumericRows, numeric_leaf_json
from tff_clustered.data.tweets import SEQUENCE_LENGTH

PathLike = Union[str, os.PathLike]


def leaf_json_files(path: PathLike) -> list[str]:
    """The JSON files of one split: `path` itself, or every `*.json` in the directory; each a
    regular file (`regular_file`)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        try:
            names = os.listdir(path)
        except OSError as e:
            fix = "make it readable (chmod u+rx) by the user running this"
            raise leaf_error(path, f"cannot be listed ({e.strerror})", fix) from e
        files = sorted(os.path.join(path, f) for f in names if f.endswith(".json"))
        if not files:
            raise DataError(
                f"no *.json file in {path}; LEAF writes them to data/train/ and data/test/ "
                "(run LEAF's preprocess.sh, then point --data_dir at the folder holding train/ "
                "and test/)"
            )
    elif os.path.lexists(path):
        regular_file(path, "point --data_dir at a LEAF data/ folder of train/ and test/ files")
        return [path]
    else:
        raise DataError(
            f"{path} does not exist; download and preprocess the dataset with LEAF "
            "(https://github.com/TalwalkarLab/leaf) and point --data_dir at its data/ folder"
        )
    for file in files:
        regular_file(
            file, "move it out of the split's folder or rename it (every *.json there is read)"
        )
    return files


# What a path that is not a regular file is, by `stat.S_IFMT` of its mode.
FILE_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def regular_file(path: str, fix: str) -> None:
    """DataError unless `path` is a regular file once its symlinks are resolved that this
    process can open: a LEAF file is read whole and hashed, and a folder, a named pipe (read
    forever) or a device is not one; `fix` ends the error."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        problem = f"cannot be opened ({e.strerror}: a broken symlink or a symlink loop?)"
        raise leaf_error(path, problem, fix) from e
    if not stat.S_ISREG(mode):
        kind = FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise leaf_error(path, f"is {kind}, not a LEAF JSON file", fix)
    try:
        open(path, "rb").close()
    except OSError as e:
        fix = f"make it readable (chmod u+r) by the user running this, or {fix}"
        raise leaf_error(path, f"cannot be read ({e.strerror})", fix) from e


def leaf_split_files(data_dir: PathLike) -> list[str]:
    """The JSON files `load_leaf` reads from a LEAF data/ folder: train/'s, then test/'s."""
    return [
        file
        for split in ("train", "test")
        for file in leaf_json_files(os.path.join(data_dir, split))
    ]


@dataclasses.dataclass(frozen=True)
class LeafExamples:
    """The users' examples of a file or split, the kind they are (None: none to tell by, or
    inputs converted by the caller's function) and the file that kind was read from."""

    clients: dict[str, ClientArrays]
    kind: Optional[ExampleKind]
    source: str
    cached: bool = False  # read from the arrays `leaf_cache` kept


def leaf_error(path: str, problem: str, fix: str = "re-run LEAF's preprocessing") -> DataError:
    return DataError(f"{path}: {problem}; {fix}".replace("\n", " "))


def parsed_json(data: bytes) -> object:
    """The JSON value of a file's bytes `data`, parsed by orjson (several times faster than
    the standard library on LEAF's numbers) into the same values: floats correctly rounded, and
    a whole number below -2**63 or above 2**64, which orjson reads as a float, becomes the same
    float32 / float64 array entry as the standard library's int would. What orjson refuses
    (invalid JSON, NaN, Infinity, numbers beyond a double's range, nesting over 1,024 levels,
    bytes that are not UTF-8) is parsed again by the standard library, which reads it as it
    always did or raises its own error. This is the reference reader: `leaf_numeric_json`
    reads numeric files faster and leaves every other file to it."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8"))


def read_leaf_json(path: str, numeric_rows: bool = False) -> dict:
    """The JSON object of a LEAF file: a file that is not JSON, or not LEAF's object of
    `users`, `num_samples` and `user_data`, is one error naming the file. With `numeric_rows`,
    a file of numeric examples is read by `leaf_numeric_json` (each user's non-empty `x`
    already its float32 array), any other by the reference reader (`parsed_json`)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        blob = None
        if numeric_rows:
            with contextlib.suppress(NotNumericRows):
                blob = numeric_leaf_json(data)
        if blob is None:
            blob = parsed_json(data)
    except json.JSONDecodeError as e:
        raise leaf_error(
            path,
            f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}): truncated or corrupt",
        ) from e
    except (UnicodeDecodeError, OSError) as e:
        raise leaf_error(path, f"cannot be read as UTF-8 JSON ({e})") from e
    except RecursionError as e:
        raise leaf_error(path, "nested too deeply to be a LEAF file") from e
    except ValueError as e:  # Python's limit on the digits of a whole number
        raise leaf_error(path, f"holds a number that cannot be read ({e})") from e
    if not isinstance(blob, dict) or "user_data" not in blob or "users" not in blob:
        raise leaf_error(
            path, "not a LEAF file: it needs the keys 'users', 'num_samples' and 'user_data'"
        )
    return blob


def leaf_lists(path: str, blob: dict) -> tuple[list[str], dict, Optional[list[int]]]:
    """A LEAF file's `users`, `user_data` and `num_samples` (None when absent), their types and
    lengths checked against each other."""
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
    listed = set(users)
    unlisted = next((user for user in user_data if user not in listed), None)
    if unlisted is not None:
        raise leaf_error(
            path,
            f"user {unlisted!r} has data in 'user_data' but is not listed in 'users' (LEAF lists "
            "every user: the file is damaged or edited)",
            "add it to 'users' and 'num_samples', or remove its data",
        )
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
    return users, user_data, num_samples


def read_leaf_examples(
    path: str,
    convert_inputs: Optional[Callable[[list], np.ndarray]] = None,
    num_classes: Optional[int] = None,
) -> LeafExamples:
    """One LEAF JSON file -> its users' examples, checking the file's own bookkeeping and
    types. Without `convert_inputs` the kind of example is read from the file's first user
    with examples (`example_kind`) and every user is converted as that kind; with it, it turns
    a user's raw `x` list into an array (raising ValueError on a bad one) and labels are class
    indices. Labels of numeric examples are checked against `num_classes` when given."""
    users, user_data, num_samples = leaf_lists(
        path, read_leaf_json(path, numeric_rows=convert_inputs is None)
    )
    kind: Optional[ExampleKind] = None
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
        if convert_inputs is None and kind is None:
            kind = example_kind(x)
        try:
            if convert_inputs is not None:
                labels = check_labels(y, num_classes)
                inputs = convert_inputs(x)
            else:
                inputs, labels = converted_examples(kind or ExampleKind.FEATURES, x, y, num_classes)
        except ValueError as e:
            raise leaf_error(path, f"user {user!r}: {e}", "fix or drop this user's examples") from e
        if len(inputs) != len(labels):
            raise leaf_error(
                path,
                f"user {user!r} has {len(inputs)} inputs but {len(labels)} labels",
                "every example needs exactly one label",
            )
        if num_samples is not None and num_samples[i] != len(labels):
            if not (kind is ExampleKind.CHARACTERS and num_samples[i] > len(labels)):
                raise leaf_error(
                    path,
                    f"user {user!r} has num_samples={num_samples[i]} but {len(labels)} examples",
                    "fix num_samples or the data",
                )
        if not finite_inputs(inputs):
            raise leaf_error(path, f"user {user!r} has NaN or infinite inputs", "clean the data")
        clients[user] = (inputs, labels)
    return LeafExamples(clients, kind, path)


def read_leaf_file(
    path: str,
    convert_inputs: Optional[Callable[[list], np.ndarray]] = None,
    num_classes: Optional[int] = None,
) -> dict[str, ClientArrays]:
    """One LEAF JSON file -> {user: (x, y)} (see `read_leaf_examples`)."""
    return read_leaf_examples(path, convert_inputs, num_classes).clients


def one_kind(parts: Iterable[LeafExamples]) -> Optional[LeafExamples]:
    """The first of `parts` whose kind is known, after checking that the others agree: one
    dataset holds one kind of example."""
    first: Optional[LeafExamples] = None
    for part in parts:
        if part.kind is None:
            continue
        if first is None:
            first = part
        elif part.kind is not first.kind:
            raise leaf_error(
                part.source,
                f"holds {part.kind.value} where {first.source} holds {first.kind.value}",
                "point --data_dir at the train/ and test/ folders of one LEAF dataset",
            )
    return first


def merged_user(user: str, parts: list[tuple[str, ClientArrays]]) -> ClientArrays:
    """A user's parts from several files of a split, concatenated; parts without examples add
    nothing, and the others must hold examples of one shape."""
    held = [(path, arrays) for path, arrays in parts if len(arrays[1])] or parts[:1]
    (first_path, (first_x, _)), *rest = held
    for path, (x, _) in rest:
        if x.shape[1:] != first_x.shape[1:]:
            raise leaf_error(
                path,
                f"user {user!r} has examples of shape {x.shape[1:]} here and "
                f"{first_x.shape[1:]} in {first_path}",
                "a user's examples must have one shape in every file",
            )
    if len(held) == 1:
        return held[0][1]
    return (
        np.concatenate([x for _, (x, _) in held]),
        np.concatenate([y for _, (_, y) in held]),
    )


def read_leaf_split_examples(
    paths: Union[PathLike, Sequence[PathLike]],
    convert_inputs: Optional[Callable[[list], np.ndarray]] = None,
    num_classes: Optional[int] = None,
    from_cache: bool = True,
) -> LeafExamples:
    """All files of one split, users merged in file order (`merged_user`), one kind; read
    from the arrays kept beside them when these files were read before (`leaf_cache`), unless
    not `from_cache` (the split is parsed, and kept again)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    names = [file for path in paths for file in leaf_json_files(path)]
    kept = None if convert_inputs is not None else leaf_cache.cache_path(names, num_classes)
    cached = leaf_cache.read_cached(kept, num_classes) if kept and from_cache else None
    if cached is not None:
        clients, kind, source = cached
        return LeafExamples(clients, ExampleKind(kind), source, cached=True)
    split = parsed_split(names, convert_inputs, num_classes)
    if kept and split.kind in (ExampleKind.FEATURES, ExampleKind.CHARACTERS):
        leaf_cache.write_cached(kept, split.clients, split.kind.value, split.source)
    return split


def parsed_split(
    names: Sequence[str],
    convert_inputs: Optional[Callable[[list], np.ndarray]],
    num_classes: Optional[int],
) -> LeafExamples:
    """The files `names` of one split parsed, users merged in file order, one kind."""
    files = [read_leaf_examples(file, convert_inputs, num_classes) for file in names]
    typed = one_kind(files)
    merged: dict[str, list[tuple[str, ClientArrays]]] = {}
    for file in files:
        for user, arrays in file.clients.items():
            merged.setdefault(user, []).append((file.source, arrays))
    return LeafExamples(
        {user: merged_user(user, parts) for user, parts in merged.items()},
        typed.kind if typed else None,
        typed.source if typed else files[0].source,
    )


def read_leaf_split(
    paths: Union[PathLike, Sequence[PathLike]],
    convert_inputs: Optional[Callable[[list], np.ndarray]] = None,
    num_classes: Optional[int] = None,
) -> dict[str, ClientArrays]:
    """All files of one split, users merged (a user's parts concatenated in file order)."""
    return read_leaf_split_examples(paths, convert_inputs, num_classes).clients


def load_leaf(
    train: Union[PathLike, Sequence[PathLike]],
    test: Union[PathLike, Sequence[PathLike]],
    num_classes: Optional[int] = None,
    name: str = "leaf",
    image_shape: Optional[tuple[int, ...]] = None,
) -> FederatedData:
    """LEAF train and test splits as `FederatedData`, their kind of example read from the data
    (see the module docstring).

    Numeric examples: `num_classes` defaults to 1 + the largest label seen; give it explicitly
    when a split may miss the top classes (labels are then checked against it). Shakespeare
    predicts one of 81 characters and Sent140 one of 2 classes, so `num_classes` is refused
    there.

    A split read from the arrays `leaf_cache` kept, whose data then fails a check (the two
    splits' users or shapes disagree: a cache file edited, or written by other code), is
    parsed again from its files (and kept again): an error then is the files' own.
    """
    splits = {
        split: read_leaf_split_examples(paths, num_classes=num_classes)
        for split, paths in (("train", train), ("test", test))
    }
    try:
        return leaf_federation(splits, train, test, num_classes, name, image_shape)
    except DataError:
        if not any(examples.cached for examples in splits.values()):
            raise
    parsed = {
        split: read_leaf_split_examples(paths, num_classes=num_classes, from_cache=False)
        for split, paths in (("train", train), ("test", test))
    }
    return leaf_federation(parsed, train, test, num_classes, name, image_shape)


def leaf_federation(
    splits: dict[str, LeafExamples],
    train: Union[PathLike, Sequence[PathLike]],
    test: Union[PathLike, Sequence[PathLike]],
    num_classes: Optional[int],
    name: str,
    image_shape: Optional[tuple[int, ...]],
) -> FederatedData:
    """`load_leaf`'s federation of the splits read from `train` and `test`."""
    typed = one_kind(splits.values())
    kind = typed.kind if typed else None
    source = f"LEAF files {train!s} / {test!s}"
    if kind is None:
        raise DataError(f"{source} hold no examples; check --data_dir")
    if kind is not ExampleKind.FEATURES and num_classes is not None:
        classes = len(LEAF_CHARACTERS) + 1 if kind is ExampleKind.CHARACTERS else 2
        raise ValueError(
            f"--num_classes={num_classes}: {typed.source} holds {kind.value}, which have "
            f"{classes} classes; leave --num_classes unset"
        )
    clients = {split: examples.clients for split, examples in splits.items()}
    vocabulary_size = None
    if kind is ExampleKind.CHARACTERS:
        num_classes = vocabulary_size = len(LEAF_CHARACTERS) + 1
    elif kind is ExampleKind.TWEETS:
        vocabulary = word_vocabulary(tokens for x, _ in clients["train"].values() for tokens in x)
        clients = {
            split: {
                user: (word_ids(x, vocabulary, SEQUENCE_LENGTH), y)
                for user, (x, y) in users.items()
            }
            for split, users in clients.items()
        }
        num_classes, vocabulary_size = 2, len(vocabulary) + 1
    elif num_classes is None:
        labels = [y for users in clients.values() for _, y in users.values() if len(y)]
        num_classes = 1 + int(max(float(np.max(y)) for y in labels))
    return from_arrays(
        name,
        clients["train"],
        clients["test"],
        num_classes,
        image_shape=image_shape,
        source=source,
        vocabulary_size=vocabulary_size,
    )
