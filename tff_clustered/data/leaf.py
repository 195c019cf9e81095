"""Reader for LEAF / FedProx JSON: `{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`, one or many files per split.

LEAF writes `data/train/*.json` and `data/test/*.json`; a user's examples may be spread over
several files of one split (they are concatenated in file-name order; a part without examples
adds nothing).

What the examples are is read from the data, one kind per dataset (`ExampleKind`):

- numeric features: `x` rows of JSON numbers, `y` class indices (FEMNIST, Synthetic, ...);
- LEAF's Shakespeare: `x` strings of one fixed length (LEAF's 80 characters), `y` the one
  character after each. Characters become ids in LEAF's own 80-character vocabulary
  (`LEAF_CHARACTERS`), any other character id 80: 81 classes, and the inputs are those ids
  (`FederatedData.vocabulary_size`) for `--model=char_lstm`, as `tff_shakespeare` feeds it;
- LEAF's Sent140 without GloVe: `x` raw rows `[id, date, query, user, text]`, `y` 0/1. The
  text is cut into LEAF's tokens (`sent140.tokenize`: its regex, the first 25); each token is
  its id in a vocabulary of the training split's tokens, most frequent first (ties in string
  order), and tokens the training split lacks and the padding after a short tweet share the
  last id, as LEAF's `line_to_indices` pads with its unknown id. `--model=char_lstm` embeds
  these ids as it embeds characters (`--dataset=sent140` looks the tokens up in GloVe).

`num_samples` is LEAF's own count of a user's examples in the file, checked against the
examples present, except that LEAF's Shakespeare split (`data/utils/split_data.py`) counts the
79 windows it skips between a user's train and test text in the test file: for character
windows a `num_samples` above the examples present is accepted, and the examples present are
used.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import os
from collections.abc import Iterable, Sequence
from typing import Callable, Optional, Union

import numpy as np

from tff_clustered.data.federated_data import ClientArrays, DataError, FederatedData, from_arrays
from tff_clustered.data.tff_datasets import character_ids

PathLike = Union[str, os.PathLike]

# LEAF's Shakespeare vocabulary, in its order (`ALL_LETTERS` of LEAF's
# models/utils/language_utils.py); any other character gets id len(LEAF_CHARACTERS).
LEAF_CHARACTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
SENT140_ROW_FIELDS = 5  # LEAF's raw row: id, date, query, user, text


class ExampleKind(enum.Enum):
    """What a LEAF dataset's examples are; the value names them in errors."""

    FEATURES = "numeric features"
    CHARACTERS = "Shakespeare character windows"
    TWEETS = "Sent140 tweet rows"


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


def leaf_split_files(data_dir: PathLike) -> list[str]:
    """The JSON files `load_leaf` reads from a LEAF data/ folder: train/'s, then test/'s."""
    return [
        file
        for split in ("train", "test")
        for file in leaf_json_files(os.path.join(data_dir, split))
    ]


NUMBER_TYPES = frozenset({int, float})


def non_number_types(values: list) -> list[str]:
    """Names of the types in `values` other than JSON numbers (bool is not a number here)."""
    return sorted(t.__name__ for t in set(map(type, values)) - NUMBER_TYPES)


def as_float_array(values: list, dtype: type, what: str) -> np.ndarray:
    """`values` (JSON numbers) as an array; a whole number too long for a float (JSON allows
    any number of digits) is a ValueError naming `what`, not NumPy's OverflowError."""
    try:
        return np.asarray(values, dtype=dtype)
    except OverflowError as e:
        raise ValueError(f"{what} hold a whole number too large for a float ({e})") from e


def numeric_inputs(x: list) -> np.ndarray:
    """A user's `x`: a list of equally long, non-empty lists of JSON numbers (no strings,
    booleans or nulls, which NumPy would silently convert) -> float32 array."""

    def numbers(i: int, row: object) -> int:
        if not isinstance(row, list):
            raise ValueError(f"example {i} must be a list of numbers, got {type(row).__name__}")
        bad = non_number_types(row)
        if bad:
            raise ValueError(f"example {i} holds {', '.join(bad)} values where numbers belong")
        return len(row)

    length = equal_length_rows(
        x,
        "examples",
        numbers,
        "features",
        "example 0 has 0 features; every example needs at least one number",
    )
    return as_float_array(x, np.float32, "inputs").reshape(len(x), length)


def equal_length_rows(
    x: object, rows: str, row_length: Callable[[int, object], int], unit: str, empty: str
) -> int:
    """The one length of `x`'s rows (`x` a list of `rows`, each measured in `unit` by
    `row_length(i, row)`, which refuses a malformed row); `empty`: the error for 0."""
    if not isinstance(x, list):
        raise ValueError(f"'x' must be a list of {rows}, got {type(x).__name__}")
    length = None
    for i, row in enumerate(x):
        size = row_length(i, row)
        if length is None:
            length = size
            if length == 0:
                raise ValueError(empty)
        elif size != length:
            raise ValueError(f"example {i} has {size} {unit}, example 0 has {length}")
    return length or 0


def check_labels(y: object, num_classes: Optional[int]) -> np.ndarray:
    """A user's `y`: a list of whole, non-negative JSON numbers below `num_classes` if given."""
    if not isinstance(y, list):
        raise ValueError(f"'y' must be a list of labels, got {type(y).__name__}")
    bad = non_number_types(y)
    if bad:
        raise ValueError(f"labels hold {', '.join(bad)} values where class indices belong")
    labels = as_float_array(y, np.float64, "labels")
    if not np.all(np.isfinite(labels)) or np.any(np.mod(labels, 1) != 0) or np.any(labels < 0):
        raise ValueError("labels must be whole non-negative numbers (class indices)")
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise ValueError(
            f"label {int(labels.max())} is outside the {num_classes} classes 0..{num_classes - 1}"
            " (raise --num_classes if the dataset has more)"
        )
    return labels


