"""The official files of CIFAR-10, CIFAR-100 and SVHN and TFDS directories, read as arrays.

The official files of CIFAR-10, CIFAR-100 and SVHN, and prepared TFDS directories, read as
NHWC uint8 images and int64 labels; nothing is downloaded. Pixels and labels are checked as
whole numbers in range (a damaged file is refused, not rounded or wrapped), and a CIFAR pickle
is unpickled with only the types an official batch holds.

Sources:
* CIFAR-10: the official Python pickle batches, `cifar-10-batches-py/` (data_batch_1..5,
  test_batch), https://www.cs.toronto.edu/~kriz/cifar.html;
* CIFAR-100: `cifar-100-python/` (train, test; fine labels), same page;
* SVHN: `train_32x32.mat` and `test_32x32.mat`, http://ufldl.stanford.edu/housenumbers/;
* CIFAR-10, CIFAR-100 and SVHN also from a prepared TFDS data directory (`cifar10`, `cifar100`,
  `svhn_cropped`).
"""

from __future__ import annotations

import os
import pickle
from typing import Optional

import numpy as np

from tff_clustered.data.federated_data import DataError, first_line

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
TFDS_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100", "svhn": "svhn_cropped"}
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


def tfds_root(tfds_name: str, tfds_dir: str) -> str:
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
    root = tfds_root(tfds_name, tfds_dir)
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
