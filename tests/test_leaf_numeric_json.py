"""LEAF JSON read by simdjson straight into arrays (`data/leaf_numeric_json.py`): the same
arrays, bit for bit, as the reference reader (orjson), and every file it cannot vouch for left
to the reference reader, values and errors alike."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
import simdjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tff_clustered.data import leaf, leaf_numeric_json
from tff_clustered.data.federated_data import DataError
from tff_clustered.data.leaf_numeric_json import NotNumericRows, numeric_leaf_json

# Numbers as JSON writes them in every form the grammar allows: whole numbers up to 64 bits
# (beyond 2**53 a float32 is rounded twice, through the double), negative zero both ways,
# exponents either case and sign, subnormal and near-overflow doubles, long decimals.
NUMBER_TEXTS = st.one_of(
    st.integers(-(2**63), 2**64 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda v: f"{v:.9e}"),
    st.sampled_from(
        [
            "-0",
            "-0.0",
            "0",
            "1E+2",
            "1e-2",
            "2.5E-3",
            "5e-324",
            "1.7976931348623157e308",
            "3.4028235e38",
            "3.4028236e38",
            "0.1000000000000000055511151231257827",
            "16777217",
            "9007199254740993",
        ]
    ),
)


@st.composite
def numeric_leaf_text(draw: st.DrawFn) -> str:
    """A LEAF file of numeric rows: users of 0-4 examples, one row length per user, numbers
    in `NUMBER_TEXTS`' forms, spaced as orjson (none), Python's json, or by hand."""
    comma, colon = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n ", " :\t")]))
    users = [f"u{i}" for i in range(draw(st.integers(1, 4)))]
    records, sizes = [], []
    for user in users:
        size, length = draw(st.integers(0, 4)), draw(st.integers(1, 5))
        rows = [
            "[" + comma.join(draw(st.lists(NUMBER_TEXTS, min_size=length, max_size=length))) + "]"
            for _ in range(size)
        ]
        labels = draw(st.lists(st.integers(0, 9), min_size=size, max_size=size))
        records.append(
            f'"{user}"{colon}{{"x"{colon}[{comma.join(rows)}]{comma}"y"{colon}{json.dumps(labels)}}}'
        )
        sizes.append(size)
    return (
        f'{{"users"{colon}{json.dumps(users)}{comma}"num_samples"{colon}{json.dumps(sizes)}'
        f'{comma}"user_data"{colon}{{{comma.join(records)}}}}}'
    )


def reference_inputs(text: str, user: str) -> np.ndarray:
    """A user's inputs as the reference reader makes them: orjson's values, NumPy's float32."""
    x = leaf.parsed_json(text.encode())["user_data"][user]["x"]
    return np.asarray(x, np.float32).reshape(len(x), -1)


@settings(max_examples=150, deadline=None)
@given(numeric_leaf_text())
def test_numeric_rows_are_the_reference_readers_float32_bit_for_bit(text: str) -> None:
    blob = numeric_leaf_json(text.encode())  # never refused: these are all numeric rows
    reference = leaf.parsed_json(text.encode())
    assert blob["users"] == reference["users"]
    assert blob["num_samples"] == reference["num_samples"]
    for user, record in blob["user_data"].items():
        assert record["y"] == reference["user_data"][user]["y"]
        x = record["x"]
        if not reference["user_data"][user]["x"]:
            assert x == []
            continue
        assert isinstance(x, np.ndarray) and x.dtype == np.float32
        expected = reference_inputs(text, user)
        assert x.shape == expected.shape
        assert x.tobytes() == expected.tobytes()


GOOD = (
    '{"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [[1, 2], [3, 4]], "y": [0, 1]}}}'
)

