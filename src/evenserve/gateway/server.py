"""The gateway process: KServe v2 HTTP API in front, routing policy in the middle, backends behind.

Paths are the worker's (KServe v2): health, server metadata, model metadata/ready/config/stats
and ``POST /v2/models/{m}[/versions/{v}]/infer``. Inference requests go through the
Dispatcher (routing policy, retry, 429/503); metadata requests (and any request naming a
model version, which only the backends know) go to any healthy host; a model's statistics
are summed over every healthy host of the model (``gateway.stats``), and
``/v2/models/stats`` gives every model's so (perf_analyzer reads it for its server-side
figures). Model control (``POST /v2/repository/models/{m}/load|unload``) answers 501 naming
the workers that host the model: the gateway loads nothing (its gRPC front answers
UNIMPLEMENTED, with the same words).
The OpenAI-compatible routes (``/v1/completions``, ``/v1/chat/completions``, streamed answers
relayed as they come, ``/v1/models``) are ``gateway.openai_front``'s; those of LLM models
are routed by the LLM router (``gateway.llm_router``, ``gateway.llm_routing``).
``/metrics`` is the gateway's Prometheus text; ``/admin/...`` needs the bearer token. HEAD is
answered as GET, without the body.
With a request log (``--record`` or ``gateway.record``: ``core.requestlog``) every HTTP
inference request answered is one record; ``GET /admin/log`` serves the recent window as a
replayable trace and ``GET /admin/record`` the log's counters.
The HTTP server is ``httpio.server`` (asyncio protocol + httptools; design note 0007); a
:class:`Gateway` is its handler: one dict lookup or ``core.wire.split_model_path`` per request.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from evenserve import __version__
from evenserve.cluster.backend_spec import BackendSpec
from evenserve.cluster.file import LoadedCluster
from evenserve.core import wire
from evenserve.core.clock import Clock, RealClock
from evenserve.core.errors import ProfileError
from evenserve.core.profile import LatencyProfile, load_profile_set
from evenserve.core.requestlog import Recorder, RecordSettings
from evenserve.gateway.admin import AdminAPI
from evenserve.gateway.answers import Answer
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.gateway.llm_router import LlmGateway
from evenserve.gateway.openai_front import OpenAIFront
from evenserve.gateway.params_api import GatewayParams
from evenserve.gateway.placement import PlacementDriver
from evenserve.gateway.placement_api import PlacementAPI
from evenserve.gateway.placement_catalogue import DeviceSetup, cluster_setup
from evenserve.gateway.poller import Poller
from evenserve.gateway.request_log import RequestLogAPI, record_answer
from evenserve.gateway.stats import collect_all_stats, collect_model_stats
from evenserve.httpio.server import Limits, Request, Response, json_bytes, json_response
from evenserve.metrics.gateway import BackendFigures, GatewayMetrics
from evenserve.policy.placement import ModelInfo
from evenserve.policy.routing import ROUTING

log = logging.getLogger("evenserve.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str) -> Response:
    return json_response(json.dumps({"error": message}).encode(), status)


def _json(obj: object) -> Response:
    return json_response(json_bytes(obj))


#: How many inference paths the fast path remembers split (``Gateway._infer_route``).
INFER_ROUTES = 4096
#: ``/v2/repository/models/{m}/load`` and ``.../unload`` (the model repository extension).
REPOSITORY_MODELS_PREFIX = "/v2/repository/models/"


def _model_control(path: str) -> tuple[str, str] | None:
    """(model, "load" | "unload") for a model-control path, else None."""
    if not path.startswith(REPOSITORY_MODELS_PREFIX):
        return None
    model, _, action = path[len(REPOSITORY_MODELS_PREFIX) :].partition("/")
    if action not in ("load", "unload") or not wire.is_safe_name(model):
        return None
    return model, action


class Gateway:
    """Everything one gateway owns; an instance is the HTTP handler (``httpio.serving.App``)."""

    def __init__(
        self,
        cluster: LoadedCluster,
        *,
        clock: Clock | None = None,
        admin_token: str | None = None,
        host: str | None = None,
        placement_models: Mapping[str, ModelInfo] | None = None,
        placement_devices: Sequence[DeviceSetup] | None = None,
        record: RecordSettings | None = None,
    ) -> None:
        self.cluster = cluster
        cfg = cluster.config.gateway
        self.cfg = cfg
        #: The listen address of both fronts (the CLI's ``--host``, else ``gateway.host``).
        self.host = host or cfg.host
        self.clock = clock or RealClock()
        policy = ROUTING.build(cfg.routing, random.Random(cfg.seed), where="gateway.routing")
        self.registry = BackendRegistry.build(
            cluster.backends(),
            policy,
            self.clock,
            window=cfg.signals.window,
            stale_after_s=cfg.signals.stale_after_ms / 1000.0,
            profiles=self._profiles,
            replicas=cfg.replicas,
            peer_weight=cfg.peer_weight,
        )
        self.metrics = GatewayMetrics(self._figures, self.registry.hosted)
        self.registry.on_eject = self._count_ejection
        # The CLI resolves the token (and says where a generated one was written); a caller
        # that gives none gets the configured one or a random one it can read here.
        self.admin_token = admin_token or cluster.resolve_admin_token().value
        self.admin = AdminAPI(self.registry, self.clock, self.admin_token, cfg.seed, cfg.routing)
        #: ``/admin/params``: versioned routing here, batching and class headroom pushed to
        #: the backends (``gateway.params_api``).
        self.params = GatewayParams(self.registry, self.admin, self.admin_token)
        self.dispatcher = Dispatcher(self.registry, cfg, self.clock, self.metrics)
        #: Whether inference goes by the dispatcher's fast path (``Dispatcher.fast``; read
        #: once per request, so a property's call is not made per request).
        self._fast_forward = self.dispatcher.fast
        #: ``Dispatcher.infer_fast``, looked up once.
        self._infer_fast = self.dispatcher.infer_fast
        #: The LLM router of OpenAI requests of LLM models (``gateway.llm_router``).
        self.llm = LlmGateway(cfg, self.clock, self.registry.is_healthy)
        self.metrics.registry.register(self.llm.collector())
        self.poller = Poller(self.registry, cfg, self.clock, llm=self.llm)
        #: The request log (``record``, else ``gateway.record``; None: off).
        self.recorder: Recorder | None = None
        settings_rec = record if record is not None else cluster.record_settings()
        if settings_rec is not None:
            self.recorder = Recorder(settings_rec, self.clock)
            rec = self.recorder
            self.metrics.count_record_drops(lambda: rec.dropped)
        self.limits = Limits(max_body_bytes=int(cfg.forward.max_body_mb * 1024 * 1024))
        #: The placement driver (``gateway.placement``; None: off). ``placement_models`` and
        #: ``placement_devices`` replace the catalogue and devices read from the file (tests).
        self.placement: PlacementDriver | None = None
        #: Whether startup runs the placement tick loop (tests drive ``tick`` themselves).
        self.placement_loop = True
        settings = cfg.placement_settings()
        if settings is not None:
            models, devices = cluster_setup(cluster, self.registry.profile_sets)
            self.placement = PlacementDriver.build(
                self.registry,
                self.clock,
                settings,
                cfg.autoscaling,
                placement_models if placement_models is not None else models,
                placement_devices if placement_devices is not None else devices,
                self._post,
            )
            self.dispatcher.placement = self.placement
            self.metrics.registry.register(self.placement.collector())
        self._exact: dict[tuple[str, str], Endpoint] = {
            ("GET", wire.HEALTH_LIVE_PATH): self.live,
            ("GET", wire.HEALTH_READY_PATH): self.server_ready,
            ("GET", wire.SERVER_METADATA_PATH): self.server_metadata,
            ("GET", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("POST", wire.REPOSITORY_INDEX_PATH): self.repository_index,
            ("GET", wire.METRICS_PATH): self.prometheus,
            **self.admin.routes(),
            **self.params.routes(),
            **PlacementAPI(self).routes(self.admin.guard),
            **RequestLogAPI(self).routes(self.admin.guard),
            **OpenAIFront(self.dispatcher, self.registry, self.llm).routes(),
        }
        self._paths = {p for _, p in self._exact}
        #: Inference routes split before (``_infer_route``).
        self._infer_routes: dict[str, tuple[str, str]] = {}
        #: The server's fast handler (``httpio.server.FastHandler``): without a request log,
        #: the dispatcher's fast path itself (``FastPath.serve``: routed there, one call per
        #: request less), else ``fast_recorded``.
        self.fast: Callable[[Request, Callable[[Response], None]], bool] = self.fast_recorded
        if self.recorder is None and self._fast_forward:
            self.dispatcher.fast_path.routes(self._infer_routes, self._infer_route)
            self.fast = self.dispatcher.fast_path.serve
        #: The gRPC server (``grpc_front``) once started, when ``gateway.grpc_port`` is set.
        self.grpc: Any = None

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
            loaded = load_profile_set(where)
        except ProfileError as exc:
            log.warning("backend %s: %s", spec.name, exc)
            return {}
        return {m: p.at_speed(spec.profile_speed) for m, p in loaded.items()}

    def _count_ejection(self, name: str, reason: str) -> None:
        self.metrics.ejections.labels(name, reason.split(" ")[0]).inc()
        log.warning("backend %s ejected: %s", name, reason)

    def _figures(self) -> Iterator[BackendFigures]:
        now = self.clock.now()
        router = self.registry.router
        for name, st in self.registry.states.items():
            v = router.view(name)
            yield name, st.healthy, router.signal_age_s(name, now), v.in_flight, v.queue_depth

    async def _post(self, name: str, path: str) -> tuple[int, bytes]:
        """POST ``path`` (model control) on backend ``name``: its status and body."""
        reply = await self.dispatcher.forwarder.request(
            "POST", self.registry.url(name), path, b"{}", {"content-type": "application/json"}
        )
        return reply.status, reply.body

    async def startup(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        await self.poller.probe_all()
        self.poller.start()
        if self.placement is not None and self.placement_loop:
            self.placement.start()
        if self.cfg.grpc_port is not None:
            from evenserve.gateway.grpc_front import GatewayGrpcServer  # the grpc extra

            self.grpc = GatewayGrpcServer(
                self.registry,
                self.dispatcher,
                self.host,
                self.cfg.grpc_port,
                self.cfg.grpc_server,
            )
            await self.grpc.start()

    def begin_drain(self) -> None:
        """Nothing to refuse: the listener closes and open requests are answered."""

    async def shutdown(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(5.0)
        if self.placement is not None:
            await self.placement.stop()
        await self.poller.stop()
        await self.dispatcher.aclose()
        if self.recorder is not None:
            self.recorder.stop()

    def ready(self) -> bool:
        """Some model is READY on a backend, and every such model has a routable backend (a
        model only loading somewhere does not make the gateway unready)."""
        models = self.registry.ready_models()
        return bool(models) and all(self.registry.router.candidates(m) for m in models)

    def refused(self, status: int, path: str) -> None:
        """The server answered an inference request itself (body or head over the limit,
        malformed HTTP): counted as the client's error."""
        found = wire.split_model_path(path)
        if found is None or found[2] != "infer":
            return
        self.metrics.observe_request(None, found.model, "client_error", None)

    def fast_recorded(self, request: Request, respond: Callable[[Response], None]) -> bool:
        """The server's fast path (``httpio.server.FastHandler``) with a request log (or
        without the pooled forwarder): inference is forwarded without a task, each answer
        recorded; everything else goes to ``__call__``."""
        if request.method != "POST" or not self._fast_forward:
            return False
        route = self._infer_routes.get(request.path) or self._infer_route(request.path)
        if route is None:
            return False
        model, path = route
        rec = self.recorder
        if rec is None:
            # An Answer is the server's Response: handed over as it is.
            self._infer_fast(model, path, request.body, request.headers, respond)
            return True
        t_s, unix_s, h = rec.clock.now(), time.time(), request.headers

        def answered(a: Answer) -> None:
            record_answer(rec, t_s, unix_s, model, h, a)
            respond(a)

        self.dispatcher.infer_fast(model, path, request.body, h, answered)
        return True

    def _infer_route(self, raw_path: str) -> tuple[str, str] | None:
        """An inference path as sent -> (model, the canonical path to forward), or None when
        it is no inference route. Remembered for up to ``INFER_ROUTES`` paths (a path splits
        the same way every time; clients send few)."""
        route = self._infer_routes.get(raw_path)
        if route is not None:
            return route
        if not raw_path.startswith(wire.MODELS_PREFIX) or not raw_path.endswith("/infer"):
            return None
        found = wire.split_model_path(raw_path)
        if found is None:
            return None
        route = (found.model, found.path())
        if len(self._infer_routes) < INFER_ROUTES:
            self._infer_routes[raw_path] = route
        return route

    # -- the handler --------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        path = request.path
        # HEAD is GET without the body (the server drops it).
        method = "GET" if request.method == "HEAD" else request.method
        if path == wire.MODEL_STATS_PATH:  # every model's (perf_analyzer asks for these)
            if method != "GET":
                return _error(405, f"{path} takes GET")
            return await self.all_stats()
        if path.startswith(wire.MODELS_PREFIX):
            found = wire.split_model_path(path)
            if found is None:
                return _error(404, f"no such path: {path[:200]!r}")
            model, _version, suffix = found
            if suffix == "infer":
                if method != "POST":
                    return _error(405, "infer takes POST")
                rec = self.recorder
                if rec is None:
                    ans = await self.dispatcher.infer(
                        model, found.path(), request.body, request.headers
                    )
                    return ans
                t_s, unix_s = rec.clock.now(), time.time()
                ans = await self.dispatcher.infer(
                    model, found.path(), request.body, request.headers
                )
                record_answer(rec, t_s, unix_s, model, request.headers, ans)
                return ans
            if method != "GET":
                return _error(405, f"{path[:200]!r} takes GET")
            if suffix == "ready" and found.version is None:
                return self.model_ready(model)
            if suffix == "stats":
                return await self.model_stats(model, found.path())
            # A version is the backends' to judge (the gateway does not know them).
            return await self.dispatcher.passthrough(model, "GET", found.path(), b"")
        endpoint = self._exact.get((method, path))
        if endpoint is not None:
            return await endpoint(request)
        control = _model_control(path)
        if control is not None:
            return _error(501, self.registry.model_control_refusal(*control))
        if path in self._paths:
            return _error(405, f"method {request.method} not allowed on {path}")
        return _error(404, f"no such path: {path[:200]!r}")

    async def model_stats(self, model: str, path: str) -> Response:
        """Triton's statistics for ``model`` summed over every healthy backend hosting it
        (``gateway.stats``); the backends that answered are named in x-evenserve-backend."""
        if not self.registry.hosts_model(model):
            return _error(404, f"unknown model {model!r}")
        merged, named = await collect_model_stats(
            self.registry, self.dispatcher.forwarder, model, path
        )
        if merged is None:
            return _error(503, f"no backend answered statistics for model {model!r}")
        body = orjson.dumps({"model_stats": [merged]})
        return json_response(body, 200, {wire.BACKEND_HEADER: ",".join(named)})

    async def all_stats(self) -> Response:
        """Every model's statistics (``model_stats``), each summed as ``model_stats`` sums."""
        entries, named = await collect_all_stats(self.registry, self.dispatcher.forwarder)
        if not entries and self.registry.models():
            return _error(503, "no backend answered statistics")
        body = orjson.dumps({"model_stats": entries})
        return json_response(body, 200, {wire.BACKEND_HEADER: ",".join(named)})

    def model_ready(self, model: str) -> Response:
        if not self.registry.hosts_model(model):
            return _error(404, f"unknown model {model!r}")
        ok = bool(self.registry.router.candidates(model))
        return Response(200 if ok else 503)

    async def live(self, request: Request) -> Response:
        return Response(200)

    async def server_ready(self, request: Request) -> Response:
        return Response(200 if self.ready() else 503)

    async def server_metadata(self, request: Request) -> Response:
        return _json(
            {
                "name": "evenserve-gateway",
                "version": __version__,
                "extensions": list(wire.GATEWAY_EXTENSIONS),
            }
        )

    async def repository_index(self, request: Request) -> Response:
        return _json(self.registry.repository_index())

    async def prometheus(self, request: Request) -> Response:
        return Response(200, self.metrics.render(), {"content-type": "text/plain; version=0.0.4"})
