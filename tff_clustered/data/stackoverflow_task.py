"""TFF's Stack Overflow tag prediction as single-label examples: words in, a tag out.

TFF's Stack Overflow tag prediction (`tff.simulation.baselines.stackoverflow`) as examples
for single-label training: TFF's vocabulary files, a post's bag of words and its label.

As TFF's `tag_prediction_preprocessing.build_to_ids_fn` does, a post's input is the bag of
words of its `tokens` and `title` over the 10,000 most frequent words, each word's count divided
by the number of in-vocabulary words. TFF's task is multi-label (every tag among the 500 most
frequent, a sigmoid each; a post with none keeps an all-zero target); the models here are
trained by softmax cross-entropy on one class, so a post's label is its *most frequent* tag
among the top `num_classes`, and a post with none has no label and is dropped.

The vocabularies are TFF's files `stackoverflow.word_count` ("word count" lines, most frequent
first) and `stackoverflow.tag_count` (JSON {tag: count}), as `stackoverflow.load_word_counts` /
`load_tag_counts` unpack them, or counted from given clients' train posts with TFF's definition
(the number of clients with a post containing the word or tag).
"""

from __future__ import annotations

import collections
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.data.federated_data import ClientArrays, DataError
from tff_clustered.data.spec import MIN_CLASSES
from tff_clustered.data.tff_datasets import reason

STACKOVERFLOW_FILE = "stackoverflow.sqlite"  # the database, which the vocabularies sit beside
WORD_COUNT_FILE = "stackoverflow.word_count"
WORD_COUNT_URL = (
    "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2"
)
TAG_COUNT_FILE = "stackoverflow.tag_count"
TAG_COUNT_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.tag_count.tar.bz2"
WORD_VOCABULARY_SIZE = 10_000  # TFF's DEFAULT_WORD_VOCAB_SIZE
TAG_VOCABULARY_SIZE = 500  # TFF's DEFAULT_TAG_VOCAB_SIZE


def vocabulary_files(data_dir: str) -> tuple[str, str]:
    """The paths of TFF's `stackoverflow.word_count` and `stackoverflow.tag_count` in
    `data_dir`."""
    return os.path.join(data_dir, WORD_COUNT_FILE), os.path.join(data_dir, TAG_COUNT_FILE)


@functools.cache
def tff_post_parser() -> Callable[[tf.Tensor], Mapping[str, tf.Tensor]]:
    """TFF's own parser of its Stack Overflow records (`stackoverflow._add_proto_parsing`) as
    one function of a vector of serialized posts, traced once per process: a client's read
    then costs no tf.data pipeline of its own."""
    from tensorflow_federated.python.simulation.datasets import stackoverflow

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def parse(blobs: tf.Tensor) -> Mapping[str, tf.Tensor]:
        posts = tf.data.Dataset.from_tensors(blobs)  # one element: the whole vector
        parsed = stackoverflow._add_proto_parsing(posts)  # noqa: SLF001 - TFF's format, one place
        return parsed.get_single_element()

    return parse


def parsed_posts(blobs: list[bytes]) -> dict[str, list[str]]:
    """`tokens`, `title` and `tags` of serialized posts, parsed by TFF's own parser."""
    batch = tff_post_parser()(tf.constant(blobs, tf.string))
    return {
        key: [b.decode("utf-8", errors="replace") for b in batch[key].numpy()]
        for key in ("tokens", "title", "tags")
    }


def word_counts_file(path: str, limit: int) -> list[str]:
    """The first `limit` words of TFF's `stackoverflow.word_count` ("word count" lines)."""
    words = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if len(fields) != 2 or not fields[1].isdigit():
                raise DataError(
                    f"{path} line {number}: {line.strip()[:60]!r} is not 'word count'; get a "
                    f"fresh copy from {WORD_COUNT_URL} (unpack it next to {STACKOVERFLOW_FILE})"
                )
            words.append(fields[0])
            if len(words) == limit:
                break
    return words


def tag_counts_file(path: str) -> list[str]:
    """The tags of TFF's `stackoverflow.tag_count` (JSON {tag: count}), most frequent first."""
    try:
        with open(path, encoding="utf-8") as f:
            counts = json.load(f)
        ranked = sorted(counts.items(), key=lambda item: -int(item[1]))
    except (ValueError, AttributeError, TypeError) as e:
        raise DataError(
            f"{path} is not TFF's tag counts (a JSON object of tag: count; {reason(e)}); get a "
            f"fresh copy from {TAG_COUNT_URL} (unpack it next to {STACKOVERFLOW_FILE})"
        ) from None
    return [tag for tag, _ in ranked]


def counted_vocabulary(per_client: Iterable[Iterable[str]], limit: int) -> list[str]:
    """The `limit` items held by the most clients (TFF's count: clients, not occurrences),
    ties by the item; each element of `per_client` is one client's items."""
    clients = collections.Counter(item for items in per_client for item in set(items) if item)
    return sorted(clients, key=lambda item: (-clients[item], item))[:limit]


