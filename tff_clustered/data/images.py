"""CIFAR-10, CIFAR-100, SVHN, Fashion-MNIST and MNIST from files the user already has (nothing
is downloaded), dealt to clients as in FedTSDP (Zhu et al., "Federated Two Stage Decoupling With
Adaptive Personalization Layers", 2023): a partition (IID, Dirichlet(beta), pathological,
shards), each client's share split 80/20 into train and test, and the official test split
without labels as the server's public set. Or dealt as in FedAC (Zhang et al.,
arXiv:2403.16460, Sec. 5.1): `fedac_dirichlet` / `fedac_pathological` give each client
n_i ~ UniformInt[50, 350] training images (a per-client Dirichlet(alpha) label mixture, or n
labels split equally) and a local test set drawn from the official test split in its training
proportions (round(0.25 n_i)); no public set then.

Sources:
* CIFAR-10: the official Python pickle batches, `cifar-10-batches-py/` (data_batch_1..5,
  test_batch), https://www.cs.toronto.edu/~kriz/cifar.html;
* CIFAR-100: `cifar-100-python/` (train, test; fine labels), same page;
* SVHN: `train_32x32.mat` and `test_32x32.mat`, http://ufldl.stanford.edu/housenumbers/;
* Fashion-MNIST (Xiao, Rasul and Vollgraf, arXiv:1708.07747, 2017), `fashion_mnist`: its four
  official IDX files (`train-images-idx3-ubyte.gz`, ..., the names MNIST's files have) or a
  Keras-style `fashion-mnist.npz`, https://github.com/zalandoresearch/fashion-mnist;
* MNIST (LeCun et al., "Gradient-based learning applied to document recognition", Proc. IEEE
  86(11), 1998), `mnist_partitioned`: the same formats (`mnist.npz`), dealt by the same
  partitions (FedGroup's own MNIST setup is `--dataset=mnist`, `data.mnist.load_mnist`);
* CIFAR-10, CIFAR-100 and SVHN also from a prepared TFDS data directory (`cifar10`, `cifar100`,
  `svhn_cropped`).

Images are float32 NHWC (32x32x3, or 28x28x1 for Fashion-MNIST and MNIST), standardised per
channel with the training split's mean and standard deviation (no augmentation).
"""

from __future__ import annotations

import os
import pickle
from typing import Optional

import numpy as np

from tff_clustered.data import fedac_partitions, partitions
from tff_clustered.data.federated_data import DataError, FederatedData, first_line, from_arrays
from tff_clustered.data.fingerprint import folder_files
from tff_clustered.data.mnist import (
    FASHION_MNIST,
    MNIST,
    MnistFormat,
    mnist_paths,
    read_mnist_splits,
)

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
NUM_CLASSES = {
    "cifar10": 10,
    "cifar100": 100,
    "svhn": 10,
    "fashion_mnist": 10,
    "mnist_partitioned": 10,
}
IMAGE_SHAPES = {
    "cifar10": (32, 32, 3),
    "cifar100": (32, 32, 3),
    "svhn": (32, 32, 3),
    "fashion_mnist": (28, 28, 1),
    "mnist_partitioned": (28, 28, 1),
}
# The grey 28x28 datasets in MNIST's file formats (`mnist.read_mnist_splits`).
MNIST_FORMATS: dict[str, MnistFormat] = {"fashion_mnist": FASHION_MNIST, "mnist_partitioned": MNIST}
# FedAC's partitions (`fedac_partitions.fedac_partition`) by the name `--partition` gives them.
FEDAC_SCHEMES = {"fedac_dirichlet": "dirichlet", "fedac_pathological": "pathological"}
TFDS_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100", "svhn": "svhn_cropped"}
FILES = {
    "cifar10": "cifar-10-batches-py/",
    "cifar100": "cifar-100-python/",
    "svhn": "train_32x32.mat and test_32x32.mat",
}
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, y_train, x_test, y_test


def _missing(name: str, path: str) -> DataError:
    """The error for a missing official file or folder: where to get it, which flag to set."""
    url = SVHN_URL if name == "svhn" else CIFAR_URL
    return DataError(
        f"{name}: {path} not found. Download it from {url} (nothing is downloaded at run time) "
        "and point --data_dir at the folder that holds it, or give --tfds_dir for a prepared "
        "TFDS directory"
    )


