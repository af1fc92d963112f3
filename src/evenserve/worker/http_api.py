"""The worker's HTTP API: KServe v2 (+ binary tensors, statistics), the load endpoint, /metrics.

Status codes: 404 unknown model or version; 400 malformed JSON, malformed binary header, or
a missing/unexpected/mistyped/misshapen input, or a bad priority or deadline (the message
names the field); 413 body over the limit; 415 unsupported Content-Encoding; 429 with
Retry-After: the queue is full (``queue-full``) or the request was shed from a full queue for
a request of a higher class (``shed``); 504: the request's deadline cannot be met, refused at
once (``deadline-infeasible``) or found while it waited (``deadline-expired``); 503 not ready
or shutting down; 500 the runtime failed. A refusal's reason is the first word of the
message and the ``x-evenserve-reason`` header (the gateway reads it). Errors are
``{"error": "..."}`` as Triton sends them, so tritonclient shows the message.
Every infer request is counted once in ``evenserve_worker_requests_total`` by outcome, and
every refusal once in ``evenserve_worker_refusals_total`` by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from evenserve import __version__ as evenserve_version
from evenserve.core import wire
from evenserve.worker.driver import (
    BatchFailedError,
    DrainingError,
    RefusedError,
)
from evenserve.worker.kserve import (
    HEADER_LENGTH,
    ModelSignature,
    ProtocolError,
    encode_infer_response,
    error_body,
    parse_infer_request,
    request_class,
)
from evenserve.worker.service import WorkerService

#: Bodies larger than this are parsed and encoded off the event loop.
OFFLOAD_BYTES = 256 * 1024
UNKNOWN_MODEL_LABEL = "_unknown"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "evenserve_load"]
Endpoint = Callable[[Request], Awaitable[Response]]


#: The ``outcome`` label of each refusal (metrics.names.OUTCOMES).
REFUSAL_OUTCOMES = {
    wire.QUEUE_FULL: "rejected_queue_full",
    wire.SHED: "shed",
    wire.DEADLINE_INFEASIBLE: "deadline_infeasible",
    wire.DEADLINE_EXPIRED: "deadline_expired",
}


def _refusal(exc: RefusedError) -> tuple[Response, str]:
    """The response and the outcome label of a refused request."""
    headers = {wire.REASON_HEADER: exc.reason}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return _error(str(exc), wire.REFUSAL_STATUS[exc.reason], headers), REFUSAL_OUTCOMES[exc.reason]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(obj, separators=(",", ":")), status_code=status, media_type="application/json"
    )


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        error_body(message), status_code=status, media_type="application/json", headers=headers
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed if gzip/deflate, refused over ``limit`` bytes."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise ProtocolError(f"Content-Length: not an integer: {cl!r}") from None
        if declared > limit:
            raise ProtocolError(
                f"request body of {declared} bytes is over the limit of {limit} bytes", 413
            )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ProtocolError(f"request body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
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


def create_app(service: WorkerService, *, manage_lifecycle: bool = True) -> Starlette:
    """The ASGI app. With ``manage_lifecycle`` its lifespan starts the service's driver and,
    at shutdown, drains the queues and stops the runtimes."""
    metrics = service.metrics

    def lookup(request: Request) -> tuple[str, ModelSignature] | Response:
        name = request.path_params["model"]
        sig = service.signatures.get(name)
        if sig is None:
            return _error(
                f"model {name!r} is not served here (models: {', '.join(service.signatures)})",
                404,
            )
        version = request.path_params.get("version")
        if version not in (None, "", sig.version):
            return _error(
                f"model {name!r} has no version {version!r} (versions: {sig.version})", 404
            )
        return name, sig

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if service.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "evenserve", "version": evenserve_version, "extensions": EXTENSIONS})

    def per_model(answer: Callable[[str], Response]) -> Endpoint:
        """An endpoint of one served model: 404 for an unknown model or version."""

        async def endpoint(request: Request) -> Response:
            found = lookup(request)
            return found if isinstance(found, Response) else answer(found[0])

        return endpoint

    model_metadata = per_model(lambda name: _json(service.model_metadata_json(name)))
    model_config = per_model(lambda name: _json(service.model_config_json(name)))
    model_ready = per_model(lambda name: Response(status_code=200 if service.ready else 503))
    model_stats = per_model(lambda name: _json({"model_stats": [service.stats[name].json()]}))

    async def all_stats(request: Request) -> Response:
        return _json({"model_stats": [s.json() for s in service.stats.values()]})

    async def repository_index(request: Request) -> Response:
        state = "READY" if service.ready else "UNAVAILABLE"
        return _json(
            [
                {"name": n, "version": s.version, "state": state}
                for n, s in service.signatures.items()
            ]
        )

    async def load(request: Request) -> Response:
        if not service.started:
            return _error("worker is loading its models", 503)
        return Response(service.load_report().model_dump_json(), media_type="application/json")

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    async def infer(request: Request) -> Response:
        t0 = time.perf_counter()
        found = lookup(request)
        if isinstance(found, Response):
            metrics.observe_request(UNKNOWN_MODEL_LABEL, "not_found", None)
            return found
        name, sig = found
        outcome = "error"
        ok = False
        try:
            response, outcome = await _infer(request, name, sig)
            ok = outcome == "success"
            return response
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            elapsed = time.perf_counter() - t0
            metrics.observe_request(name, outcome, elapsed)
            if outcome not in ("not_found", "cancelled"):
                service.stats[name].record_request(ok, elapsed)

    async def _infer(request: Request, name: str, sig: ModelSignature) -> tuple[Response, str]:
        if service.draining or not service.ready:
            return _error("the worker is not ready (loading or shutting down)", 503), (
                "unavailable"
            )
        try:
            body = await read_body(request, service.options.max_body_bytes)
            hl = request.headers.get(HEADER_LENGTH)
            header_length: int | None = None
            if hl is not None:
                try:
                    header_length = int(hl)
                except ValueError:
                    raise ProtocolError(f"{HEADER_LENGTH}: not an integer: {hl!r}") from None
            if len(body) > OFFLOAD_BYTES:
                req = await asyncio.to_thread(parse_infer_request, body, header_length, sig)
            else:
                req = parse_infer_request(body, header_length, sig)
            priority, deadline_in_s = request_class(req, request.headers)
        except ProtocolError as exc:
            outcome = {413: "too_large"}.get(exc.status, "bad_request")
            return _error(str(exc), exc.status), outcome
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
        data, headers = await asyncio.to_thread(encode) if big else encode()
        return Response(data, headers=headers), "success"

    routes = [
        Route(wire.HEALTH_LIVE_PATH, live, methods=["GET"]),
        Route(wire.HEALTH_READY_PATH, ready, methods=["GET"]),
        Route(wire.SERVER_METADATA_PATH, server_metadata, methods=["GET"]),
        Route(wire.REPOSITORY_INDEX_PATH, repository_index, methods=["POST", "GET"]),
        Route(wire.MODEL_STATS_PATH, all_stats, methods=["GET"]),
    ]
    for m in wire.MODEL_ROUTES:
        routes += [
            Route(m, model_metadata, methods=["GET"]),
            Route(m + "/ready", model_ready, methods=["GET"]),
            Route(m + "/config", model_config, methods=["GET"]),
            Route(m + "/stats", model_stats, methods=["GET"]),
            Route(m + "/infer", infer, methods=["POST"]),
        ]
    routes += [
        Route(wire.LOAD_PATH, load, methods=["GET"]),
        Route(wire.METRICS_PATH, prometheus, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    return Starlette(routes=routes, lifespan=lifespan)
