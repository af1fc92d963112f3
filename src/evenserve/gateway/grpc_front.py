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

import asyncio
from collections.abc import Mapping
from functools import partial
from typing import Any

import grpc
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2, service_pb2_grpc

from evenserve import __version__
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.gateway import grpc_codec as codec
from evenserve.gateway.answers import Answer, GrpcReply
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.gateway.forwarder import ForwardError, Reply, ResponseTimeout, Unreachable
from evenserve.gateway.stats import collect_all_stats, collect_model_stats
from evenserve.httpio.client import parse_headers
from evenserve.httpio.grpc_h2 import GrpcH2Server, Limits
from evenserve.httpio.grpc_service import (
    SERVED_RPCS,
    SERVICE,
    Handler,
    add_service,
    unary_handlers,
)

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
#: The gRPC status of an HTTP answer (a backend's or the gateway's own), as the worker's gRPC
#: front gives it for the same refusal (``worker.grpc_api``); any other status is INTERNAL.
CODE_OF_STATUS = {
    400: S.INVALID_ARGUMENT,
    404: S.NOT_FOUND,
    413: S.RESOURCE_EXHAUSTED,  # over the size limit (grpcio's own answer for a message)
    422: S.INVALID_ARGUMENT,  # a request a server's schema refused (FastAPI's, MLServer's)
    429: S.RESOURCE_EXHAUSTED,
    501: S.UNIMPLEMENTED,
    503: S.UNAVAILABLE,
    504: S.DEADLINE_EXCEEDED,
}
#: The response headers of an HTTP answer that go back as trailing metadata (with
#: ``x-evenserve-backend``), as the worker's gRPC front sends them.
TRAILING_HEADERS = (wire.REASON_HEADER, wire.RETRY_AFTER_HEADER, wire.LOAD_WAIT_HEADER)
#: The headers of an HTTP answer the front reads: those, and the binary extension's length.
READ_HEADERS = frozenset(h.encode() for h in (*TRAILING_HEADERS, codec.HEADER_LENGTH))
#: A client deadline further than this (seconds) is no deadline (grpcio's "infinite").
NO_DEADLINE_S = 365 * 86400.0
INFER_METHOD = f"/{SERVICE}/ModelInfer"
#: Each backend channel's options: no size limits (the gateway's own limit applies to what
#: it takes); no transparent retries: the dispatcher retries itself, and grpc's retry
#: support keeps a copy of every request it sends (up to 256 KiB) in case it retries; its
#: own connection (grpc shares one per address between channels by default, so a fresh
#: channel would inherit the old one's reconnect backoff: ``GatewayServicer._channel``).
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.enable_retries", 0),
    ("grpc.use_local_subchannel_pool", 1),
)
#: Top-level fields of a ModelInferRequest walked to find its model_name before letting
#: protobuf parse it (in C) instead: a request has a handful (name, inputs, raw contents).
MAX_SCANNED_FIELDS = 64
MAX_FIELD_NUMBER = codec.MAX_FIELD_NUMBER


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


def code_of(status: int) -> Any:
    """The gRPC status of an HTTP answer's status (``CODE_OF_STATUS``)."""
    return CODE_OF_STATUS.get(status, S.INTERNAL)


def metadata_value(value: str) -> bool:
    """Whether ``value`` can go as (ASCII) gRPC metadata or an HTTP header value as it is."""
    return value.isascii() and value.isprintable()


def http_headers(
    meta: Mapping[str, str], remaining_s: float | None, header_length: int
) -> dict[str, str]:
    """The HTTP request headers of a ModelInfer translated (``grpc_codec.to_http``): the
    binary extension's, and the client's class and deadline metadata (``deadline_ms``: its
    gRPC deadline counts). ValueError naming a metadata value an HTTP header cannot carry."""
    headers = {
        "content-type": codec.BINARY_CONTENT_TYPE,
        codec.HEADER_LENGTH: str(header_length),
    }
    priority = meta.get(wire.PRIORITY_HEADER)
    deadline = deadline_ms(meta.get(wire.DEADLINE_HEADER), remaining_s)
    for key, value in ((wire.PRIORITY_HEADER, priority), (wire.DEADLINE_HEADER, deadline)):
        if value is None:
            continue
        if not metadata_value(value):
            raise ValueError(f"metadata {key}: not printable ASCII: {wire.shown(value)}")
        headers[key] = value
    return headers