# Each file the numeric reader must leave to the reference reader, with what that reader
# then says (an error naming the problem, or the values it always read).
NOT_NUMERIC = {
    "a string among the numbers": (GOOD.replace("[1, 2]", '[1, "2"]'), "holds str values"),
    "a boolean among the numbers": (GOOD.replace("[1, 2]", "[1, true]"), "holds bool values"),
    "a null among the numbers": (GOOD.replace("[1, 2]", "[1, null]"), "holds NoneType values"),
    "ragged rows": (GOOD.replace("[1, 2]", "[1]"), "example 1 has 2 features"),
    "an empty row": (GOOD.replace("[1, 2]", "[]"), "example 0 has 0 features"),
    "rows holding lists of the same count": (
        GOOD.replace("[[1, 2], [3, 4]]", "[[[1], [2]], [[3], [4]]]"),
        "holds list values",
    ),
    "a flat x": (GOOD.replace("[[1, 2], [3, 4]]", "[1, 2]"), "must be a list of numbers"),
    "NaN": (GOOD.replace("[1, 2]", "[1, NaN]"), "NaN or infinite"),
    "a number beyond a double": (GOOD.replace("[1, 2]", "[1, 1e400]"), "NaN or infinite"),
    "a whole number beyond 64 bits": (
        GOOD.replace("[1, 2]", f"[1, {2**64 + 1}]"),
        None,
    ),
    "invalid JSON": (GOOD[:-3], "not valid JSON"),
    "a repeated x": (GOOD.replace('"y": [0, 1]', '"x": [[5, 6], [7, 8]], "y": [0, 1]'), None),
    "a '[' inside a user name": (GOOD.replace('"a"', '"a["'), None),
    "user_data that is not an object": (
        '{"users": ["a"], "num_samples": [2], "user_data": [[1, 2]]}',
        "must be an object by user",
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_NUMERIC))
def test_files_it_cannot_vouch_for_are_the_reference_readers(case: str) -> None:
    text, error = NOT_NUMERIC[case]
    with pytest.raises(NotNumericRows):
        numeric_leaf_json(text.encode())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "data.json")
        with open(path, "w") as f:
            f.write(text)
        if error is not None:
            with pytest.raises(DataError, match=error):
                leaf.read_leaf_file(path)
            return
        clients = leaf.read_leaf_file(path)
    reference = leaf.parsed_json(text.encode())["user_data"]
    for user, (x, _) in clients.items():
        assert x.tobytes() == np.asarray(reference[user]["x"], np.float32).tobytes()


def test_a_leaf_file_of_numeric_rows_is_read_by_simdjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader a numeric file takes: never the reference one, and the same arrays."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "data.json")
        with open(path, "w") as f:
            f.write(GOOD)
        fast = leaf.read_leaf_file(path)

        def reference_only(data: bytes) -> object:
            raise AssertionError("a numeric file went to the reference reader")

        monkeypatch.setattr(leaf, "parsed_json", reference_only)
        assert leaf.read_leaf_file(path).keys() == fast.keys()
    x, y = fast["a"]
    assert x.dtype == np.float32 and x.tolist() == [[1, 2], [3, 4]] and y.tolist() == [0, 1]


class ScanCounter:
    """simdjson's `Object` and `Array` behind proxies that add up the keys each lookup by key
    scans (simdjson's lookup walks an object's keys from the first until it finds the key)."""

    def __init__(self) -> None:
        self.scanned = 0
        counter = self

        class Object:
            def __init__(self, node: simdjson.Object) -> None:
                self.node = node

            def __getitem__(self, key: str) -> object:
                counter.scanned += list(self.node.keys()).index(key) + 1
                return counter.wrap(self.node[key])

            def __len__(self) -> int:
                return len(self.node)

            def keys(self) -> list[str]:
                return list(self.node.keys())

            def as_dict(self) -> dict:
                return self.node.as_dict()

        class Array:
            def __init__(self, node: simdjson.Array) -> None:
                self.node = node

            def __len__(self) -> int:
                return len(self.node)

            def __iter__(self) -> Iterator[object]:
                return (counter.wrap(item) for item in self.node)

            def as_list(self) -> list:
                return self.node.as_list()

            def as_buffer(self, *, of_type: str) -> object:
                return self.node.as_buffer(of_type=of_type)

        class Parser:
            def parse(self, data: bytes) -> object:
                return counter.wrap(simdjson.Parser().parse(data))

        self.Object, self.Array, self.Parser = Object, Array, Parser

    def wrap(self, node: object) -> object:
        if isinstance(node, simdjson.Object):
            return self.Object(node)
        if isinstance(node, simdjson.Array):
            return self.Array(node)
        return node


@pytest.mark.parametrize("users", [10, 3000])
def test_a_files_users_are_read_in_linear_time(
    users: int, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Reading a LEAF file scans at most as many keys as the file has bytes (simdjson's lookup
    by key scans; looking each of 100,000 users up took a minute), and reads the same arrays."""
    names = [f"u{i}" for i in range(users)]
    text = json.dumps(
        {
            "users": names,
            "num_samples": [1] * users,
            "user_data": {name: {"x": [[i, 0.5]], "y": [i % 3]} for i, name in enumerate(names)},
        }
    )
    path = os.path.join(str(tmp_path), "data.json")
    with open(path, "w") as f:
        f.write(text)
    counter = ScanCounter()
    monkeypatch.setattr(leaf_numeric_json, "simdjson", counter)
    clients = leaf.read_leaf_file(path)
    assert counter.scanned <= len(text)
    reference = leaf.parsed_json(text.encode())["user_data"]
    assert list(clients) == names
    for name, (x, _) in clients.items():
        assert x.tobytes() == np.asarray(reference[name]["x"], np.float32).tobytes()
