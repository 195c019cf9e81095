"""Every random choice of a run derives from its seed, through one of two kinds of stream.

* Data streams (`DataStream`, `data_rng`): what a loader draws once, when it builds the data
  (which examples each client holds, each client's test set, a planted grouping, ...). A
  loader draws each purpose's choices in sequence from that purpose's own generator,
  `np.random.default_rng([seed, *stream.value, *parts])`, so that one purpose's draws do not
  shift another's (a different grouping leaves the clients' images as they are). The data is
  rebuilt, identically, whenever a run starts or resumes. The ids are those the committed
  result tables were made with: a stream's generator must not change.
* Run-time streams (`derived_seed(seed, stream, round, client, ...)`, `rng_for`): the choices a
  run makes as it goes (the clients sampled per round, local shuffles, an algorithm's draws).
  Each is a pure function of the seed and of where in the run it is made, with no generator
  state to carry, so a run resumed from a checkpoint ends exactly where an uninterrupted run
  would.

Each table names every stream once (`DataStream` refuses two names of one id), so no two
purposes share a stream by accident.
"""

from __future__ import annotations

import enum

import numpy as np

# Run-time streams: the first part after the seed of a `derived_seed`.
SAMPLING, SHUFFLE, PRETRAIN_SHUFFLE, ALGORITHM, DROPOUT, PUBLIC_BATCH = 1, 2, 3, 4, 5, 6
FINE_TUNE_SHUFFLE = 7
# The clients every evaluation of a run scores with `--eval_clients` (`TrainingConfig`).
EVAL_SAMPLE = 8
# The Gaussian noise a private aggregator adds to each cluster's sum in a round
# (`federated.cluster_dp.ClusterDP`, `--dp_noise=seeded`): the round's 128-bit key
# (`derived_key`), split there by cluster and tensor.
DP_NOISE = 9
# A tuned comparison's trials (`comparison/tuning.py`): the value of one knob in one trial,
# folded with the trial and the knob's name.
TUNING = 10
# The Gaussian noise on each client's own pre-training update a private run's cold start reads
# (`loop.update_release`), folded there with the round and the client's index.
COLD_START_NOISE = 11


@enum.unique
class DataStream(enum.Enum):
    """A loader's random stream: its value is what follows the seed in the generator's entropy
    (`data_rng`); () is the seed alone."""

    # A loader that draws everything from one generator, in order: Synthetic(alpha, beta)'s
    # devices and splits, FedGroup's MNIST partition and splits.
    LOADER = ()
    # digits_clusters: which images each client holds, and each client's train/test split.
    DIGITS_SHARES = (0,)
    # digits_clusters: each planted group's label permutation.
    LABEL_PERMUTATIONS = (1,)
    # digits_clusters: each client's planted group.
    PLANTED_GROUPS = (2,)
    # digits_*: the images held out as the server's unlabeled public set.
    PUBLIC_HOLDOUT = (3,)
    # Which training examples each client holds: the partition of a pooled training set
    # (digits_*, the image federations, PathMNIST, FedAC's training sets), or which writers
    # mnist_writers keeps.
    CLIENT_EXAMPLES = (4,)
    # Each client's test set: its train/test split, its holdout, or FedAC's local test set.
    CLIENT_TEST_SETS = (5,)
    # The image federations' `train_examples`: which training images are dealt at all.
    TRAIN_SUBSET = (6,)
    # `tff_clustered.federated_data` without `test`: each given client's train/test split.
    GIVEN_CLIENTS_SPLIT = (7,)
    # TFF's SQLite datasets: which of the file's clients are kept.
    TFF_CLIENTS = (11,)
    # TFF's CIFAR-100: client k's local test set (part k).
    TFF_CLIENT_HOLDOUT = (12,)
    # The synthetic population (`data/population.py`): each planted group's linear map, and
    # client k's examples (part k).
    POPULATION_GROUP_MAPS = (13,)
    POPULATION_CLIENT = (14,)
    # `--split=validation`: which of client k's training examples (part k) are held out as its
    # validation set (`data/validation.py`).
    VALIDATION_EXAMPLES = (15,)


def data_rng(seed: int, stream: DataStream, *parts: int) -> np.random.Generator:
    """The generator of `stream` for `seed` (and `parts`, e.g. a client's index):
    `np.random.default_rng([seed, *stream.value, *parts])`. `DataStream.LOADER` takes no parts
    (the seed alone followed by parts would be another stream's generator)."""
    if parts and not stream.value:
        raise ValueError(f"{stream} is the seed alone and takes no parts, got {parts}")
    return np.random.default_rng([int(seed), *stream.value, *(int(p) for p in parts)])


def derived_seed(*parts: int) -> int:
    """A 31-bit seed that is a fixed function of its integer parts."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


def derived_key(*parts: int) -> tuple[int, int]:
    """A 128-bit key (two int64 values, a stateless TF seed) that is a fixed function of its
    integer parts: every bit of a seed of any width reaches it, as `derived_seed`'s 31 bits
    could not carry a wider seed."""
    words = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)
    low, high = (int(w) for w in words.view(np.int64))
    return low, high


def rng_for(*parts: int) -> np.random.Generator:
    """The generator of the run-time seed `derived_seed(*parts)`."""
    return np.random.default_rng(derived_seed(*parts))
