"""Property-based corruption of every file loader: LEAF JSON, MNIST IDX / npz, Sent140 + GloVe,
and the image files (CIFAR, SVHN, PathMNIST, TFDS) damaged byte by byte.

Each test writes a small valid dataset in the real format, checks that it loads, then applies
one generated corruption (truncation, wrong types, ragged rows, NaN/inf, labels out of range,
empty or duplicate users, huge declared sizes, ...). The loader must then raise our
`DataError`: one line that names the corrupted file (or its folder) and says what to do. Any
other exception, or a load that succeeds, fails the test. Hypothesis runs derandomized, so the
suite sees the same cases every time.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import struct
import tempfile
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tff_clustered.data import DataError, load_dataset
from tff_clustered.data.leaf import load_leaf
from tff_clustered.data.sent140 import load_sent140
from tff_clustered.data.tweets import tokenize

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WRONG_VALUES = st.sampled_from(["seven", None, True, {"a": 1}, [1, 2], -3.5])


def assert_named_error(load: Callable[[], object], *names: str) -> DataError:
    """`load` fails with one line of our error naming one of `names` and giving a fix."""
    with pytest.raises(DataError) as info:
        load()
    message = str(info.value)
    assert "\n" not in message, message
    assert any(name in message for name in names), (names, message)
    assert ";" in message or "download" in message, f"no fix offered: {message}"
    return info.value


# --------------------------------------------------------------------------------------------
# LEAF JSON


def leaf_blob(prefix: str, sizes: list[int], features: int, rng: np.random.Generator) -> dict:
    users = [f"{prefix}{i}" for i in range(len(sizes))]
    return {
        "users": users,
        "num_samples": list(sizes),
        "user_data": {
            u: {
                "x": rng.normal(size=(n, features)).round(3).tolist(),
                "y": rng.integers(0, 3, n).tolist(),
            }
            for u, n in zip(users, sizes)
        },
    }


LEAF_CORRUPTIONS = [
    "truncate",
    "wrong_type",
    "ragged_row",
    "non_finite",
    "label_out_of_range",
    "empty_user",
    "duplicate_user",
    "huge_num_samples",
    "unlisted_user",
    "label_count",
    "missing_key",
]


def corrupt_leaf(
    blob: dict, data: st.DataObject, num_classes: int | None, text_rows: bool = False
) -> dict | str:
    """One corruption of a parsed LEAF file; a `str` result is raw (already broken) text.
    `text_rows`: examples are Sent140 raw rows (a list whose field 4 is the text), so changes
    to other fields of a row are not corruptions and are not drawn."""
    kinds = [k for k in LEAF_CORRUPTIONS if not (text_rows and k == "ragged_row")]
    kind = data.draw(st.sampled_from(kinds), label="corruption")
    users = blob["users"]
    user = data.draw(st.sampled_from(users), label="user")
    record = blob["user_data"][user]
    row = data.draw(st.integers(0, len(record["x"]) - 1), label="row")
    if kind == "truncate":
        text = json.dumps(blob)
        return text[: data.draw(st.integers(0, len(text) - 1), label="cut")]
    if kind == "wrong_type":
        places = ["users", "num_samples", "user_data", "record", "x", "row", "y", "label"]
        where = data.draw(st.sampled_from(places + ([] if text_rows else ["value"])), label="at")
        value = data.draw(WRONG_VALUES, label="value")
        if where in ("users", "num_samples", "user_data"):
            value = data.draw(st.sampled_from([7, "users", {"k": 1}, [None], [1.5]]))
            if where == "user_data" and isinstance(value, dict):
                value = [value]
            blob[where] = value
        elif where == "record":
            blob["user_data"][user] = data.draw(st.sampled_from([[1], "x", 3, None]))
        elif where in ("x", "y"):
            record[where] = data.draw(st.sampled_from(["12", 4, {"0": 1}, None]))
        elif where == "row":
            rows = [5, None, {"f": 1}] + ([] if text_rows else ["1,2,3"])  # a str is a tweet
            record["x"][row] = data.draw(st.sampled_from(rows))
        elif where == "value":
            record["x"][row][0] = value if value != -3.5 else "1.0"
        else:  # a label
            record["y"][row] = value if value != -3.5 else 1.5
    elif kind == "ragged_row":
        if data.draw(st.booleans(), label="longer"):
            record["x"][row].append(0.5)
        else:
            record["x"][row].pop()
    elif kind == "non_finite":
        value = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="value")
        if text_rows or data.draw(st.booleans(), label="in_label"):
            record["y"][row] = value
        else:
            record["x"][row][data.draw(st.integers(0, len(record["x"][row]) - 1))] = value
    elif kind == "label_out_of_range":
        low = [-1, -100] if num_classes is None else [-1, num_classes, num_classes + 40]
        record["y"][row] = data.draw(st.sampled_from(low), label="label")
    elif kind == "empty_user":
        record["x"], record["y"] = [], []
        blob["num_samples"][users.index(user)] = 0
    elif kind == "duplicate_user":
        users.append(user)
        blob["num_samples"].append(len(record["y"]))
    elif kind == "huge_num_samples":
        blob["num_samples"][users.index(user)] = data.draw(
            st.sampled_from([10**6, 2**31, 2**63, 10**30, -(2**40)]), label="size"
        )
    elif kind == "unlisted_user":
        users.append("ghost")
        blob["num_samples"].append(1)
    elif kind == "label_count":
        record["y"].pop() if data.draw(st.booleans()) else record["y"].append(0)
    elif kind == "missing_key":
        del blob[data.draw(st.sampled_from(["users", "user_data"]), label="key")]
    return blob


def write_json(path: str, blob: dict | str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(blob if isinstance(blob, str) else json.dumps(blob))


@SETTINGS
@given(data=st.data())
def test_corrupt_leaf_files_give_one_named_error(data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    features = data.draw(st.integers(2, 5), label="features")
    num_classes = data.draw(st.sampled_from([None, 3]), label="num_classes")
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=2, max_size=3), label="sizes")
    with tempfile.TemporaryDirectory() as root:
        files = {}
        for split in ("train", "test"):
            os.makedirs(os.path.join(root, split))
            files[split] = os.path.join(root, split, "all_data_0.json")
            write_json(files[split], leaf_blob("u", sizes, features, rng))
        load = lambda: load_leaf(  # noqa: E731
            os.path.join(root, "train"), os.path.join(root, "test"), num_classes=num_classes
        )
        assert len(load().client_ids) == len(sizes)  # the uncorrupted files are fine
        split = data.draw(st.sampled_from(["train", "test"]), label="split")
        with open(files[split], encoding="utf-8") as f:
            blob = json.load(f)
        write_json(files[split], corrupt_leaf(blob, data, num_classes))
        assert_named_error(load, files[split], os.path.dirname(files[split]))


# --------------------------------------------------------------------------------------------
# MNIST: IDX files (plain or gzipped) and Keras' mnist.npz

IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def mnist_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """30 training and 10 test images whose labels give digits 0..2 enough examples for two
    clients (FedGroup's partition needs 5 per owner)."""
    return {
        "x_train": rng.integers(0, 256, (30, 28, 28), dtype=np.uint8),
        "y_train": np.arange(30, dtype=np.uint8) % 3,
        "x_test": rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
        "y_test": np.arange(10, dtype=np.uint8) % 3,
    }


def idx_bytes(array: np.ndarray) -> bytes:
    return (
        b"\x00\x00\x08"
        + bytes([array.ndim])
        + struct.pack(">" + "I" * array.ndim, *array.shape)
        + array.tobytes()
    )


def corrupt_idx(raw: bytes, key: str, data: st.DataObject) -> bytes:
    """One corruption of an IDX file's (uncompressed) bytes."""
    ndim = raw[3]
    kind = data.draw(
        st.sampled_from(
            [
                "truncate",
                "extra_bytes",
                "bad_magic",
                "huge_dims",
                "same_size_wrong_dims",
                "count_mismatch",
                "label_out_of_range",
            ]
        ),
        label="corruption",
    )
    header = 4 + 4 * ndim
    dims = list(struct.unpack(">" + "I" * ndim, raw[4:header]))
    body = raw[header:]
    if kind == "truncate":
        return raw[: data.draw(st.integers(0, len(raw) - 1), label="cut")]
    if kind == "extra_bytes":
        return raw + bytes(data.draw(st.integers(1, 900), label="extra"))
    if kind == "bad_magic":
        i = data.draw(st.integers(0, 2), label="byte")
        good = raw[i]
        value = data.draw(st.integers(0, 255).filter(lambda v: v != good), label="value")
        return raw[:i] + bytes([value]) + raw[i + 1 :]
    if kind == "huge_dims":
        i = data.draw(st.integers(0, ndim - 1), label="dim")
        dims[i] = data.draw(st.sampled_from([2**20, 2**31 - 1, 2**32 - 1]), label="size")
    elif kind == "same_size_wrong_dims" and ndim == 3:
        dims = [dims[0], 14, 56] if data.draw(st.booleans()) else [dims[0] * 28, 28, 1]
    elif kind in ("count_mismatch", "same_size_wrong_dims"):
        # one example fewer, header and body alike: the images and labels no longer pair up
        per_example = len(body) // dims[0]
        dims[0] -= 1
        body = body[per_example:]
    else:  # a label byte out of 0..9 (or, for images, a label-like corruption of labels)
        if key.startswith("x"):
            return raw[:header]  # header only: holds no data for its shape
        i = data.draw(st.integers(0, len(body) - 1), label="label")
        body = body[:i] + bytes([data.draw(st.integers(10, 255))]) + body[i + 1 :]
    return b"\x00\x00\x08" + bytes([ndim]) + struct.pack(">" + "I" * ndim, *dims) + body


@SETTINGS
@given(data=st.data())
def test_corrupt_mnist_idx_files_give_one_named_error(data: st.DataObject) -> None:
    arrays = mnist_arrays(np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed")))
    gzipped = data.draw(st.booleans(), label="gzipped")
    with tempfile.TemporaryDirectory() as root:
        paths = {}
        for key, name in IDX_NAMES.items():
            paths[key] = os.path.join(root, name + (".gz" if gzipped else ""))
            with (gzip.open if gzipped else open)(paths[key], "wb") as f:
                f.write(idx_bytes(arrays[key]))
        load = lambda: load_dataset("mnist", root, num_clients=2, seed=0)  # noqa: E731
        assert len(load().client_ids) == 2
        key = data.draw(st.sampled_from(sorted(IDX_NAMES)), label="file")
        raw = corrupt_idx(idx_bytes(arrays[key]), key, data)
        if gzipped and data.draw(st.booleans(), label="cut_compressed"):
            packed = gzip.compress(idx_bytes(arrays[key]))
            with open(paths[key], "wb") as f:  # the compressed stream itself cut short
                f.write(packed[: data.draw(st.integers(0, len(packed) - 9), label="gz_cut")])
        else:
            with (gzip.open if gzipped else open)(paths[key], "wb") as f:
                f.write(raw)
        names = [paths[key]]
        if key.startswith("y"):  # a count mismatch may be reported with the images' file
            names.append(paths["x" + key[1:]])
        else:
            names.append(paths["y" + key[1:]])
        assert_named_error(load, *names)


def corrupt_npz_arrays(arrays: dict[str, np.ndarray], data: st.DataObject) -> dict:
    key = data.draw(st.sampled_from(sorted(arrays)), label="array")
    kind = data.draw(
        st.sampled_from(
            [
                "missing",
                "flat_or_3d",
                "non_finite",
                "out_of_range",
                "fraction",
                "strings",
                "objects",
                "count_mismatch",
                "empty_shape",
            ]
        ),
        label="corruption",
    )
    array = arrays[key]
    if kind == "missing":
        del arrays[key]
    elif kind == "flat_or_3d":
        arrays[key] = array.reshape(len(array), -1) if array.ndim == 3 else array[:, None, None]
    elif kind in ("non_finite", "out_of_range", "fraction"):
        array = array.astype(np.float32)
        value = {
            "non_finite": data.draw(st.sampled_from([np.nan, np.inf, -np.inf])),
            "out_of_range": data.draw(
                st.sampled_from([-1.0, 256.0, 1e9] if array.ndim == 3 else [-1.0, 10.0, 200.0])
            ),
            "fraction": 1.5,
        }[kind]
        array.reshape(-1)[data.draw(st.integers(0, array.size - 1), label="at")] = value
        arrays[key] = array
    elif kind == "strings":
        arrays[key] = array.astype(str)
    elif kind == "objects":
        arrays[key] = np.array([None] * len(array), dtype=object)
    elif kind == "count_mismatch":
        arrays[key] = array[1:]
    else:
        arrays[key] = np.asarray(7, np.uint8)
    return arrays


@SETTINGS
@given(data=st.data())
def test_corrupt_mnist_npz_gives_one_named_error(data: st.DataObject) -> None:
    arrays = mnist_arrays(np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed")))
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "mnist.npz")
        np.savez(path, **arrays)
        load = lambda: load_dataset("mnist", root, num_clients=2, seed=0)  # noqa: E731
        assert len(load().client_ids) == 2
        if data.draw(st.booleans(), label="cut_file"):
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            packed = buffer.getvalue()
            cut = data.draw(st.integers(0, len(packed) - 1), label="cut")
            with open(path, "wb") as f:
                f.write(packed[:cut])
        else:
            np.savez(path, **corrupt_npz_arrays(dict(arrays), data))
        assert_named_error(load, path)


# --------------------------------------------------------------------------------------------
# Sent140: LEAF JSON of raw tweet rows, plus a GloVe text file

WORDS = ["good", "bad", "day", "sad", "fun", "."]


def tweet(words: list[str], rng: np.random.Generator) -> list:
    text = " ".join(rng.choice(words, size=int(rng.integers(1, 6))))
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text]


def sent140_blob(prefix: str, rng: np.random.Generator) -> dict:
    users = [f"{prefix}{i}" for i in range(3)]
    sizes = [int(rng.integers(1, 4)) for _ in users]
    return {
        "users": users,
        "num_samples": sizes,
        "user_data": {
            u: {"x": [tweet(WORDS, rng) for _ in range(n)], "y": rng.choice([0, 4], n).tolist()}
            for u, n in zip(users, sizes)
        },
    }


def glove_text(rng: np.random.Generator, dim: int = 4) -> str:
    return "".join(
        word + " " + " ".join(f"{v:.4f}" for v in rng.normal(size=dim)) + "\n"
        for word in WORDS + ["unused"]
    )


def corrupt_glove(text: str, used: set[str], data: st.DataObject) -> str:
    """One corruption of the GloVe text, on the line of a word in `used` (a line the tweets
    never look up may be damaged without harm)."""
    lines = text.splitlines(keepends=True)
    i = data.draw(st.sampled_from([i for i, w in enumerate(WORDS) if w in used]), label="line")
    word, _, rest = lines[i].rstrip("\n").partition(" ")
    values = rest.split()
    kind = data.draw(
        st.sampled_from(
            [
                "cut_inside_vector",
                "non_number",
                "non_finite",
                "extra_value",
                "binary",
                "empty",
                "first_line_bare",
            ]
        ),
        label="corruption",
    )
    if kind == "cut_inside_vector":  # the file ends inside a used word's vector
        keep = data.draw(st.integers(0, len(values) - 1), label="keep")
        return "".join(lines[:i]) + word + " " + " ".join(values[:keep])
    if kind == "non_number":
        values[data.draw(st.integers(0, len(values) - 1))] = data.draw(
            st.sampled_from(["x1", "0,5", "--"])
        )
    elif kind == "non_finite":
        values[data.draw(st.integers(0, len(values) - 1))] = data.draw(
            st.sampled_from(["nan", "inf", "-inf"])
        )
    elif kind == "extra_value" and i > 0:
        values.append("0.1")
    elif kind == "extra_value":
        values.pop()  # on the first line, which sets the dimension: the rest then disagree
    elif kind == "binary":
        return "".join(lines[:i]) + "\udcff\udcfe garbage\n" + "".join(lines[i:])
    elif kind == "empty":
        return ""
    else:
        return "word\n" + text
    lines[i] = word + " " + " ".join(values) + "\n"
    return "".join(lines)


def used_words(files: dict[str, str]) -> set[str]:
    used = set()
    for path in files.values():
        with open(path, encoding="utf-8") as f:
            for record in json.load(f)["user_data"].values():
                used |= {token for row in record["x"] for token in tokenize(row[4])}
    return used


@SETTINGS
@given(data=st.data())
def test_corrupt_sent140_and_glove_give_one_named_error(data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    with tempfile.TemporaryDirectory() as root:
        files = {}
        for split in ("train", "test"):
            os.makedirs(os.path.join(root, split))
            files[split] = os.path.join(root, split, "all_data.json")
            write_json(files[split], sent140_blob("t", rng))
        glove = os.path.join(root, "glove.4d.txt")
        text = glove_text(rng)
        with open(glove, "w", encoding="utf-8") as f:
            f.write(text)
        load = lambda: load_sent140(root, glove)  # noqa: E731
        assert len(load().client_ids) == 3
        if data.draw(st.booleans(), label="corrupt_glove"):
            with open(glove, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(corrupt_glove(text, used_words(files), data))
            assert_named_error(load, glove)
            return
        split = data.draw(st.sampled_from(["train", "test"]), label="split")
        with open(files[split], encoding="utf-8") as f:
            blob = json.load(f)
        user = data.draw(st.sampled_from(blob["users"]), label="user")
        record = blob["user_data"][user]
        kind = data.draw(
            st.sampled_from(["leaf", "row_type", "short_row", "text_type", "label"]),
            label="corruption",
        )
        if kind == "leaf":
            blob = corrupt_leaf(blob, data, num_classes=5, text_rows=True)
        elif kind == "row_type":
            record["x"][0] = data.draw(st.sampled_from([5, None, {"text": "hi"}]))
        elif kind == "short_row":
            record["x"][0] = record["x"][0][:4]
        elif kind == "text_type":
            record["x"][0][4] = data.draw(st.sampled_from([5, None, ["good"], {"t": 1}]))
        else:
            record["y"][0] = data.draw(st.sampled_from([2, 3, -4, 7, "4", 0.5]))
        write_json(files[split], blob)
        assert_named_error(load, files[split], os.path.dirname(files[split]))


# --------------------------------------------------------------------------------------------
# Image files (CIFAR pickles, SVHN .mat, PathMNIST .npz, a prepared TFDS folder), damaged byte
# by byte. A damaged file may still be valid (bytes inside the pixels), so the property is: the
# reader returns images and labels that pass its checks, or raises our one-line `DataError`;
# never another exception.

IMAGE_FIXTURES = {  # fixture folder, the file damaged in it, reader
    "cifar10": ("cifar10_tiny", "cifar-10-batches-py/data_batch_1"),
    "svhn": ("svhn_tiny", "train_32x32.mat"),
    "pathmnist": ("pathmnist_tiny", "pathmnist.npz"),
    "tfds_info": ("tfds_tiny", "cifar10/3.0.2/dataset_info.json"),
    "tfds_records": ("tfds_tiny", "cifar10/3.0.2/cifar10-train.tfrecord-00000-of-00001"),
}


def read_image_fixture(name: str, folder: str) -> tuple:
    from tff_clustered.data.image_formats import read_cifar, read_svhn, read_tfds
    from tff_clustered.data.medmnist import read_pathmnist

    if name == "cifar10":
        return read_cifar("cifar10", folder)
    if name == "svhn":
        return read_svhn(folder)
    if name == "pathmnist":
        return read_pathmnist(folder)
    return read_tfds("cifar10", folder)


@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_damaged_image_files_read_valid_arrays_or_give_one_named_error(
    data: st.DataObject,
) -> None:
    import shutil

    from conftest import TESTDATA

    name = data.draw(st.sampled_from(sorted(IMAGE_FIXTURES)), label="file")
    fixture, relative = IMAGE_FIXTURES[name]
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, fixture)
        shutil.copytree(os.path.join(TESTDATA, fixture), folder)
        path = os.path.join(folder, relative)
        with open(path, "rb") as f:
            content = bytearray(f.read())
        start = data.draw(st.integers(0, len(content) - 1), label="at")
        kind = data.draw(st.sampled_from(["truncate", "overwrite", "zero"]), label="damage")
        if kind == "truncate":
            content = content[:start]
        else:
            length = data.draw(st.integers(1, 64), label="length")
            noise = data.draw(st.binary(min_size=length, max_size=length), label="bytes")
            content[start : start + length] = noise if kind == "overwrite" else bytes(length)
        with open(path, "wb") as f:
            f.write(bytes(content))
        try:
            x_train, y_train, x_test, y_test = read_image_fixture(name, folder)
        except DataError as e:
            assert "\n" not in str(e), str(e)
            return
        for x, y in ((x_train, y_train), (x_test, y_test)):
            assert x.dtype == np.uint8 and x.ndim == 4 and len(x) == len(y)
            assert np.issubdtype(y.dtype, np.integer) and y.min() >= 0
