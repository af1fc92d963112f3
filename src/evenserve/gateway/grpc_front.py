"""The gateway's KServe v2 gRPC API (Triton's ``inference.GRPCInferenceService``).

Served when ``gateway.grpc_port`` is set, on the gateway's loop (grpcio's asyncio server):
ServerLive, ServerReady (some backend is routable), ModelReady (the model has a routable
host), ServerMetadata and ModelInfer; every other RPC answers UNIMPLEMENTED.

ModelInfer goes through the Dispatcher's decision core like an HTTP request
(``Dispatcher.infer_grpc``): unknown model NOT_FOUND, overload RESOURCE_EXHAUSTED with
``x-evenserve-reason: overloaded``; the request message is forwarded unchanged (with the
class and deadline metadata) to the chosen backend's ``grpc_url`` over one kept channel per
backend, and its answer relayed with its code, message and trailing metadata, plus
``x-evenserve-backend``. A backend's UNAVAILABLE (not ready, draining, cannot connect) or
RESOURCE_EXHAUSTED ``queue-full`` is retried once elsewhere, as HTTP's 503 and 429.
Backends without a ``grpc_url`` are not candidates.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from evenserve import __version__
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Answer, Dispatcher, GrpcReply
from evenserve.gateway.forwarder import ResponseTimeout

S = grpc.StatusCode
#: The HTTP counterpart of a backend's gRPC status, for the dispatcher's rules.
HTTP_OF = {
    S.OK: 200,
    S.INVALID_ARGUMENT: 400,
    S.NOT_FOUND: 404,
    S.UNAVAILABLE: 503,
    S.DEADLINE_EXCEEDED: 504,
    S.UNIMPLEMENTED: 501,
}
#: The gRPC status of the gateway's own answers.
GRPC_OF = {
    404: S.NOT_FOUND,
    429: S.RESOURCE_EXHAUSTED,
    503: S.UNAVAILABLE,
    504: S.DEADLINE_EXCEEDED,
}
#: Request metadata forwarded to the backend.
FORWARD_METADATA = (wire.PRIORITY_HEADER, wire.DEADLINE_HEADER)


def http_status(code: Any, reason: str | None) -> int:
    if code == S.RESOURCE_EXHAUSTED:  # a refusal (429); without a reason, over the size limit
        return 429 if reason else 413
    return HTTP_OF.get(code, 500)


class GatewayServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, registry: BackendRegistry, dispatcher: Dispatcher, timeout_s: float) -> None:
        self.registry = registry
        self.dispatcher = dispatcher
        self.timeout_s = timeout_s
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []

    def _stub(self, name: str) -> Any:
        stub = self._stubs.get(name)
        if stub is None:
            url = self.registry.states[name].spec.grpc_url
            channel = grpc.aio.insecure_channel(
                url,
                options=[
                    ("grpc.max_send_message_length", -1),
                    ("grpc.max_receive_message_length", -1),
                ],
            )
            self._channels.append(channel)
            stub = self._stubs[name] = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return stub

    async def aclose(self) -> None:
        for c in self._channels:
            await c.close()

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        router = self.registry.router
        ok = any(router.candidates(m) for m in self.registry.models())
        return service_pb2.ServerReadyResponse(ready=ok)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ok = self.registry.hosts_model(request.name) and bool(
            self.registry.router.candidates(request.name)
        )
        return service_pb2.ModelReadyResponse(ready=ok)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(name="evenserve-gateway", version=__version__)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        model = request.model_name
        meta = {k.lower(): v for k, v in context.invocation_metadata() or ()}
        forward = tuple((k, meta[k]) for k in FORWARD_METADATA if k in meta)

        async def send(name: str) -> GrpcReply:
            call = self._stub(name).ModelInfer(request, timeout=self.timeout_s, metadata=forward)
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                trailing = tuple(
                    (k, v) for k, v in exc.trailing_metadata() or () if isinstance(v, str)
                )
                reason = dict(trailing).get(wire.REASON_HEADER)
                if exc.code() == S.DEADLINE_EXCEEDED and reason is None:
                    raise ResponseTimeout("timeout") from None
                return GrpcReply(
                    http_status(exc.code(), reason),
                    reason,
                    exc.code(),
                    exc.details() or "",
                    trailing,
                )
            return GrpcReply(200, None, S.OK, response=response)

        hosts = self.registry.hosts_of(model)
        without = [n for n in hosts if self.registry.states[n].spec.grpc_url is None]
        if hosts and len(without) == len(hosts):
            self.dispatcher.metrics.observe_request(None, model, "unavailable", None)
            await context.abort(S.UNAVAILABLE, f"no backend of model {model!r} serves gRPC")
        ans = await self.dispatcher.infer_grpc(model, send, without)
        return await self._relay(ans, context)

    @staticmethod
    async def _relay(ans: Answer, context: Any) -> Any:
        got = ans.grpc
        trailing: list[tuple[str, str]] = []
        if got is not None:
            trailing += [(k, v) for k, v in got.trailing if k != wire.BACKEND_HEADER]
        else:
            trailing += [
                (k, ans.headers[k]) for k in (wire.REASON_HEADER, "retry-after") if k in ans.headers
            ]
        if ans.backend is not None:
            trailing.append((wire.BACKEND_HEADER, ans.backend))
        context.set_trailing_metadata(tuple(trailing))
        if got is not None:
            if got.code == S.OK:
                return got.response
            await context.abort(got.code, got.message)
        try:
            message = str(json.loads(ans.body)["error"])
        except (ValueError, KeyError, TypeError):
            message = f"status {ans.status}"
        await context.abort(GRPC_OF.get(ans.status, S.INTERNAL), message)


class GatewayGrpcServer:
    """grpcio's asyncio server with the gateway's servicer, on the running loop."""

    def __init__(
        self, registry: BackendRegistry, dispatcher: Dispatcher, host: str, port: int
    ) -> None:
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = 0
        fwd = dispatcher.cfg.forward
        self.servicer = GatewayServicer(registry, dispatcher, fwd.request_timeout_s)
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", int(fwd.max_body_mb * 1024 * 1024)),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)

    async def start(self) -> None:
        try:
            port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise ConfigError(f"gateway.grpc_port: cannot bind {self.address}: {exc}") from None
        if not port:
            raise ConfigError(f"gateway.grpc_port: cannot bind {self.address}")
        self.port = int(port)
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        await self.server.stop(grace_s)
        await self.servicer.aclose()
