"""Algorithm options as command-line flags, declared once.

Each algorithm's `Options` is a frozen dataclass; each field is a flag of the same name, with
its help text in the field's metadata (`option(...)`). A field that several algorithms share
(`num_clusters`, `mu`) is defined once, the first time, and must have the same type and
default wherever it appears.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional

from absl import flags


def option(default: Any, help: str, choices: Optional[tuple[str, ...]] = None) -> Any:
    """A dataclass field that is also a flag."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def base_type(annotation: Any) -> type:
    """The type of an annotation, `Optional[X]` -> X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def define_flags(options_cls: type, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    hints = typing.get_type_hints(options_cls)
    for field in dataclasses.fields(options_cls):
        kind = base_type(hints[field.name])
        if field.name in flag_values:
            existing = flag_values[field.name]
            if existing.default != field.default:
                raise ValueError(
                    f"option {field.name} of {options_cls.__qualname__} has default "
                    f"{field.default!r} but another algorithm's has {existing.default!r}; "
                    "a shared option needs one default (use None for 'the algorithm's default')"
                )
            continue
        help_text = field.metadata.get("help") or field.name
        choices = field.metadata.get("choices")
        if choices:
            flags.DEFINE_enum(
                field.name, field.default, list(choices), help_text, flag_values=flag_values
            )
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
            raise TypeError(f"option {field.name}: unsupported type {kind}")
        define(field.name, field.default, help_text, flag_values=flag_values)


def from_flags(options_cls: type, flag_values: flags.FlagValues = flags.FLAGS) -> Any:
    """The options the parsed flags describe."""
    return options_cls(
        **{f.name: flag_values[f.name].value for f in dataclasses.fields(options_cls)}
    )


def names(options_cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(options_cls))