def answer_headers(ans: Answer) -> Mapping[str, str]:
    """The headers of an answer the front reads (``READ_HEADERS``), in one pass over a
    relayed answer's head (``Answer.header`` reads it for each name)."""
    if ans.raw is not None:
        return parse_headers(ans.head, READ_HEADERS)
    return ans.headers


def trailing_of(header: Any, backend: str | None) -> list[tuple[str, str]]:
    """The trailing metadata of an HTTP answer: ``TRAILING_HEADERS`` it has (``header``: the
    answer's header lookup), and the backend that answered."""
    out = []
    for key in TRAILING_HEADERS:
        value = header(key)
        if value is not None and metadata_value(value):
            out.append((key, value))
    if backend is not None:
        out.append((wire.BACKEND_HEADER, backend))
    return out


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


def backend_failure(exc: Any) -> GrpcReply:
    """A backend's failed ModelInfer call as the dispatcher judges it: a GrpcReply with the
    backend's status, message and trailing metadata; raises Unreachable when the connection
    was refused (the request never reached it), ResponseTimeout when our own time limit ran
    out (a DEADLINE_EXCEEDED without the worker's reason)."""
    if connect_refused(exc):
        raise Unreachable("connect-refused")
    trailing = tuple((k, v) for k, v in exc.trailing_metadata() or () if isinstance(v, str))
    reason = dict(trailing).get(wire.REASON_HEADER)
    if exc.code() == S.DEADLINE_EXCEEDED and reason is None:
        raise ResponseTimeout("timeout")
    return GrpcReply(
        http_status(exc.code(), reason), reason, exc.code(), exc.details() or "", trailing
    )


def _scan_model_name(raw: bytes) -> str | None:
    """Field 1 (``model_name``) of a serialized ModelInferRequest, from a walk over its
    top-level fields (each skipped by its length; the last field 1 wins, as in protobuf's own
    parse); None when the walk cannot tell: bytes that are not a well-formed message, a
    group, field 1 of another wire type (protobuf keeps it as an unknown field), more than
    MAX_SCANNED_FIELDS fields."""
    end = len(raw)
    i = 0
    name = b""
    try:
        for _ in range(MAX_SCANNED_FIELDS):
            if i == end:
                return name.decode()
            tag, i = codec.varint(raw, i)
            field, kind = tag >> 3, tag & 7
            if not 0 < field <= MAX_FIELD_NUMBER:
                return None
            if kind == 2:
                size, i = codec.varint(raw, i)
                if i + size > end:
                    return None
                if field == 1:
                    name = raw[i : i + size]
                i += size
            elif field == 1:  # model_name is a string: let protobuf judge
                return None
            elif kind == 0:
                _, i = codec.varint(raw, i)
            elif kind == 1 or kind == 5:
                i += 8 if kind == 1 else 4
                if i > end:
                    return None
            else:  # groups: let protobuf judge
                return None
    except (IndexError, ValueError):  # a cut varint, a name that is not UTF-8
        return None
    return name.decode() if i == end else None


def model_name_of(raw: bytes) -> str:
    """``model_name`` of a serialized ModelInferRequest, without parsing the message (a walk
    over its top-level fields), or from protobuf's parse when the walk cannot tell;
    ValueError when the bytes are not a ModelInferRequest. Not a validation: bytes malformed
    further in (an input's field) are the backend's to refuse, as it parses them whole."""
    name = _scan_model_name(raw)
    if name is not None:
        return name
    try:
        return str(service_pb2.ModelInferRequest.FromString(raw).model_name)
    except DecodeError as exc:
        raise ValueError(f"the request is not a ModelInferRequest: {exc}") from None


