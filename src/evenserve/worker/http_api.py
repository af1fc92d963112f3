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
``x-evenserve-compute-ms`` (the batch's compute time). What a request means, and its
counting and its line in the request log (``--record``), are the data plane's
(``worker.dataplane``), shared with the gRPC front; this module decodes and encodes.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from evenserve import __version__ as evenserve_version
from evenserve.core import wire
from evenserve.httpio.server import Limits, Request, Response, json_bytes
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL
from evenserve.runtime.base import Array
from evenserve.worker.admin import WorkerAdmin
from evenserve.worker.dataplane import Answer, DataPlane, NotServedError
from evenserve.worker.kserve import (
    HEADER_LENGTH,
    InferRequest,
    ModelSignature,
    ProtocolError,
    parse_header_length,
    parse_infer_request,
)
from evenserve.worker.kserve_encode import encode_infer_response, error_body
from evenserve.worker.load_override import load_override
from evenserve.worker.models.control import ModelControlError

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


def _failure(answer: Answer[Any]) -> Response:
    """A failed answer: its status (``core.wire``'s outcome table), reason and hints."""
    headers: dict[str, str] = {}
    if answer.reason is not None:
        headers[wire.REASON_HEADER] = answer.reason
    if answer.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(answer.retry_after_s)))
    if answer.load_wait_s is not None:
        headers[wire.LOAD_WAIT_HEADER] = _ms(answer.load_wait_s)
    return _error(answer.message, answer.outcome.http_status, headers)


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


class _InferCodec:
    """The JSON and binary-tensor codec of one HTTP inference request (``dataplane``)."""

    __slots__ = ("front", "request")
    transport = "http"

    def __init__(self, front: WorkerApp, request: Request) -> None:
        self.front = front
        self.request = request

    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    async def decode(self, sig: ModelSignature) -> InferRequest:
        request = self.request
        body = read_body(request, self.front.max_body_bytes)
        header_length = parse_header_length(request.headers.get(HEADER_LENGTH.lower()))
        if len(body) > OFFLOAD_BYTES:
            return await self.front.off_loop(partial(parse_infer_request, body, header_length, sig))
        return parse_infer_request(body, header_length, sig)

    async def encode(
        self, sig: ModelSignature, req: InferRequest, outputs: Mapping[str, Array]
    ) -> tuple[bytes, dict[str, str]]:
        encode = partial(encode_infer_response, sig, req.id, outputs, req.outputs)
        big = sum(int(a.nbytes) for a in outputs.values()) > OFFLOAD_BYTES
        return await self.front.off_loop(encode) if big else encode()


