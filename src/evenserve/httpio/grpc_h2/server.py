"""The listener (``GrpcH2Server``), what it lets a connection ask (``Limits``), and a
client connection as an asyncio protocol (``H2Connection``: its settings sent, its preface
awaited, its calls cancelled when it goes, reading paused while it does not read)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from evenserve.httpio.grpc_h2.call import Handler
from evenserve.httpio.grpc_h2.frames import (
    DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM,
    NO_ERROR,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    frame_head,
)
from evenserve.httpio.grpc_h2.reading import Reading
from evenserve.httpio.grpc_h2.writing import Writing


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection may ask of the server (the package's docstring)."""

    max_message_bytes: int = 4 * 1024 * 1024
    max_header_list_bytes: int = 16 * 1024
    max_concurrent_streams: int = 256
    #: The MAX_FRAME_SIZE advertised (frames up to it are read).
    max_frame_bytes: int = 1 << 20
    #: The window given to each stream and to the connection.
    window_bytes: int = 16 * 1024 * 1024
    preface_timeout_s: float = 10.0
    max_connections: int = 4096

    @property
    def hard_header_list_bytes(self) -> int:
        """A header block over this (compressed or decoded) is a connection error."""
        return max(4 * self.max_header_list_bytes, 64 * 1024)


class H2Connection(Reading, asyncio.Protocol):
    """One client connection (the package's docstring)."""

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        if len(self.server.connections) > self.limits.max_connections:
            self.goaway(ENHANCE_YOUR_CALM, "too many connections")
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lim = self.limits
        settings = (
            (S_MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, lim.window_bytes),
            (S_MAX_FRAME_SIZE, lim.max_frame_bytes),
            (S_MAX_HEADER_LIST_SIZE, lim.max_header_list_bytes),
            (S_ENABLE_PUSH, 0),
        )
        payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in settings)
        self.out.append(frame_head(len(payload), SETTINGS, 0, 0) + payload)
        self.out.append(self.window_update(0, lim.window_bytes - DEFAULT_WINDOW))
        self.flush()
        self.preface_timer = self.loop.call_later(lim.preface_timeout_s, self.preface_late)

    def pause_writing(self) -> None:
        """The client does not read what we write: stop reading what it sends (PINGs and
        SETTINGS would otherwise queue answers without bound) until it does."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def preface_late(self) -> None:
        if self.preface and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self.preface_timer is not None:
            self.preface_timer.cancel()
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        self.blocked.clear()
        self.server.idle(self)


class GrpcH2Server:
    """The listener: an asyncio server of ``H2Connection``; ``handlers`` by path, and the
    paths answered UNIMPLEMENTED with their message as soon as their headers are read
    (``refused``: RPCs not served, streaming ones included); any other path is UNIMPLEMENTED
    too."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        limits: Limits,
        refused: Mapping[str, str] | None = None,
    ) -> None:
        self.handlers = dict(handlers)
        self.refused = dict(refused or {})
        self.limits = limits
        self.loop = asyncio.get_event_loop()
        self.connections: set[H2Connection] = set()
        self.server: asyncio.Server | None = None
        self.stopping: asyncio.Event | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); the port bound."""
        self.loop = asyncio.get_running_loop()
        self.server = await self.loop.create_server(
            lambda: H2Connection(self), host, port, reuse_address=True
        )
        return int(self.server.sockets[0].getsockname()[1])

    def idle(self, conn: Writing) -> None:
        """``conn`` has no call in flight: closed if the server is stopping."""
        if self.stopping is not None and not conn.calls and conn.transport is not None:
            conn.flush()  # the last answer, then the close
            conn.transport.close()
        if self.stopping is not None and not any(c.calls for c in self.connections):
            self.stopping.set()

    async def stop(self, grace_s: float) -> None:
        """Stop listening; GOAWAY to every connection; let the calls in flight finish for up
        to ``grace_s``, then close every connection."""
        if self.server is not None:
            self.server.close()
        self.stopping = asyncio.Event()
        for conn in list(self.connections):
            conn.goaway(NO_ERROR, "server stopping", close=not conn.calls)
        if any(c.calls for c in self.connections):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), grace_s)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self.server is not None:
            await self.server.wait_closed()
