"""The worker's HTTP API: KServe v2 (+ binary tensors, statistics), the load endpoint, /metrics.

HEAD is answered as GET, without the body.

Status codes: 404 unknown model or version; 400 malformed JSON, malformed binary header, or
a missing/unexpected/mistyped/misshapen input, or a bad priority or deadline (the message
names the field); 413 body over the limit; 415 unsupported Content-Encoding; 429 with
Retry-After: the queue is full (``queue-full``) or the request was shed from a full queue for
a request of a higher class (``shed``); 504: the request's deadline cannot be met, refused at
once (``deadline-infeasible``) or found while it waited (``deadline-expired``); 503 not ready
or shutting down; 500 the runtime failed. An inference request for a model being loaded
(LOADING) waits for the load, at most ``--load-wait-ms``, then runs as any other; its response
carries ``x-evenserve-load-wait-ms`` (the time it waited). Past the bound it is answered 503
with Retry-After (``model 'm' is still loading after N ms``); if the load fails, 503 with the
load's error. A model being unloaded is refused at once (503). A refusal's reason is the
first word of the message and the ``x-evenserve-reason`` header (the gateway reads it). Errors are
``{"error": "..."}`` as Triton sends them, so tritonclient shows the message.
Every infer request is counted once in ``evenserve_worker_requests_total`` by outcome, and
every refusal once in ``evenserve_worker_refusals_total`` by reason.
Answered requests carry ``x-evenserve-queue-ms`` (arrival to the batch's start) and
``x-evenserve-compute-ms`` (the batch's compute time). With a recorder (``--record``) every
inference request the handler answers is one line of the request log (``core.requestlog``).
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from evenserve import __version__ as evenserve_version
from evenserve.core import wire
from evenserve.core.requestlog import Recorder
from evenserve.httpio.server import Limits, Request, Response, json_bytes
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL
from evenserve.worker.admin import WorkerAdmin
from evenserve.worker.driver import (
    BatchFailedError,
    DrainingError,
    RefusedError,
)
from evenserve.worker.kserve import (
    HEADER_LENGTH,
    ModelSignature,
    ProtocolError,
    parse_header_length,
    parse_infer_request,
    request_class,
)
from evenserve.worker.kserve_encode import encode_infer_response, error_body
from evenserve.worker.load_override import load_override
from evenserve.worker.service import LOADING, LoadWaitError, ModelControlError, WorkerService

if TYPE_CHECKING:
    from evenserve.worker.grpc_api import GrpcServer

#: Bodies larger than this are parsed and encoded off the event loop, on the codec thread.
OFFLOAD_BYTES = 256 * 1024
#: Threads that parse and encode large bodies. One: the JSON and numpy work holds the GIL
#: throughout (orjson does not release it), so more threads would not decode faster, and
#: each would take the GIL from the event loop in turn: with one, the loop waits for at most
#: one decode (about 10 ms for a 3 MB ResNet-50 JSON tensor) before it answers a probe.
CODEC_THREADS = 1
EXTENSIONS = [
    "binary_tensor_data",
    "statistics",
    "model_configuration",
    "model_repository",
    "evenserve_load",
]
Endpoint = Callable[[Request], Awaitable[Response]]
T = TypeVar("T")
JSON = {"content-type": "application/json"}


#: The ``outcome`` label of each refusal (metrics.names.OUTCOMES).
REFUSAL_OUTCOMES = {
    wire.QUEUE_FULL: "rejected_queue_full",
    wire.SHED: "shed",
    wire.DEADLINE_INFEASIBLE: "deadline_infeasible",
    wire.DEADLINE_EXPIRED: "deadline_expired",
    wire.LOAD_TIMEOUT: "unavailable",
}


def _refusal(exc: RefusedError) -> tuple[Response, str]:
    """The response and the outcome label of a refused request."""
    headers = {wire.REASON_HEADER: exc.reason}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return _error(str(exc), wire.REFUSAL_STATUS[exc.reason], headers), REFUSAL_OUTCOMES[exc.reason]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.3f}"


def _json(obj: Any, status: int = 200) -> Response:
    return Response(status, json_bytes(obj), JSON)


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(status, error_body(message), {**JSON, **(headers or {})})


def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed if gzip/deflate, refused over ``limit`` bytes (the
    server has already refused a body over it as sent)."""
    body = request.body
    if len(body) > limit:
        raise ProtocolError(f"request body is over the limit of {limit} bytes", 413)
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(f"Content-Encoding {encoding!r} is not supported", 415)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise ProtocolError(f"decompressed body is over the limit of {limit} bytes", 413)
    return out


