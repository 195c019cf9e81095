"""A dataset's split as TFF's `ClientData`, made only when something asks for it.

A run reads its clients' arrays (`FederatedData.arrays`) and never TFF's `ClientData`; a user
or a test may still ask `FederatedData.train` / `.test` for one (`create_tf_dataset_for_client`).
It is made then, here, so that a run on `--execution=in_process` imports no TFF: this module
is the data layer's one import of `tensorflow_federated`, and `federated_data.py` imports it
on first use. Each client's dataset is `tf.data.Dataset.from_tensor_slices` of its arrays
(`OrderedDict(x=float32, y=int32)`), read when asked for (a lazy source reads it then).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff


class ArraysClientData(tff.simulation.datasets.ClientData):
    """One split of a dataset as TFF's `ClientData`: `client_ids` in the dataset's order, each
    client's dataset made from `arrays(client_id)` when asked for."""

    def __init__(
        self,
        client_ids: Sequence[str],
        arrays: Callable[[str], Mapping[str, object]],
        input_shape: Sequence[int],
    ) -> None:
        super().__init__()
        self._client_ids, self._arrays = list(client_ids), arrays
        self._spec = collections.OrderedDict(
            x=tf.TensorSpec(tuple(input_shape), tf.float32), y=tf.TensorSpec((), tf.int32)
        )

    @property
    def client_ids(self) -> list[str]:
        return list(self._client_ids)

    @property
    def serializable_dataset_fn(self) -> Callable[[str], tf.data.Dataset]:
        return self.create_tf_dataset_for_client

    @property
    def element_type_structure(self) -> Mapping[str, tf.TensorSpec]:
        return self._spec

    def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
        client = client_id.decode() if isinstance(client_id, bytes) else str(client_id)
        return tf.data.Dataset.from_tensor_slices(self._arrays(client))
