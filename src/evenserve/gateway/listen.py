"""The gateway process's listener: its socket bound before it starts, then served until a
signal (open requests answered first)."""

from __future__ import annotations

import socket

from evenserve.gateway.server import Gateway
from evenserve.httpio.serving import Serving


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (SO_REUSEADDR; SO_REUSEPORT with ``reuse_port``),
    for ``serve``: bound before the gateway starts, so a port that cannot be had is an error
    at once (OSError, OverflowError for a port outside 0..65535)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def serve(
    gateway: Gateway,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Run the gateway until SIGINT/SIGTERM (open requests are answered first), on uvloop;
    on ``sock`` (``listening_socket``) when given, else on ``host:port``."""
    cfg = gateway.cfg
    Serving(
        gateway,
        host or gateway.host,
        port or cfg.port,
        sock=sock,
        limits=gateway.limits,
        drain_timeout_s=10,
        reuse_port=cfg.reuse_port,
    ).run()