class _Channel:
    """One backend's kept channel: its stub (metadata, config) and its raw ModelInfer call;
    ``since_s``: when it was opened (the registry's clock)."""

    __slots__ = ("channel", "infer", "since_s", "stub", "url")

    def __init__(self, url: str, since_s: float) -> None:
        self.url = url
        self.since_s = since_s
        self.channel = grpc.aio.insecure_channel(url, options=list(CHANNEL_OPTIONS))
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.infer = self.channel.unary_unary(INFER_METHOD)  # bytes in, bytes out


class GatewayServicer:
    #: The RPCs served; every other answers UNIMPLEMENTED (``httpio.grpc_service``).
    RPCS = SERVED_RPCS
    #: The RPCs taken and answered as bytes.
    RAW = ("ModelInfer",)

    def __init__(self, registry: BackendRegistry, dispatcher: Dispatcher, timeout_s: float) -> None:
        self.registry = registry
        self.dispatcher = dispatcher
        self.timeout_s = timeout_s
        default = dispatcher.cfg.grpc_forward
        #: The backends ModelInfer is relayed to over gRPC (``grpc_forward: grpc``); every
        #: other one gets it translated to HTTP. Backend specs do not change at run time.
        self.relays = frozenset(
            n for n, st in registry.states.items() if st.spec.forwards_grpc(default)
        )
        self._channels: dict[str, _Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()
        #: Each model's path and version -> its HTTP inference path (a client sends few).
        self._paths: dict[tuple[str, str], str] = {}

    def rpcs(self) -> dict[str, Handler]:
        """Each served RPC's coroutine, by name."""
        return {name: getattr(self, name) for name in self.RPCS}

    def open(self) -> None:
        """A channel to every backend relayed to over gRPC, connecting now (on the running
        loop): the first request does not wait for a connection."""
        for name in self.relays:
            if self.registry.states[name].spec.grpc_url is not None:
                self._channel(name).channel.get_state(try_to_connect=True)

    def _channel(self, name: str) -> _Channel:
        """Backend ``name``'s kept channel; a fresh one if its ``grpc_url`` changed or the
        backend was ejected or readmitted since the channel was opened. A channel whose
        backend was down is in grpc's reconnect backoff (1 s, growing to 2 min) and fails
        every call at once until its next attempt: the backend would be ejected again though
        it is back. A fresh channel connects at once."""
        st = self.registry.states[name]
        url = st.spec.grpc_url
        ch = self._channels.get(name)
        if ch is None or ch.url != url or ch.since_s < st.changed_at_s:
            assert url is not None  # backends without one are never picked
            if ch is not None:  # its calls in flight may finish
                task = asyncio.get_running_loop().create_task(ch.channel.close(self.timeout_s))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            ch = self._channels[name] = _Channel(url, self.registry.clock.now())
        return ch

    async def aclose(self) -> None:
        for ch in self._channels.values():
            await ch.channel.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

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
            return codec.error_message(reply.body, 503)
        if reply.status != 200:
            return code_of(reply.status), codec.error_message(reply.body, reply.status)
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
    async def ModelInfer(self, raw: bytes, context: Any) -> Any:
        """Translated to HTTP and sent over the dispatcher's fast path; relayed as bytes when
        a host of the model is relayed to over gRPC (``_infer_relayed``)."""
        relays = self.relays
        if relays:
            try:
                model = model_name_of(raw)
            except ValueError as exc:
                await context.abort(S.INVALID_ARGUMENT, str(exc))
            hosts = self.registry.hosts_of(model)
            if any(n in relays for n in hosts):  # (grpcio's channel sends bytes only)
                return await self._infer_relayed(bytes(raw), model, hosts, context)
        try:
            req, raws = codec.parse_request(raw)
        except codec.CodecError as exc:
            await context.abort(S.INVALID_ARGUMENT, str(exc))
        model = req.model_name
        if not self.registry.hosts_model(model):  # the dispatcher's NOT_FOUND, counted so
            return await self._answer(await self._dispatch(model, "", b"", {}), True, context)
        http = await self._translate(req, raws, context)
        meta = dict(context.invocation_metadata() or ())
        try:
            headers = http_headers(meta, context.time_remaining(), http.header_length)
        except ValueError as exc:
            await self._refuse(model, context, S.INVALID_ARGUMENT, str(exc))
        ans = await self._dispatch(model, http.path, http.body, headers)
        return await self._answer(ans, http.raw_outputs, context)

    async def _refuse(self, model: str, context: Any, code: Any, message: str) -> None:
        """A request the gateway refuses itself before any backend sees it (counted as the
        client's error, as the HTTP server's refusals are)."""
        self.dispatcher.metrics.observe_request(None, model, "client_error", None)
        await context.abort(code, message)

    async def _translate(self, req: Any, raws: codec.Raws, context: Any) -> codec.HttpInfer:
        """``req`` as its HTTP request (``grpc_codec.to_http``), or the call refused:
        INVALID_ARGUMENT naming the field, NOT_FOUND a version no HTTP route can name."""
        version = req.model_version
        if version and not wire.is_safe_name(version):
            model = req.model_name
            await self._refuse(model, context, S.NOT_FOUND, no_version(model, version))
        try:
            return codec.to_http(req, raws)
        except codec.CodecError as exc:
            await self._refuse(req.model_name, context, S.INVALID_ARGUMENT, str(exc))
            raise  # not reached: abort raises

    async def _dispatch(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        """The dispatcher's answer to the HTTP request: over its fast path (a callback, no
        task) when it has one. A call cancelled meanwhile (the client's deadline, a
        cancel) leaves the request to finish and its answer unread."""
        d = self.dispatcher
        if not d.fast:
            return await d.infer(model, path, body, headers)
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        d.infer_fast(model, path, body, headers, partial(_resolve, fut))
        return await fut

    async def _answer(self, ans: Answer, raw_outputs: bool, context: Any) -> Any:
        """An HTTP answer as the gRPC answer: a 200 translated (``grpc_codec.to_grpc``), a
        refusal as its gRPC status and message; the trailing metadata (``trailing_of``)."""
        headers = answer_headers(ans)
        trailing = trailing_of(headers.get, ans.backend)
        body = ans.body if ans.raw is None else memoryview(ans.raw)[ans.raw_head :]
        if ans.status == 200:
            try:
                out = codec.to_grpc(body, headers.get(codec.HEADER_LENGTH), raw_outputs)
            except codec.CodecError as exc:
                code, message = S.INVALID_ARGUMENT, str(exc)
            except codec.BadAnswer as exc:
                code, message = S.INTERNAL, bad_answer(ans.backend, exc)
            else:
                context.set_trailing_metadata(tuple(trailing))
                return out
        else:
            code, message = code_of(ans.status), codec.error_message(body, ans.status)
        context.set_trailing_metadata(tuple(trailing))
        await context.abort(code, message)

    async def _infer_relayed(
        self, raw: bytes, model: str, hosts: tuple[str, ...], context: Any
    ) -> Any:
        """ModelInfer for a model some host of which is relayed to over gRPC: the request's
        bytes go as they came to those hosts (their ``grpc_url``; one without is not a
        candidate), translated to HTTP to the others; the dispatcher's ``infer_grpc`` tries
        them by the same rules."""
        registry = self.registry
        states = registry.states
        relays = self.relays
        without = [n for n in hosts if n in relays and states[n].spec.grpc_url is None]
        if hosts and len(without) == len(hosts):
            self.dispatcher.metrics.observe_request(None, model, "unavailable", None)
            await context.abort(S.UNAVAILABLE, f"no backend of model {model!r} serves gRPC")
        meta = dict(context.invocation_metadata() or ())
        http: codec.HttpInfer | None = None
        if any(n not in relays for n in hosts):
            try:
                req, raws = codec.parse_request(raw)
            except codec.CodecError as exc:
                await context.abort(S.INVALID_ARGUMENT, str(exc))
            http = await self._translate(req, raws, context)
            try:
                http_headers(meta, None, http.header_length)
            except ValueError as exc:
                await self._refuse(model, context, S.INVALID_ARGUMENT, str(exc))
        timeout_s = self.timeout_s
        forwarder = self.dispatcher.forwarder

        async def send(name: str) -> GrpcReply:
            # The deadline as it stands at this try (a retry has less time left).
            remaining = context.time_remaining()
            if name not in relays:
                assert http is not None
                headers = http_headers(meta, remaining, http.header_length)
                reply = await forwarder.request(
                    "POST", registry.url(name), http.path, http.body, headers
                )
                return grpc_reply(reply, http.raw_outputs, name)
            forward = forward_metadata(meta, remaining)
            try:
                response = await self._channel(name).infer(raw, timeout=timeout_s, metadata=forward)
            except grpc.aio.AioRpcError as exc:
                return backend_failure(exc)
            return GrpcReply(200, None, S.OK, response=response)

        ans = await self.dispatcher.infer_grpc(
            model, send, without, dict(forward_metadata(meta, context.time_remaining()))
        )
        return await self._relay(ans, context)

    @staticmethod
    async def _relay(ans: Answer, context: Any) -> Any:
        got = ans.grpc
        trailing: list[tuple[str, str]] = []
        if got is not None:
            trailing += [(k, v) for k, v in got.trailing if k != wire.BACKEND_HEADER]
        else:
            trailing += trailing_of(answer_headers(ans).get, None)
        if ans.backend is not None:
            trailing.append((wire.BACKEND_HEADER, ans.backend))
        context.set_trailing_metadata(tuple(trailing))
        if got is not None:
            if got.code == S.OK:
                return got.response
            await context.abort(got.code, got.message)
        await context.abort(code_of(ans.status), codec.error_message(ans.body, ans.status))


def _resolve(fut: asyncio.Future[Answer], ans: Answer) -> None:
    """The dispatcher's answer callback: the awaiting call's result (unless it is gone)."""
    if not fut.done():
        fut.set_result(ans)


def no_version(model: str, version: str) -> str:
    """A version no HTTP route can name (``wire.is_safe_name``): no backend has it."""
    return f"model {model!r} has no version {wire.shown_name(version)}"


def bad_answer(backend: str | None, exc: Exception) -> str:
    return f"backend {backend} answered what is not a v2 inference response: {exc}"


def grpc_reply(reply: Reply, raw_outputs: bool, name: str) -> GrpcReply:
    """Backend ``name``'s HTTP answer to a translated ModelInfer as the dispatcher judges a
    gRPC one: the HTTP status, the reason, the gRPC status and message, the trailing
    metadata, and for a 200 the ModelInferResponse's bytes."""
    headers = parse_headers(reply.head) if reply.head else reply.headers
    trailing = tuple(trailing_of(headers.get, None))
    status = reply.status
    if status != 200:
        message = codec.error_message(reply.body, status)
        reason = headers.get(wire.REASON_HEADER)
        return GrpcReply(status, reason, code_of(status), message, trailing)
    try:
        response = codec.to_grpc(reply.body, headers.get(codec.HEADER_LENGTH), raw_outputs)
    except codec.CodecError as exc:
        return GrpcReply(200, None, S.INVALID_ARGUMENT, str(exc), trailing)
    except codec.BadAnswer as exc:
        return GrpcReply(200, None, S.INTERNAL, bad_answer(name, exc), trailing)
    return GrpcReply(200, None, S.OK, "", trailing, response)


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
