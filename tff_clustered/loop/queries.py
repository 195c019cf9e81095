"""The `Queries` an algorithm is given: read-only computations on the run as it stands.

The `Queries` an algorithm is given (`algorithms.base.Queries`): read-only computations on the
run as it stands (local updates, raw or as a private run releases them; losses; stored models;
predictions; initial models), and nothing else of the loop, so that a decision cannot reach
into the run's state. Tests of decisions pass a fake one (`tests/test_decisions.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tff_clustered import weights as flat
from tff_clustered.algorithms.base import ReleasedUpdates
from tff_clustered.federated import client_work
from tff_clustered.federated.signature import RoundIO, RoundSignature
from tff_clustered.loop.client_store import ClientStore
from tff_clustered.loop.divergence import DivergenceError
from tff_clustered.loop.round_calls import RoundCalls
from tff_clustered.loop.state import cluster_capacity
from tff_clustered.loop.training_call import LocalTraining, TrainRequest
from tff_clustered.loop.update_release import UpdateRelease
from tff_clustered.models.keras_models import ModelSpec, initial_weights
from tff_clustered.seeds import PRETRAIN_SHUFFLE


@dataclasses.dataclass(frozen=True)
class ServerQueries:
    """`Queries` on a run whose current round is `_signature` and whose clients' own models are
    in `_store`; `_release`: the mechanism a private run's individual updates go through before
    the server reads them (None: they are read raw)."""

    _calls: RoundCalls
    _store: ClientStore
    _signature: RoundSignature
    _model: ModelSpec
    _initial_state: tuple[np.ndarray, ...]
    _release: Optional[UpdateRelease] = None

    @property
    def _model_size(self) -> int:
        return sum(int(np.prod(s)) for s in self._calls.layout.shapes)

    def local_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int = 0,
        steps: Optional[int] = None,
        chunk: int = 100,
        stream: int = PRETRAIN_SHUFFLE,
    ) -> np.ndarray:
        """Flat updates of plain local SGD (no proximal term, no momentum) from flat model
        `start`, one row per client (FedGroup's ClientPretrain): `epochs` passes over each
        client's data, or `steps` minibatches when given; shuffled from seed stream `stream`."""
        fed_round = self._calls.rounds_cache.get(
            RoundSignature(
                num_clusters=1,
                shared=tuple(range(self._calls.layout.num_trainable)),
                work=client_work.LocalSGD(),
                return_model_deltas=True,
            )
        )
        training = LocalTraining(epochs, self._calls.config.learning_rate, steps, stream)
        rows = []
        for begin in range(0, len(client_ids), chunk):
            ids = list(client_ids[begin : begin + chunk])
            request = TrainRequest(
                fed_round,
                round_num,
                ids,
                np.zeros(len(ids), np.int32),
                np.asarray(start, np.float32)[None, :],
                training,
            )
            outputs = self._calls.train(request).outputs
            diverged = [c for c, o in zip(ids, outputs) if not bool(o["finite"])]
            if diverged:
                raise DivergenceError(
                    f"local training from the given model diverged (NaN or infinity) for "
                    f"clients {', '.join(diverged)}; lower --learning_rate"
                )
            rows += [np.asarray(o["model_delta"], np.float32) for o in outputs]
        return np.stack(rows) if rows else np.zeros((0, self._model_size), np.float32)

    def released_updates(
        self,
        client_ids: Sequence[str],
        start: np.ndarray,
        epochs: int,
        round_num: int = 0,
        steps: Optional[int] = None,
    ) -> ReleasedUpdates:
        """The `local_updates` as the server may read them: through the private run's
        `UpdateRelease` (clipped and noised, its noise keyed by `round_num` and each client's
        index), or raw without one."""
        updates = self.local_updates(client_ids, start, epochs, round_num, steps)
        release = self._release
        if release is None:
            return ReleasedUpdates(tuple(client_ids), updates)
        positions = [self._calls.client_index[c] for c in client_ids]
        noised = release.apply(updates, positions, round_num)
        return ReleasedUpdates(tuple(client_ids), noised, release.noise_multiplier, release.clip)

    def cluster_losses(self, cluster_models: np.ndarray, client_ids: Sequence[str]) -> np.ndarray:
        """Mean training loss of every cluster model on each client, (clients, clusters): with
        stored tensors, each client scored exactly as alone (`RoundCalls.score`'s `exact`), so
        that an argmin over these losses does not depend on which clients share a call."""
        calls = self._calls
        signature = dataclasses.replace(
            self._signature, num_clusters=cluster_capacity(len(cluster_models))
        )
        losses = np.zeros((len(client_ids), len(cluster_models)))
        if RoundIO.of(calls.layout, signature).store_in:  # stored tensors complete each model
            fed_round = calls.rounds_cache.get(signature)
            for k in range(len(cluster_models)):
                keys = np.full(len(client_ids), k, np.int32)
                results = calls.score(
                    fed_round, cluster_models, keys, client_ids, self._store, "train", exact=True
                )
                losses[:, k] = [
                    results[c]["loss_sum"] / max(results[c]["num_examples"], 1.0)
                    for c in client_ids
                ]
            return losses
        # Each chunk of clients pooled once and scored by every model.
        sums = calls.pooled_sums(list(cluster_models), client_ids, "train")
        for k, (loss_sum, _, num_examples) in enumerate(sums):
            losses[:, k] = loss_sum / np.maximum(num_examples, 1.0)
        return losses

    def client_models(self, client_ids: Sequence[str]) -> np.ndarray:
        """The clients' stored own models, flat, one row per client."""
        return self._store.flat(client_ids, self._model_size)

    def initial_model(self, seed: int) -> np.ndarray:
        """A freshly initialised flat model, a fixed function of `seed`."""
        return flat.flatten(initial_weights(self._model, seed) + list(self._initial_state))

    def predict_probabilities(self, models: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Softmax outputs of each flat model on inputs `x`, (models, len(x), classes)."""
        return self._calls.predict_probabilities(models, x)
