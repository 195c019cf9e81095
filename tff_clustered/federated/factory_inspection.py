"""What a run reads of a `tff.aggregators` factory before running it.

What a run reads of a `tff.aggregators` factory before running it (`tff_factory_aggregator.
TffFactoryPerCluster`): the secure-sum intrinsics its process calls, which TFF 0.87's C++
worker cannot run, and its parameters as plain values, which the run's settings record so that
a resumed run with a changed factory is refused.

Parameters: a factory is a Python object holding its constructor's arguments, as attributes
(`MeanFactory`, `DifferentiallyPrivateFactory` and its `tensorflow_privacy` query: the noise's
standard deviation, the clip) or in the closure of a class made inside a function
(`tff.aggregators.clipping_factory`'s and `zeroing_factory`'s wrappers). `factory_parameters`
walks both, each value under its path (`inner_agg_factory/_query/_numerator/_stddev`). What a
factory keeps inside built TFF computations (a fixed clipping norm becomes a constant process;
an estimate's start, inside its `EstimationProcess`) cannot be read: those parts are listed as
`unread` (the computations' serialized forms are not stable across processes, so no digest of
them would compare two runs reliably).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import types
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tff_clustered.frameworks import tff

# TFF's secure-sum intrinsics (`federated_secure_sum`, `..._bitwidth`, `federated_secure_
# modular_sum`...), which TFF 0.87's C++ worker cannot execute.
SECURE_PREFIX = "federated_secure"
# The walk's limits: deeper nesting, or more values, is left unread.
MAX_DEPTH = 16
MAX_VALUES = 2000
# An array of more values is recorded by its digest.
MAX_LISTED = 16


def secure_intrinsics(process: tff.templates.AggregationProcess) -> tuple[str, ...]:
    """The secure-sum intrinsics `process`'s computations call, wherever they are nested."""
    found: set[str] = set()

    def record(comp: Any) -> tuple[Any, bool]:
        if isinstance(comp, tff.framework.Intrinsic) and comp.uri.startswith(SECURE_PREFIX):
            found.add(comp.uri)
        return comp, False

    for computation in (process.initialize, process.next):
        tff.framework.transform_postorder(computation.to_building_block(), record)
    return tuple(sorted(found))


@dataclasses.dataclass(frozen=True)
class FactoryParameters:
    """A factory's readable parameters (`values`: path -> a plain value) and the paths of its
    parts that could not be read (`unread`: TFF computations, objects without attributes)."""

    values: dict[str, Any]
    unread: tuple[str, ...]


def factory_parameters(factory: Any) -> FactoryParameters:
    """`factory`'s parameters (see the module docstring), in a fixed order."""
    values: dict[str, Any] = {}
    unread: list[str] = []

    def walk(obj: Any, path: str, ancestors: frozenset[int]) -> None:
        if len(values) >= MAX_VALUES or len(ancestors) > MAX_DEPTH:
            unread.append(path)
            return
        plain = plain_value(obj)
        if plain is not NOT_PLAIN:
            values[path] = plain
            return
        if id(obj) in ancestors:  # a cycle
            values[path] = "(cycle)"
            return
        ancestors = ancestors | {id(obj)}
        if isinstance(obj, tff.Computation):  # its constants are inside a serialized graph
            values[path] = f"computation {obj.type_signature}"
            unread.append(path)
            return
        held = parts(obj)
        if held is None:
            values[path] = f"unread {type(obj).__qualname__}"
            unread.append(path)
            return
        for key, part in held:
            walk(part, f"{path}/{key}" if path else key, ancestors)

    walk(factory, "", frozenset())
    return FactoryParameters(values, tuple(unread))


class _NotPlain:
    pass


NOT_PLAIN = _NotPlain()


def plain_value(obj: Any) -> Any:
    """`obj` as a value a settings file holds (JSON, and equal to itself: non-finite floats
    as text), or `NOT_PLAIN` for a container or an object to walk into."""
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else repr(obj)
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__qualname__}.{obj.name}"
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, (np.dtype, tf.dtypes.DType, tff.types.Type)):
        return str(obj)
    if isinstance(obj, (np.ndarray, np.generic)) or tf.is_tensor(obj):
        try:
            array = np.asarray(obj)
        except Exception:  # a symbolic tensor holds no value: unread
            return NOT_PLAIN
        if array.size <= MAX_LISTED and array.dtype.kind in "biuf":
            return [plain_value(v) for v in array.reshape(-1).tolist()]
        digest = hashlib.sha256(array.tobytes()).hexdigest()[:16]
        return f"array {array.dtype}{list(array.shape)} sha256:{digest}"
    return NOT_PLAIN


def parts(obj: Any) -> Optional[list[tuple[str, Any]]]:
    """What `obj` holds, by name: a container's items, a function's name and closure, an
    object's class and attributes (and, for a class made inside a function, the closure of its
    methods: TFF's robust wrappers keep their arguments there); None for an object without
    attributes (a C extension's, a symbolic tensor)."""
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, functools.partial):
        return [("func", obj.func), ("args", obj.args), ("keywords", obj.keywords)]
    if isinstance(obj, types.FunctionType):
        named = [("function", f"{obj.__module__}.{obj.__qualname__}")]
        return named + closure(obj) + [("defaults", obj.__defaults__)] * bool(obj.__defaults__)
    if not hasattr(obj, "__dict__"):
        return None
    cls = type(obj)
    found = [("class", f"{cls.__module__}.{cls.__qualname__}")]
    if "<locals>" in cls.__qualname__:
        for member in vars(cls).values():
            if isinstance(member, types.FunctionType):
                found += [(n, v) for n, v in closure(member) if n not in dict(found)]
    return found + sorted(vars(obj).items())


def closure(function: types.FunctionType) -> list[tuple[str, Any]]:
    """The variables `function` closes over, by name (not its class cell)."""
    cells = zip(function.__code__.co_freevars, function.__closure__ or ())
    return [(name, cell.cell_contents) for name, cell in cells if name != "__class__"]


def unread_warning(description: str, parameters: FactoryParameters) -> str:
    """What a resumed run says of the factory's parameters it could not compare with its
    checkpoint's ("" when every one was compared)."""
    unread = parameters.unread
    if not unread:
        return ""
    return (
        f"warning: {len(unread)} parts of the tff.aggregators factory {description} (e.g. "
        f"{unread[0]}) are TFF computations whose parameters (a fixed norm, an estimate's "
        "start) cannot be read, so they were not compared with the checkpoint's; resume only "
        "with the factory that made it"
    )
