"""The gateway's OpenAI front in front of fake OpenAI backends on loopback: a streamed chat
completion relayed event by event before the backend's stream ends, the backend's stream
closed when the client goes away, a failure mid-stream as an SSE error event, a 503 before
the stream retried on the next backend, the 400/404 error shapes, ``/v1/models``, and the
requests counted in the gateway's metrics.

The fake backend is the project's own HTTP server (its streamed answers close their producer
when the gateway's connection goes away) with the KServe v2 endpoints the gateway's poller
reads. Events are released by the test (asyncio events), never by time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from evenserve.cluster.file import parse_cluster
from evenserve.core.load import LoadReport
from evenserve.core.wire import HEALTH_LIVE_PATH, HEALTH_READY_PATH, LOAD_PATH
from evenserve.gateway.server import Gateway
from evenserve.httpio.server import HttpServer, Request, Response, StreamResponse
from tests.integration.fake_v2 import serving


@dataclass
class FakeOpenAI:
    """An OpenAI backend: ``/v1/chat/completions`` streams ``events`` (event k once
    ``gates[k]`` is set, then ``[DONE]`` once the last gate is; ``fail_after``: the stream
    breaks before that event),
    ``/v1/completions`` answers whole (``status``: answer every request with it instead).
    Its stream's producer records how it ended."""

    name: str
    models: list[str]
    events: int = 3
    fail_after: int | None = None
    status: int | None = None
    gates: list[asyncio.Event] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    server: HttpServer | None = None

    def __post_init__(self) -> None:
        self.gates = [asyncio.Event() for _ in range(self.events + 1)]

    async def __call__(self, req: Request) -> Response:
        if req.path in (HEALTH_LIVE_PATH, HEALTH_READY_PATH):
            return Response(200)
        if req.path == LOAD_PATH:
            rep = LoadReport(
                timestamp_s=time.time(), device="fake", queue_depth=0, in_flight=0,
                queued_by_model=dict.fromkeys(self.models, 0), max_queue_by_model={},
                utilization=0.1, utilization_window_s=1.0, memory_used_bytes=1e9,
                memory_total_bytes=24e9, ready=True,
            )  # fmt: skip
            return Response(
                200, rep.model_dump_json().encode(), {"content-type": "application/json"}
            )
        if not req.path.startswith("/v1/"):
            return Response(404, b'{"error":"no such path"}', {"content-type": "application/json"})
        body = orjson.loads(req.body)
        self.received.append(body)
        self.seen_headers.append(req.headers)
        if self.status is not None:
            err = {"error": {"message": f"{self.name} says {self.status}", "type": "x"}}
            return Response(self.status, orjson.dumps(err), {"content-type": "application/json"})
        if req.path == "/v1/chat/completions" and body.get("stream"):
            return StreamResponse(200, {"content-type": "text/event-stream"}, self._events())
        answer = {"id": "cmpl-1", "object": "text_completion", "served_by": self.name}
        return Response(200, orjson.dumps(answer), {"content-type": "application/json"})

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            for k in range(self.events):
                await self.gates[k].wait()
                if self.fail_after == k:
                    raise RuntimeError("the fake engine broke")
                yield b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % k
            await self.gates[self.events].wait()
            yield b"data: [DONE]\n\n"
            self.ended.append("done")
        except (GeneratorExit, asyncio.CancelledError):
            self.ended.append("closed")
            raise
        except RuntimeError:
            self.ended.append("failed")
            raise


@contextlib.asynccontextmanager
async def backends(*fakes: FakeOpenAI) -> AsyncIterator[list[str]]:
    urls = []
    async with contextlib.AsyncExitStack() as stack:
        for fb in fakes:
            srv = HttpServer(fb)
            await srv.start("127.0.0.1", 0)
            stack.push_async_callback(srv.stop, 1.0)
            fb.server = srv
            urls.append(f"http://127.0.0.1:{srv.port}")
        yield urls


