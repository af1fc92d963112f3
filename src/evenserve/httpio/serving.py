"""A server process's life: start the application, serve, on SIGTERM/SIGINT stop gracefully.

The order of a graceful stop: the application is told first (``begin_drain``: the worker turns
not-ready and refuses new inference with 503, so a gateway routes elsewhere), then the server
stops listening and answers every request it has read (``HttpServer.stop``), then the
application shuts down (``shutdown``: the worker's queues are drained and its runtimes
stopped). A second signal exits at once. :class:`Serving` runs in the foreground (``run``)
or on a thread (``start_thread``, for tests and in-process clusters) on uvloop when it is
installed.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import threading
from typing import Protocol

from evenserve.httpio.server import HttpServer, Limits, Request, Response, raise_descriptor_limit


class App(Protocol):
    async def __call__(self, request: Request) -> Response: ...

    async def startup(self) -> None: ...

    def begin_drain(self) -> None: ...

    async def shutdown(self) -> None: ...


#: The cyclic garbage collector's first threshold for a serving process (CPython: 700).
GC_THRESHOLD = 50_000


def tune_gc() -> None:
    """Move what startup allocated (modules, config, models) out of the collector's sight and
    collect young objects less often: every request allocates a few dozen objects (a task, a
    future, requests and answers), and at the default threshold the collector runs every few
    requests. Measured on the gateway at 1,000 req/s: CPU per request -8 % (design 0007)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Serving:
    def __init__(
        self,
        app: App,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        limits: Limits | None = None,
        drain_timeout_s: float = 10.0,
        reuse_port: bool = False,
    ) -> None:
        self.app = app
        #: Listen with SO_REUSEPORT (``HttpServer.start``).
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.sock = sock
        self.limits = limits
        self.drain_timeout_s = drain_timeout_s
        self.started = threading.Event()
        self.server: HttpServer | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    async def serve(self, handle_signals: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        raise_descriptor_limit()
        await self.app.startup()
        tune_gc()
        try:
            app = self.app
            self.server = HttpServer(
                app, self.limits, getattr(app, "refused", None), getattr(app, "fast", None)
            )
            await self.server.start(
                self.host, self.port, sock=self.sock, reuse_port=self.reuse_port
            )
            self.port = self.server.port
            if handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self._on_signal)
            self.started.set()
            await self._stop.wait()
            self.app.begin_drain()
            await self.server.stop(self.drain_timeout_s)
        finally:
            await self.app.shutdown()

    def _on_signal(self) -> None:
        assert self._stop is not None
        if self._stop.is_set():
            os._exit(1)  # a second signal: exit at once
        self._stop.set()

    def request_stop(self) -> None:
        """Begin the graceful stop (from any thread)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def run(self) -> None:
        """Serve in the foreground until SIGTERM/SIGINT, then stop gracefully."""
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(self.serve(handle_signals=True))

    # -- on a thread ----------------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(self.serve())
        except BaseException as exc:  # surfaced by start_thread / stop_thread
            self._error = exc
            self.started.set()

    def start_thread(self, timeout_s: float = 60.0, name: str = "evenserve-http") -> None:
        self._thread = threading.Thread(target=self._thread_main, daemon=True, name=name)
        self._thread.start()
        if not self.started.wait(timeout_s):
            raise TimeoutError(f"server did not start within {timeout_s} s")
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error

    def stop_thread(self, timeout_s: float = 60.0) -> None:
        if self._thread is None:
            return
        self.request_stop()
        self._thread.join(timeout_s)
        self._thread = None
