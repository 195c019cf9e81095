"""Per-client state as one typed store: each client's own model (trainable tensors, then state
such as BatchNorm statistics), owned by the orchestration and checkpointed with the run.

What a client keeps depends on the algorithm: its personal tensors (FedPer), its whole latest
model (stateful clients: Local, FeSEM, FedTSDP), or a separate personal model (Ditto). The
store does not care: a round reads some variable indices of each client's model and writes
some back. A client that never trained holds the initial model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

Variables = tuple[np.ndarray, ...]


@dataclasses.dataclass
class ClientStore:
    initial: Variables
    models: dict[str, Variables] = dataclasses.field(default_factory=dict)

    def model(self, client_id: str) -> Variables:
        """The client's whole own model (the initial one until it first trains)."""
        return self.models.get(client_id, self.initial)

    def variables(self, client_id: str, indices: Sequence[int]) -> Variables:
        model = self.model(client_id)
        return tuple(model[i] for i in indices)

    def update(self, client_id: str, indices: Sequence[int], values: Sequence[np.ndarray]) -> None:
        if len(indices) != len(values):
            raise ValueError(f"{len(values)} values for {len(indices)} variable indices")
        if not indices:
            return
        model = list(self.model(client_id))
        for i, v in zip(indices, values):
            model[i] = np.asarray(v, np.float32)
        self.models[client_id] = tuple(model)

    def flat(self, client_ids: Sequence[str], num_values: int) -> np.ndarray:
        """The clients' own models as rows of flat vectors (first `num_values` values)."""
        rows = [
            np.concatenate([np.asarray(v, np.float32).ravel() for v in self.model(c)])[:num_values]
            for c in client_ids
        ]
        return np.stack(rows) if rows else np.zeros((0, num_values), np.float32)
