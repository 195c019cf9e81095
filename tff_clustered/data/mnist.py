"""MNIST in FedGroup's setup (1,000 two-digit clients), and the readers of MNIST's files.

MNIST in FedGroup's setup (FedProx's generator): 1,000 clients with two digits
each and power-law sizes, from MNIST files the user already has; and the readers of MNIST's file
formats, which Fashion-MNIST shares (Xiao, Rasul and Vollgraf, "Fashion-MNIST: a Novel Image
Dataset for Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017: the same four IDX
file names, 60,000 / 10,000 28x28 grey images, 10 classes).

Reads the four IDX files (`train-images-idx3-ubyte`, ..., optionally `.gz`) or a Keras-style
`.npz` (`x_train`, `y_train`, `x_test`, `y_test`; `mnist.npz`, or `fashion-mnist.npz` /
`fashion_mnist.npz`) from `data_dir`.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import os
import struct
import zipfile
import zlib

import numpy as np

from tff_clustered.data.federated_data import (
    DataError,
    FederatedData,
    first_line,
    from_arrays,
    split_train_test,
)
from tff_clustered.seeds import DataStream, data_rng

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
MAX_IDX_BYTES = 1 << 30  # MNIST's largest file holds 47 MB; a larger header is corrupt
IDX_LIST = (
    "train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
    "t10k-labels-idx1-ubyte[.gz]"
)


@dataclasses.dataclass(frozen=True)
class MnistFormat:
    """A dataset stored as MNIST is (four IDX files, or a Keras `.npz` of `x_train`, `y_train`,
    `x_test`, `y_test`): its name in messages, the `.npz` names it may have (the first is the
    one messages name) and where to get the files."""

    name: str
    npz_names: tuple[str, ...]
    url: str

    @property
    def redownload(self) -> str:
        return f"the file is corrupt or not {self.name}, download it again"

    @property
    def missing_help(self) -> str:
        """What to put where: the files, their source and the flag."""
        npz = " or ".join(self.npz_names)
        return (
            f"put the four {self.name} IDX files ({IDX_LIST}, from {self.url} or a mirror) or "
            f"Keras' {npz} in --data_dir"
        )


MNIST = MnistFormat("MNIST", ("mnist.npz",), "http://yann.lecun.com/exdb/mnist/")
FASHION_MNIST = MnistFormat(
    "Fashion-MNIST",
    ("fashion-mnist.npz", "fashion_mnist.npz"),
    "https://github.com/zalandoresearch/fashion-mnist",
)
IDX_SHAPES = {"x_train": (28, 28), "y_train": (), "x_test": (28, 28), "y_test": ()}


def read_idx(path: str) -> np.ndarray:
    """One IDX file (uint8 data), gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            magic = f.read(4)
            if len(magic) != 4 or magic[:2] != b"\x00\x00" or magic[2] != 0x08:
                raise DataError(
                    f"{path} is not an IDX file of unsigned bytes (bad magic number); "
                    "download it again"
                )
            header = f.read(4 * magic[3])
            if len(header) != 4 * magic[3]:
                raise DataError(f"{path} ends inside its header: truncated, download it again")
            dims = struct.unpack(">" + "I" * magic[3], header)
            expected = math.prod(dims)
            data = f.read(expected + 1) if expected < MAX_IDX_BYTES else b""
    except (OSError, EOFError, zlib.error) as e:
        message = first_line(e)
        raise DataError(f"{path} cannot be read ({message}); download it again") from e
    if expected >= MAX_IDX_BYTES:
        raise DataError(
            f"{path} declares shape {dims} ({expected} bytes), more than any MNIST file; "
            "the header is corrupt, download it again"
        )
    if len(data) != expected:
        raise DataError(
            f"{path} holds {len(data)} bytes for shape {dims}: "
            f"{'truncated' if len(data) < expected else 'extra bytes after the data'}, "
            "download it again"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def read_npz(path: str, fmt: MnistFormat = MNIST) -> dict[str, np.ndarray]:
    """A Keras-style `.npz` of `fmt` (`mnist.npz`; no pickled objects)."""
    try:
        with np.load(path, allow_pickle=False) as blob:
            missing = [k for k in IDX_FILES if k not in blob.files]
            if missing:
                raise DataError(
                    f"{path} lacks {', '.join(missing)}; Keras' {fmt.npz_names[0]} holds x_train, "
                    "y_train, x_test and y_test"
                )
            return {k: blob[k] for k in IDX_FILES}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        message = first_line(e)
        raise DataError(
            f"{path} cannot be read as an .npz of arrays ({message}); download Keras' "
            f"{fmt.npz_names[0]} again"
        ) from e


def check_mnist_part(
    key: str, array: np.ndarray, source: str, fmt: MnistFormat = MNIST
) -> np.ndarray:
    """One of x_train/y_train/x_test/y_test: 28x28 images with values 0..255, or labels 0..9."""
    shape = IDX_SHAPES[key]
    if array.ndim != 1 + len(shape) or array.shape[1:] != shape:
        want = "(n, 28, 28) images" if shape else "(n,) labels"
        raise DataError(
            f"{source}: {key} has shape {array.shape}, {fmt.name} needs {want}; {fmt.redownload}"
        )
    if array.dtype.kind not in "uif":
        raise DataError(
            f"{source}: {key} holds {array.dtype} values, {fmt.name} needs numbers; "
            f"{fmt.redownload}"
        )
    values = array.astype(np.float64)
    high = 255 if shape else 9
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > high):
        raise DataError(
            f"{source}: {key} has values outside 0..{high} (or NaN); the file is corrupt, "
            "download it again"
        )
    if np.any(np.mod(values, 1) != 0):
        raise DataError(f"{source}: {key} must hold whole numbers; download it again")
    return array.astype(np.uint8)


