"""Sent140 in FedGroup's setup (spec A.12): LEAF JSON of tweets by user, plus GloVe vectors.

Each tweet's text (raw field 4) is split with the regex `[\\w']+|[.,!?;]` (no lower-casing);
the first 25 tokens are looked up in the GloVe table; out-of-vocabulary tokens and the right
padding are zero vectors (the extra all-zero row of the spec). Labels: '4'/1 positive, '0'/0
negative. The lookup happens here, on the data side: the embedding is frozen, so this is the
same function as a frozen Embedding layer, without shipping the table inside computations.
"""

from __future__ import annotations

import os
import re

import numpy as np

from tff_clustered.data.federated_data import DataError, FederatedData, from_arrays
from tff_clustered.data.leaf import read_leaf_split

TOKEN_PATTERN = re.compile(r"[\w']+|[.,!?;]")
SEQUENCE_LENGTH = 25
TEXT_FIELD = 4
GLOVE_HELP = (
    "download GloVe 6B (glove.6B.300d.txt, https://nlp.stanford.edu/projects/glove/) and pass "
    "its path with --glove_path"
)


def tokenize(text: str, length: int = SEQUENCE_LENGTH) -> list[str]:
    return TOKEN_PATTERN.findall(text)[:length]


def tweet_text(raw: object) -> str:
    """The text of one LEAF Sent140 example: field 4 of the raw row (or the string itself)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (list, tuple)) and len(raw) > TEXT_FIELD:
        return str(raw[TEXT_FIELD])
    raise DataError(
        f"a Sent140 example must be a raw row with the text at field 4, got {raw!r:.80}"
    )


def read_glove(path: str, vocabulary: set[str]) -> dict[str, np.ndarray]:
    """Vectors of the words in `vocabulary`, streaming the (large) GloVe text file once."""
    if not path or not os.path.isfile(path):
        raise DataError(f"GloVe file {path!r} not found; {GLOVE_HELP}")
    vectors: dict[str, np.ndarray] = {}
    dim = None
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            word, _, rest = line.rstrip("\n").partition(" ")
            if dim is None:
                dim = len(rest.split())
            if word in vocabulary:
                values = np.asarray(rest.split(), dtype=np.float32)
                if len(values) != dim:
                    raise DataError(
                        f"{path}, line {line_number}: {len(values)} values, expected {dim}; "
                        "the GloVe file is corrupt"
                    )
                vectors[word] = values
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
            lambda rows: (
                np.asarray([tokenize(tweet_text(r), sequence_length) for r in rows], object)
                if rows
                else np.zeros((0,), object)
            ),
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

    def labels(y: np.ndarray) -> np.ndarray:
        return np.where(y == 4, 1, y)

    arrays = {
        name: {user: (embed(x), labels(y)) for user, (x, y) in split.items()}
        for name, split in splits.items()
    }
    return from_arrays(
        "sent140", arrays["train"], arrays["test"], 2, source=f"LEAF Sent140 files in {data_dir}"
    )
