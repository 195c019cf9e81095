"""The values a tuned comparison may try for one knob, declared beside the knob's option.

An algorithm's option declares its range with `options.option(..., search=...)`; the learning
rate, shared by every algorithm, is `LEARNING_RATE`. A tuning trial draws each knob's value
with its own generator (`comparison/tuning.py`). The ranges are ours: the papers tune and say
so loosely, none gives a range.

A range of numbers (`Range`: `LogUniform`, `Uniform`; `AroundConfigured` is a `LogUniform`
once the configured value is known, `range_of`) has a scale (log or linear) and the limits no
value of its knob can pass (`limits`: a threshold on a statistic in [0, 1], a strength that
must stay positive). A chosen value within `EDGE_SHARE` of an edge of the range searched
(`edge_of`) may have its optimum beyond it: the tuning can search `beyond` that edge, within
the limits. A choice (`Choice`) is a set of alternatives, not a range: it has no edge.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Union

import numpy as np

# A value whose position in its range, on the range's scale, is within this share of the
# range's width of an edge lies at that edge (`edge_of`).
EDGE_SHARE = 0.1
# The two edges of a range.
LOW = "low"
HIGH = "high"


@dataclasses.dataclass(frozen=True)
class LogUniform:
    """A number drawn log-uniformly from [low, high] (a strength: mu, lambda)."""

    low: float
    high: float
    # The knob's own bounds, which a search beyond the range stays within (a strength > 0).
    limits: tuple[float, float] = (0.0, math.inf)

    def draw(self, rng: np.random.Generator, configured: Any) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def text(self) -> str:
        return f"log-uniform [{self.low:g}, {self.high:g}]"

    def range_of(self, configured: Any) -> LogUniform:
        return self

    @staticmethod
    def scaled(value: float) -> float:
        """`value` on the range's scale: its log (0, a limit, is minus infinity)."""
        return math.log(value) if value > 0 else -math.inf

    @staticmethod
    def unscaled(position: float) -> float:
        return math.exp(position)


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A number drawn uniformly from [low, high] (a threshold)."""

    low: float
    high: float
    # The knob's own bounds, which a search beyond the range stays within (a Hopkins
    # statistic's threshold: [0, 1]).
    limits: tuple[float, float] = (-math.inf, math.inf)

    def draw(self, rng: np.random.Generator, configured: Any) -> float:
        return float(rng.uniform(self.low, self.high))

    def text(self) -> str:
        return f"uniform [{self.low:g}, {self.high:g}]"

    def range_of(self, configured: Any) -> Uniform:
        return self

    @staticmethod
    def scaled(value: float) -> float:
        return value

    @staticmethod
    def unscaled(position: float) -> float:
        return position


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `values`, each as likely (a count of layers, a rule)."""

    values: tuple[Any, ...]

    def draw(self, rng: np.random.Generator, configured: Any) -> Any:
        value = self.values[int(rng.integers(len(self.values)))]
        return value.item() if isinstance(value, np.generic) else value

    def text(self) -> str:
        return f"one of {', '.join(map(str, self.values))}"

    def range_of(self, configured: Any) -> None:
        """None: alternatives, not a range of numbers (no edge, nothing beyond)."""
        return None


@dataclasses.dataclass(frozen=True)
class AroundConfigured:
    """A number drawn log-uniformly from [v / factor, v * factor], v the run's configured value
    (the table's, or the flag's): the range follows each table's scale instead of a constant."""

    factor: float

    def draw(self, rng: np.random.Generator, configured: Any) -> float:
        spread = math.log(self.factor)
        return float(configured * math.exp(rng.uniform(-spread, spread)))

    def text(self) -> str:
        return f"log-uniform [v / {self.factor:g}, v * {self.factor:g}], v the table's value"

    def range_of(self, configured: Any) -> LogUniform:
        """The range drawn from for the configured value v: [v / factor, v * factor]."""
        return LogUniform(configured / self.factor, configured * self.factor)


Space = Union[LogUniform, Uniform, Choice, AroundConfigured]
# A range of numbers, on a log or linear scale: what `range_of` gives for a space's knob.
Range = Union[LogUniform, Uniform]


def width(searched: Range) -> float:
    """`searched`'s width on its scale (a log range's: the log of its high / low)."""
    return searched.scaled(searched.high) - searched.scaled(searched.low)


def edge_of(searched: Range, value: float, share: float = EDGE_SHARE) -> Optional[str]:
    """`LOW` or `HIGH` when `value` lies within `share` of `searched`'s width (on its scale)
    of that edge, or beyond it; None inside (and for a range of no width)."""
    span = width(searched)
    if not span > 0 or not math.isfinite(span):
        return None
    position = (searched.scaled(value) - searched.scaled(searched.low)) / span
    if position >= 1 - share:
        return HIGH
    if position <= share:
        return LOW
    return None


def beyond(searched: Range, edge: str, step: float) -> Optional[Range]:
    """The range just beyond `searched`'s `edge`, `step` wide on its scale, cut at the knob's
    limits; None when that edge is at a limit already (nothing lies beyond it)."""
    low_limit, high_limit = searched.limits
    if edge == HIGH:
        far = min(searched.unscaled(searched.scaled(searched.high) + step), high_limit)
        return (
            dataclasses.replace(searched, low=searched.high, high=far)
            if far > searched.high
            else None
        )
    far = max(searched.unscaled(searched.scaled(searched.low) - step), low_limit)
    return dataclasses.replace(searched, low=far, high=searched.low) if far < searched.low else None


def joined(searched: Range, widened: Range) -> Range:
    """The range `searched` and its widening beyond one edge cover together."""
    return dataclasses.replace(
        searched, low=min(searched.low, widened.low), high=max(searched.high, widened.high)
    )


def range_text(searched: Range) -> str:
    """A range as the Tuning section writes it: `[0.00075, 0.012]`."""
    return f"[{searched.low:.3g}, {searched.high:.3g}]"


# The client learning rate every algorithm shares: within a factor of 4 of the table's value.
LEARNING_RATE = AroundConfigured(4.0)
