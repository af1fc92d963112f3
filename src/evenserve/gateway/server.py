"""The gateway process: KServe v2 HTTP API in front, routing policy in the middle, backends behind.

Paths are the worker's (KServe v2): health, server metadata, model metadata/ready/config/stats
and ``POST /v2/models/{m}[/versions/{v}]/infer``. Inference requests go through the
Dispatcher (routing policy, retry, 429/503); metadata requests go to any healthy host.
``/metrics`` is the gateway's Prometheus text; ``/admin/...`` needs the bearer token.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evenserve import __version__
from evenserve.core import wire
from evenserve.core.clock import Clock, RealClock
from evenserve.core.errors import ProfileError
from evenserve.core.profile import LatencyProfile, load_profile_set
from evenserve.gateway.admin import AdminAPI
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.config import BackendSpec, LoadedCluster
from evenserve.gateway.dispatcher import Answer, Dispatcher
from evenserve.gateway.poller import Poller
from evenserve.metrics.gateway import BackendFigures, GatewayMetrics
from evenserve.policy.routing import ROUTING

log = logging.getLogger("evenserve.gateway")

MAX_BODY_BYTES = 256 * 1024 * 1024
#: A model's GET routes the gateway relays from a backend that hosts it (metadata, config,
#: statistics), after the model's route.
PASSED_ON = ("", "/config", "/stats")


def _answer(ans: Answer) -> Response:
    return Response(ans.body, status_code=ans.status, headers=ans.headers)


class Gateway:
    """Everything one gateway owns; ``app`` is the ASGI application."""

    def __init__(
        self,
        cluster: LoadedCluster,
        *,
        clock: Clock | None = None,
        admin_token: str | None = None,
    ) -> None:
        self.cluster = cluster
        cfg = cluster.config.gateway
        self.cfg = cfg
        self.clock = clock or RealClock()
        policy = ROUTING.build(cfg.routing, random.Random(cfg.seed), where="gateway.routing")
        self.registry = BackendRegistry.build(
            cluster.backends(),
            policy,
            self.clock,
            window=cfg.signals.window,
            stale_after_s=cfg.signals.stale_after_ms / 1000.0,
            profiles=self._profiles,
        )
        self.metrics = GatewayMetrics(self._figures)
        self.registry.on_eject = self._count_ejection
        token = admin_token or cluster.admin_token()
        self.token_generated = token is None
        self.admin_token = token or secrets.token_urlsafe(24)
        self.admin = AdminAPI(self.registry, self.clock, self.admin_token, cfg.seed, cfg.routing)
        self.dispatcher = Dispatcher(self.registry, cfg, self.clock, self.metrics)
        self.poller = Poller(self.registry, cfg, self.clock)
        self.app = Starlette(routes=self._routes(), lifespan=self._lifespan)

    # -- wiring -----------------------------------------------------------------------------
    def _profiles(self, spec: BackendSpec) -> dict[str, LatencyProfile]:
        if spec.profiles is None:
            return {}
        where = self.cluster.profile_dir(spec.profiles)
        if where is None:
            log.warning(
                "backend %s: profile set %r not found; no profiles", spec.name, spec.profiles
            )
            return {}
        try:
            return load_profile_set(where)
        except ProfileError as exc:
            log.warning("backend %s: %s", spec.name, exc)
            return {}

    def _count_ejection(self, name: str, reason: str) -> None:
        self.metrics.ejections.labels(name, reason.split(" ")[0]).inc()
        log.warning("backend %s ejected: %s", name, reason)

    def _figures(self) -> Iterator[BackendFigures]:
        now = self.clock.now()
        router = self.registry.router
        for name, st in self.registry.states.items():
            v = router.view(name)
            yield name, st.healthy, router.signal_age_s(name, now), v.in_flight, v.queue_depth

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.poller.probe_all()
        self.poller.start()
        try:
            yield
        finally:
            await self.poller.stop()
            await self.dispatcher.aclose()

    def ready(self) -> bool:
        """Every served model has at least one routable backend."""
        return all(self.registry.router.candidates(m) for m in self.registry.models())

    # -- endpoints --------------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        model = request.path_params["model"]
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > MAX_BODY_BYTES:
            return JSONResponse(
                {"error": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413
            )
        body = await request.body()
        return _answer(await self.dispatcher.infer(model, request.url.path, body, request.headers))

    async def model_passthrough(self, request: Request) -> Response:
        model = request.path_params["model"]
        body = await request.body()
        return _answer(
            await self.dispatcher.passthrough(model, request.method, request.url.path, body)
        )

    async def model_ready(self, request: Request) -> Response:
        model = request.path_params["model"]
        if not self.registry.hosts_model(model):
            return JSONResponse({"error": f"unknown model {model!r}"}, status_code=404)
        ok = bool(self.registry.router.candidates(model))
        return Response(status_code=200 if ok else 503)

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def server_ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.ready() else 503)

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(
            {
                "name": "evenserve-gateway",
                "version": __version__,
                "extensions": ["binary_tensor_data", "model_repository"],
            }
        )

    async def repository_index(self, request: Request) -> Response:
        router = self.registry.router
        return JSONResponse(
            [
                {"name": m, "state": "READY" if router.candidates(m) else "UNAVAILABLE"}
                for m in self.registry.models()
            ]
        )

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def _routes(self) -> list[Route]:
        routes = [
            Route(wire.HEALTH_LIVE_PATH, self.live, methods=["GET"]),
            Route(wire.HEALTH_READY_PATH, self.server_ready, methods=["GET"]),
            Route(wire.SERVER_METADATA_PATH, self.server_metadata, methods=["GET"]),
            Route(wire.REPOSITORY_INDEX_PATH, self.repository_index, methods=["POST", "GET"]),
            Route(wire.METRICS_PATH, self.prometheus, methods=["GET"]),
        ]
        for m in wire.MODEL_ROUTES:
            routes += [
                Route(m + "/infer", self.infer, methods=["POST"]),
                Route(m + "/ready", self.model_ready, methods=["GET"]),
                *(Route(m + s, self.model_passthrough, methods=["GET"]) for s in PASSED_ON),
            ]
        return routes + self.admin.routes()


def serve(gateway: Gateway, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway until SIGINT/SIGTERM (uvicorn drains in-flight requests first).

    uvicorn picks uvloop and httptools when they are installed (``loop``/``http`` auto).
    """
    cfg = gateway.cfg
    config = uvicorn.Config(
        gateway.app,
        host=host or cfg.host,
        port=port or cfg.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run()
