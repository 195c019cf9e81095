"""Algorithm options as command-line flags, declared once.

Each algorithm's `Options` is a frozen dataclass; each field is a flag of the same name, with
its help text in the field's metadata (`option(...)`). Options are the algorithm's own: two
algorithms may each have a `personal_layers` or a `num_clusters` with their own default and
help. One flag carries a name for all of them (the same type everywhere); a flag left unset
gives each algorithm its own default (`from_flags`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import reprlib
import typing
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
from absl import flags


def option(
    default: Any,
    help: str,
    choices: Optional[tuple[str, ...]] = None,
    flag: Optional[str] = None,
    lower_bound: Optional[float] = None,
    search: Any = None,
) -> Any:
    """A dataclass field that is also a flag: of the field's name unless `flag` names it (an
    aggregator's `clip` is `--dp_clip`), its values one of `choices`, or at least `lower_bound`
    (the flag parser refuses others); `search` (a `search_space` range) makes it a knob a
    tuned comparison draws from (`search_space_of`)."""
    metadata = {"help": help, "choices": choices, "flag": flag, "lower_bound": lower_bound}
    return dataclasses.field(default=default, metadata={**metadata, "search": search})


def search_space_of(options_cls: type) -> dict[str, Any]:
    """The knobs of an `Options` class that declare a `search` range, by field name."""
    return {
        f.name: f.metadata["search"]
        for f in dataclasses.fields(options_cls)
        if f.metadata.get("search") is not None
    }


def flag_name(field: dataclasses.Field) -> str:
    """The flag of an option field: its own name unless `option(flag=...)` gives another."""
    return field.metadata.get("flag") or field.name


def base_type(annotation: Any) -> type:
    """The type of an annotation, `Optional[X]` -> X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def described(value: Any) -> str:
    """`value`, cut short, and its type as a one-line error quotes them: `2.5 (a float)`."""
    return f"{' '.join(reprlib.repr(value).split())} ({article_of(type(value))})"


def checked_value(owner: str, name: str, value: Any, annotation: Any) -> Any:
    """`value` for the field `name` of `owner` declared as `annotation` (bool, int, float, str,
    `Optional` of one, or a class), as a plain Python value (a NumPy scalar becomes one).

    A value of another type is a TypeError naming the field, the value and what to write,
    as the command line refuses a flag it cannot parse: a bool is not an int (True would train
    one round), a float is not an int even when whole (2.0 is refused rather than silently
    rounded: 2.7 would be), a string of digits is not a number. An int is a float; NaN and
    ranges are the owner's checks."""
    kind = base_type(annotation)
    if kind is Any:  # any value (e.g. a Python object the owner checks itself)
        return value
    optional = type(None) in typing.get_args(annotation)
    where = f"{owner}: {name}"
    if value is None:
        if optional:
            return None
        raise TypeError(f"{where} must be {article_of(kind)}, got None; give a value")
    is_bool = isinstance(value, (bool, np.bool_))
    got = described(value)
    if kind is bool:
        if is_bool:
            return bool(value)
        raise TypeError(f"{where} must be True or False, got {got}; give True or False")
    if kind is int:
        if isinstance(value, numbers.Integral) and not is_bool:
            return int(value)
        whole = None
        if isinstance(value, numbers.Real) and not is_bool and float(value).is_integer():
            whole = int(value)
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            whole = int(value)
        fix = f"write {whole}" if whole is not None else "give a whole number"
        raise TypeError(f"{where} must be an int, got {got}; {fix}")
    if kind is float:
        if isinstance(value, numbers.Real) and not is_bool:
            return value if isinstance(value, (int, float)) else float(value)
        fix = "give a number"
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                fix = f"write {float(value)!r}, a number, not a string"
        raise TypeError(f"{where} must be a number, got {got}; {fix}")
    if kind is str:
        if isinstance(value, str):
            return str(value)
        raise TypeError(f"{where} must be a string, got {got}; give it in quotes")
    if isinstance(kind, type) and not isinstance(value, kind):
        raise TypeError(f"{where} must be {article_of(kind)}, got {got}; give {kind.__name__}(...)")
    return value


