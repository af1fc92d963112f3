"""``HttpServer``: the listening socket, its connections counted and their deadlines swept
(one sweep per server, no timer per request), the graceful stop; ``Limits``, and the
process's descriptor limit they are sized by."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass

from evenserve.httpio.server.connection import LINGER_S, Connection
from evenserve.httpio.server.messages import FastHandler, Handler, refresh_date


def _default_max_connections() -> int:
    """Client connections a process accepts: its descriptor limit less a reserve of 256 for
    its own outgoing connections, files and the listening sockets."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(16384, soft - 256))


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 128
    max_body_bytes: int = 256 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    #: How often connections are checked against their deadlines (at most half the
    #: shortest timeout).
    sweep_s: float = 0.5
    max_connections: int = 0  # 0: the descriptor limit less a reserve
    max_pipelined: int = 16

    def connections(self) -> int:
        return self.max_connections or _default_max_connections()


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as nginx's
    ``worker_rlimit_nofile`` does); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


class HttpServer:
    """Serves ``handler`` on a listening socket (see the package's docstring)."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits | None = None,
        on_refusal: Callable[[int, str], None] | None = None,
        fast: FastHandler | None = None,
    ) -> None:
        self.handler = handler
        #: Tried first for every request (see FastHandler).
        self.fast = fast
        #: Told of each request the server answered itself (status, path as far as read).
        self.on_refusal = on_refusal
        self.limits = limits or Limits()
        self.max_connections = self.limits.connections()
        self.connections: set[Connection] = set()
        self.refused_connections = 0
        self.timed_out = 0
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def handling(self) -> int:
        """Requests being handled now."""
        return sum(c.busy for c in self.connections)

    async def _sweep(self) -> None:
        lim = self.limits
        period = min(
            lim.sweep_s,
            lim.header_timeout_s / 2,
            lim.body_timeout_s / 2,
            lim.keepalive_timeout_s / 2,
            LINGER_S / 2,
        )
        loop = self.loop
        while True:
            await asyncio.sleep(period)
            refresh_date()
            now = loop.time()
            for c in [c for c in self.connections if c.deadline and c.deadline <= now]:
                c.timed_out()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() first"
        return self._loop

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        """Listen on ``sock``, else on ``host:port``; with ``reuse_port`` (SO_REUSEPORT)
        several processes listen on the same port and the kernel splits the connections
        among them (several gateways behind one address)."""
        self._loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await self._loop.create_server(
                lambda: Connection(self), sock=sock, backlog=4096
            )
        else:
            self._server = await self._loop.create_server(
                lambda: Connection(self),
                host,
                port,
                backlog=4096,
                reuse_address=True,
                reuse_port=reuse_port or None,
            )

        self._sweeper = self._loop.create_task(self._sweep())

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop listening, answer every request already read, then close (the package's
        docstring)."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            c.stopping = True
            if c.idle():
                c._close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.connections and loop.time() < deadline:
            for c in list(self.connections):
                if c.idle():
                    c._close()
            await asyncio.sleep(0.01)
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
            c._close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
