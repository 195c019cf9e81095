"""A run's state as JSON text plus NumPy arrays, so that a checkpoint never runs code.

`encode_tree` turns a state (dataclasses, containers, numbers, strings, arrays) into a JSON-able
tree whose arrays are moved out and referenced by entry name; `decode_tree` rebuilds it.
Dataclasses are recorded by `module:qualname` and rebuilt only when they are dataclasses of
this package, each field checked against its annotation; nothing else in the tree names code.
A state class that moved to another module is still found under the name older checkpoints
wrote (`RELOCATED`), so that a run checkpointed before the move resumes.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from typing import Any

import numpy as np

PACKAGE = "tff_clustered."
# State classes that moved, by the name older checkpoints recorded: the name they have now.
RELOCATED = {
    "tff_clustered.loop.privacy:PrivacyLedger": "tff_clustered.loop.privacy_ledger:PrivacyLedger",
}


# A dict of at least this many str -> int entries (clients' clusters) is kept as two arrays.
COLUMNS_FROM = 1024


class StateDecodeError(ValueError):
    """A tree `decode_tree` refuses: a foreign or unknown class, a missing array, a field of
    another type, or a structure this version does not write."""


def encode_tree(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON-able form of `value`; arrays go to `arrays` and are referenced by name."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)  # NaN and infinity: JSON's common extension, read back as such
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("object arrays cannot be checkpointed")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"ndarray": name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {
            f.name: encode_tree(getattr(value, f.name), arrays) for f in dataclasses.fields(cls)
        }
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}[type(value)]
        items = sorted(value, key=repr) if kind in ("set", "frozenset") else value
        return {kind: [encode_tree(v, arrays) for v in items]}
    if isinstance(value, dict):
        if (  # a population's clusters: two arrays, not a JSON pair per client
            len(value) >= COLUMNS_FROM
            and set(map(type, value)) == {str}
            and set(map(type, value.values())) == {int}
        ):
            text, lengths, values = (f"a{len(arrays) + k}" for k in range(3))
            arrays[text] = np.frombuffer("".join(value).encode(*UTF8), np.uint8)
            arrays[lengths] = np.fromiter(map(len, value), np.int64, len(value))
            arrays[values] = np.fromiter(value.values(), np.int64, len(value))
            return {"str_int_text": [text, lengths, values]}
        return {
            "dict": [[encode_tree(k, arrays), encode_tree(v, arrays)] for k, v in value.items()]
        }
    raise TypeError(f"a checkpoint cannot hold a {type(value).__name__}")


# The keys' text: UTF-8, a lone surrogate (a valid str, not valid UTF-8) passed through.
UTF8 = ("utf-8", "surrogatepass")
# A long str -> int dict's arrays, by the kind that keeps it: its keys' text end to end and each
# key's length in characters (older checkpoints: an array of strings), then its values.
COLUMN_DICTS = {"str_int_text": 3, "str_int_dict": 2}


def column_dict(kind: str, body: Any, arrays: Any) -> tuple[list[str], np.ndarray]:
    """The keys and values (int64) of a str -> int dict kept as arrays (`COLUMN_DICTS`);
    `StateDecodeError` for arrays that are missing or do not hold one key per value."""
    if not (isinstance(body, list) and len(body) == COLUMN_DICTS[kind]):
        raise StateDecodeError(f"a dict's arrays {body!r} are not {COLUMN_DICTS[kind]} names")
    if not all(isinstance(name, str) and name in arrays for name in body):
        raise StateDecodeError(f"the arrays {body!r} of a dict are missing")
    *keys, values = (arrays[name] for name in body)
    if values.dtype != np.int64 or values.ndim != 1:
        raise StateDecodeError("a dict's values are not integers")
    if kind == "str_int_dict" and keys[0].dtype.kind == "U" and keys[0].shape == values.shape:
        return keys[0].tolist(), values
    text, lengths = keys if kind == "str_int_text" else (None, None)
    if text is not None and text.dtype == np.uint8 and lengths.shape == values.shape:
        try:
            decoded = text.tobytes().decode(*UTF8)
        except UnicodeDecodeError:
            decoded = None
        ends = np.cumsum(lengths).tolist() if lengths.dtype == np.int64 else [-1]
        if decoded is not None and (ends[-1] if ends else 0) == len(decoded):
            return [decoded[a:b] for a, b in zip([0, *ends[:-1]], ends)], values
    raise StateDecodeError("a dict's keys are not as many strings as its values")


def _dataclass(name: str) -> type:
    """A dataclass of this package by `module:qualname`; anything else is refused."""
    if not isinstance(name, str):
        raise StateDecodeError(f"a state class name is a {type(name).__name__}, not a name")
    module_name, _, qualname = RELOCATED.get(name, name).partition(":")
    if not module_name.startswith(PACKAGE) or not qualname:
        raise StateDecodeError(f"it names {name!r}, which is not a tff-clustered state class")
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise StateDecodeError(f"it names an unknown state class {name!r}") from e
    if not (isinstance(found, type) and dataclasses.is_dataclass(found)):
        raise StateDecodeError(f"it names {name!r}, which is not a state class")
    return found


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def decode_tree(tree: Any, arrays: Any) -> Any:
    """The value `encode_tree` made `tree` from, its arrays taken from `arrays` by name;
    `StateDecodeError` for anything `encode_tree` does not write."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, dict) and len(tree) == 1:
        ((kind, body),) = tree.items()
        if kind == "ndarray":
            if not isinstance(body, str) or body not in arrays:
                raise StateDecodeError(f"array {body!r} is missing")
            return arrays[body]
        if kind in ("list", "tuple", "set", "frozenset") and isinstance(body, list):
            items = [decode_tree(v, arrays) for v in body]
            if kind in ("set", "frozenset") and not all(_hashable(v) for v in items):
                raise StateDecodeError(f"a {kind} holds an unhashable item")
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
        if kind in COLUMN_DICTS:
            keys, values = column_dict(kind, body, arrays)
            return dict(zip(keys, values.tolist()))
        if kind == "dict" and isinstance(body, list):
            if not all(isinstance(pair, list) and len(pair) == 2 for pair in body):
                raise StateDecodeError("a dict entry is not a (key, value) pair")
            decoded = [(decode_tree(k, arrays), decode_tree(v, arrays)) for k, v in body]
            if not all(_hashable(k) for k, _ in decoded):
                raise StateDecodeError("a dict key is not hashable")
            return dict(decoded)
    if isinstance(tree, dict) and set(tree) == {"dataclass", "fields"}:
        cls = _dataclass(tree["dataclass"])
        if not isinstance(tree["fields"], dict):
            raise StateDecodeError(f"its {cls.__name__} has no fields")
        fields = {k: decode_tree(v, arrays) for k, v in tree["fields"].items()}
        _check_field_types(cls, fields)
        try:
            return cls(**fields)
        except TypeError as e:
            raise StateDecodeError(f"its {cls.__name__} does not match this version: {e}") from e
    raise StateDecodeError(f"unexpected structure {str(tree)[:80]!r}")


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type at its top level (containers' items are not
    checked; hints this cannot read, e.g. a Literal or a TypeVar, pass)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    hint = origin or hint
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating))
    if hint is int:
        return isinstance(value, (int, np.integer))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_field_types(cls: type, fields: dict[str, Any]) -> None:
    """Refuses a field whose value is not of its annotated type (a crafted checkpoint would
    otherwise fail later, far from its cause)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - annotations this cannot resolve are not checked
        return
    for name, value in fields.items():
        if name in hints and not _matches(value, hints[name]):
            raise StateDecodeError(
                f"its {cls.__name__}.{name} is a {type(value).__name__}, not {hints[name]}"
            )
