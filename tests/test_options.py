"""Algorithm options as flags: each algorithm's own defaults and help behind one flag name."""

from __future__ import annotations

import dataclasses

import pytest
from absl import flags

from tff_clustered import options as options_lib
from tff_clustered.algorithms import make_options
from tff_clustered.options import option


@dataclasses.dataclass(frozen=True)
class FirstOptions:
    personal_layers: int = option(1, "First: personal top layers.")
    shared_knob: float = option(0.5, "A knob both have alike.")


@dataclasses.dataclass(frozen=True)
class SecondOptions:
    personal_layers: int = option(2, "Second: personal top layers of its body.")
    shared_knob: float = option(0.5, "A knob both have alike.")


def flag_values(*args: str) -> flags.FlagValues:
    values = flags.FlagValues()
    options_lib.define_flags({"first": FirstOptions, "second": SecondOptions}, values)
    values(["prog", *args])
    return values


def test_each_algorithm_gets_its_own_default_unless_the_flag_is_given() -> None:
    unset = flag_values()
    assert unset["personal_layers"].default is None  # the defaults differ: none for the flag
    assert unset["shared_knob"].default == 0.5  # they agree: the flag has it
    help_text = unset["personal_layers"].help
    assert "first: First: personal top layers. (default 1)" in help_text
    assert "second: Second: personal top layers of its body. (default 2)" in help_text
    assert options_lib.from_flags(FirstOptions, unset) == FirstOptions(1, 0.5)
    assert options_lib.from_flags(SecondOptions, unset) == SecondOptions(2, 0.5)
    given = flag_values("--personal_layers=3", "--shared_knob=0.25")
    assert options_lib.from_flags(FirstOptions, given) == FirstOptions(3, 0.25)
    assert options_lib.from_flags(SecondOptions, given) == SecondOptions(3, 0.25)
    # A value set in code (a comparison table's defaults) counts as given.
    unset["personal_layers"].value = 4
    assert options_lib.from_flags(SecondOptions, unset).personal_layers == 4


def test_one_name_needs_one_type() -> None:
    @dataclasses.dataclass(frozen=True)
    class Other:
        personal_layers: str = option("top", "A string this time.")

    with pytest.raises(ValueError, match="personal_layers has several types"):
        options_lib.define_flags({"first": FirstOptions, "other": Other}, flags.FlagValues())


def test_algorithms_hold_their_real_defaults() -> None:
    # No "unset" sentinels where an algorithm has a default of its own.
    assert make_options("ifca").num_clusters == 3
    assert make_options("fedgroup").num_clusters == 3
    assert make_options("fedac").num_clusters == 10
    assert make_options("fedprox").mu == make_options("fedgrouprox").mu == 0.01
    assert (make_options("fedac").gc_lower, make_options("fedac").gc_upper) == (0.2, 0.8)


def test_algorithms_alike_share_one_line_of_the_help() -> None:
    @dataclasses.dataclass(frozen=True)
    class ThirdOptions:
        personal_layers: int = option(1, "First: personal top layers.")

    values = flags.FlagValues()
    options_lib.define_flags(
        {"first": FirstOptions, "second": SecondOptions, "third": ThirdOptions}, values
    )
    help_text = values["personal_layers"].help
    assert help_text.startswith("first, third: First: personal top layers. (default 1) | ")
    assert help_text.count("(default") == 2


def test_every_algorithms_options_are_type_checked_where_they_are_made() -> None:
    """`IFCA.Options(num_clusters=2.7)` in code is refused as `--num_clusters=2.7` is: every
    algorithm's own Options class checks each field's type at construction (a float for an int,
    a string for a float, a bool for a number), naming the algorithm and the option."""
    import dataclasses
    import typing

    from tff_clustered.algorithms import ALGORITHMS

    wrong = {int: 2.5, float: "0.1", str: 3, bool: "yes"}
    checked = 0
    for cls in ALGORITHMS.values():
        hints = typing.get_type_hints(cls.Options)
        for field in dataclasses.fields(cls.Options):
            kind = hints[field.name]
            if kind not in wrong:
                continue
            with pytest.raises(TypeError, match=rf": {field.name} must be"):
                cls.Options(**{field.name: wrong[kind]})
            checked += 1
        cls.Options()  # the defaults pass
    assert checked >= 50, checked
