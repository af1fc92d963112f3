"""Running a worker: the httpio server with graceful shutdown, in the foreground or on a thread.

Graceful shutdown (SIGTERM or Ctrl-C): the worker turns not-ready and refuses new inference
with 503; the driver switches to draining (every queue is dispatched as it stands, whatever
its policy would have waited for); the server closes the listening socket and answers the
open requests, which are now being served; then the runtimes are stopped
(``httpio.serving``). A second Ctrl-C exits at once.
"""

from __future__ import annotations

import socket

from evenserve.core.requestlog import Recorder
from evenserve.httpio.serving import Serving
from evenserve.worker.app import Worker, WorkerServing


def make_server(
    worker: Worker,
    sock: socket.socket,
    *,
    grpc_host: str = "127.0.0.1",
    grpc_port: int | None = None,
    recorder: Recorder | None = None,
) -> Serving:
    """The worker's server on a bound socket; ``run()`` serves until SIGTERM/SIGINT. With
    ``grpc_port`` (0: any free port) it also serves KServe v2 over gRPC (``grpc_api``), the
    HTTP front's sibling (``app.WorkerServing``); with
    ``recorder`` it writes the request log (``core.requestlog``)."""
    app = WorkerServing(worker, grpc_host=grpc_host, grpc_port=grpc_port, recorder=recorder)
    return Serving(
        app, sock=sock, limits=app.limits, drain_timeout_s=worker.options.drain_timeout_s + 5
    )


def grpc_port_of(server: Serving) -> int | None:
    """The port the worker's gRPC server listens on (None: no gRPC), once started."""
    app = server.app
    grpc = getattr(app, "grpc", None)
    return None if grpc is None else int(grpc.port)


class BackgroundWorker:
    """A worker serving on a thread (tests, notebooks, in-process clusters).

    ``start`` loads the models, binds 127.0.0.1 on a free port (or ``port``) and returns once
    the server accepts connections; ``stop`` drains gracefully and joins the thread. With
    ``grpc_port`` (0: a free port) it also serves gRPC; ``grpc_port`` is the bound port once
    started. With ``recorder`` it writes the request log (``core.requestlog``).
    """

    def __init__(
        self,
        worker: Worker,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        grpc_port: int | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.worker = worker
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._server = make_server(
            worker, self._sock, grpc_host=host, grpc_port=grpc_port, recorder=recorder
        )
        self.grpc_port: int | None = grpc_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> BackgroundWorker:
        self.worker.load()
        self._server.start_thread(timeout_s, name="evenserve-worker-http")
        self.grpc_port = grpc_port_of(self._server)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._server.stop_thread(timeout_s)
        self._sock.close()

    def __enter__(self) -> BackgroundWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
