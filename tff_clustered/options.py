"""Algorithm options as command-line flags, declared once.

Each algorithm's `Options` is a frozen dataclass; each field is a flag of the same name, with
its help text in the field's metadata (`option(...)`). Options are the algorithm's own: two
algorithms may each have a `personal_layers` or a `num_clusters` with their own default and
help. One flag carries a name for all of them (the same type everywhere); a flag left unset
gives each algorithm its own default (`from_flags`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Optional

from absl import flags


def option(default: Any, help: str, choices: Optional[tuple[str, ...]] = None) -> Any:
    """A dataclass field that is also a flag."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def base_type(annotation: Any) -> type:
    """The type of an annotation, `Optional[X]` -> X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def define_flags(
    options_classes: Mapping[str, type], flag_values: flags.FlagValues = flags.FLAGS
) -> None:
    """Every option of the algorithms' `Options` classes (`{algorithm: Options}`) as one flag
    of its name. Options of one name must have one type; where their defaults differ, the flag
    has none (None) and its help gives each algorithm's default, which `from_flags` applies
    for the algorithm that runs."""
    by_name: dict[str, list[tuple[str, dataclasses.Field, type]]] = {}
    for algorithm, options_cls in options_classes.items():
        hints = typing.get_type_hints(options_cls)
        for field in dataclasses.fields(options_cls):
            entry = (algorithm, field, base_type(hints[field.name]))
            by_name.setdefault(field.name, []).append(entry)
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
        define(name, default, help_text, flag_values=flag_values)


def from_flags(options_cls: type, flag_values: flags.FlagValues = flags.FLAGS) -> Any:
    """The options the parsed flags describe: each option a flag sets (given, or set to
    another value than the flag's default, as a table's defaults do), else the algorithm's own
    default."""
    values = {}
    for field in dataclasses.fields(options_cls):
        flag = flag_values[field.name]
        if flag.present or flag.value != flag.default:
            values[field.name] = flag.value
    return options_cls(**values)


def names(options_cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(options_cls))