def article_of(kind: Any) -> str:
    """`kind`'s name with its article: "an int", "a ServerOptimizer"."""
    name = getattr(kind, "__name__", str(kind))
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name}"


@functools.cache
def field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """The dataclass `cls`'s fields with their resolved annotations."""
    hints = typing.get_type_hints(cls)
    return tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls))


def checked_fields(instance: Any, owner: str) -> dict[str, Any]:
    """The fields of the dataclass `instance` whose values `checked_value` turns into plain
    Python values (a NumPy int into an int), with those values; a value of a wrong type is a
    TypeError (see `checked_value`)."""
    changed = {}
    for name, annotation in field_types(type(instance)):
        value = getattr(instance, name)
        plain = checked_value(owner, name, value, annotation)
        if plain is not value:
            changed[name] = plain
    return changed


def checked(options: Any, owner: str) -> Any:
    """An algorithm's `options` with every value of its declared type (`checked_fields`):
    what a flag's parser gives the command line, checked where options are made in code."""
    changed = checked_fields(options, owner)
    return dataclasses.replace(options, **changed) if changed else options


def define_flags(
    options_classes: Mapping[str, type],
    flag_values: flags.FlagValues = flags.FLAGS,
    owners_prefix: str = "",
) -> None:
    """Every option of the algorithms' `Options` classes (`{algorithm: Options}`) as one flag
    of its name (`flag_name`). Options of one name must have one type; where their defaults
    differ, the flag has none (None) and its help gives each algorithm's default, which
    `from_flags` applies for the algorithm that runs. `owners_prefix` (e.g. "--aggregator=")
    starts each flag's help with the owners that take it: `--aggregator=robust/secure: ...`."""
    by_name: dict[str, list[tuple[str, dataclasses.Field, type]]] = {}
    for algorithm, options_cls in options_classes.items():
        hints = typing.get_type_hints(options_cls)
        for field in dataclasses.fields(options_cls):
            entry = (algorithm, field, base_type(hints[field.name]))
            by_name.setdefault(flag_name(field), []).append(entry)
    for name, entries in by_name.items():
        if name in flag_values:
            raise ValueError(f"option {name} is already a flag; rename the option")
        kinds = {kind for _, _, kind in entries}
        if len(kinds) > 1:
            raise ValueError(f"option {name} has several types ({kinds}); give it one")
        kind = kinds.pop()
        defaults = {field.default for _, field, _ in entries}
        field = entries[0][1]
        help_text = field.metadata.get("help") or name
        if len(defaults) == 1:
            default = defaults.pop()
        else:  # each algorithm its own default and help, algorithms alike listed together
            default = None
            alike: dict[tuple[str, Any], list[str]] = {}
            for algorithm, f, _ in entries:
                alike.setdefault((f.metadata.get("help") or name, f.default), []).append(algorithm)
            help_text = " | ".join(
                f"{', '.join(algorithms)}: {text} (default {value})"
                for (text, value), algorithms in alike.items()
            )
        if owners_prefix:
            help_text = f"{owners_prefix}{'/'.join(owner for owner, _, _ in entries)}: {help_text}"
        choices = field.metadata.get("choices")
        if choices:
            flags.DEFINE_enum(name, default, list(choices), help_text, flag_values=flag_values)
            continue
        if kind is bool:
            define = flags.DEFINE_bool
        elif kind is int:
            define = flags.DEFINE_integer
        elif kind is float:
            define = flags.DEFINE_float
        elif kind is str:
            define = flags.DEFINE_string
        else:
            raise TypeError(f"option {name}: unsupported type {kind}")
        bound = field.metadata.get("lower_bound")
        bounds = {} if bound is None else {"lower_bound": bound}
        define(name, default, help_text, flag_values=flag_values, **bounds)


def from_flags(options_cls: type, flag_values: flags.FlagValues = flags.FLAGS) -> Any:
    """The options the parsed flags describe: each option a flag sets (given, or set to
    another value than the flag's default, as a table's defaults do), else the algorithm's own
    default."""
    values = {}
    for field in dataclasses.fields(options_cls):
        flag = flag_values[flag_name(field)]
        if flag.present or flag.value != flag.default:
            values[field.name] = flag.value
    return options_cls(**values)


def names(options_cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(options_cls))
