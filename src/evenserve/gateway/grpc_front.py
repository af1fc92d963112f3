"""The gateway's KServe v2 gRPC API (Triton's ``inference.GRPCInferenceService``).

Served when ``gateway.grpc_port`` is set, on the gateway's loop (grpcio's asyncio server):
ServerLive, ServerReady (some backend is routable), ModelReady (the model has a routable
host), ServerMetadata, ModelMetadata and ModelConfig (asked of one healthy host of the
model, the next one on UNAVAILABLE or no answer; NOT_FOUND for a model no backend hosts),
ModelStatistics (summed over every healthy host, as the HTTP ``/stats``: ``gateway.stats``;
an empty name: every model), RepositoryIndex (the HTTP index's list),
RepositoryModelLoad/Unload (UNIMPLEMENTED, as HTTP's 501: model control goes to a worker,
named in the message) and ModelInfer. Every other RPC (streaming, shared memory, trace and
log settings) answers UNIMPLEMENTED naming itself, and a request whose bytes are not its
message INVALID_ARGUMENT, with nothing logged (``httpio.grpc_service``). A model name no
backend hosts is cut in the NOT_FOUND message (``wire.shown_name``): gRPC names are
unbounded, and a message over the client's metadata limit would reach it as
RESOURCE_EXHAUSTED.

How a backend is reached is its ``grpc_forward`` (the backend's own, else
``gateway.grpc_forward``; ``http`` by default):

- ``http``: only the client-facing side speaks gRPC. ModelInfer is parsed and translated to
  a KServe v2 HTTP request with the binary tensor extension (``grpc_codec.to_http``) and goes
  through the dispatcher's HTTP fast path (``Dispatcher.infer_fast``: the routing, admission,
  retry-once, ejection and metrics of an HTTP request, over the pooled HTTP client to the
  backend's ``url``); the answer is translated back (``grpc_codec.to_grpc``), a refusal to
  the gRPC status the worker's own gRPC front gives for it (``CODE_OF_STATUS``: 400 and 422
  INVALID_ARGUMENT, 404 NOT_FOUND, 413 and 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504
  DEADLINE_EXCEEDED, 501 UNIMPLEMENTED, anything else INTERNAL) with its message, and
  ``x-evenserve-reason``, ``retry-after``, ``x-evenserve-load-wait-ms`` and
  ``x-evenserve-backend`` in the trailing metadata. The metadata ``x-evenserve-priority``
  goes as that header, and the client's gRPC deadline as ``x-evenserve-deadline-ms``
  (``deadline_ms``: the sooner of it and the client's own header), once, when the request
  is admitted (as an HTTP client's header, a retry carries the same). A request the codec
  cannot translate is INVALID_ARGUMENT naming the field (a version no HTTP route can name,
  NOT_FOUND), refused before any backend sees it and counted as the client's error.
  ModelMetadata and ModelConfig are the backend's HTTP documents (``GET
  /v2/models/{m}[/versions/{v}]`` and ``.../config``) parsed into their messages. A call its
  client gives up (deadline, cancel) leaves its request to finish; the answer is dropped.
- ``grpc``: for servers whose HTTP API lacks the binary extension (MLServer), over their
  ``grpc_url``, as bytes both ways. The request is not parsed: its model name is read from
  the wire (``model_name_of``: a walk over the message's top-level fields, field 1;
  protobuf's parse only when the walk cannot tell), and the bytes are forwarded as they came
  (with the class and deadline metadata, the deadline as it stands at each try) over one
  kept channel per backend (opened when the server starts, connecting at once; opened
  afresh once the backend was ejected or readmitted, so grpc's reconnect backoff from its
  outage does not fail the calls after it is back; no transparent retries, which would copy
  every request), through the dispatcher's ``infer_grpc`` (the same rules, a backend's gRPC
  status judged as its HTTP counterpart: UNAVAILABLE as 503, RESOURCE_EXHAUSTED with a
  reason as 429). The backend's answer is relayed as bytes too, or as its code, message and
  trailing metadata, plus ``x-evenserve-backend``. A refused connection also ejects the
  backend at once, as over HTTP (the poller readmits it). Such a backend without a
  ``grpc_url`` is not a candidate. A model some hosts of which are relayed to and others
  not takes this path, each host reached its own way.
"""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from evenserve import __version__
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.gateway import grpc_answer
from evenserve.gateway import grpc_codec as codec
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.gateway.forwarder import ForwardError, Unreachable
from evenserve.gateway.grpc_infer import GrpcInference
from evenserve.gateway.grpc_status import S, code_of, connect_refused, no_version
from evenserve.gateway.stats import collect_all_stats, collect_model_stats
from evenserve.httpio.grpc_h2 import GrpcH2Server, Limits
from evenserve.httpio.grpc_service import (
    SERVED_RPCS,
    Handler,
    add_service,
    unary_handlers,
)


