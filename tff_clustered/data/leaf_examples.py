"""What a LEAF user's examples are (`ExampleKind`), and their conversion from JSON to arrays.

What a LEAF user's examples are, read from the data, one kind per dataset (`ExampleKind`),
and their conversion from LEAF's JSON to arrays:

- numeric features: `x` rows of JSON numbers, `y` class indices (FEMNIST, Synthetic, ...);
- LEAF's Shakespeare: `x` strings of one fixed length (LEAF's 80 characters), `y` the one
  character after each. Characters become ids in LEAF's own 80-character vocabulary
  (`LEAF_CHARACTERS`), any other character id 80: 81 classes, and the inputs are those ids
  (`FederatedData.vocabulary_size`) for `--model=char_lstm`, as `tff_shakespeare` feeds it;
- LEAF's Sent140 without GloVe: `x` raw rows `[id, date, query, user, text]`, `y` 0/1. The
  text is cut into LEAF's tokens (`sent140.tokenize`: its regex, the first 25); each token is
  its id in a vocabulary of the training split's tokens, most frequent first (ties in string
  order), and tokens the training split lacks and the padding after a short tweet share the
  last id, as LEAF's `line_to_indices` pads with its unknown id (`word_vocabulary`,
  `word_ids`). `--model=char_lstm` embeds these ids as it embeds characters
  (`--dataset=sent140` looks the tokens up in GloVe).

A bad user's examples are a ValueError naming the problem; the reader (`leaf.py`) adds the
file and the user.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Sequence
from typing import Callable, Optional, Union

import numpy as np

from tff_clustered.data.federated_data import ClientArrays
from tff_clustered.data.tff_datasets import character_ids
from tff_clustered.data.tweets import RAW_LABELS, tokenized_tweets

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


def numeric_inputs(x: Union[list, np.ndarray]) -> np.ndarray:
    """A user's `x`: a list of equally long, non-empty lists of JSON numbers (no strings,
    booleans or nulls, which NumPy would silently convert) -> float32 array. An array is
    returned as it is: `leaf_numeric_json` made it from such rows."""
    if isinstance(x, np.ndarray):
        return x

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
    return class_indices(as_float_array(y, np.float64, "labels"), num_classes)


def class_indices(labels: np.ndarray, num_classes: Optional[int]) -> np.ndarray:
    """`labels` as they are, checked: whole non-negative numbers below `num_classes` if given
    (ValueError naming the first problem)."""
    if not np.all(np.isfinite(labels)) or np.any(np.mod(labels, 1) != 0) or np.any(labels < 0):
        raise ValueError("labels must be whole non-negative numbers (class indices)")
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise ValueError(
            f"label {int(labels.max())} is outside the {num_classes} classes 0..{num_classes - 1}"
            " (raise --num_classes if the dataset has more)"
        )
    return labels


def finite_inputs(inputs: np.ndarray) -> bool:
    """Whether `inputs` hold no NaN or infinity (integer inputs always do)."""
    return inputs.dtype.kind != "f" or bool(np.all(np.isfinite(inputs)))


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
    return tokenized_tweets(x)


def sent140_labels(y: object) -> np.ndarray:
    """A user's Sent140 `y`: 0 negative, 1 (or the raw 4) positive -> 0/1."""
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
    text) a tweet, anything else numeric features (checked as such; an array is numeric
    features read by `leaf_numeric_json`)."""
    if isinstance(x, np.ndarray):
        return ExampleKind.FEATURES if len(x) else None
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