class WorkerApp:
    """The worker's HTTP front (an ``httpio.serving.App``'s handler): routes, decodes and
    encodes; what a request means is the data plane's. Its own life is the codec thread's
    (``close``); the worker's and the gRPC front's are the composition root's (``app``)."""

    def __init__(
        self,
        plane: DataPlane,
        admin: WorkerAdmin,
        extra_routes: Mapping[tuple[str, str], Endpoint] | None = None,
    ) -> None:
        self.plane = plane
        self.metrics = plane.metrics
        self.max_body_bytes = plane.device.options.max_body_bytes
        self.limits = Limits(max_body_bytes=self.max_body_bytes)
        #: Parses and encodes large bodies (``OFFLOAD_BYTES``; started on first use).
        self._codec: ThreadPoolExecutor | None = None
        #: ``/admin/params`` (``worker.admin``; off without a token).
        self.admin = admin
        self._exact: dict[tuple[str, str], Endpoint] = {
            ("GET", wire.HEALTH_LIVE_PATH): self.live,
            ("GET", wire.HEALTH_READY_PATH): self.ready,
            ("GET", wire.SERVER_METADATA_PATH): self.server_metadata,
            ("GET", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("POST", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("GET", wire.MODEL_STATS_PATH): self.all_stats,
            ("GET", wire.LOAD_PATH): self.load,
            ("GET", wire.METRICS_PATH): self.prometheus,
            **admin.routes(),
            **(extra_routes or {}),  # the OpenAI front over LLM models (``worker.llm``)
        }
        self._paths = {p for _, p in self._exact}
        p = plane
        self._per_model: dict[str, Callable[[str, str | None], Response]] = {
            "": lambda name, version: _json(p.model_metadata(name, version)),
            "config": lambda name, version: _json(p.model_config(name, version)),
            "ready": self._model_ready,
            "stats": lambda name, version: _json(p.statistics(name, version)),
        }

    def _model_ready(self, name: str, version: str | None) -> Response:
        self.plane.model(name, version)  # NotServedError: 404, or 503 while it loads
        return Response(200 if self.plane.model_ready(name) else 503)

    def close(self) -> None:
        if self._codec is not None:
            self._codec.shutdown(wait=False)

    async def off_loop(self, fn: Callable[[], T]) -> T:
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
        name = found[0] if found[0] in self.plane.models else UNKNOWN_MODEL_LABEL
        outcome = wire.TOO_LARGE if status == 413 else wire.BAD_REQUEST
        self.metrics.observe_request(name, outcome.label, None)

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
        if suffix == "infer":
            return await self.infer(request, name, version)
        try:
            return self._per_model[suffix](name, version)
        except NotServedError as exc:
            return _error(str(exc), exc.outcome.http_status)

    # -- endpoints -------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return Response(200)

    async def ready(self, request: Request) -> Response:
        return Response(200 if self.plane.ready else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json({"name": "evenserve", "version": evenserve_version, "extensions": EXTENSIONS})

    async def all_stats(self, request: Request) -> Response:
        return _json(self.plane.statistics())

    async def repository_index(self, request: Request) -> Response:
        """Triton's index: every model folder and model known, with its state; the body
        ``{"ready": true}`` keeps the READY ones."""
        ready_only = False
        try:
            body = _json_body(request, self.max_body_bytes)
            if body is not None:
                ready = body.get("ready", False)
                if not isinstance(ready, bool):
                    raise ProtocolError("ready: must be true or false")
                ready_only = ready
        except ProtocolError as exc:
            return _error(str(exc), exc.status)
        return _json(self.plane.repository_index(ready_only))

    async def repository_control(self, request: Request, name: str, action: str) -> Response:
        """``POST /v2/repository/models/{m}/load`` (optional body ``{"parameters": {"config":
        "<model.yaml fields as JSON>"}}``, the config as a string as Triton takes it, or as
        an object) and ``.../unload``: 200 once done, a load's body saying where it came
        from and how long it took (``{"load_source": "host" | "disk", "load_seconds": s}``:
        host, the warm pool; an unload's ``{}``)."""
        control = self.plane.control
        reply: dict[str, Any] = {}
        try:
            body = _json_body(request, self.max_body_bytes)
            if action == "load":
                reply = await control.request_load(name, load_override(body))
            else:
                await control.request_unload(name)
        except ProtocolError as exc:
            return _error(str(exc), exc.status)
        except ModelControlError as exc:
            return _error(str(exc), exc.status)
        return _json(reply)

    async def load(self, request: Request) -> Response:
        if self.plane.device.driver is None:
            return _error("worker is loading its models", 503)
        return Response(200, self.plane.load_report().model_dump_json().encode(), JSON)

    async def prometheus(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(200, body, {"content-type": content_type})

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        answer = await self.plane.infer(name, version, _InferCodec(self, request))
        if answer.body is None:
            return _failure(answer)
        data, headers = answer.body
        if answer.queue_s is not None and answer.compute_s is not None:
            headers[wire.QUEUE_MS_HEADER] = _ms(answer.queue_s)
            headers[wire.COMPUTE_MS_HEADER] = _ms(answer.compute_s)
        if answer.load_wait_s is not None:
            headers[wire.LOAD_WAIT_HEADER] = _ms(answer.load_wait_s)
        return Response(200, data, headers)
