"""Running a worker: uvicorn with graceful shutdown, in the foreground or on a thread.

Graceful shutdown (SIGTERM or Ctrl-C): the worker turns not-ready and refuses new inference
with 503; the driver switches to draining (every queue is dispatched as it stands, whatever
its policy would have waited for); uvicorn closes the listening socket and waits for the
open requests, which are now being served, then the lifespan stops the runtimes. A second
Ctrl-C exits at once (uvicorn's behaviour).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Generator
from types import FrameType

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from evenserve.worker.http_api import create_app
from evenserve.worker.service import WorkerService


class GracefulServer(uvicorn.Server):
    """uvicorn, plus: the first SIGTERM/SIGINT starts the worker's drain, and a completed
    graceful shutdown exits with status 0 (uvicorn would re-raise the signal afterwards)."""

    def __init__(self, config: uvicorn.Config, service: WorkerService) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.begin_drain_threadsafe()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def make_server(
    service: WorkerService, host: str, port: int, log_level: str = "info"
) -> GracefulServer:
    config = uvicorn.Config(
        create_app(service),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(service.options.drain_timeout_s) + 5,
        server_header=False,
    )
    return GracefulServer(config, service)


class BackgroundWorker:
    """A worker serving on a thread (tests, notebooks, in-process clusters).

    ``start`` loads the models, binds 127.0.0.1 on a free port (or ``port``) and returns once
    the server accepts connections; ``stop`` drains gracefully and joins the thread.
    """

    def __init__(
        self,
        service: WorkerService,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ) -> None:
        self.service = service
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._server = make_server(service, host, self.port, log_level)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> BackgroundWorker:
        self.service.load()
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            daemon=True,
            name="evenserve-worker-http",
        )
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not self._server.started and waited < timeout_s:
            if not self._thread.is_alive():
                raise RuntimeError("worker server thread exited during startup")
            deadline.wait(0.01)
            waited += 0.01
        if not self._server.started:
            raise TimeoutError(f"worker did not start within {timeout_s} s")
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        if self._thread is None:
            return
        self.service.begin_drain_threadsafe()
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()
        self._thread = None

    def __enter__(self) -> BackgroundWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
