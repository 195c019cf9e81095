"""TensorFlow Federated imported when first used, so that a run that needs none never loads it.

Importing TFF costs about a second on top of TensorFlow's import, and a run on
`--execution=in_process` uses nothing of it. Modules that use TFF write
`from tff_clustered.frameworks import tff` instead of `import tensorflow_federated as tff`:
the name is a stand-in that imports TFF at its first attribute (`tff.tensorflow.computation`,
`tff.aggregators...`), then is the module itself for every later use. A module that subclasses
a TFF class at its top level imports TFF itself (`data/client_datasets.py`), and is imported
only where that class is needed.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class ImportedOnUse:
    """A module imported at the first attribute asked of it (`name`: the module's name)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # copy, pickle and inspect probe these
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    @property
    def imported(self) -> bool:
        """Whether the module is loaded (by this stand-in or by anything else)."""
        return self._name in sys.modules


tff: Any = ImportedOnUse("tensorflow_federated")


def to_type(spec: Any) -> Any:
    """TF specs -> TFF types (TFF 0.87's `tff.to_type` rejects them)."""
    return tff.types.tensorflow_to_type(spec)
