"""What a client connection may send and how long it may take (``Limits``), and what a
connection sees of the server that accepted it (``Listener``, which ``HttpServer`` is)."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from evenserve.httpio.server.messages import FastHandler, Handler


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


class Listener(Protocol):
    """What a connection reads and counts of its server (``listener.HttpServer``)."""

    handler: Handler
    fast: FastHandler | None
    on_refusal: Callable[[int, str], None] | None
    limits: Limits
    max_connections: int
    connections: set[Any]
    refused_connections: int
    timed_out: int
    stopping: bool

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
