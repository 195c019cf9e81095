"""LEAF splits read once, then loaded from the cache: the same arrays, and a changed file is
parsed again (data/leaf_cache.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
from collections.abc import Callable

import numpy as np
import pytest

from tff_clustered.data import leaf, leaf_cache


def leaf_folder(root: str, scale: float = 1.0) -> str:
    """A LEAF data/ folder of two users of numeric features, train and test."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        users = ["u0", "u1"]
        blob = {
            "users": users,
            "num_samples": [3, 2],
            "user_data": {
                u: {"x": (scale * rng.normal(size=(n, 4))).tolist(), "y": [1] * n}
                for u, n in zip(users, (3, 2))
            },
        }
        os.makedirs(os.path.join(root, split))
        with open(os.path.join(root, split, "d.json"), "w") as f:
            json.dump(blob, f)
    return root


def test_a_split_read_again_comes_from_the_cache_with_the_same_arrays(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", str(tmp_path / "cache"))
    root = leaf_folder(str(tmp_path / "data"))
    parsed = leaf.load_leaf(os.path.join(root, "train"), os.path.join(root, "test"))
    assert len(os.listdir(tmp_path / "cache")) == 2  # one file per split
    assert sorted(os.listdir(os.path.join(root, "train"))) == ["d.json"]  # the data's untouched

    def parsed_again(*args: object) -> None:
        raise AssertionError("parsed again instead of read from the cache")

    monkeypatch.setattr(leaf, "parsed_split", parsed_again)
    cached = leaf.load_leaf(os.path.join(root, "train"), os.path.join(root, "test"))
    assert cached.client_ids == parsed.client_ids
    for split in ("train", "test"):
        for user in parsed.client_ids:
            for key in ("x", "y"):
                a, b = parsed.arrays(split, user)[key], cached.arrays(split, user)[key]
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_a_changed_file_is_parsed_again_and_its_stale_cache_removed(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", str(tmp_path / "cache"))
    root = leaf_folder(str(tmp_path / "data"))
    before = leaf.read_leaf_split(os.path.join(root, "train"))
    os.rename(root, str(tmp_path / "old"))
    leaf_folder(root, scale=2.0)  # same paths, other numbers
    after = leaf.read_leaf_split(os.path.join(root, "train"))
    assert np.array_equal(after["u0"][0], 2 * before["u0"][0])  # doubling is exact: parsed
    assert len(os.listdir(tmp_path / "cache")) == 1  # the earlier content's file deleted


def test_no_cache_is_kept_when_it_is_turned_off(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", leaf_cache.OFF)
    root = leaf_folder(str(tmp_path / "data"))
    assert leaf_cache.cache_path([os.path.join(root, "train", "d.json")], None) is None
    leaf.read_leaf_split(os.path.join(root, "train"))
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_the_cache_keeps_within_its_bound_by_deleting_the_least_recently_used(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", str(cache))
    a, b, c = (os.path.join(leaf_folder(str(tmp_path / name)), "train") for name in "abc")

    def kept(train: str) -> str:
        return os.path.basename(leaf_cache.cache_path([os.path.join(train, "d.json")], None))

    for age, train in enumerate((a, b)):  # a written long ago, b later
        leaf.read_leaf_split(train)
        os.utime(cache / kept(train), ns=(10**18 + age, 10**18 + age))
    leaf.read_leaf_split(a)  # read again: now the most recently used
    sizes = {train: (cache / kept(train)).stat().st_size for train in (a, b)}
    # room for all but the least recently used once c is kept (c is as large as a)
    bound = sizes[a] + sizes[b] + sizes[a] - 1
    monkeypatch.setattr(leaf_cache, "limit_bytes", lambda: bound)
    leaf.read_leaf_split(c)
    assert sorted(os.listdir(cache)) == sorted([kept(a), kept(c)])  # b, the least used, gone
    monkeypatch.undo()
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", str(cache))
    monkeypatch.setenv(leaf_cache.LIMIT_VARIABLE, "0")  # only the split just kept stays
    leaf.read_leaf_split(b)
    assert os.listdir(cache) == [kept(b)]


def test_a_cache_bound_that_is_not_a_number_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(leaf_cache.LIMIT_VARIABLE, raising=False)
    assert leaf_cache.limit_bytes() == leaf_cache.DEFAULT_LIMIT_MB * 2**20
    for given in ("lots", "²", "-1", "1e3", "١٢"):  # "²" and "١٢" are str.isdigit()
        monkeypatch.setenv(leaf_cache.LIMIT_VARIABLE, given)
        with pytest.raises(ValueError, match=f"TFF_CLUSTERED_CACHE_MB='{given}' is not a number"):
            leaf_cache.limit_bytes()


def flipped_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 3)  # among x's values
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def cut_in_half(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def saved_over(path: str) -> None:
    """The arrays saved again by NumPy, one value NaN, the meta as it was."""
    with np.load(path) as kept:
        arrays = {name: kept[name] for name in kept.files}
    arrays["x"] = arrays["x"].copy()
    arrays["x"][0, 0] = np.nan
    np.savez(path, **arrays)


def other_splits_file(path: str) -> None:
    """The test split's kept file copied over the training split's: readable and whole."""
    folder = os.path.dirname(path)
    other = next(name for name in os.listdir(folder) if name != os.path.basename(path))
    shutil.copyfile(os.path.join(folder, other), path)


def rewritten(change: Callable[[dict], tuple[dict, str]]) -> Callable[[str], None]:
    """The kept split written again by `write_cached` itself (so readable, CRCs and all), its
    users' arrays and kind changed by `change`."""

    def damage(path: str) -> None:
        clients, kind, source = leaf_cache.read_cached(path, None)
        leaf_cache.write_cached(path, *change(dict(clients)), source)

    return damage


def with_x(clients: dict, x: Callable[[np.ndarray], np.ndarray]) -> dict:
    return {user: (x(inputs), labels) for user, (inputs, labels) in clients.items()}


DAMAGES = {
    "a flipped byte": flipped_byte,
    "cut in half": cut_in_half,
    "empty": lambda path: os.truncate(path, 0),
    "a named pipe": lambda path: os.remove(path) or os.mkfifo(path),
    "arrays saved over": saved_over,
    "the other split's file": other_splits_file,
    "NaN": rewritten(lambda c: (with_x(c, lambda x: x * np.nan), "numeric features")),
    "label 7": rewritten(
        lambda c: ({u: (x, np.full_like(y, 7)) for u, (x, y) in c.items()}, "numeric features")
    ),
    "labels of another dtype": rewritten(
        lambda c: ({u: (x, y.astype(np.int64)) for u, (x, y) in c.items()}, "numeric features")
    ),
    "fewer users": rewritten(lambda c: ({"u0": c["u0"]}, "numeric features")),
    "another shape": rewritten(lambda c: (with_x(c, lambda x: x[:, :3]), "numeric features")),
    "another kind": rewritten(lambda c: (c, "Sent140 tweet rows")),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_or_edited_cache_file_is_parsed_again_and_rewritten(
    damage: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept split that cannot be read (a flipped byte, cut, empty), whose arrays are not the
    ones written, or whose content fails a check of parsing or of the federation (NaN, a label
    beyond the classes, another dtype, users or shape the test split lacks) is parsed again
    from its intact files, and kept again."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFF_CLUSTERED_CACHE", str(cache))
    root = leaf_folder(str(tmp_path / "data"))
    train, test = os.path.join(root, "train"), os.path.join(root, "test")
    parsed = leaf.load_leaf(train, test, num_classes=2)
    kept = leaf_cache.cache_path([os.path.join(train, "d.json")], 2)
    DAMAGES[damage](kept)

    def hung(*_: object) -> None:
        raise AssertionError(f"the read of {kept} hung")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)  # a read of a named pipe waits for a writer forever
    try:
        again = leaf.load_leaf(train, test, num_classes=2)
    finally:
        signal.alarm(0)
    assert again.client_ids == parsed.client_ids
    for user in parsed.client_ids:
        for key in ("x", "y"):
            a, b = parsed.arrays("train", user)[key], again.arrays("train", user)[key]
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    clients, _, _ = leaf_cache.read_cached(kept, 2)  # kept again, whole
    assert sorted(clients) == ["u0", "u1"]
