"""LEAF's text tasks read from LEAF's own JSON (Shakespeare's character windows, Sent140's raw
tweet rows without GloVe), LEAF's `num_samples` quirk, and LEAF files that must be refused with
the loader's one-line error: numbers too large for a float, examples with no feature, a user
whose parts in two files disagree."""

from __future__ import annotations

import collections
import json
import os
import re

import numpy as np
import pytest
from conftest import TESTDATA

from tff_clustered.cli import run_flags
from tff_clustered.data import DataError, load_dataset, load_leaf
from tff_clustered.data.tff_datasets import next_character_examples
from tff_clustered.models import model_spec

SHAKESPEARE_TINY = os.path.join(TESTDATA, "leaf_shakespeare_tiny")
SENT140_TINY = os.path.join(TESTDATA, "sent140_tiny")
# ALL_LETTERS of LEAF's models/utils/language_utils.py, as LEAF's Shakespeare model reads it.
LEAF_ALL_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
MACBETH = "THE_TRAGEDY_OF_MACBETH_MACBETH"
GOOD_USER = {"x": [[0.0, 1.0], [1.0, 0.0]], "y": [0, 1]}


def leaf_blob(**user_data: dict) -> dict:
    """A LEAF file of these users, `num_samples` counting their examples."""
    return {
        "users": list(user_data),
        "num_samples": [len(record["y"]) for record in user_data.values()],
        "user_data": user_data,
    }


def write_leaf(path: object, blob: object) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(blob if isinstance(blob, str) else json.dumps(blob))
    return path


def leaf_dir(root: object, train: object, test: object) -> str:
    """`root` as a LEAF data/ folder with one train and one test file."""
    write_leaf(os.path.join(root, "train", "t.json"), train)
    write_leaf(os.path.join(root, "test", "t.json"), test)
    return os.fspath(root)