def _json_body(request: Request, limit: int) -> dict[str, Any] | None:
    """An optional JSON object body (None when empty); ProtocolError otherwise."""
    data = read_body(request, limit)
    if not data.strip():
        return None
    try:
        body = wire.parse_json(data)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    if not isinstance(body, dict):
        raise ProtocolError("body: expected a JSON object")
    return body


class _Note:
    """What the request log needs of one request beyond its answer (``--record``)."""

    __slots__ = ("deadline_ms", "priority", "t_s", "unix_s")

    def __init__(self, t_s: float, unix_s: float) -> None:
        self.t_s = t_s
        self.unix_s = unix_s
        self.priority: int | None = None
        self.deadline_ms: float | None = None


class WorkerApp:
    """The worker's HTTP handler (an ``httpio.serving.App``). With ``manage_lifecycle`` its
    startup starts the service's driver and its shutdown drains the queues and stops the
    runtimes. With ``grpc_port`` (0: any free port) its startup also starts the KServe v2
    gRPC server (``grpc_api``) on the same loop, on ``grpc_host``; the graceful stop turns
    it not-ready with the HTTP side, and shutdown stops it while the queues drain."""

    def __init__(
        self,
        service: WorkerService,
        *,
        manage_lifecycle: bool = True,
        grpc_host: str = "127.0.0.1",
        grpc_port: int | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.service = service
        #: The request log (``--record``; None: off).
        self.recorder = recorder
        self.manage_lifecycle = manage_lifecycle
        self.grpc_host = grpc_host
        self.grpc_port = grpc_port
        self.grpc: GrpcServer | None = None
        self.metrics = service.metrics
        self.limits = Limits(max_body_bytes=service.options.max_body_bytes)
        #: Parses and encodes large bodies (``OFFLOAD_BYTES``; started on first use).
        self._codec: ThreadPoolExecutor | None = None
        #: ``/admin/params`` (``worker.admin``; off without a token).
        self.admin = WorkerAdmin(service, service.options.admin_token)
        self._exact: dict[tuple[str, str], Endpoint] = {
            ("GET", wire.HEALTH_LIVE_PATH): self.live,
            ("GET", wire.HEALTH_READY_PATH): self.ready,
            ("GET", wire.SERVER_METADATA_PATH): self.server_metadata,
            ("GET", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("POST", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("GET", wire.MODEL_STATS_PATH): self.all_stats,
            ("GET", wire.LOAD_PATH): self.load,
            ("GET", wire.METRICS_PATH): self.prometheus,
            **self.admin.routes(),
        }
        self._paths = {p for _, p in self._exact}
        svc = service
        self._per_model: dict[str, Callable[[str], Response]] = {
            "": lambda name: _json(svc.model_metadata_json(name)),
            "config": lambda name: _json(svc.model_config_json(name)),
            "ready": lambda name: Response(200 if svc.model_ready(name) else 503),
            "stats": lambda name: _json({"model_stats": [svc.stats[name].json()]}),
        }

    # -- lifecycle (httpio.serving.App) ---------------------------------------------------------
    async def startup(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        if self.grpc_port is not None:
            from evenserve.worker.grpc_api import GrpcServer

            # Not ready (UNAVAILABLE) until the service has started below.
            self.grpc = GrpcServer(self.service, self.grpc_host, self.grpc_port)
            await self.grpc.start()
        try:
            if self.manage_lifecycle:
                await self.service.start()
        except BaseException:
            if self.grpc is not None:
                await self.grpc.stop(0)
            raise

    def begin_drain(self) -> None:
        self.service.begin_drain()

    async def shutdown(self) -> None:
        # The gRPC server stops taking calls and answers its open ones while the queues drain.
        grpc_stop = None
        if self.grpc is not None:
            grace = self.service.options.drain_timeout_s + 5
            grpc_stop = asyncio.ensure_future(self.grpc.stop(grace))
        try:
            if self.manage_lifecycle:
                await self.service.stop()
        finally:
            if grpc_stop is not None:
                await grpc_stop
            if self.recorder is not None:
                self.recorder.stop()
            if self._codec is not None:
                self._codec.shutdown(wait=False)

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the codec thread (``CODEC_THREADS``)."""
        if self._codec is None:
            self._codec = ThreadPoolExecutor(CODEC_THREADS, thread_name_prefix="evenserve-codec")
        return await asyncio.get_running_loop().run_in_executor(self._codec, fn)

    def refused(self, status: int, path: str) -> None:
        """The server answered an inference request itself (a body over the limit, a head
        too large, malformed HTTP): counted like the requests the handler answers."""
        found = wire.split_model_path(path)
        if found is None or found[2] != "infer":
            return
        name = found[0] if found[0] in self.service.signatures else UNKNOWN_MODEL_LABEL
        self.metrics.observe_request(name, "too_large" if status == 413 else "bad_request", None)

    # -- routing ---------------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        path = request.path
        # HEAD is GET without the body (the server drops it).
        method = "GET" if request.method == "HEAD" else request.method
        endpoint = self._exact.get((method, path))
        if endpoint is not None:
            return await endpoint(request)
        if path in self._paths:
            return _error(f"method {request.method} not allowed on {path}", 405)
        control = wire.split_repository_path(path)
        if control is not None:
            if method != "POST":
                return _error(f"{path[:200]!r} takes POST", 405)
            return await self.repository_control(request, *control)
        found = wire.split_model_path(path)
        if found is None:
            return _error(f"no such path: {path[:200]!r}", 404)
        name, version, suffix = found
        takes = "POST" if suffix == "infer" else "GET"
        if method != takes:
            return _error(f"{path[:200]!r} takes {takes}", 405)
        sig = self.service.signatures.get(name)
        if sig is None and suffix == "infer" and self.service.model_state(name).state == LOADING:
            return await self.infer_after_load(request, name, version)
        if sig is None:
            if self.service.model_state(name).state == LOADING:  # soon served: retry
                if suffix == "infer":
                    self.metrics.observe_request(name, "unavailable", None)
                return _error(f"model {name!r} is loading", 503)
            if suffix == "infer":
                self.metrics.observe_request(UNKNOWN_MODEL_LABEL, "not_found", None)
            return _error(
                f"model {name!r} is not served here (models: {', '.join(self.service.signatures)})",
                404,
            )
        if version not in (None, "", sig.version):
            if suffix == "infer":
                self.metrics.observe_request(UNKNOWN_MODEL_LABEL, "not_found", None)
            return _error(
                f"model {name!r} has no version {version!r} (versions: {sig.version})", 404
            )
        if suffix == "infer":
            return await self.infer(request, name, sig)
        return self._per_model[suffix](name)

    # -- endpoints -------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        return Response(200 if self.service.ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json({"name": "evenserve", "version": evenserve_version, "extensions": EXTENSIONS})

    async def all_stats(self, request: Request) -> Response:
        return _json({"model_stats": [s.json() for s in self.service.stats.values()]})

    async def repository_index(self, request: Request) -> Response:
        """Triton's index: every model folder and model known, with its state; the body
        ``{"ready": true}`` keeps the READY ones."""
        ready_only = False
        try:
            body = _json_body(request, self.service.options.max_body_bytes)
            if body is not None:
                ready = body.get("ready", False)
                if not isinstance(ready, bool):
                    raise ProtocolError("ready: must be true or false")
                ready_only = ready
        except ProtocolError as exc:
            return _error(str(exc), exc.status)
        return _json(self.service.repository_index(ready_only))

    async def repository_control(self, request: Request, name: str, action: str) -> Response:
        """``POST /v2/repository/models/{m}/load`` (optional body ``{"parameters": {"config":
        "<model.yaml fields as JSON>"}}``, the config as a string as Triton takes it, or as
        an object) and ``.../unload``: 200 once done, a load's body saying where it came
        from and how long it took (``{"load_source": "host" | "disk", "load_seconds": s}``:
        host, the warm pool; an unload's ``{}``)."""
        svc = self.service
        reply: dict[str, Any] = {}
        try:
            body = _json_body(request, svc.options.max_body_bytes)
            if action == "load":
                reply = await svc.request_load(name, load_override(body))
            else:
                await svc.request_unload(name)
        except ProtocolError as exc:
            return _error(str(exc), exc.status)
        except ModelControlError as exc:
            return _error(str(exc), exc.status)
        return _json(reply)

    async def load(self, request: Request) -> Response:
        if not self.service.started:
            return _error("worker is loading its models", 503)
        return Response(200, self.service.load_report().model_dump_json().encode(), JSON)

    async def prometheus(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(200, body, {"content-type": content_type})

    async def infer_after_load(self, request: Request, name: str, version: str | None) -> Response:
        """An inference request for a model being loaded: wait for the load (bounded), then
        serve it as any other; the response says how long it waited."""
        t0 = time.perf_counter()
        svc = self.service
        try:
            waited_s = await svc.await_load(name)
        except LoadWaitError as exc:
            headers = {wire.LOAD_WAIT_HEADER: _ms(exc.waited_s)}
            if exc.retry_after_s is not None:
                headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
            svc.metrics.observe_request(name, "unavailable", None)
            return _error(str(exc), 503, headers)
        sig = svc.signatures.get(name)
        if sig is None or version not in (None, "", sig.version):
            response = await self(request)  # unloaded again meanwhile, or no such version
        else:
            response = await self.infer(request, name, sig, t0)
        headers = {**(response.headers or {}), wire.LOAD_WAIT_HEADER: _ms(waited_s)}
        return Response(response.status, response.body, headers)

    async def infer(
        self, request: Request, name: str, sig: ModelSignature, t0: float | None = None
    ) -> Response:
        t0 = time.perf_counter() if t0 is None else t0
        outcome = "error"
        rec = self.recorder
        note = None if rec is None else _Note(rec.clock.now(), rec.wall())
        try:
            response, outcome = await self._infer(request, name, sig, note)
            if rec is not None and note is not None:
                h = response.headers or {}
                rec.add(
                    note.t_s,
                    note.unix_s,
                    name,
                    note.priority,
                    note.deadline_ms,
                    None,
                    response.status,
                    h.get(wire.QUEUE_MS_HEADER),
                    h.get(wire.COMPUTE_MS_HEADER),
                )
            return response
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.service.count_infer(name, outcome, time.perf_counter() - t0)

    async def _infer(
        self, request: Request, name: str, sig: ModelSignature, note: _Note | None = None
    ) -> tuple[Response, str]:
        service = self.service
        if service.draining or not service.ready:
            return _error("the worker is not ready (loading or shutting down)", 503), (
                "unavailable"
            )
        try:
            body = read_body(request, service.options.max_body_bytes)
            header_length = parse_header_length(request.headers.get(HEADER_LENGTH.lower()))
            if len(body) > OFFLOAD_BYTES:
                req = await self._off_loop(partial(parse_infer_request, body, header_length, sig))
            else:
                req = parse_infer_request(body, header_length, sig)
            priority, deadline_in_s = request_class(req, request.headers)
            if note is not None:
                note.priority = priority
                note.deadline_ms = None if deadline_in_s is None else deadline_in_s * 1000.0
        except ProtocolError as exc:
            outcome = {413: "too_large"}.get(exc.status, "bad_request")
            return _error(str(exc), exc.status), outcome
        refusal = service.model_refusal(name)  # no await from here to the submit
        if refusal is not None:
            return _error(refusal, 503), "unavailable"
        try:  # refused or draining at once, or while it waited; or its batch failed
            pending = service.driver.submit(
                name, req.inputs, items=req.items, priority=priority, deadline_in_s=deadline_in_s
            )
            assert pending.future is not None
            outputs = await pending.future
        except RefusedError as exc:
            return _refusal(exc)
        except DrainingError as exc:
            return _error(str(exc), 503), "unavailable"
        except BatchFailedError as exc:
            return _error(f"inference failed: {exc}", 500), "error"
        encode = partial(encode_infer_response, sig, req.id, outputs, req.outputs)
        big = sum(int(a.nbytes) for a in outputs.values()) > OFFLOAD_BYTES
        data, headers = await self._off_loop(encode) if big else encode()
        if pending.queue_s is not None and pending.compute_s is not None:
            headers[wire.QUEUE_MS_HEADER] = _ms(pending.queue_s)
            headers[wire.COMPUTE_MS_HEADER] = _ms(pending.compute_s)
        return Response(200, data, headers), "success"


def create_app(
    service: WorkerService,
    *,
    manage_lifecycle: bool = True,
    grpc_host: str = "127.0.0.1",
    grpc_port: int | None = None,
    recorder: Recorder | None = None,
) -> WorkerApp:
    """The worker's HTTP handler (see :class:`WorkerApp`)."""
    return WorkerApp(
        service,
        manage_lifecycle=manage_lifecycle,
        grpc_host=grpc_host,
        grpc_port=grpc_port,
        recorder=recorder,
    )
