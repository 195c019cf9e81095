"""Sent140's tweets as LEAF stores them, turned into tokens.

Sent140's tweets as LEAF stores them, turned into tokens: the raw row's text field, split
with the regex `[\\w']+|[.,!?;]` (no lower-casing) and cut at `SEQUENCE_LENGTH` tokens. Shared
by the GloVe reader (`sent140.py`) and LEAF's word ids (`leaf_examples.py`)."""

from __future__ import annotations

import re

import numpy as np

TOKEN_PATTERN = re.compile(r"[\w']+|[.,!?;]")
SEQUENCE_LENGTH = 25
TEXT_FIELD = 4
RAW_LABELS = (0, 1, 4)  # negative, positive (LEAF's 0/1 or the raw 0/4)


def tokenize(text: str, length: int = SEQUENCE_LENGTH) -> list[str]:
    return TOKEN_PATTERN.findall(text)[:length]


def tweet_text(raw: object) -> str:
    """The text of one LEAF Sent140 example: field 4 of the raw row (or the string itself)."""
    if isinstance(raw, str):
        return raw
    if (
        isinstance(raw, (list, tuple))
        and len(raw) > TEXT_FIELD
        and isinstance(raw[TEXT_FIELD], str)
    ):
        return raw[TEXT_FIELD]
    raise ValueError(
        f"a Sent140 example must be a raw row with the text (a string) at field 4, got {raw!r:.60}"
    )


def tokenized_tweets(rows: object, sequence_length: int = SEQUENCE_LENGTH) -> np.ndarray:
    """A user's raw `x` rows -> an object array of token lists (ValueError on a bad row)."""
    if not isinstance(rows, list):
        raise ValueError(f"'x' must be a list of raw tweet rows, got {type(rows).__name__}")
    out = np.empty(len(rows), object)
    for i, row in enumerate(rows):
        out[i] = tokenize(tweet_text(row), sequence_length)
    return out
