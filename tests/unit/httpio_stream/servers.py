"""Helpers for the streaming tests: a server whose streamed answers a test steps through,
and a plain asyncio server that writes an answer in parts, each when the test releases it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from evenserve.httpio.server import HttpServer, Limits, Request, Response, StreamResponse


async def until(cond: Callable[[], bool], cap_s: float = 30.0) -> None:
    """Wait for ``cond`` (polling the loop); the cap only guards against a hang."""
    loop = asyncio.get_running_loop()
    end = loop.time() + cap_s
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


@dataclass
class Producer:
    """A streamed answer's producer that yields ``pieces[k]`` once ``gates[k]`` is set, and
    records how it ended: "done", "closed" (GeneratorExit), "cancelled" or "failed"."""

    pieces: list[bytes]
    gated: bool = True
    fail_after: int | None = None
    gates: list[asyncio.Event] = field(default_factory=list)
    yielded: int = 0
    ended: str | None = None

    def __post_init__(self) -> None:
        self.gates = [asyncio.Event() for _ in self.pieces]

    def release(self, k: int | None = None) -> None:
        for i, g in enumerate(self.gates):
            if k is None or i == k:
                g.set()

    async def run(self) -> AsyncIterator[bytes]:
        try:
            for k, piece in enumerate(self.pieces):
                if self.fail_after is not None and k == self.fail_after:
                    raise RuntimeError("the producer broke")
                if self.gated:
                    await self.gates[k].wait()
                self.yielded += 1
                yield piece
            self.ended = "done"
        except GeneratorExit:
            self.ended = "closed"
            raise
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        except RuntimeError:
            self.ended = "failed"
            raise


class StreamApp:
    """A handler: ``/stream`` answers with the current producer's pieces, anything else
    with a small whole body naming the path. Every path handled is recorded."""

    def __init__(self) -> None:
        self.producer = Producer([b"one", b"two", b"three"])
        self.paths: list[str] = []

    async def __call__(self, req: Request) -> Response:
        self.paths.append(req.path)
        if req.path == "/stream":
            headers = {"content-type": "text/event-stream", "x-kind": "stream"}
            return StreamResponse(200, headers, self.producer.run())
        return Response(200, req.path.encode(), {"content-type": "text/plain"})


@contextlib.asynccontextmanager
async def stream_server(app: StreamApp, **limits: float) -> AsyncIterator[HttpServer]:
    srv = HttpServer(app, Limits(**limits))  # type: ignore[arg-type]
    await srv.start("127.0.0.1", 0)
    try:
        yield srv
    finally:
        await srv.stop(1.0)


@dataclass
class RawScript:
    """What the plain server writes for each connection: ``parts`` in order, part k once
    ``gates[k]`` is set (the first part is written at once), closing after the last when
    ``close``; ``requests`` counts the requests it read."""

    parts: list[bytes]
    close: bool = False
    gates: list[asyncio.Event] = field(default_factory=list)
    requests: int = 0
    lost: bool = False

    def __post_init__(self) -> None:
        self.gates = [asyncio.Event() for _ in self.parts]
        self.gates[0].set()


@contextlib.asynccontextmanager
async def raw_server(script: RawScript) -> AsyncIterator[int]:
    """A plain asyncio server on loopback that answers every request with ``script``."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    await r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                script.requests += 1
                for gate, part in zip(script.gates, script.parts, strict=True):
                    await gate.wait()
                    w.write(part)
                    await w.drain()
                if script.close:
                    return
        except ConnectionError:
            script.lost = True
        finally:
            w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
