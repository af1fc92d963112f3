"""A tiny KServe v2 backend for gateway tests: echo inference, a controllable load endpoint.

Not a mock of the gateway's collaborators: a real HTTP server on 127.0.0.1 (uvicorn on a
pre-bound socket, in the test's event loop) that the gateway talks to over TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH
from evenserve.httpio.server import HttpServer, Limits
from evenserve.httpio.serving import App


@dataclass
class FakeBackend:
    name: str
    models: list[str]
    delay_s: float = 0.0
    ready: bool = True
    reported_queue: int | None = None  # None: report the real number of waiting requests
    #: The queue bound reported for every model (None: unbounded, none reported).
    reported_bound: int | None = None
    infer_status: int | None = None  # answer every infer with this status (e.g. 503, 429)
    metrics_text: str | None = None
    received: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    #: When set, every inference waits for this event before answering (a test releases it).
    gate: asyncio.Event | None = None
    #: Its repository index, model -> state (None: no index, 404, as a server without the
    #: repository extension). A test changes it (and ``models``) to load or unload a model.
    index: dict[str, str] | None = None
    index_requests: int = 0
    #: Model control (``/v2/repository/models/{m}/load|unload``): how long a load takes, a
    #: status to answer every load with instead (e.g. 400), and every call in order
    #: (``"load m"``, ``"unload m"``). A load or unload flips ``index`` and ``models``.
    load_delay_s: float = 0.0
    load_status: int | None = None
    #: What a load's reply says it came from (the worker's: host, its warm pool, or disk).
    load_source: str = "disk"
    control_log: list[str] = field(default_factory=list)
    seen_headers: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v2/health/live", self._live),
                Route("/v2/health/ready", self._ready),
                Route("/v2/models/{model}", self._meta),
                Route("/v2/models/{model}/infer", self._infer, methods=["POST"]),
                Route(LOAD_PATH, self._load),
                Route("/v2/repository/index", self._index, methods=["GET", "POST"]),
                Route("/v2/repository/models/{model}/{action}", self._control, methods=["POST"]),
                Route("/metrics", self._metrics),
            ]
        )

    async def _live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.ready else 503)

    async def _meta(self, request: Request) -> Response:
        m = request.path_params["model"]
        if m not in self.models:
            return JSONResponse({"error": f"unknown model {m}"}, status_code=404)
        return JSONResponse(
            {
                "name": m,
                "versions": ["1"],
                "platform": "fake",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
            }
        )

    async def _infer(self, request: Request) -> Response:
        m = request.path_params["model"]
        self.received += 1
        self.seen_headers.append(dict(request.headers))
        if self.infer_status is not None:
            return JSONResponse(
                {"error": f"fake {self.name} says {self.infer_status}"},
                status_code=self.infer_status,
                headers={"retry-after": "2"} if self.infer_status == 429 else None,
            )
        if m not in self.models:
            return JSONResponse({"error": f"unknown model {m}"}, status_code=404)
        body = await request.body()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.in_flight -= 1
        if request.headers.get("inference-header-content-length") is not None:
            # Binary extension: echo the bytes back with the same header split.
            return Response(
                body,
                headers={
                    "inference-header-content-length": request.headers[
                        "inference-header-content-length"
                    ],
                    "content-type": "application/octet-stream",
                },
            )
        try:
            req = json.loads(body)
            inputs = req["inputs"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return JSONResponse({"error": "bad inference request"}, status_code=400)
        outputs = [{**i, "name": "OUTPUT0"} for i in inputs]
        return JSONResponse(
            {"model_name": m, "model_version": "1", "outputs": outputs, "served_by": self.name}
        )

    async def _index(self, request: Request) -> Response:
        if self.index is None:
            return JSONResponse({"error": "no repository extension"}, status_code=404)
        self.index_requests += 1
        return JSONResponse(
            [{"name": m, "version": "1", "state": s, "reason": ""} for m, s in self.index.items()]
        )

    async def _control(self, request: Request) -> Response:
        m, action = request.path_params["model"], request.path_params["action"]
        self.control_log.append(f"{action} {m}")
        if self.index is None:
            self.index = dict.fromkeys(self.models, "READY")
        if action == "load":
            if self.load_status is not None:
                return JSONResponse({"error": "fake refuses"}, status_code=self.load_status)
            self.index[m] = "LOADING"
            await asyncio.sleep(self.load_delay_s)
            self.index[m] = "READY"
            if m not in self.models:
                self.models.append(m)
            return JSONResponse({"load_source": self.load_source, "load_seconds": 0.0})
        elif action == "unload":
            self.index.pop(m, None)
            if m in self.models:
                self.models.remove(m)
        else:
            return JSONResponse({"error": f"no action {action}"}, status_code=404)
        return JSONResponse({})

    async def _load(self, request: Request) -> Response:
        q = self.in_flight if self.reported_queue is None else self.reported_queue
        rep = LoadReport(
            timestamp_s=time.time(),
            device="fake",
            queue_depth=q,
            in_flight=0,
            queued_by_model={m: q for m in self.models},
            max_queue_by_model={}
            if self.reported_bound is None
            else {m: self.reported_bound for m in self.models},
            utilization=0.1,
            utilization_window_s=1.0,
            memory_used_bytes=1e9,
            memory_total_bytes=24e9,
            ready=self.ready,
        )
        return Response(rep.model_dump_json(), media_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        if self.metrics_text is None:
            return Response(status_code=404)
        return PlainTextResponse(self.metrics_text)


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.set_inheritable(True)
    return sock


class Served:
    """An ASGI app running on a loopback port inside the current event loop."""

    def __init__(self, app: object, sock: socket.socket | None = None, **config: Any) -> None:
        self.sock = sock or bound_socket()
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", **config)  # type: ignore[arg-type]
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await self._task
        self.sock.close()


class ServedApp:
    """One of our ``httpio.serving.App``s (a Gateway) on a loopback port in this event loop."""

    def __init__(self, app: App, limits: Limits | None = None) -> None:
        self.app = app
        self.server = HttpServer(
            app, limits, getattr(app, "refused", None), getattr(app, "fast", None)
        )
        self.url = ""

    async def start(self) -> None:
        await self.app.startup()
        await self.server.start("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.port}"

    async def stop(self) -> None:
        await self.server.stop(5.0)
        await self.app.shutdown()


@contextlib.asynccontextmanager
async def serving(app: object, **config: Any) -> AsyncIterator[Served | ServedApp]:
    """``app`` on a loopback port: an ASGI app under uvicorn (``config``: more
    ``uvicorn.Config`` settings), or one of ours (an ``httpio.serving.App``) on our server."""
    s: Served | ServedApp
    if hasattr(app, "startup") and hasattr(app, "begin_drain"):
        s = ServedApp(cast(App, app), getattr(app, "limits", None))
    else:
        s = Served(app, **config)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()