def raw_file(split: str, folder: str = SHAKESPEARE_TINY) -> dict:
    files = sorted(os.listdir(os.path.join(folder, split)))
    with open(os.path.join(folder, split, files[0]), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def shakespeare() -> object:
    return load_dataset("leaf", data_dir=SHAKESPEARE_TINY)


@pytest.fixture(scope="module")
def sent140() -> object:
    return load_dataset("leaf", data_dir=SENT140_TINY)


def test_leaf_shakespeare_json_loads_as_ids_in_leafs_vocabulary(shakespeare: object) -> None:
    assert shakespeare.num_classes == shakespeare.vocabulary_size == 81  # 80 + any other
    assert shakespeare.input_shape == (80,)
    for split, arrays in (("train", shakespeare.train_arrays), ("test", shakespeare.test_arrays)):
        record = raw_file(split)["user_data"][MACBETH]
        x, y = arrays[MACBETH]["x"], arrays[MACBETH]["y"]
        assert x.dtype == np.float32 and len(x) == len(record["x"])
        for i in (0, len(x) - 1):
            assert x[i].tolist() == [LEAF_ALL_LETTERS.index(c) for c in record["x"][i]]
            assert y[i] == LEAF_ALL_LETTERS.index(record["y"][i])


def test_leaf_shakespeare_matches_the_tff_loaders_windows_of_the_same_text(
    shakespeare: object,
) -> None:
    """Same input format as `tff_shakespeare` feeds char_lstm: the windows of a user's text
    (stride 1), the next character's id as the label; only the vocabulary is LEAF's."""
    record = raw_file("train")["user_data"][MACBETH]
    text = record["x"][0] + "".join(record["y"])
    x, y = next_character_examples(text, LEAF_ALL_LETTERS)
    np.testing.assert_array_equal(shakespeare.train_arrays[MACBETH]["x"], x)
    np.testing.assert_array_equal(shakespeare.train_arrays[MACBETH]["y"], y)


def test_test_files_listing_more_samples_than_they_hold_use_those_present(
    shakespeare: object,
) -> None:
    """LEAF's Shakespeare split counts the 79 windows it skips in the test file."""
    test = raw_file("test")
    held = [len(test["user_data"][u]["y"]) for u in test["users"]]
    assert [n - h for n, h in zip(test["num_samples"], held)] == [79, 79, 79]  # the fixture
    assert [shakespeare.test_sizes[u] for u in test["users"]] == held


@pytest.mark.parametrize("name", ["shakespeare", "sent140"])
def test_leaf_text_tasks_run_through_char_lstm(name: str, request: pytest.FixtureRequest) -> None:
    data = request.getfixturevalue(name)
    model = model_spec(
        "char_lstm", data.input_shape, data.num_classes, vocabulary_size=data.vocabulary_size
    ).build()
    x = next(iter(data.train_arrays.values()))["x"][:3]
    assert model(x).shape == (3, data.num_classes)


def test_unknown_characters_get_the_id_after_leafs_80(tmp_path: object) -> None:
    window = "\n" + "é" + "a" * 77 + "}"
    user = {"x": [window, "b" * 80], "y": ["~", "\n"]}
    blob = dict(leaf_blob(u=user), hierarchies=["A_PLAY"])  # LEAF's all_data files carry it
    data = load_leaf(write_leaf(tmp_path / "a.json", blob), tmp_path / "a.json")
    x, y = data.train_arrays["u"]["x"], data.train_arrays["u"]["y"]
    assert x[0, :2].tolist() == [0, 80] and x[0, -1] == 79
    assert y.tolist() == [80, 0]


@pytest.mark.parametrize(
    "user, message",
    [
        ({"x": ["ab", "abc"], "y": ["c", "d"]}, "example 1 has 3 characters, example 0 has 2"),
        ({"x": ["", ""], "y": ["c", "d"]}, "example 0 is an empty string"),
        ({"x": ["ab", "bc"], "y": ["c", "de"]}, "label 1 is 'de'; a Shakespeare label is"),
        ({"x": ["ab", "bc"], "y": [3, 4]}, "label 0 is 3; a Shakespeare label is"),
        ({"x": ["ab", [1.0, 2.0]], "y": ["c", "d"]}, "example 1 must be a string"),
    ],
)
def test_bad_shakespeare_examples_are_named(tmp_path: object, user: dict, message: str) -> None:
    path = write_leaf(tmp_path / "a.json", leaf_blob(u=user))
    with pytest.raises(DataError, match=f"a.json: user 'u': {re.escape(message)}"):
        load_leaf(path, path)


def test_shakespeare_num_samples_below_the_examples_held_is_refused(tmp_path: object) -> None:
    blob = leaf_blob(u={"x": ["ab", "bc"], "y": ["c", "d"]})
    blob["num_samples"] = [1]
    path = write_leaf(tmp_path / "a.json", blob)
    with pytest.raises(DataError, match="user 'u' has num_samples=1 but 2 examples"):
        load_leaf(path, path)


def test_leaf_sent140_without_glove_is_word_ids_from_the_training_split(
    sent140: object,
) -> None:
    train, test = raw_file("train", SENT140_TINY), raw_file("test", SENT140_TINY)
    tokens = lambda row: re.findall(r"[\w']+|[.,!?;]", row[4])[:25]  # noqa: E731 - LEAF's
    counts = collections.Counter(
        t for record in train["user_data"].values() for row in record["x"] for t in tokens(row)
    )
    words = sorted(counts, key=lambda w: (-counts[w], w))
    unknown = len(words)
    assert sent140.num_classes == 2 and sent140.input_shape == (25,)
    assert sent140.vocabulary_size == unknown + 1
    for blob, arrays in ((train, sent140.train_arrays), (test, sent140.test_arrays)):
        for user, record in blob["user_data"].items():
            for row, x, label, y in zip(
                record["x"], arrays[user]["x"], record["y"], arrays[user]["y"]
            ):
                ids = [words.index(t) if t in counts else unknown for t in tokens(row)]
                assert x.tolist() == ids + [unknown] * (25 - len(ids))
                assert y == min(label, 1)  # the raw positive 4 is 1


def test_leaf_sent140_labels_other_than_0_1_4_are_named(tmp_path: object) -> None:
    row = ["1", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", "a good day"]
    bad = leaf_blob(u={"x": [row, row], "y": [0, 2]})
    good = leaf_blob(u={"x": [row], "y": [1]})
    with pytest.raises(DataError, match="user 'u': label 2 is not a Sent140 label"):
        load_leaf(write_leaf(tmp_path / "a.json", bad), write_leaf(tmp_path / "b.json", good))


def test_one_dataset_holds_one_kind_of_example(tmp_path: object) -> None:
    characters = write_leaf(tmp_path / "c.json", leaf_blob(u={"x": ["ab"], "y": ["c"]}))
    numbers = write_leaf(tmp_path / "n.json", leaf_blob(u=GOOD_USER))
    with pytest.raises(DataError, match="n.json: holds numeric features where .*c.json holds"):
        load_leaf(characters, numbers)


def test_leaf_text_tasks_refuse_num_classes(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="which have 81 classes; leave --num_classes unset"):
        load_dataset("leaf", data_dir=SHAKESPEARE_TINY, num_classes=80)


def with_number(user: dict, digits: str) -> str:
    """The LEAF file of `user` as JSON text, its "N" written as the bare number `digits`."""
    return json.dumps(leaf_blob(u=user)).replace('"N"', digits)


HUGE = "1" + "0" * 400  # a JSON number: Python reads it as an int, too large for any float


@pytest.mark.parametrize(
    "text, message",
    [
        (
            with_number({"x": [["N", 1.0], [0.0, 1.0]], "y": [0, 1]}, HUGE),
            "user 'u': inputs hold a whole number too large for a float",
        ),
        (
            with_number({"x": [[1.0, 1.0], [0.0, 1.0]], "y": ["N", 1]}, HUGE),
            "user 'u': labels hold a whole number too large for a float",
        ),
        (
            with_number({"x": [["N"]], "y": [0]}, "9" * 5000),
            "holds a number that cannot be read",
        ),
        (json.dumps(leaf_blob(u={"x": [[], []], "y": [0, 1]})), "user 'u': example 0 has 0 "),
    ],
    ids=["huge_input", "huge_label", "digits_beyond_pythons_limit", "no_features"],
)
def test_leaf_files_that_cannot_be_used_exit_2_with_one_line_naming_file_and_user(
    tmp_path: object, capsys: pytest.CaptureFixture, text: str, message: str
) -> None:
    """The CLI's data-error path (`train.py` loads the data inside `reported_errors`)."""
    data_dir = leaf_dir(tmp_path, text, leaf_blob(u=GOOD_USER))
    with pytest.raises(SystemExit) as stopped:
        with run_flags.reported_errors(lambda: "nothing was written"):
            load_dataset("leaf", data_dir=data_dir)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {os.path.join(data_dir, 'train', 't.json')}: {message}")


def test_a_user_with_an_empty_part_in_another_file_keeps_its_examples(tmp_path: object) -> None:
    write_leaf(tmp_path / "train" / "1.json", leaf_blob(u={"x": [], "y": []}))
    write_leaf(tmp_path / "train" / "2.json", leaf_blob(u=GOOD_USER))
    write_leaf(tmp_path / "test" / "1.json", leaf_blob(u=GOOD_USER))
    data = load_leaf(tmp_path / "train", tmp_path / "test")
    np.testing.assert_array_equal(data.train_arrays["u"]["x"], GOOD_USER["x"])


def test_a_user_whose_parts_disagree_in_shape_is_named_with_both_files(tmp_path: object) -> None:
    write_leaf(tmp_path / "train" / "1.json", leaf_blob(u={"x": [[1.0, 2.0, 3.0]], "y": [0]}))
    write_leaf(tmp_path / "train" / "2.json", leaf_blob(u=GOOD_USER))
    write_leaf(tmp_path / "test" / "1.json", leaf_blob(u=GOOD_USER))
    with pytest.raises(DataError, match=r"2.json: user 'u' has examples of shape \(2,\) here and "):
        load_leaf(tmp_path / "train", tmp_path / "test")


def test_the_errors_of_a_missing_glove_and_of_char_lstm_name_the_leaf_path() -> None:
    with pytest.raises(DataError, match="without GloVe, --dataset=leaf --model=char_lstm"):
        load_dataset("sent140", data_dir=SENT140_TINY)
    with pytest.raises(ValueError, match="or --dataset=leaf on LEAF's Shakespeare or Sent140"):
        model_spec("char_lstm", (64,), 10)
