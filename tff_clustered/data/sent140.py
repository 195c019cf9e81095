"""Sent140 in FedGroup's setup: LEAF JSON of tweets by user, plus GloVe vectors.

Each tweet's text (raw field 4) is split with the regex `[\\w']+|[.,!?;]` (no lower-casing);
the first 25 tokens are looked up in the GloVe table; out-of-vocabulary tokens and the right
padding are zero vectors (an all-zero row after GloVe's 400,000). Labels: '4'/1 positive, '0'/0
negative. The lookup happens here, on the data side: the embedding is frozen, so this is the
same function as a frozen Embedding layer, without shipping the table inside computations.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import DataError, FederatedData, first_line, from_arrays
from tff_clustered.data.leaf import read_leaf_split
from tff_clustered.data.tweets import RAW_LABELS, SEQUENCE_LENGTH, tokenized_tweets

GLOVE_HELP = (
    "download GloVe 6B (glove.6B.300d.txt, https://nlp.stanford.edu/projects/glove/) and pass "
    "its path with --glove_path (or, without GloVe, --dataset=leaf --model=char_lstm: word ids "
    "from the training split)"
)


def read_glove(
    path: str, vocabulary: set[str], lines: Optional[int] = None
) -> dict[str, np.ndarray]:
    """Vectors of the words in `vocabulary`, streaming the (large) GloVe text file once (its
    first `lines` only, when given: the doctor's check); the first line's vector is checked
    whatever its word, so a file that is not GloVe text is refused."""
    if not path or not os.path.isfile(path):
        raise DataError(f"GloVe file {path!r} not found; {GLOVE_HELP}")
    vectors: dict[str, np.ndarray] = {}
    dim = None
    named = re.search(r"\.(\d+)d\.txt$", os.path.basename(path))  # glove.6B.300d.txt
    named_dim = int(named.group(1)) if named else None
    line_number = 1  # the line being read, for the error message
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                word, _, rest = line.rstrip("\n").partition(" ")
                if dim is None:
                    dim = len(rest.split())
                    if dim == 0:
                        raise ValueError("no vector after the first word")
                    if named_dim is not None and dim != named_dim:
                        raise ValueError(f"{dim} values where the file name says {named_dim}")
                if word in vocabulary or line_number == 1:
                    values = np.asarray(rest.split(), dtype=np.float32)
                    if len(values) != dim:
                        raise ValueError(f"{len(values)} values, expected {dim}")
                    if not np.all(np.isfinite(values)):
                        raise ValueError("NaN or infinite values")
                    vectors[word] = values
                line_number += 1
                if lines is not None and line_number > lines:
                    break
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
        message = first_line(e)
        raise DataError(
            f"{path}, line {line_number}: {message}; the GloVe file is "
            f"corrupt or not GloVe text, {GLOVE_HELP}"
        ) from e
    if dim is None:
        raise DataError(f"GloVe file {path} is empty; {GLOVE_HELP}")
    vectors[""] = np.zeros(dim, np.float32)  # marks the dimension even with no hit
    return vectors


def load_sent140(
    data_dir: str, glove_path: str, sequence_length: int = SEQUENCE_LENGTH
) -> FederatedData:
    """LEAF `data_dir/train`, `data_dir/test` and a GloVe file -> (25, dim) embedded inputs."""
    splits = {
        name: read_leaf_split(
            os.path.join(data_dir, name),
            lambda rows: tokenized_tweets(rows, sequence_length),
            num_classes=5,  # raw Sent140 labels are 0 / 4 (or 0 / 1), mapped to 0 / 1 below
        )
        for name in ("train", "test")
    }
    vocabulary = {
        t for split in splits.values() for x, _ in split.values() for tokens in x for t in tokens
    }
    vectors = read_glove(glove_path, vocabulary)
    dim = len(vectors[""])
    zero = vectors[""]

    def embed(token_lists: np.ndarray) -> np.ndarray:
        out = np.zeros((len(token_lists), sequence_length, dim), np.float32)
        for i, tokens in enumerate(token_lists):
            for j, token in enumerate(tokens):
                out[i, j] = vectors.get(token, zero)
        return out

    for name, split in splits.items():
        for user, (_, y) in split.items():
            odd = sorted(set(np.unique(y).tolist()) - set(RAW_LABELS))
            if odd:
                raise DataError(
                    f"{os.path.join(data_dir, name)}: user {user!r} has label {odd[0]:g}; "
                    "Sent140 labels are 0 (negative) and 4 or 1 (positive), fix the labels"
                )

    def labels(y: np.ndarray) -> np.ndarray:
        return np.where(y == 4, 1, y)

    arrays = {
        name: {user: (embed(x), labels(y)) for user, (x, y) in split.items()}
        for name, split in splits.items()
    }
    return from_arrays(
        "sent140",
        arrays["train"],
        arrays["test"],
        2,
        source=f"LEAF Sent140 files {os.path.join(data_dir, 'train')} / "
        f"{os.path.join(data_dir, 'test')}",
    )