class GatewayServicer(GrpcInference):
    """The gateway's KServe v2 gRPC service: ModelInfer (``GrpcInference``) and the rest
    (module docstring)."""

    #: The RPCs served; every other answers UNIMPLEMENTED (``httpio.grpc_service``).
    RPCS = SERVED_RPCS
    #: The RPCs taken and answered as bytes.
    RAW = ("ModelInfer",)

    def rpcs(self) -> dict[str, Handler]:
        """Each served RPC's coroutine, by name."""
        return {name: getattr(self, name) for name in self.RPCS}

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
        """``method`` asked of one healthy host of ``request.name`` (the next one on
        UNAVAILABLE or no answer, up to ``1 + forward.retries``), its answer relayed: over
        gRPC from a backend relayed to (one without a ``grpc_url`` is skipped), over HTTP
        (``GET`` the model's metadata or config, translated) from every other."""
        model, version = request.name, request.version
        if not self.registry.hosts_model(model):
            await context.abort(
                S.NOT_FOUND,
                f"unknown model {wire.shown_name(model)} "
                f"(served: {', '.join(self.registry.models())})",
            )
        if version and not wire.is_safe_name(version):
            await context.abort(S.NOT_FOUND, no_version(model, version))
        states = self.registry.states
        hosts = [
            v.name
            for v in self.registry.router.candidates(model)
            if v.name not in self.relays or states[v.name].spec.grpc_url is not None
        ]
        failures: list[str] = []
        for name in hosts[: 1 + self.dispatcher.cfg.forward.retries]:
            if name in self.relays:
                try:
                    response = await getattr(self._channel(name).stub, method)(
                        request, timeout=self.timeout_s
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == S.UNAVAILABLE:
                        if connect_refused(exc):
                            self.registry.eject(name, "connect-refused")
                        failures.append(f"{name}: {exc.details()}")
                        continue
                    context.set_trailing_metadata(((wire.BACKEND_HEADER, name),))
                    await context.abort(exc.code(), exc.details() or "")
            else:
                got = await self._from_http(name, method, model, version)
                if isinstance(got, str):
                    failures.append(f"{name}: {got}")
                    continue
                if isinstance(got, tuple):
                    context.set_trailing_metadata(((wire.BACKEND_HEADER, name),))
                    await context.abort(*got)
                response = got
            context.set_trailing_metadata(((wire.BACKEND_HEADER, name),))
            return response
        what = "; ".join(failures) if failures else "none is ready"
        await context.abort(
            S.UNAVAILABLE, f"no backend serving gRPC available for model {model!r} ({what})"
        )

    async def _from_http(self, name: str, method: str, model: str, version: str) -> Any:
        """ModelMetadata or ModelConfig of backend ``name`` over HTTP: the response message;
        a (code, message) to answer with; or a string saying why to ask the next host (no
        answer, 503)."""
        path = codec.model_path(model, version, "config" if method == "ModelConfig" else "")
        try:
            reply = await self.dispatcher.forwarder.request(
                "GET",
                self.registry.url(name),
                path,
                b"",
                {"accept-encoding": "identity"},
            )
        except ForwardError as exc:
            if isinstance(exc, Unreachable) and str(exc) == "connect-refused":
                self.registry.eject(name, "connect-refused")
            return f"{type(exc).__name__} {exc}"
        if reply.status == 503:
            return grpc_answer.error_message(reply.body, 503)
        if reply.status != 200:
            return code_of(reply.status), grpc_answer.error_message(reply.body, reply.status)
        try:
            doc = orjson.loads(reply.body)
            if method == "ModelConfig":
                config = json_format.ParseDict(
                    doc, service_pb2.model__config__pb2.ModelConfig(), ignore_unknown_fields=True
                )
                return service_pb2.ModelConfigResponse(config=config)
            return json_format.ParseDict(
                doc, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True
            )
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            what = "config" if method == "ModelConfig" else "metadata"
            return S.INTERNAL, f"backend {name}: its model {what} is not readable: {exc}"

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return await self._from_one_host("ModelMetadata", request, context)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._from_one_host("ModelConfig", request, context)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """Each model's statistics summed over its healthy hosts (every model's for an
        empty name); UNAVAILABLE when no host answered."""
        name = request.name
        if name and not self.registry.hosts_model(name):
            await context.abort(S.NOT_FOUND, f"unknown model {wire.shown_name(name)}")
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


class GatewayGrpcServer:
    """The gateway's gRPC listener, on the running loop, with the gateway's servicer:
    ``kind`` ``h2`` (the default), the project's own HTTP/2 server (``httpio.grpc_h2``), or
    ``grpcio``, grpcio's asyncio server. The same servicer and limits either way: requests up
    to ``forward.max_body_mb``."""

    def __init__(
        self,
        registry: BackendRegistry,
        dispatcher: Dispatcher,
        host: str,
        port: int,
        kind: str = "h2",
    ) -> None:
        self.host = host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.wanted_port = port
        self.port = 0
        self.kind = kind
        fwd = dispatcher.cfg.forward
        max_body = int(fwd.max_body_mb * 1024 * 1024)
        self.servicer = GatewayServicer(registry, dispatcher, fwd.request_timeout_s)
        self.server: Any = None
        self.h2: GrpcH2Server | None = None
        if kind == "grpcio":
            self.server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", max_body),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.so_reuseport", 0),
                ]
            )
            add_service(self.server, self.servicer.rpcs(), raw=GatewayServicer.RAW)
        elif kind == "h2":
            handlers, refused = unary_handlers(self.servicer.rpcs(), raw=GatewayServicer.RAW)
            self.h2 = GrpcH2Server(handlers, Limits(max_message_bytes=max_body), refused)
        else:
            raise ConfigError(f"gateway.grpc_server: {kind!r} is not grpcio or h2")

    async def start(self) -> None:
        if self.h2 is not None:
            try:
                self.port = await self.h2.start(self.host, self.wanted_port)
            except OSError as exc:
                raise ConfigError(f"gateway.grpc_port: cannot bind {self.address}: {exc}") from None
            self.servicer.open()
            return
        try:
            port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise ConfigError(f"gateway.grpc_port: cannot bind {self.address}: {exc}") from None
        if not port:
            raise ConfigError(f"gateway.grpc_port: cannot bind {self.address}")
        self.port = int(port)
        self.servicer.open()
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        if self.h2 is not None:
            await self.h2.stop(grace_s)
        else:
            await self.server.stop(grace_s)
        await self.servicer.aclose()