def bag_of_words(texts: Sequence[str], vocabulary: Mapping[str, int]) -> np.ndarray:
    """Each text's in-vocabulary word counts divided by its number of in-vocabulary words
    (all zero when it has none), as TFF's `build_to_ids_fn`: (len(texts), len(vocabulary))."""
    x = np.zeros((len(texts), len(vocabulary)), np.float32)
    for row, text in enumerate(texts):
        ids = [vocabulary[w] for w in text.split() if w in vocabulary]
        if ids:
            x[row] = np.bincount(ids, minlength=len(vocabulary)) / len(ids)
    return x


def most_frequent_tags(tags: Sequence[str], rank: Mapping[str, int]) -> np.ndarray:
    """Each post's label: the rank of its most frequent tag in `rank`, -1 when it has none."""
    return np.array(
        [min((rank[t] for t in joined.split("|") if t in rank), default=-1) for joined in tags],
        np.int64,
    )


def labelled_examples(
    posts: Mapping[str, Sequence[str]], word_index: Mapping[str, int], tag_rank: Mapping[str, int]
) -> ClientArrays:
    """One client's parsed posts of a split (`parsed_posts`: `tokens`, `title`, `tags`) as
    examples: each post with a tag in `tag_rank` as its bag of words over `word_index`
    (`bag_of_words` of tokens and title) labelled with its most frequent tag
    (`most_frequent_tags`); the others are dropped."""
    y = most_frequent_tags(posts["tags"], tag_rank)
    texts = [f"{a} {b}" for a, b, keep in zip(posts["tokens"], posts["title"], y >= 0) if keep]
    return bag_of_words(texts, word_index), y[y >= 0]


class TagPrediction:
    """The task's vocabularies: `words` (the inputs' features) and `tags` (the classes), most
    frequent first; `examples` labels one client's serialized posts of a split (the parser
    `sql_clients.SqlClients` reads a client with)."""

    def __init__(self, words: Sequence[str], tags: Sequence[str]) -> None:
        self.words, self.tags = list(words), list(tags)
        self.word_index = {w: i for i, w in enumerate(self.words)}
        self.tag_rank = {t: i for i, t in enumerate(self.tags)}

    def labelled(self, posts: Mapping[str, Sequence[str]]) -> ClientArrays:
        return labelled_examples(posts, self.word_index, self.tag_rank)

    def examples(self, blobs: list[bytes]) -> ClientArrays:
        if not blobs:
            return np.zeros((0, len(self.words)), np.float32), np.zeros((0,), np.int64)
        return self.labelled(parsed_posts(blobs))


def task_vocabularies(
    data_dir: Optional[str],
    database: str,
    num_classes: Optional[int],
    word_vocabulary_size: int,
    train_posts: Optional[Callable[[], list[dict[str, list[str]]]]] = None,
) -> TagPrediction:
    """The words and tags of TFF's `stackoverflow.word_count` and `stackoverflow.tag_count` in
    `data_dir`; a file that is absent is counted from `train_posts()` (each client's parsed
    train posts: a vocabulary of those clients), or without `train_posts` an error naming the
    files and where to get them."""
    words_path, tags_path = vocabulary_files(data_dir or "")
    classes = TAG_VOCABULARY_SIZE if num_classes is None else num_classes
    missing = [p for p in (words_path, tags_path) if not os.path.isfile(p)]
    if missing and train_posts is None:
        raise DataError(
            f"--dataset=tff_stackoverflow without --num_clients reads every client when a round "
            f"first needs it, so its vocabularies come from TFF's files, and "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} absent: download "
            f"{WORD_COUNT_URL} and {TAG_COUNT_URL} (or run tff.simulation.datasets."
            "stackoverflow.load_word_counts() and load_tag_counts() on a machine with network "
            "access: they leave them in ~/.keras/datasets/), unpack them next to "
            f"{STACKOVERFLOW_FILE}; or give --num_clients to count them from the drawn clients"
        )
    posts = train_posts() if missing and train_posts is not None else []
    if os.path.isfile(words_path):
        words = word_counts_file(words_path, word_vocabulary_size)
    else:
        words = counted_vocabulary(
            (" ".join(p["tokens"]).split() for p in posts), word_vocabulary_size
        )
    if os.path.isfile(tags_path):
        tags = tag_counts_file(tags_path)
    else:
        tags = counted_vocabulary(("|".join(p["tags"]).split("|") for p in posts), classes)
    if num_classes is not None and not MIN_CLASSES <= num_classes <= len(tags):
        given = tags_path if os.path.isfile(tags_path) else database
        fix = (
            f"use --num_classes between {MIN_CLASSES} and {len(tags)}"
            if len(tags) >= MIN_CLASSES
            else f"a classifier needs at least {MIN_CLASSES}: give TFF's {TAG_COUNT_FILE} (or "
            "draw more clients with --num_clients)"
        )
        raise DataError(f"--num_classes={num_classes}: {given} gives {len(tags)} tags; {fix}")
    return TagPrediction(words, tags[:classes])