@contextlib.asynccontextmanager
async def gateway(*fakes: FakeOpenAI) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    async with backends(*fakes) as urls:
        raw = {
            "gateway": {
                "routing": "round-robin",
                "admin": {"token": "test-token-123456"},
                "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
                "health": {"interval_ms": 50, "timeout_ms": 10_000},
            },
            "backends": [
                {"name": fb.name, "url": u, "models": fb.models}
                for fb, u in zip(fakes, urls, strict=True)
            ],
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        async with (
            serving(g) as served,
            httpx.AsyncClient(base_url=served.url, timeout=60) as client,
        ):
            yield g, client


CHAT = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def counted(g: Gateway, outcome: str, model: str = "llm") -> float:
    """The gateway's request count for ``model`` with ``outcome``, all backends."""
    text = g.metrics.render().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("evenserve_gateway_requests_total{")
            and f'model="{model}"' in line
            and f'outcome="{outcome}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def next_event(it: AsyncIterator[bytes], got: bytearray) -> bytes:
    """Read until one more complete event (ending in a blank line) is in ``got``."""
    while True:
        end = got.find(b"\n\n")
        if end >= 0:
            event = bytes(got[: end + 2])
            del got[: end + 2]
            return event
        got.extend(await asyncio.wait_for(anext(it), 30))  # a hang guard only


async def test_a_stream_is_relayed_event_by_event_before_the_backend_ends_it() -> None:
    fb = FakeOpenAI("a", ["llm"])
    async with gateway(fb) as (g, client):
        headers = {"x-evenserve-priority": "batch"}
        async with client.stream("POST", "/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-evenserve-backend"] == "a"
            it, got = r.aiter_raw(), bytearray()
            for k in range(fb.events):
                fb.gates[k].set()  # event k is made only now; the stream is not over
                assert await next_event(it, got) == (
                    b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % k
                )
                assert fb.ended == []
            fb.gates[-1].set()
            assert await next_event(it, got) == b"data: [DONE]\n\n"
        assert fb.ended == ["done"]
        assert fb.received == [CHAT]
        assert fb.seen_headers[0]["x-evenserve-priority"] == "batch"
        assert counted(g, "ok") == 1
        assert g.registry.router.view("a").in_flight == 0


async def test_a_client_that_goes_away_closes_the_backends_stream() -> None:
    fb = FakeOpenAI("a", ["llm"])
    async with gateway(fb) as (g, client):
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            fb.gates[0].set()
            await next_event(r.aiter_raw(), bytearray())
        # The client closed its connection with the stream still open at the backend.
        deadline = asyncio.get_running_loop().time() + 30
        while not fb.ended:
            assert asyncio.get_running_loop().time() < deadline, "the backend's stream stayed open"
            await asyncio.sleep(0.01)
        assert fb.ended == ["closed"]
        while g.registry.router.view("a").in_flight:
            await asyncio.sleep(0.01)
        assert counted(g, "ok") == 1


async def test_a_failure_mid_stream_becomes_an_sse_error_event() -> None:
    fb = FakeOpenAI("a", ["llm"], fail_after=1)
    async with gateway(fb) as (g, client):
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            it, got = r.aiter_raw(), bytearray()
            fb.gates[0].set()
            assert (await next_event(it, got)).startswith(b'data: {"choices"')
            fb.gates[1].set()  # the backend's stream breaks now
            event = await next_event(it, got)
            rest = b"".join([bytes(got)] + [c async for c in it])
        assert event.startswith(b"data: ") and rest == b""
        err = json.loads(event[len(b"data: ") :])["error"]
        assert err["type"] == "server_error" and err["code"] == "backend_error"
        assert "backend a failed mid-stream" in err["message"]
        assert counted(g, "backend_error") == 1


async def test_a_503_before_the_stream_goes_to_the_next_backend() -> None:
    busy = FakeOpenAI("a", ["llm"], status=503)
    fine = FakeOpenAI("b", ["llm"])
    async with gateway(busy, fine) as (g, client):
        for _ in range(2):  # round robin: each backend first once
            r = await client.post("/v1/completions", json={"model": "llm", "prompt": "hi"})
            assert r.status_code == 200 and r.json()["served_by"] == "b"
            assert r.headers["x-evenserve-backend"] == "b"
        assert len(busy.received) >= 1 and len(fine.received) == 2
        # No backend left that takes it: the last refusal, relayed as it came.
        fine.status = 503
        r = await client.post("/v1/completions", json={"model": "llm", "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["message"].endswith("says 503")
        assert counted(g, "ok") == 2 and counted(g, "backend_error") == 1


async def test_error_shapes_and_the_model_list() -> None:
    fb = FakeOpenAI("a", ["llm", "other"])
    async with gateway(fb) as (g, client):
        r = await client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
        assert r.status_code == 404
        assert r.json() == {
            "error": {
                "message": "The model 'nope' does not exist",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        }
        assert counted(g, "unknown_model", "_unknown") == 1
        for body in (b"not json", b"[1]", b'{"messages": []}', b'{"model": 3}'):
            r = await client.post("/v1/completions", content=body)
            assert r.status_code == 400, body
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["code"] is None
            assert set(err) == {"message", "type", "param", "code"}
        assert r.json()["error"]["param"] == "model"
        r = await client.get("/v1/models")
        assert r.status_code == 200
        listed = r.json()
        assert listed["object"] == "list"
        assert [m["id"] for m in listed["data"]] == ["llm", "other"]
        assert all(m["object"] == "model" and m["owned_by"] == "evenserve" for m in listed["data"])
        assert all(isinstance(m["created"], int) for m in listed["data"])
        assert (await client.get("/v1/completions")).status_code == 405
