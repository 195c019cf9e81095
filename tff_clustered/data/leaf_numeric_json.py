"""LEAF JSON of numeric examples, read by simdjson straight into NumPy.

Making a Python number of every input value is most of a LEAF file's first read: orjson spends
about 1.3 s of a 2 s read of FEMNIST's 77 MB training file in its parser, and the arrays are
made from its lists after that. simdjson parses the file into its own tape and hands each
user's `x` over as one buffer of doubles (`Array.as_buffer`), so no Python number is made for an
input value (the same file: about 0.5 s).

This reader vouches only for what it reads exactly as the reference reader
(`leaf.parsed_json`: orjson, the standard library behind it) would, and refuses everything else
with `NotNumericRows`, after which the file is read by the reference reader, which gives its own
values or its own error. It reads a file whose every user's `x` is empty or rows of JSON numbers,
all of one length, in objects without a repeated key. It refuses:

- whatever simdjson refuses: invalid JSON, NaN or Infinity, a whole number beyond 64 bits, a
  number beyond a double's range, bytes that are not UTF-8;
- strings, booleans, nulls or lists where a row's numbers belong, and ragged or empty rows;
- Shakespeare's and Sent140's examples;
- a `[` inside a string, which the check that no row holds a list (a count of the file's `[`)
  cannot tell from a list;
- a file whose users, looked up one by one, would scan more keys than it has bytes
  (`too_many_users`). simdjson finds an object's value by scanning its keys from the first
  (`Object.__getitem__`), and its only iterators over values convert them whole into Python
  values, so looking up each of N users scans N^2/2 keys: 100,000 users took a minute. Within
  the bound the scans cost about as much as simdjson's parse at most (LEAF's files hold a few
  hundred users in megabytes); beyond it the reference reader's linear read is the faster.

The values are the same bit for bit: simdjson rounds each decimal to the nearest double as
orjson does, a whole number becomes the double Python's `float(int)` gives (which is how NumPy
converts orjson's ints), and the double is rounded to float32 as NumPy rounds orjson's floats.
Everything but the inputs (`users`, `num_samples`, each `y`, any other key) is the same Python
value the reference reader gives, so the checks after it (`leaf.read_leaf_examples`) raise the
same errors.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import simdjson

Node = Union[simdjson.Object, simdjson.Array, str, int, float, bool, None]


class NotNumericRows(Exception):
    """A file this reader does not vouch for (see the module docstring): read it with the
    reference reader."""


def plain(node: Node) -> object:
    """`node` as the Python value the reference reader gives (a later duplicate key wins, as
    in orjson and the standard library)."""
    if isinstance(node, simdjson.Object):
        return node.as_dict()
    if isinstance(node, simdjson.Array):
        return node.as_list()
    return node


def unique_keys(node: simdjson.Object) -> list[str]:
    """The keys of `node`; NotNumericRows when one repeats (simdjson's lookup finds the first,
    the reference reader keeps the last)."""
    keys = list(node.keys())
    if len(set(keys)) != len(keys):
        raise NotNumericRows("a repeated key")
    return keys


def list_count(value: object) -> int:
    """How many JSON lists the Python value `value` holds, itself included."""
    if isinstance(value, list):
        return 1 + sum(list_count(item) for item in value)
    if isinstance(value, dict):
        return sum(list_count(item) for item in value.values())
    return 0


def numeric_rows(x: Node) -> Union[np.ndarray, list]:
    """A user's `x`: rows of JSON numbers of one length -> float32 (rows, length); an empty list
    stays as it is. Rows holding lists are caught by the caller's count of `[`."""
    if not isinstance(x, simdjson.Array):
        raise NotNumericRows("'x' is not a list")
    if len(x) == 0:
        return []
    lengths = {len(row) if isinstance(row, simdjson.Array) else -1 for row in x}
    (length,) = lengths if len(lengths) == 1 else (-1,)
    if length < 1:
        raise NotNumericRows("rows that are not lists of one length")
    try:
        values = np.frombuffer(x.as_buffer(of_type="d"), np.float64)
    except TypeError as e:  # a string, boolean or null among the numbers
        raise NotNumericRows(str(e)) from e
    if values.size != len(x) * length:
        raise NotNumericRows("rows that hold lists")
    return values.astype(np.float32).reshape(len(x), length)


def too_many_users(users: int, size: int) -> bool:
    """Whether looking each of `users` users up in a file of `size` bytes would scan more
    keys (users^2 / 2) than the file has bytes."""
    return users * users > 2 * size


def numeric_leaf_json(data: bytes) -> dict:
    """The JSON object of a LEAF file's bytes `data` as the reference reader gives it, except
    that each user's non-empty `x` is already its float32 array (examples, features);
    NotNumericRows for a file this reader does not vouch for."""
    try:
        document = simdjson.Parser().parse(data)
    except (ValueError, RuntimeError) as e:  # UnicodeDecodeError is a ValueError
        raise NotNumericRows(str(e)) from e
    if not isinstance(document, simdjson.Object):
        raise NotNumericRows("not a JSON object")
    keys = unique_keys(document)
    blob = {key: plain(document[key]) for key in keys if key != "user_data"}
    lists = list_count(blob)
    if "user_data" in keys:
        user_data = document["user_data"]
        if not isinstance(user_data, simdjson.Object):
            raise NotNumericRows("'user_data' is not an object")
        if too_many_users(len(user_data), len(data)):
            raise NotNumericRows("more users than a linear read by key allows")
        blob["user_data"] = {user: user_record(user_data[user]) for user in unique_keys(user_data)}
        lists += sum(
            list_count(record)
            + (1 + len(record["x"]) if isinstance(record.get("x"), np.ndarray) else 0)
            for record in blob["user_data"].values()
        )
    if data.count(b"[") != lists:
        raise NotNumericRows("a row that holds a list, or a '[' inside a string")
    return blob


def user_record(record: Node) -> dict:
    """A user's record with its `x` read by `numeric_rows`, the rest as plain values."""
    if not isinstance(record, simdjson.Object):
        raise NotNumericRows("a user's record is not an object")
    return {
        key: numeric_rows(record[key]) if key == "x" else plain(record[key])
        for key in unique_keys(record)
    }
