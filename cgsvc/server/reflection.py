"""Server reflection, v1 beside v1alpha.

grpcio-reflection serves only `grpc.reflection.v1alpha.ServerReflection`. The current
standard, `grpc.reflection.v1.ServerReflection`, has the same messages (same fields and
numbers) under another package, and clients such as grpc-js's ask for v1 only. So the one
v1alpha servicer also answers v1's method, decoding and encoding with the (wire-identical)
v1alpha message classes.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1 = "grpc.reflection.v1.ServerReflection"


def enable(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    names = [*service_names, reflection.SERVICE_NAME, V1]
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(V1, {"ServerReflectionInfo": handler})])
