"""The registry of algorithms by name, each one module defining an `Algorithm` subclass.

Algorithms by name. A new algorithm is one module here defining an `Algorithm` subclass
(with its `Options`, which become its flags)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any

from absl import flags

from tff_clustered import options as options_lib
from tff_clustered.algorithms.base import Algorithm


def _discover() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Algorithm) and cls.name and cls.__module__ == module.__name__:
                found[cls.name] = cls
    return dict(sorted(found.items()))


ALGORITHMS: dict[str, type[Algorithm]] = _discover()


def define_all_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Every algorithm's options as flags (one flag per option name)."""
    options_lib.define_flags({name: cls.Options for name, cls in ALGORITHMS.items()}, flag_values)


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def make_options(name: str, **values: Any) -> Any:
    """`name`'s options from keyword values; an option it does not take is a clear error."""
    cls = algorithm_class(name)
    accepted = options_lib.names(cls.Options)
    for key in values:
        if key not in accepted:
            hint = cls.refused.get(key, "")
            raise ValueError(
                f"{name} takes no --{key}"
                + (f": {hint}" if hint else "")
                + f" (its options: {', '.join(accepted) or 'none'})"
            )
    for field in dataclasses.fields(cls.Options):
        choices = field.metadata.get("choices")
        if choices and field.name in values and values[field.name] not in choices:
            raise ValueError(
                f"{name}: --{field.name}={values[field.name]} is not one of {', '.join(choices)}"
            )
    # Typed under the name asked for (an Options class can serve several algorithms, and
    # checks its own types again where it is made).
    for field_name, annotation in options_lib.field_types(cls.Options):
        if field_name in values:
            values[field_name] = options_lib.checked_value(
                name, field_name, values[field_name], annotation
            )
    return cls.Options(**values)


def make_algorithm(name: str, options: Any = None, **values: Any) -> Algorithm:
    """The algorithm `name` with `options` (its Options) or keyword option values."""
    cls = algorithm_class(name)
    if options is None:
        options = make_options(name, **values)
    elif values:
        options = dataclasses.replace(options, **values)
    return cls(options)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "algorithm_class",
    "define_all_flags",
    "make_algorithm",
    "make_options",
]
