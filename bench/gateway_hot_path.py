"""The gateway's request path in one process, without sockets: CPU per proxied request.

A request's bytes are fed to the gateway's HTTP server connection as if read from a socket;
the gateway parses it, routes it, and writes it to a pooled backend connection whose
transport is a stub; the stub's write is answered at once with a backend's answer fed to that
connection as if read; the gateway relays the answer to the client connection's stub
transport. Every piece of evenserve code on the request path runs (server parse, admission,
routing, the dispatcher's fast path, the HTTP client, the relay, the metrics); the kernel and
the event loop's polling do not. So the figure is the Python part of what the gateway spends
per request, free of the host's noise in the network stack, and the one to compare before
and after a change on the request path (a whole-process figure beside nginx is
``bench/vs_nginx.py``'s ``added`` scenario).

    .venv/bin/python bench/gateway_hot_path.py                       # queue-aware, 1 backend
    .venv/bin/python bench/gateway_hot_path.py --backends 4 --routing least-expected-work
    .venv/bin/python bench/gateway_hot_path.py --loop uvloop           # the gateway's loop

Prints process CPU microseconds per request: the least of ``--repeats`` rounds of
``--requests`` requests each (a busy host only ever adds time), after a warm-up.

Under ``valgrind --tool=callgrind`` (instructions, no timing noise): run it with two request
counts and divide the difference in instructions by the difference in requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from evenserve.httpio.client.connection import Connection as BackendConnection
from evenserve.httpio.server import HttpServer
from evenserve.httpio.server.connection import Connection

BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()
REQUEST = (
    b"POST /v2/models/zero/infer HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
) + BODY
ANSWER_BODY = (
    b'{"model_name":"zero","model_version":"1","outputs":'
    b'[{"name":"y","datatype":"FP32","shape":[1,2],"data":[0.0,0.0]}]}'
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 09:00:00 GMT\r\n"
    b"content-type: application/json\r\nx-evenserve-queue-ms: 0.010\r\n"
    b"x-evenserve-compute-ms: 0.001\r\ncontent-length: %d\r\n\r\n" % len(ANSWER_BODY)
) + ANSWER_BODY


class StubTransport(asyncio.Transport):
    """A transport whose writes go to ``on_write``."""

    def __init__(self, on_write: Any) -> None:
        super().__init__()
        self.on_write = on_write

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.on_write(data)

    def writelines(self, parts: Any) -> None:
        self.on_write(b"".join(parts))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def measure(requests: int, repeats: int, backends: int, routing: str) -> float:
    """Least CPU seconds per request over ``repeats`` rounds."""
    loop = asyncio.get_running_loop()
    raw = {
        "gateway": {
            "routing": routing,
            # No probe runs here (the gateway is not started): signals never go stale.
            "signals": {"interval_ms": 1e6, "stale_after_ms": 1e8},
            "health": {"interval_ms": 1e6},
        },
        "backends": [
            {"name": f"b{i}", "url": f"http://127.0.0.1:{9000 + i}", "models": ["zero"]}
            for i in range(backends)
        ],
    }
    gw = Gateway(parse_cluster(raw, Path(".")))
    for i in range(backends):
        gw.registry.admit(f"b{i}")
    server = HttpServer(gw, gw.limits, gw.refused, gw.fast)
    server._loop = loop
    forwarder = gw.dispatcher.forwarder
    to_answer: list[Any] = []
    for i in range(backends):
        c = forwarder.client(f"http://127.0.0.1:{9000 + i}")  # type: ignore[attr-defined]
        c._loop = loop
        conn = BackendConnection(c.keep, loop)
        conn.connection_made(StubTransport(lambda _data, conn=conn: to_answer.append(conn)))
        c._all.add(conn)
        c._idle.append(conn)
        conn.idle_since = loop.time() + 1e9  # never retired as idle here
    for c in forwarder._clients.values():  # type: ignore[attr-defined]
        # Nor after its first use: a backend a policy leaves alone for seconds (slow under
        # a profiler) would otherwise be retired and its next try would try to connect.
        c.max_idle_s = float("inf")
    answered = [0]

    def client_write(_data: bytes) -> None:
        answered[0] += 1

    client_conn = Connection(server)
    client_conn.connection_made(StubTransport(client_write))

    def one() -> None:
        client_conn.data_received(REQUEST)
        while to_answer:
            to_answer.pop().data_received(ANSWER)

    for _ in range(500):
        one()
    best = float("inf")
    for _ in range(repeats):
        before = answered[0]
        t = time.process_time()
        for _ in range(requests):
            one()
        best = min(best, (time.process_time() - t) / requests)
        if answered[0] - before != requests:
            raise SystemExit(f"{answered[0] - before} of {requests} requests answered")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backends", type=int, default=1)
    ap.add_argument("--routing", default="queue-aware")
    ap.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop (the gateway runs on uvloop; asyncio's pure-Python loop.time() "
        "adds a few calls per request)",
    )
    args = ap.parse_args()
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        best = runner.run(measure(args.requests, args.repeats, args.backends, args.routing))
    print(
        f"{args.routing}, {args.backends} backend(s), {args.loop} loop: {best * 1e6:.2f} us CPU "
        "per request (gateway request path, no sockets)"
    )


if __name__ == "__main__":
    main()
