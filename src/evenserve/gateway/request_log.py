"""The gateway's request log: each HTTP inference request answered as one record
(``record_answer``), and its endpoints (``/admin/log``: the recent window as a replayable
trace; ``/admin/record``: the log's counters). 404 when recording is off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from evenserve.core import wire
from evenserve.core.requestlog import Recorder, parse_log_query
from evenserve.gateway.answers import Answer
from evenserve.httpio.server import Request, Response, json_bytes, json_response

Endpoint = Callable[[Request], Awaitable[Response]]


class HasRecorder(Protocol):
    recorder: Recorder | None


def _error(status: int, message: str) -> Response:
    return json_response(json.dumps({"error": message}).encode(), status)


def record_answer(
    rec: Recorder, t_s: float, unix_s: float, model: str, h: Mapping[str, str], a: Answer
) -> None:
    rec.add(
        t_s,
        unix_s,
        model,
        h.get(wire.PRIORITY_HEADER),
        h.get(wire.DEADLINE_HEADER),
        a.backend,
        a.status,
        a.header(wire.QUEUE_MS_HEADER),
        a.header(wire.COMPUTE_MS_HEADER),
    )


class RequestLogAPI:
    """The endpoints over ``host``'s recorder (read at each request)."""

    def __init__(self, host: HasRecorder) -> None:
        self.host = host

    def routes(self, guard: Callable[[Endpoint], Endpoint]) -> Mapping[tuple[str, str], Endpoint]:
        return {
            ("GET", "/admin/log"): guard(self.log_view),
            ("GET", "/admin/record"): guard(self.record_view),
        }

    async def log_view(self, request: Request) -> Response:
        """The request log's recent window as JSONL (a trace: ``t_s`` from the first record
        returned; query ``since_unix_s``, ``since_seq``, ``limit``)."""
        if self.host.recorder is None:
            return _error(404, "recording is off (no --record and no gateway.record)")
        try:
            q = parse_log_query(request.query)
        except ValueError as exc:
            return _error(400, str(exc))
        body, origin, last = await asyncio.to_thread(self.host.recorder.lines, q)
        headers = {"content-type": "application/x-ndjson", wire.LOG_LAST_SEQ_HEADER: str(last)}
        if origin is not None:
            headers[wire.LOG_ORIGIN_HEADER] = repr(round(origin, 6))
        return Response(200, body, headers)

    async def record_view(self, request: Request) -> Response:
        """The request log's counters (records, dropped, in the window, the file's size)."""
        if self.host.recorder is None:
            return _error(404, "recording is off (no --record and no gateway.record)")
        return json_response(json_bytes(self.host.recorder.status()))
