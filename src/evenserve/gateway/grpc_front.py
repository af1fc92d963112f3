"""The gateway's KServe v2 gRPC API (Triton's ``inference.GRPCInferenceService``).

Served when ``gateway.grpc_port`` is set, on the gateway's loop (grpcio's asyncio server):
ServerLive, ServerReady (some backend is routable), ModelReady (the model has a routable
host), ServerMetadata, ModelMetadata and ModelConfig (asked of one healthy host of the model
over its ``grpc_url``, the next on UNAVAILABLE; NOT_FOUND for a model no backend hosts,
UNAVAILABLE when no healthy host serves gRPC), ModelStatistics (summed over every healthy
host, as the HTTP ``/stats``: ``gateway.stats``; an empty name: every model),
RepositoryIndex (the HTTP index's list), RepositoryModelLoad/Unload (UNIMPLEMENTED, as HTTP's
501: model control goes to a worker, named in the message) and ModelInfer; every other RPC
answers UNIMPLEMENTED.

ModelInfer goes through the Dispatcher's decision core like an HTTP request
(``Dispatcher.infer_grpc``): unknown model NOT_FOUND, overload RESOURCE_EXHAUSTED with
``x-evenserve-reason: overloaded``; the request message is forwarded unchanged (with the
class and deadline metadata) to the chosen backend's ``grpc_url`` over one kept channel per
backend, and its answer relayed with its code, message and trailing metadata, plus
``x-evenserve-backend``. A backend's UNAVAILABLE (not ready, draining, cannot connect) or
RESOURCE_EXHAUSTED ``queue-full`` is retried once elsewhere, as HTTP's 503 and 429; a
refused connection also ejects the backend at once, as over HTTP (the poller readmits it).
Backends without a ``grpc_url`` are not candidates. The client's gRPC deadline becomes the
request's scheduling deadline: its remaining time is forwarded as ``x-evenserve-deadline-ms``
(the sooner of it and the client's own header), as an HTTP client's header is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from evenserve import __version__
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Answer, Dispatcher, GrpcReply
from evenserve.gateway.forwarder import ResponseTimeout, Unreachable
from evenserve.gateway.stats import collect_all_stats, collect_model_stats

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
#: A client deadline further than this (seconds) is no deadline (grpcio's "infinite").
NO_DEADLINE_S = 365 * 86400.0


def deadline_ms(header: str | None, remaining_s: float | None) -> str | None:
    """The ``x-evenserve-deadline-ms`` to forward: the client's gRPC deadline (its remaining
    time, ``context.time_remaining()``) or the client's header, whichever is sooner; a header
    that is not a number is forwarded as it is, for the worker to refuse."""
    if remaining_s is None or remaining_s >= NO_DEADLINE_S:
        return header
    ms = max(remaining_s * 1000.0, 0.001)
    if header is not None:
        try:
            given = float(header.strip())
        except ValueError:
            return header
        if not given < ms:
            return f"{ms:.3f}"
        return header
    return f"{ms:.3f}"


def connect_refused(exc: Any) -> bool:
    """A backend call that failed because the backend refused the connection."""
    return exc.code() == S.UNAVAILABLE and "connection refused" in (exc.details() or "").lower()


def http_status(code: Any, reason: str | None) -> int:
    if code == S.RESOURCE_EXHAUSTED:  # a refusal (429); without a reason, over the size limit
        return 429 if reason else 413
    return HTTP_OF.get(code, 500)


def forward_metadata(
    meta: Mapping[str, str], remaining_s: float | None
) -> tuple[tuple[str, str], ...]:
    """The request metadata forwarded to the backend: the class, and the deadline
    (``deadline_ms``)."""
    out = (
        [(wire.PRIORITY_HEADER, meta[wire.PRIORITY_HEADER])] if wire.PRIORITY_HEADER in meta else []
    )
    deadline = deadline_ms(meta.get(wire.DEADLINE_HEADER), remaining_s)
    if deadline is not None:
        out.append((wire.DEADLINE_HEADER, deadline))
    return tuple(out)


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
        return service_pb2.ServerMetadataResponse(
            name="evenserve-gateway", version=__version__, extensions=wire.GATEWAY_EXTENSIONS
        )

    # -- model metadata, config, statistics, repository -----------------------------------
    async def _from_one_host(self, method: str, request: Any, context: Any) -> Any:
        """``method`` asked of one healthy gRPC host of ``request.name`` (the next one on
        UNAVAILABLE, up to ``1 + forward.retries``), its answer relayed."""
        model = request.name
        if not self.registry.hosts_model(model):
            await context.abort(
                S.NOT_FOUND,
                f"unknown model {model!r} (served: {', '.join(self.registry.models())})",
            )
        states = self.registry.states
        hosts = [
            v.name
            for v in self.registry.router.candidates(model)
            if states[v.name].spec.grpc_url is not None
        ]
        failures: list[str] = []
        for name in hosts[: 1 + self.dispatcher.cfg.forward.retries]:
            try:
                response = await getattr(self._stub(name), method)(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == S.UNAVAILABLE:
                    if connect_refused(exc):
                        self.registry.eject(name, "connect-refused")
                    failures.append(f"{name}: {exc.details()}")
                    continue
                context.set_trailing_metadata(((wire.BACKEND_HEADER, name),))
                await context.abort(exc.code(), exc.details() or "")
            context.set_trailing_metadata(((wire.BACKEND_HEADER, name),))
            return response
        what = "; ".join(failures) if failures else "none is ready"
        await context.abort(
            S.UNAVAILABLE, f"no backend serving gRPC available for model {model!r} ({what})"
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return await self._from_one_host("ModelMetadata", request, context)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._from_one_host("ModelConfig", request, context)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """Each model's statistics summed over its healthy hosts (every model's for an
        empty name); UNAVAILABLE when no host answered."""
        name = request.name
        if name and not self.registry.hosts_model(name):
            await context.abort(S.NOT_FOUND, f"unknown model {name!r}")
        fwd = self.dispatcher.forwarder
        version = request.version or None
        if name:
            path = wire.ModelPath(name, version, "stats").path()
            merged, named = await collect_model_stats(self.registry, fwd, name, path)
            entries = [] if merged is None else [merged]
        else:
            entries, named = await collect_all_stats(self.registry, fwd, version)
        if not entries and (name or self.registry.models()):
            what = f"model {name!r}" if name else "any model"
            await context.abort(S.UNAVAILABLE, f"no backend answered statistics for {what}")
        context.set_trailing_metadata(((wire.BACKEND_HEADER, ",".join(named)),))
        return json_format.ParseDict(
            {"model_stats": entries},
            service_pb2.ModelStatisticsResponse(),
            ignore_unknown_fields=True,
        )

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        resp = service_pb2.RepositoryIndexResponse()
        for entry in self.registry.repository_index():
            if request.ready and entry["state"] != "READY":
                continue
            resp.models.add(name=entry["name"], state=entry["state"])
        return resp

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        message = self.registry.model_control_refusal(request.model_name, "load")
        await context.abort(S.UNIMPLEMENTED, message)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        message = self.registry.model_control_refusal(request.model_name, "unload")
        await context.abort(S.UNIMPLEMENTED, message)

    # -- inference ------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        model = request.model_name
        meta = {k.lower(): v for k, v in context.invocation_metadata() or ()}

        async def send(name: str) -> GrpcReply:
            # The deadline as it stands at this try (a retry has less time left).
            forward = forward_metadata(meta, context.time_remaining())
            call = self._stub(name).ModelInfer(request, timeout=self.timeout_s, metadata=forward)
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                if connect_refused(exc):  # never reached the backend: eject, try elsewhere
                    raise Unreachable("connect-refused") from None
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
