"""A round's CLIENTS-placed argument serialized for TFF's worker in one lean pass.

TFF 0.87's execution context serializes a CLIENTS-placed argument value by value
(`value_serialization.serialize_value`), and each value's tracing spans, type checks and
container conversions, with the argument's traversal (`transform_args`), cost this process
about 1 ms per client of a round of about ten values each: more than the bytes
(docs/performance.md). `ClientValues` is that argument already placed: TFF's context ingests
it (`ingestable_base.Ingestable`) by building the very `executor_pb2.Value` proto TFF's
serialization builds (each tensor by `array.to_proto` or `array.to_proto_content` as it
chooses, the structs and the federated wrapper as it nests them) in one pass, and sending it
with the remote executor's own request. The proto is TFF's, byte for byte (tested), so the
worker gets the same values. An executor other than TFF's `RemoteExecutor` (a test context)
gets the values through its own `create_value`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@functools.cache
def _tff_internals() -> Any:
    """TFF's modules this serialization uses, imported on first use (the in-process path
    imports no TFF); `ClientValues` is registered as TFF's `Ingestable` and
    `CardinalityCarrying` (both abstract base classes) there."""
    from types import SimpleNamespace

    from tensorflow_federated.proto.v0 import executor_pb2
    from tensorflow_federated.python.common_libs import structure
    from tensorflow_federated.python.core.impl.compiler import array
    from tensorflow_federated.python.core.impl.executors import (
        cardinality_carrying_base,
        ingestable_base,
        remote_executor,
    )
    from tensorflow_federated.python.core.impl.types import (
        array_shape,
        computation_types,
        placements,
        type_serialization,
    )

    ingestable_base.Ingestable.register(ClientValues)
    cardinality_carrying_base.CardinalityCarrying.register(ClientValues)
    return SimpleNamespace(
        executor_pb2=executor_pb2,
        array=array,
        remote_executor=remote_executor,
        array_shape=array_shape,
        types=computation_types,
        clients=placements.CLIENTS,
        type_serialization=type_serialization,
        elements=structure.iter_elements,
    )


def serialized(value: Any, type_spec: Any) -> Any:
    """`value` of TFF type `type_spec` (tensors, structs of them, or a CLIENTS-placed list of
    them) as the `executor_pb2.Value` TFF's `serialize_value` makes of it. A struct's values
    are read by name from a mapping, by position from a tuple (a NamedTuple's order)."""
    tff = _tff_internals()
    pb = tff.executor_pb2
    if isinstance(type_spec, tff.types.TensorType):
        dtype = type_spec.dtype.type
        if tff.array_shape.is_shape_scalar(type_spec.shape) or dtype is np.str_:
            return pb.Value(array=tff.array.to_proto(value, dtype_hint=dtype))
        return pb.Value(array=tff.array.to_proto_content(value, dtype_hint=dtype))
    if isinstance(type_spec, tff.types.StructType):
        elements = []
        for i, (name, member) in enumerate(tff.elements(type_spec)):
            item = value[name] if isinstance(value, Mapping) else value[i]
            element = serialized(item, member)
            elements.append(pb.Value.Struct.Element(name=name or "", value=element))
        return pb.Value(struct=pb.Value.Struct(element=elements))
    if isinstance(type_spec, tff.types.FederatedType) and not type_spec.all_equal:
        proto = pb.Value()
        proto.federated.value.extend(serialized(v, type_spec.member) for v in value)
        proto.federated.type.CopyFrom(tff.type_serialization.serialize_type(type_spec).federated)
        return proto
    raise TypeError(f"no lean serialization of a value of type {type_spec}")


class ClientValues:
    """The per-client values `values` as one CLIENTS-placed argument of TFF type
    `type_signature` (`FederatedType(member, CLIENTS)`), serialized by `serialized` when TFF's
    context ingests it."""

    def __init__(self, values: Sequence[Any], type_signature: Any) -> None:
        tff = _tff_internals()
        if type_signature.placement is not tff.clients or type_signature.all_equal:
            raise ValueError(f"ClientValues carries CLIENTS-placed values, not {type_signature}")
        self.values, self._type = list(values), type_signature

    @property
    def type_signature(self) -> Any:
        return self._type

    @property
    def cardinality(self) -> dict:
        return {_tff_internals().clients: len(self.values)}

    async def ingest(self, executor: Any) -> Any:
        """The values as one value of `executor`: a remote executor's made from the lean
        proto, any other's by its `create_value`."""
        tff = _tff_internals()
        remote = tff.remote_executor
        if not isinstance(executor, remote.RemoteExecutor):
            return await executor.create_value(self.values, self._type)
        executor._check_has_executor_id()  # TFF 0.87's own steps of `create_value`
        request = tff.executor_pb2.CreateValueRequest(
            executor=executor._executor_id, value=serialized(self.values, self._type)
        )
        response = executor._stub.create_value(request)
        return remote.RemoteValue(response.value_ref, self._type, executor)


def client_values(values: Sequence[Any], computation: Any, position: int) -> ClientValues:
    """`values` as the CLIENTS-placed argument at `position` of TFF `computation`."""
    return ClientValues(values, computation.type_signature.parameter[position])
