"""Writes testdata/leaf_shakespeare_tiny/: three speaking parts in LEAF's Shakespeare format.

Writes testdata/leaf_shakespeare_tiny/: three speaking parts of Shakespeare (public domain)
as LEAF's Shakespeare preprocessing writes them (deterministic, no randomness involved).

It follows LEAF's own steps (https://github.com/TalwalkarLab/leaf, data/shakespeare/preprocess/
shake_utils.py and data/utils/split_data.py) on a user's text: newlines become spaces and runs
of spaces one space, every 80-character window is an `x` and the character after it its `y`;
then `./preprocess.sh ... -t sample --tf 0.5` keeps the first half of the windows for train and,
for the test file, skips the next 79 windows (those overlapping train's text) but still counts
them in `num_samples`. Written as LEAF writes its train/test files: `users`, `num_samples`,
`user_data` (LEAF's split drops `hierarchies`).
"""

from __future__ import annotations

import json
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
OUT = os.path.join(ROOT, "leaf_shakespeare_tiny")
WINDOW = 80
TRAIN_FRACTION = 0.5  # --tf 0.5: LEAF's file-name label "5"

# LEAF's user names: PLAY_CHARACTER, spaces as underscores. The texts as LEAF's raw files hold
# them: a character's lines, one per line.
PARTS = {
    "THE_TRAGEDY_OF_MACBETH_MACBETH": (
        "Tomorrow, and tomorrow, and tomorrow,\n"
        "Creeps in this petty pace from day to day,\n"
        "To the last syllable of recorded time;\n"
        "And all our yesterdays have lighted fools\n"
        "The way to dusty death. Out, out, brief candle!\n"
        "Life's but a walking shadow, a poor player\n"
        "That struts and frets his hour upon the stage\n"
        "And then is heard no more. It is a tale\n"
        "Told by an idiot, full of sound and fury,\n"
        "Signifying nothing.\n"
    ),
    "THE_TRAGEDY_OF_HAMLET_PRINCE_OF_DENMARK_HAMLET": (
        "To be, or not to be, that is the question:\n"
        "Whether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\n"
        "Or to take arms against a sea of troubles\n"
        "And by opposing end them. To die, to sleep;\n"
        "No more; and by a sleep to say we end\n"
        "The heart-ache and the thousand natural shocks\n"
        "That flesh is heir to: 'tis a consummation\n"
        "Devoutly to be wish'd.\n"
    ),
    "MUCH_ADO_ABOUT_NOTHING_BEATRICE": (
        "I wonder that you will still be talking, Signior Benedick: nobody marks you.\n"
        "Is it possible disdain should die while she hath such meet food to feed it as\n"
        "Signior Benedick? Courtesy itself must convert to disdain, if you come in her\n"
        "presence. I had rather hear my dog bark at a crow than a man swear he loves me.\n"
    ),
}


def windows(text: str) -> tuple[list[str], list[str]]:
    """LEAF's `__txt_to_data`: every WINDOW-character window and the character after it."""
    text = re.sub(r"   *", " ", text.replace("\n", " "))
    x = [text[i : i + WINDOW] for i in range(len(text) - WINDOW)]
    y = [text[i + WINDOW] for i in range(len(text) - WINDOW)]
    return x, y


def main() -> None:
    splits: dict[str, dict] = {
        split: {"users": [], "num_samples": [], "user_data": {}} for split in ("train", "test")
    }
    for user, text in PARTS.items():
        x, y = windows(text)
        # split_data.py, by sample, for shakespeare
        num_train = max(1, int(TRAIN_FRACTION * len(y)))
        test_indices = range(num_train + WINDOW - 1, len(y))
        assert len(test_indices) >= 1, f"{user}'s text is too short for a test window"
        for split, indices, count in (
            ("train", range(num_train), num_train),
            ("test", test_indices, len(y) - num_train),  # LEAF's count, skipped windows too
        ):
            splits[split]["users"].append(user)
            splits[split]["num_samples"].append(count)
            splits[split]["user_data"][user] = {
                "x": [x[i] for i in indices],
                "y": [y[i] for i in indices],
            }
    for split, blob in splits.items():
        os.makedirs(os.path.join(OUT, split), exist_ok=True)
        path = os.path.join(OUT, split, f"all_data_niid_0_keep_0_{split}_5.json")
        with open(path, "w") as f:
            json.dump(blob, f)
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(
            "# leaf_shakespeare_tiny\n\nLEAF's Shakespeare next-character task in LEAF's JSON "
            "(train/*.json, test/*.json: `users`, `num_samples`, `user_data` -> `x` 80-character "
            "strings, `y` the next character), for 3 speaking parts of a few lines each (public "
            "domain), split as LEAF's `-t sample --tf 0.5` splits: the test file's "
            "`num_samples` counts 79 windows more per user than it holds, as LEAF's do. Made by "
            "scripts/make_leaf_text_fixtures.py.\n"
        )


if __name__ == "__main__":
    main()
