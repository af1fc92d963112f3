"""The KServe v2 gRPC service's handler table, shared by the worker's and the gateway's gRPC
fronts (``worker.grpc_api``, ``gateway.grpc_front``; both need the ``grpc`` extra).

``service_handlers`` maps every RPC of Triton's ``inference.GRPCInferenceService`` (read from
tritonclient's generated descriptor) to a grpcio method handler: an RPC the front implements
is served by its coroutine, with the request parsed and the response serialized by the
message classes the descriptor names, or, for an RPC listed as raw, taken and answered as
the serialized bytes (the gateway relays ModelInfer without parsing it). Every other RPC
(streaming inference, shared memory, trace and log settings) answers UNIMPLEMENTED with a
message naming it. A request whose bytes are not its message answers INVALID_ARGUMENT. Both
go through ``context.abort``: no exception escapes to grpcio, so nothing is logged (the
generated servicer's stubs raise NotImplementedError, and grpcio's own deserializer raises
DecodeError: grpcio logs either with a traceback and answers UNIMPLEMENTED or UNKNOWN).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
#: The RPCs the worker's and the gateway's fronts serve; every other answers UNIMPLEMENTED.
SERVED_RPCS = (
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "ModelInfer",
)
#: An implemented RPC: (request, context) -> response (messages, or bytes for a raw RPC).
Handler = Callable[[Any, Any], Awaitable[Any]]
#: Why an RPC that is not served is not, for its UNIMPLEMENTED message.
NOT_SERVED = {
    "ModelStreamInfer": "streaming inference is not supported; use ModelInfer",
    "SystemSharedMemory": "shared memory is not supported; send the tensors in the request",
    "CudaSharedMemory": "shared memory is not supported; send the tensors in the request",
}


def methods() -> list[Any]:
    """The service's method descriptors, in the order the proto declares them."""
    return list(service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods)


def not_served_message(method: str) -> str:
    why = next((w for prefix, w in NOT_SERVED.items() if method.startswith(prefix)), None)
    return f"{method} is not implemented by this server" + (f": {why}" if why else "")


def _unimplemented(method: str) -> Handler:
    message = not_served_message(method)

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    return refuse


def service_handlers(impl: Mapping[str, Handler], raw: Collection[str] = ()) -> dict[str, Any]:
    """The method handlers of every RPC of the service (see the module docstring): ``impl``
    serves the RPCs it names (``raw`` ones with bytes in and out), the others answer
    UNIMPLEMENTED. ValueError for a name in ``impl`` or ``raw`` the service does not have."""
    table = {m.name: m for m in methods()}
    unknown = sorted(set(impl) - set(table)) + sorted(set(raw) - set(impl))
    if unknown:
        raise ValueError(f"not RPCs of {SERVICE} served here: {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name, m in table.items():
        fn = impl.get(name)
        if fn is None:
            fn = _unimplemented(name)
            if m.client_streaming and m.server_streaming:
                out[name] = grpc.stream_stream_rpc_method_handler(fn)
            elif m.client_streaming:
                out[name] = grpc.stream_unary_rpc_method_handler(fn)
            elif m.server_streaming:
                out[name] = grpc.unary_stream_rpc_method_handler(fn)
            else:
                out[name] = grpc.unary_unary_rpc_method_handler(fn)
            continue
        if m.client_streaming or m.server_streaming:
            raise ValueError(f"{name}: only unary RPCs are served")
        if name in raw:
            out[name] = grpc.unary_unary_rpc_method_handler(fn)
            continue
        response = getattr(service_pb2, m.output_type.name)
        out[name] = grpc.unary_unary_rpc_method_handler(
            _parsing(fn, getattr(service_pb2, m.input_type.name)),
            response_serializer=response.SerializeToString,
        )
    return out


def _parsing(fn: Handler, request_class: Any) -> Handler:
    """``fn`` behind the parse of its request: bytes that are not a ``request_class`` message
    answer INVALID_ARGUMENT (grpcio's own deserializer would answer UNKNOWN and log a
    traceback)."""
    what = request_class.DESCRIPTOR.name
    parse = request_class.FromString

    async def parsed(raw: bytes, context: Any) -> Any:
        try:
            request = parse(raw)
        except DecodeError as exc:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a {what}: {exc}"
            )
        return await fn(request, context)

    return parsed


def unary_handlers(
    impl: Mapping[str, Handler], raw: Collection[str] = ()
) -> tuple[dict[str, Handler], dict[str, str]]:
    """The service for the project's own HTTP/2 server (``httpio.grpc_h2``): the handler of
    each RPC ``impl`` serves, by path (bytes in, bytes out: a parsed RPC's request parsed,
    INVALID_ARGUMENT when it is not its message, and its response serialized), and the
    UNIMPLEMENTED message of every other RPC of the service, by path (answered as soon as
    its headers are read, streaming ones included). ValueError as ``service_handlers``."""
    table = {m.name: m for m in methods()}
    unknown = sorted(set(impl) - set(table)) + sorted(set(raw) - set(impl))
    if unknown:
        raise ValueError(f"not RPCs of {SERVICE} served here: {', '.join(unknown)}")
    handlers: dict[str, Handler] = {}
    refused: dict[str, str] = {}
    for name, m in table.items():
        path = f"/{SERVICE}/{name}"
        fn = impl.get(name)
        if fn is None:
            refused[path] = not_served_message(name)
        elif m.client_streaming or m.server_streaming:
            raise ValueError(f"{name}: only unary RPCs are served")
        elif name in raw:
            handlers[path] = fn
        else:
            handlers[path] = _serializing(_parsing(fn, getattr(service_pb2, m.input_type.name)))
    return handlers, refused


def _serializing(fn: Handler) -> Handler:
    async def serialized(raw: Any, context: Any) -> bytes:
        return bytes((await fn(raw, context)).SerializeToString())

    return serialized


def add_service(server: Any, impl: Mapping[str, Handler], raw: Collection[str] = ()) -> None:
    """Serve the service on grpcio's asyncio ``server`` (``service_handlers``)."""
    handlers = service_handlers(impl, raw)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # grpcio >= 1.63 matches registered methods in its core, before the generic handlers.
    register = getattr(server, "add_registered_method_handlers", None)
    if register is not None:
        register(SERVICE, handlers)
