"""Algorithms by name. A new algorithm is one module here defining an `Algorithm` subclass."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Optional

from tff_clustered.algorithms.base import Algorithm, AlgorithmOptions


def _discover() -> dict[str, type[Algorithm]]:
    found: dict[str, type[Algorithm]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Algorithm) and cls.name and cls.__module__ == module.__name__:
                found[cls.name] = cls
    return dict(sorted(found.items()))


ALGORITHMS: dict[str, type[Algorithm]] = _discover()


def make_algorithm(name: str, options: Optional[AlgorithmOptions] = None) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name](options or AlgorithmOptions())


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "make_algorithm"]