class CifarUnpickler(pickle.Unpickler):
    """Unpickles only what the official CIFAR batches hold: dicts, lists, bytes, numbers and
    NumPy arrays. Any other global (a function a crafted file could call) is refused, so a
    batch file someone sent you cannot run code."""

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),  # Python 2 byte strings
        }
    )

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"it refers to {module}.{name}, which a CIFAR batch never does"
            )
        return super().find_class(module, name)


def _unpickle(name: str, path: str) -> dict:
    """One official CIFAR pickle (a dict with bytes keys)."""
    if not os.path.isfile(path):
        raise _missing(name, path)
    try:
        with open(path, "rb") as f:
            batch = CifarUnpickler(f, encoding="bytes").load()
    except Exception as e:  # noqa: BLE001 - any failure to unpickle is a bad file
        message = first_line(e)
        raise DataError(
            f"{name}: {path} cannot be read as a CIFAR pickle batch ({message}); download the "
            "official files again"
        ) from e
    if not isinstance(batch, dict):
        raise DataError(
            f"{name}: {path} holds a {type(batch).__name__}, not a CIFAR batch (a dict); download "
            "the official files again"
        )
    return batch


def whole_numbers(
    values: object, what: str, fix: str, noun: str, dtype: type, upper: Optional[int] = None
) -> np.ndarray:
    """`values` as `dtype`, refused (a `DataError` naming `what`, the first bad `noun` and the
    `fix`) unless they are whole non-negative numbers, at most `upper` when given: NaN, 300
    or 0.5 is a damaged file, not a value to round, wrap or truncate."""
    try:
        array = np.asarray(values)
    except Exception as e:  # noqa: BLE001 - ragged or exotic contents
        raise DataError(f"{what} cannot be read as an array ({first_line(e)}); {fix}") from e
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise DataError(f"{what} holds {array.dtype} values, not {noun}s; {fix}")
    if array.dtype != np.uint8 and array.size:  # uint8 holds only whole 0..255
        wrong = ~np.isfinite(array) | (array < 0) | (np.mod(array, 1) != 0)
        if upper is not None:
            wrong |= array > upper
        if np.any(wrong):
            value = array.reshape(-1)[np.argmax(wrong.reshape(-1))]
            bound = f"0..{upper}" if upper is not None else "0 or more"
            raise DataError(f"{what} holds the {noun} {value}, not a whole {bound}; {fix}")
    return array.astype(dtype)


def pixel_array(values: object, what: str, fix: str) -> np.ndarray:
    """Pixels as uint8: whole numbers in 0..255."""
    return whole_numbers(values, what, fix, "pixel value", np.uint8, upper=255)


def label_array(values: object, what: str, fix: str) -> np.ndarray:
    """Class indices as int64: whole non-negative numbers (a float label 2.7 would otherwise
    be truncated to class 2)."""
    return whole_numbers(values, what, fix, "label", np.int64)


def _cifar_images(
    name: str, path: str, batch: dict, label_key: bytes
) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32, 32, 3) uint8 images from a batch's CHW rows (`b"data"`), and its labels."""
    fix = "download the official files again"
    try:
        data = pixel_array(batch[b"data"], f"{name}: {path}", fix)
        labels = label_array(batch[label_key], f"{name}: {path}", fix).reshape(-1)
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    except DataError:
        raise
    except (KeyError, ValueError) as e:
        raise DataError(f"{name}: {path} is not a CIFAR batch ({e!r} missing or misshaped)") from e
    if len(images) != len(labels):
        raise DataError(
            f"{name}: {path} holds {len(images)} images but {len(labels)} labels; download it again"
        )
    refuse_labels_outside(labels, NUM_CLASSES[name], f"{name}: {path}", fix)
    return images, labels


def refuse_labels_outside(labels: np.ndarray, classes: int, what: str, fix: str) -> None:
    """`DataError` naming the first label outside 0..classes-1."""
    bad = labels[(labels < 0) | (labels >= classes)]
    if bad.size:
        raise DataError(
            f"{what} holds label {int(bad[0])}, outside the {classes} classes "
            f"0..{classes - 1}; {fix}"
        )