def mnist_files(data_dir: str, fmt: MnistFormat = MNIST) -> dict[str, str]:
    """The file holding each of `IDX_FILES`' parts of `fmt` in `data_dir`: the first of
    `fmt.npz_names` present (for all four), else each IDX file (plain or `.gz`). What
    `read_mnist_splits` reads, and what a checkpoint fingerprints."""
    if not data_dir or not os.path.isdir(data_dir):
        raise DataError(f"{fmt.name} folder {data_dir!r} does not exist; {fmt.missing_help}")
    npzs = [os.path.join(data_dir, name) for name in fmt.npz_names]
    npz = next((p for p in npzs if os.path.exists(p)), None)
    if npz is not None:
        return {k: npz for k in IDX_FILES}
    sources = {}
    for key, name in IDX_FILES.items():
        candidates = [os.path.join(data_dir, name + ext) for ext in ("", ".gz")]
        path = next((p for p in candidates if os.path.exists(p)), None)
        if path is None:
            raise DataError(f"{candidates[0]}[.gz] is missing; {fmt.missing_help}")
        sources[key] = path
    return sources


def mnist_paths(data_dir: str, fmt: MnistFormat = MNIST) -> list[str]:
    """The files `mnist_files` finds, each once (the .npz holds every split), sorted."""
    return sorted(set(mnist_files(data_dir, fmt).values()))


def read_mnist_splits(
    data_dir: str, fmt: MnistFormat = MNIST
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(x_train, y_train, x_test, y_test)` of `fmt` in `data_dir`, in the files' order: uint8
    (n, 28, 28) images and int64 labels. Reads the first of `fmt.npz_names` present, else the
    four IDX files (each plain or `.gz`)."""
    sources = mnist_files(data_dir, fmt)
    if len(set(sources.values())) == 1:
        npz = sources["x_train"]
        parts = {k: check_mnist_part(k, v, npz, fmt) for k, v in read_npz(npz, fmt).items()}
    else:
        parts = {k: check_mnist_part(k, read_idx(p), p, fmt) for k, p in sources.items()}
    for split in ("train", "test"):
        x, y = parts[f"x_{split}"], parts[f"y_{split}"]
        if len(x) != len(y):
            raise DataError(
                f"{sources[f'x_{split}']} holds {len(x)} images but {sources[f'y_{split}']} "
                f"holds {len(y)} labels; one of them is corrupt, download both again"
            )
    return (
        parts["x_train"],
        parts["y_train"].astype(np.int64),
        parts["x_test"],
        parts["y_test"].astype(np.int64),
    )


def read_mnist(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 (or however many the files hold) images as (n, 784) uint8, and labels."""
    x_train, y_train, x_test, y_test = read_mnist_splits(data_dir)
    x = np.concatenate([x_train, x_test]).reshape(-1, 784)
    y = np.concatenate([y_train, y_test])
    return x, y


def partition_by_classes(
    y: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
    min_per_class: int = 5,
    sigma: float = 2.0,
) -> list[np.ndarray]:
    """Client u owns classes (u + j) mod C, j < classes_per_client; it first gets
    `min_per_class` examples of each, then the rest of each class is split among its owners in
    lognormal(0, sigma) proportions (FedProx's power-law generator)."""
    num_classes = int(y.max()) + 1
    owners: dict[int, list[tuple[int, int]]] = {c: [] for c in range(num_classes)}
    for u in range(num_clients):
        for j in range(classes_per_client):
            owners[(u + j) % num_classes].append((u, j))
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        if not owners[c]:
            continue
        if len(idx) < min_per_class * len(owners[c]):
            raise DataError(
                f"class {c} has {len(idx)} examples, too few for {len(owners[c])} owners; "
                "use fewer clients"
            )
        for n, (u, _) in enumerate(owners[c]):
            shares[u].append(idx[n * min_per_class : (n + 1) * min_per_class])
        rest = idx[min_per_class * len(owners[c]) :]
        props = rng.lognormal(0, sigma, len(owners[c]))
        cuts = np.floor(np.cumsum(props / props.sum()) * len(rest)).astype(int)
        for (u, _), part in zip(owners[c], np.split(rest, cuts[:-1])):
            shares[u].append(part)
    return [np.concatenate(s) for s in shares]


def load_mnist(
    data_dir: str, num_clients: int = 1000, classes_per_client: int = 2, seed: int = 0
) -> FederatedData:
    """FedGroup's MNIST: per-pixel standardisation over all images, power-law two-digit
    clients, 90/10 split per client."""
    x, y = read_mnist(data_dir)
    x = x.astype(np.float32)
    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 0.001)
    rng = data_rng(seed, DataStream.LOADER)
    train, test = {}, {}
    for u, idx in enumerate(partition_by_classes(y, num_clients, classes_per_client, rng)):
        cid = f"mnist_{u:04d}"
        train[cid], test[cid] = split_train_test(x[idx], y[idx], 0.9, rng)
    return from_arrays("mnist", train, test, 10, image_shape=(28, 28, 1), source=data_dir)
