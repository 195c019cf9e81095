"""The values a tuned comparison may try for one knob, declared beside the knob's option.

An algorithm's option declares its range with `options.option(..., search=...)`; the learning
rate, shared by every algorithm, is `LEARNING_RATE`. A tuning trial draws each knob's value
with its own generator (`comparison/tuning.py`). The ranges are ours: the papers tune and say
so loosely, none gives a range.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class LogUniform:
    """A number drawn log-uniformly from [low, high] (a strength: mu, lambda)."""

    low: float
    high: float

    def draw(self, rng: np.random.Generator, configured: Any) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def text(self) -> str:
        return f"log-uniform [{self.low:g}, {self.high:g}]"


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A number drawn uniformly from [low, high] (a threshold)."""

    low: float
    high: float

    def draw(self, rng: np.random.Generator, configured: Any) -> float:
        return float(rng.uniform(self.low, self.high))

    def text(self) -> str:
        return f"uniform [{self.low:g}, {self.high:g}]"


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `values`, each as likely (a count of layers, a rule)."""

    values: tuple[Any, ...]

    def draw(self, rng: np.random.Generator, configured: Any) -> Any:
        value = self.values[int(rng.integers(len(self.values)))]
        return value.item() if isinstance(value, np.generic) else value

    def text(self) -> str:
        return f"one of {', '.join(map(str, self.values))}"


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


Space = Union[LogUniform, Uniform, Choice, AroundConfigured]

# The client learning rate every algorithm shares: within a factor of 4 of the table's value.
LEARNING_RATE = AroundConfigured(4.0)