# The official pickles of each split.
CIFAR_FILES = {
    "cifar10": ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
    "cifar100": (["train"], ["test"]),
}


def cifar_root(name: str, data_dir: str) -> str:
    """The official folder: `data_dir` may hold it or be that folder itself."""
    folder = FOLDERS[name]
    if os.path.basename(os.path.normpath(data_dir)) == folder:
        return data_dir
    return os.path.join(data_dir, folder)


def svhn_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}_32x32.mat")


def read_cifar(name: str, data_dir: str) -> Arrays:
    """CIFAR-10 or CIFAR-100 from the official pickle files."""
    root = cifar_root(name, data_dir)
    if not os.path.isdir(root):
        raise _missing(name, root)
    train_files, test_files = CIFAR_FILES[name]
    key = b"labels" if name == "cifar10" else b"fine_labels"

    def read(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [
            _cifar_images(name, os.path.join(root, f), _unpickle(name, os.path.join(root, f)), key)
            for f in files
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return (*read(train_files), *read(test_files))


def read_svhn(data_dir: str) -> Arrays:
    """SVHN cropped digits from train_32x32.mat / test_32x32.mat (label 10 is the digit 0)."""
    from scipy.io import loadmat

    out = []
    for split in ("train", "test"):
        path = svhn_path(data_dir, split)
        if not os.path.isfile(path):
            raise _missing("svhn", path)
        try:
            mat = loadmat(path)
            x, y = mat["X"], mat["y"]
        except Exception as e:  # noqa: BLE001
            raise DataError(f"svhn: {path} is not an SVHN .mat file ({first_line(e)})") from e
        fix = "download it again"
        x = pixel_array(x, f"svhn: {path}", fix)
        y = label_array(y, f"svhn: {path}", fix).reshape(-1)
        if x.ndim != 4:
            raise DataError(f"svhn: {path} holds images of shape {x.shape}, not 4-d; {fix}")
        x = x.transpose(3, 0, 1, 2)
        if len(x) != len(y) or x.shape[1:] != (32, 32, 3):
            raise DataError(
                f"svhn: {path} holds {x.shape} images and {len(y)} labels; download it again"
            )
        y = np.where(y == 10, 0, y)  # SVHN's label 10 is the digit 0
        refuse_labels_outside(y, NUM_CLASSES["svhn"], f"svhn: {path}", fix)
        out += [x, y]
    return tuple(out)  # type: ignore[return-value]


def _tfds_root(tfds_name: str, tfds_dir: str) -> str:
    """The TFDS data directory, also when `tfds_dir` names the dataset's own folder
    (`<dir>/cifar10`) or one of its versions (`<dir>/cifar10/3.0.2`)."""
    path = os.path.normpath(os.path.expanduser(tfds_dir))
    if os.path.isfile(os.path.join(path, "dataset_info.json")):
        path = os.path.dirname(path)
    if os.path.basename(path) == tfds_name:
        path = os.path.dirname(path)
    return path


def read_tfds(name: str, tfds_dir: str) -> Arrays:
    """A prepared TFDS dataset (`cifar10`, `cifar100`, `svhn_cropped`) under `tfds_dir`, as
    `tfds.load(..., download=False)` would read it: nothing is downloaded or prepared."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError(
            f"{name}: --tfds_dir needs the tensorflow-datasets package ({e}); install "
            "requirements/lock.txt, or use --data_dir with the original files"
        ) from e
    tfds_name = TFDS_NAMES[name]
    root = _tfds_root(tfds_name, tfds_dir)
    try:
        builder = tfds.builder(tfds_name, data_dir=root)
        prepared = builder.is_prepared()
    except Exception as e:  # noqa: BLE001 - a damaged dataset_info.json, among others
        raise DataError(
            f"{name}: the TFDS dataset {tfds_name!r} under {root} cannot be opened "
            f"({first_line(e)}); prepare it again, or use --data_dir with the original files"
        ) from e
    if not prepared:
        folder = os.path.join(root, tfds_name)
        found = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        have = f"it holds versions {found}, " if found else ""
        raise DataError(
            f"{name}: no prepared TFDS dataset {tfds_name!r} version {builder.version} under "
            f"{root} ({have}expected {os.path.join(folder, str(builder.version))}); prepare it "
            "where there is network access (tfds build), copy the directory here, or use "
            "--data_dir with the original files"
        )
    out = []
    for split in ("train", "test"):
        try:
            batch = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        except Exception as e:  # noqa: BLE001 - TFDS raises many kinds for a damaged directory
            raise DataError(
                f"{name}: the {split} split of the TFDS dataset in {builder.data_dir} cannot be "
                f"read ({e}); prepare it again"
            ) from e
        what, fix = f"{name}: the {split} split of {builder.data_dir}", "prepare it again"
        out += [pixel_array(batch["image"], what, fix), label_array(batch["label"], what, fix)]
    return tuple(out)  # type: ignore[return-value]


def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of NHWC images, accumulated in float64 over
    chunks of `chunk` images (two passes). NumPy's own float32 reduction over axes (0, 1, 2)
    is not pairwise and stalls once the running sum reaches about 2**32: on 50,000 CIFAR-sized
    images of uniform 0..255 noise it gives a mean of 84 instead of 127.5."""
    n = len(x)
    total = sum(x[i : i + chunk].sum(axis=(0, 1, 2), dtype=np.float64) for i in range(0, n, chunk))
    count = n * x.shape[1] * x.shape[2]
    mean = total / count
    squares = sum(
        np.square(x[i : i + chunk].astype(np.float64) - mean).sum(axis=(0, 1, 2))
        for i in range(0, n, chunk)
    )
    return mean, np.sqrt(squares / count)


def standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both splits as float32, standardised per channel with the training split's mean and
    standard deviation (`channel_stats`; in place: CIFAR's 50,000 training images take 600 MB
    as float32). A constant scale of the pixels (such as to [0, 1]) cancels out."""
    train = x_train.astype(np.float32)
    test = x_test.astype(np.float32)
    mean, std = channel_stats(train)
    mean, std = mean.astype(np.float32), np.maximum(std, 1e-3).astype(np.float32)
    for x in (train, test):
        x -= mean
        x /= std
    return train, test


def read_official(name: str, data_dir: str) -> Arrays:
    """`name`'s official files under `data_dir` as NHWC uint8 images and int64 labels (the grey
    28x28 datasets get a channel axis)."""
    if name in MNIST_FORMATS:
        x_train, y_train, x_test, y_test = read_mnist_splits(data_dir, MNIST_FORMATS[name])
        return x_train[..., None], y_train, x_test[..., None], y_test
    if name == "svhn":
        return read_svhn(data_dir)
    return read_cifar(name, data_dir)


def image_files(name: str, data_dir: Optional[str], tfds_dir: Optional[str]) -> list[str]:
    """The files `load_image_federation` reads for `name`: every file of the TFDS dataset's
    folder under `tfds_dir` when given, else the official files under `data_dir` (none when
    neither is given: the loader then refuses the run)."""
    if tfds_dir and name in TFDS_NAMES:
        tfds_name = TFDS_NAMES[name]
        return folder_files(os.path.join(_tfds_root(tfds_name, tfds_dir), tfds_name))
    if not data_dir:
        return []
    if name in MNIST_FORMATS:
        return mnist_paths(data_dir, MNIST_FORMATS[name])
    if name == "svhn":
        return [svhn_path(data_dir, split) for split in ("train", "test")]
    root = cifar_root(name, data_dir)
    return [os.path.join(root, f) for split in CIFAR_FILES[name] for f in split]


def load_image_federation(
    name: str,
    data_dir: Optional[str],
    partition: str = "dirichlet",
    num_clients: int = 20,
    dirichlet_beta: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    tfds_dir: Optional[str] = None,
    train_examples: Optional[int] = None,
) -> FederatedData:
    """`name` (cifar10, cifar100, svhn, fashion_mnist, mnist_partitioned) as FedTSDP deals it:
    the official training split standardised and dealt to `num_clients` clients by `partition`
    (`iid`, `dirichlet` with `dirichlet_beta`, `pathological` with `classes_per_client`, or
    McMahan et al.'s two label-sorted `shards` per client), each client's share split 80/20 into
    train and test; the official test split, without labels, is the server's public set
    (`public_x`). `fedac_dirichlet` (alpha = `dirichlet_beta`) and `fedac_pathological`
    (`classes_per_client` labels) deal FedAC's clients instead (module docstring). Reads `tfds_dir`
    (a prepared TFDS directory; cifar10, cifar100, svhn) when given, else the official files under
    `data_dir`. `train_examples`: deal a uniform choice of that many training images instead
    of all (seed stream [seed, 6]; a smaller run on the same distribution). The partition draws
    from seed stream [seed, 4], the per-client splits from [seed, 5]."""
    if name not in NUM_CLASSES:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(NUM_CLASSES)}")
    if tfds_dir and name not in TFDS_NAMES:
        raise DataError(
            f"--dataset={name} is not read from --tfds_dir (that is for "
            f"{', '.join(TFDS_NAMES)}); {MNIST_FORMATS[name].missing_help}"
        )
    if tfds_dir:
        x_train, y_train, x_test, y_test = read_tfds(name, tfds_dir)
        source = f"TFDS {TFDS_NAMES[name]} in {tfds_dir}"
    elif data_dir:
        x_train, y_train, x_test, y_test = read_official(name, data_dir)
        source = data_dir
    elif name in MNIST_FORMATS:
        raise DataError(
            f"--dataset={name} reads files you already have: {MNIST_FORMATS[name].missing_help}"
        )
    else:
        url = SVHN_URL if name == "svhn" else CIFAR_URL
        raise DataError(
            f"--dataset={name} reads files you already have: give --data_dir (the folder with "
            f"{FILES[name]}, from {url}) or --tfds_dir (a prepared TFDS directory)"
        )
    shape = IMAGE_SHAPES[name]
    for split, x in (("train", x_train), ("test", x_test)):
        if x.shape[1:] != shape or not len(x):
            raise DataError(
                f"{name}: {split} images in {source} have shape {x.shape}, expected "
                f"(n>0, {', '.join(map(str, shape))}); check that the files are the official ones"
            )
    bad = y_train[(y_train < 0) | (y_train >= NUM_CLASSES[name])]
    if bad.size:
        raise DataError(
            f"{name}: label {int(bad[0])} outside 0..{NUM_CLASSES[name] - 1} in {source}; "
            "check that the files are the official ones"
        )
    if train_examples is not None:
        if not 1 <= train_examples <= len(y_train):
            raise DataError(
                f"--train_examples={train_examples}: {name} has {len(y_train)} training images "
                f"in {source}; give a number in 1..{len(y_train)} or leave it unset"
            )
        chosen = np.sort(
            np.random.default_rng([seed, 6]).permutation(len(y_train))[:train_examples]
        )
        x_train, y_train = x_train[chosen], y_train[chosen]
    train, public = standardise(x_train, x_test)
    if partition in FEDAC_SCHEMES:
        drawn = fedac_partitions.fedac_partition(
            y_train,
            y_test,
            num_clients,
            FEDAC_SCHEMES[partition],
            np.random.default_rng([seed, 4]),
            np.random.default_rng([seed, 5]),
            alpha=dirichlet_beta,
            labels_per_client=classes_per_client,
        )
        return from_arrays(
            name,
            {f"{name}_{k:03d}": (train[i], y_train[i]) for k, i in enumerate(drawn.train)},
            {f"{name}_{k:03d}": (public[i], y_test[i]) for k, i in enumerate(drawn.test)},
            NUM_CLASSES[name],
            image_shape=shape,
            source=source,
        )
    parts = partitions.partition(
        y_train,
        num_clients,
        partition,
        np.random.default_rng([seed, 4]),
        dirichlet_beta=dirichlet_beta,
        classes_per_client=classes_per_client,
    )
    return partitions.federate(
        name,
        train,
        y_train,
        parts,
        NUM_CLASSES[name],
        np.random.default_rng([seed, 5]),
        public_x=public,
        image_shape=shape,
        source=source,
    )
