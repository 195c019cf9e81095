"""The records of a `tff_sql` population parsed: `tf.train.Example`s of `x` and `y` features.

Each record is what `save_to_sql_client_data` writes for an element OrderedDict(x=float32[d],
y=int64): `x` a float vector, `y` an int label (`vector_records`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from tff_clustered.data.federated_data import ClientArrays, DataError


def not_vector_examples(shape: Sequence[int] = ()) -> str:
    """What a record that `vector_records` cannot parse is not (`shape`: its `x`'s, if known)."""
    floats = f"{'x'.join(str(d) for d in shape)} floats" if len(shape) else "floats"
    return f"a record is not a tf.train.Example of x ({floats}) and y (an int64 label)"


def vector_records(blobs: list[bytes]) -> ClientArrays:
    """`x` (a float vector) and `y` (an int label) of serialized `tf.train.Example`s, the
    records `save_to_sql_client_data` writes for elements OrderedDict(x=float32[d], y=int64).
    A record that cannot be parsed: ValueError (`not_vector_examples`), not the parser's error,
    which quotes the record's bytes (and fails to, when they are not UTF-8)."""
    if not blobs:
        return np.zeros((0, 1), np.float32), np.zeros((0,), np.int64)
    try:
        first = tf.train.Example.FromString(blobs[0]).features.feature
    except DecodeError:
        raise ValueError(not_vector_examples()) from None
    if "x" not in first or "y" not in first:
        raise DataError(f"records have features {sorted(first)}, not x and y")
    width = len(first["x"].float_list.value)
    features = {
        "x": tf.io.FixedLenFeature([width], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
    }
    try:
        parsed = tf.io.parse_example(tf.constant(blobs), features)
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        raise ValueError(not_vector_examples([width])) from None
    return parsed["x"].numpy(), parsed["y"].numpy()