def character_windows(x: object) -> np.ndarray:
    """A user's Shakespeare `x`: equally long, non-empty strings -> their characters' ids in
    `LEAF_CHARACTERS` (float32, one row per string)."""

    def characters(i: int, window: object) -> int:
        if not isinstance(window, str):
            raise ValueError(
                f"example {i} must be a string of characters (a Shakespeare window), got "
                f"{type(window).__name__}"
            )
        return len(window)

    length = equal_length_rows(
        x,
        "character windows",
        characters,
        "characters",
        "example 0 is an empty string; a window needs characters (LEAF's hold 80)",
    )
    ids = character_ids("".join(x), LEAF_CHARACTERS)
    return ids.reshape(len(x), length).astype(np.float32)


def next_characters(y: object) -> np.ndarray:
    """A user's Shakespeare `y`: one-character strings -> their ids in `LEAF_CHARACTERS`."""
    if not isinstance(y, list):
        raise ValueError(f"'y' must be a list of next characters, got {type(y).__name__}")
    for i, label in enumerate(y):
        if not isinstance(label, str) or len(label) != 1:
            raise ValueError(
                f"label {i} is {label!r:.20}; a Shakespeare label is the one character after "
                "its window"
            )
    return character_ids("".join(y), LEAF_CHARACTERS).astype(np.int64)


def tweet_tokens(x: object) -> np.ndarray:
    """A user's Sent140 `x`: raw rows -> an object array of token lists (`sent140`'s)."""
    from tff_clustered.data.sent140 import tokenized_tweets  # sent140 imports this module

    return tokenized_tweets(x)


def sent140_labels(y: object) -> np.ndarray:
    """A user's Sent140 `y`: 0 negative, 1 (or the raw 4) positive -> 0/1."""
    from tff_clustered.data.sent140 import RAW_LABELS  # sent140 imports this module

    labels = check_labels(y, None)
    odd = sorted(set(np.unique(labels).tolist()) - set(RAW_LABELS))
    if odd:
        raise ValueError(
            f"label {odd[0]:g} is not a Sent140 label: 0 (negative) and 1 or 4 (positive)"
        )
    return np.where(labels == 4, 1, labels)


def example_kind(x: object) -> Optional[ExampleKind]:
    """The kind of a user's examples, from its first one (None: no example to tell by): a
    string is a Shakespeare window, a row of LEAF's 5 Sent140 strings (id, date, query, user,
    text) a tweet, anything else numeric features (checked as such)."""
    if not isinstance(x, list) or not x:
        return None
    first = x[0]
    if isinstance(first, str):
        return ExampleKind.CHARACTERS
    if (
        isinstance(first, list)
        and len(first) == SENT140_ROW_FIELDS
        and all(isinstance(field, str) for field in first)
    ):
        return ExampleKind.TWEETS
    return ExampleKind.FEATURES


def converted_examples(
    kind: ExampleKind, x: object, y: object, num_classes: Optional[int]
) -> ClientArrays:
    """A user's raw `x`, `y` as arrays of `kind` (ValueError on a bad one)."""
    if kind is ExampleKind.CHARACTERS:
        return character_windows(x), next_characters(y)
    if kind is ExampleKind.TWEETS:
        return tweet_tokens(x), sent140_labels(y)
    labels = check_labels(y, num_classes)
    return numeric_inputs(x), labels


@dataclasses.dataclass(frozen=True)
class LeafExamples:
    """The users' examples of a file or split, the kind they are (None: none to tell by, or
    inputs converted by the caller's function) and the file that kind was read from."""

    clients: dict[str, ClientArrays]
    kind: Optional[ExampleKind]
    source: str


def leaf_error(path: str, problem: str, fix: str = "re-run LEAF's preprocessing") -> DataError:
    return DataError(f"{path}: {problem}; {fix}".replace("\n", " "))


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
    except ValueError as e:  # Python's limit on the digits of a whole number
        raise leaf_error(path, f"holds a number that cannot be read ({e})") from e
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
        if inputs.dtype.kind == "f" and not np.all(np.isfinite(inputs)):
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
) -> LeafExamples:
    """All files of one split, users merged in file order (`merged_user`), one kind."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = [
        read_leaf_examples(file, convert_inputs, num_classes)
        for path in paths
        for file in leaf_json_files(path)
    ]
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


def word_vocabulary(token_lists: Iterable[Sequence[str]]) -> dict[str, int]:
    """Each token's id: most frequent first, ties in string order (the same on every run)."""
    counts = collections.Counter(token for tokens in token_lists for token in tokens)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return {token: i for i, (token, _) in enumerate(ordered)}


def word_ids(token_lists: np.ndarray, vocabulary: dict[str, int], length: int) -> np.ndarray:
    """Token lists -> (n, length) ids as float32; unknown tokens and the padding after a
    short list are len(vocabulary)."""
    unknown = len(vocabulary)
    out = np.full((len(token_lists), length), unknown, np.float32)
    for i, tokens in enumerate(token_lists):
        out[i, : len(tokens)] = [vocabulary.get(token, unknown) for token in tokens[:length]]
    return out


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
    """
    splits = {
        split: read_leaf_split_examples(paths, num_classes=num_classes)
        for split, paths in (("train", train), ("test", test))
    }
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
        from tff_clustered.data.sent140 import SEQUENCE_LENGTH

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
