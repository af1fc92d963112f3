"""Signal and readiness polling: keeps the Router's view of every backend fresh and honest.

Theory of operation. One loop per probe period (all backends that share it probe in the same
tick, each probe in flight on its own, a task or the load probe's callback, so that a slow
backend delays no other).
- ``evenserve`` backends (our workers): every ``signals.interval_ms`` (100 ms) GET the load
  endpoint (core.wire.LOAD_PATH). A 200 with ``ready: true`` is fed to ``Router.observe`` as a
  LoadSample stamped with the gateway's receive time (two processes' clocks are not comparable)
  and readmits the backend if it was ejected; ``ready: false`` (a draining worker) ejects it.
- ``prometheus`` backends (Triton, MLServer, ...): every signals period GET the metrics URL and
  map it through the configured mapping (prometheus_signals); readiness comes from a separate
  GET ``/v2/health/ready`` every ``health.interval_ms``.
- ``none`` backends: readiness only; the router routes them on its own in-flight counts.
- ``kind: openai`` backends (vLLM, SGLang, TGI, trtllm-serve, or evenserve workers read as
  foreign): every ``health.interval_ms`` GET ``/v1/models``: its answer is both readiness
  (a 200 with a model list admits, another status ejects) and the backend's models (all
  READY; the LLM router's engines, ``gateway.llm_router``); with ``signals.source: llm``,
  every signals period GET its ``/metrics`` and read it through its engine's LLM mapping
  (``prometheus_signals.llm_samples_from_text``; ``engine: auto``: told by the names, once
  found): each model's sample goes to the LLM router, their sums (waiting, running) to the
  classic router as a LoadSample. Metrics are advisory: a failure only lets them go stale.
- evenserve workers' load reports carry their LLM engines (``llm_by_model``): fed to the
  LLM router with the time the report was read.
- Ejection needs the backend's own evidence: a not-ready answer or a bad load report ejects
  at once (with the reason), and so does a refused connection; the next successful probe
  readmits it. A probe without an answer in time is a miss, judged by ``probe_misses`` (the
  gateway's own lag never ejects a healthy backend, nor does a miss while it answers
  requests, nor do misses of every backend at once).
- Every backend, whatever its source: every ``health.interval_ms`` read its repository index
  (``repository_index``: what the gateway learns from it, advisory, never health).
- The signal period's tick also calls ``Router.expire``: a backend whose newest sample is
  older than ``signals.stale_after_ms`` has unknown signals (never "idle").
Probes use one persistent keep-alive connection per backend (``httpio.client.HttpClient``)
apart from the data plane; the load probe goes by callback on it, without a task
(``send_load``). An idle backend (nothing queued, running or in flight from this gateway)
is polled every ``signals.idle_interval_ms`` instead of every tick (``load_due``), and an
index probe that is not due starts no task: an idle gateway with 4 backends takes under
1 % of a core (``bench/vs_nginx.py``'s ``idle`` scenario).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from urllib.parse import urlsplit

import orjson
from pydantic import ValidationError

from evenserve.cluster.gateway_section import GatewaySection
from evenserve.core.clock import Clock
from evenserve.core.load import LoadReport
from evenserve.core.types import LoadSample
from evenserve.core.wire import HEALTH_READY_PATH, LOAD_PATH, METRICS_PATH, REPOSITORY_INDEX_PATH
from evenserve.gateway.backends import READY, BackendRegistry, BackendState
from evenserve.gateway.llm_router import LlmGateway
from evenserve.gateway.probe_misses import MissJudge
from evenserve.gateway.prometheus_signals import (
    LLM_MAPPINGS,
    PrometheusParseError,
    detect_engine,
    llm_samples_from_text,
    sample_from_text,
)
from evenserve.gateway.repository_index import BadIndex, index_due, parse_index
from evenserve.httpio.client import HttpClient, HttpClientError, Reply

log = logging.getLogger("evenserve.gateway.poller")
Probe = Callable[[], Awaitable[None]]
#: GET a URL within a time limit (seconds); raises ``httpio.client`` errors.
Fetch = Callable[[str, float], Awaitable[Reply]]
#: An OpenAI server's model list (``kind: openai``).
OPENAI_MODELS_PATH = "/v1/models"
#: The body the index probe posts: every model, whatever its state (``{"ready": true}``
#: would hide the LOADING ones).
INDEX_BODY = b"{}"


class _Sent:
    """A load probe sent by callback (``Poller.send_load``): done once its answer, or its
    failure, has been judged."""

    __slots__ = ("finished",)

    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


#: A probe in progress, as ``Poller._tick`` holds it.
_Running = _Sent | asyncio.Task[None]
#: A probe not sent at a tick (not due).
_DONE = _Sent()
_DONE.finished = True


@functools.cache
def _split(url: str) -> tuple[str, str]:
    """``http://host:port/p?q`` -> (``http://host:port``, ``/p?q``)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{parts.netloc}", path


class Poller:
    def __init__(
        self,
        registry: BackendRegistry,
        cfg: GatewaySection,
        clock: Clock,
        fetch: Fetch | None = None,
        index: Fetch | None = None,
        llm: LlmGateway | None = None,
    ) -> None:
        self.registry = registry
        #: The LLM router (engines from load reports, ``/v1/models`` and ``/metrics``).
        self.llm = llm
        #: Per ``kind: openai`` backend with ``engine: auto``: the family its text named.
        self._engines: dict[str, str] = {}
        self.cfg = cfg
        self.clock = clock
        self.fetch: Fetch = fetch or self._http_get
        #: POST a repository index URL (``index``; default: over HTTP when ``fetch`` is the
        #: default too, else ``fetch``, a test's, asked with GET).
        self.index: Fetch = index or (self._http_index if fetch is None else self.fetch)
        self._clients: dict[str, HttpClient] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: set[asyncio.Task[None]] = set()
        #: Whether a probe without an answer ejects its backend (``probe_misses``).
        self.judge = MissJudge(registry, cfg.health.misses)
        #: Backends without models configured whose index answered 404/405 (warned once).
        self._no_index: set[str] = set()
        #: Per load URL, its GET's head (``send_load``).
        self._load_heads: dict[str, bytes] = {}

    def _client(self, url: str) -> HttpClient:
        c = self._clients.get(url)
        if c is None:
            # Two connections: a prometheus backend's metrics and readiness probes may overlap.
            c = self._clients[url] = HttpClient(url, 1.0, max_connections=2)
        return c

    async def _http_get(self, url: str, timeout_s: float) -> Reply:
        origin, path = _split(url)
        return await self._client(origin).request("GET", path, timeout_s=timeout_s)

    async def _http_index(self, url: str, timeout_s: float) -> Reply:
        origin, path = _split(url)
        return await self._client(origin).request(
            "POST", path, INDEX_BODY, {"content-type": "application/json"}, timeout_s=timeout_s
        )

    async def _get(self, st: BackendState, url: str, timeout_ms: float) -> Reply | None:
        """GET ``url``; None after a failure has been judged (ejected, or a miss counted)."""
        sent_s = self.clock.now()
        try:
            reply = await self.fetch(url, timeout_ms / 1000.0)
        except HttpClientError as exc:
            self.judge.failed(st, exc, sent_s)
            return None
        st.misses = 0
        return reply

    # -- one probe of each kind (also used directly by tests) -------------------------------
    async def probe_load(self, st: BackendState) -> None:
        url = st.spec.signals.url or st.spec.url + LOAD_PATH
        resp = await self._get(st, url, self.cfg.signals.timeout_ms)
        if resp is not None:
            self._load_answered(st, resp)

    def send_load(self, st: BackendState) -> _Sent | None:
        """``probe_load`` without a task or a coroutine, over an idle kept connection (the
        HTTP client's callback path): what an idle gateway spends most of its time on. None
        (nothing sent) when the probes are not over HTTP (a test's ``fetch``) or no idle
        connection is ready: then ``probe_load`` runs as a task."""
        if self.fetch != self._http_get:
            return None
        url = st.spec.signals.url or st.spec.url + LOAD_PATH
        origin, path = _split(url)
        client = self._client(origin)
        head = self._load_heads.get(url)
        if head is None:
            head = self._load_heads[url] = client.head("GET", path, {}, 0)
        sent = _Sent()
        callback = partial(self._load_back, st, sent, self.clock.now())
        if not client.send_cb(head, b"", callback, self.cfg.signals.timeout_ms / 1000.0):
            return None
        return sent

    def _load_back(
        self,
        st: BackendState,
        sent: _Sent,
        sent_s: float,
        reply: Reply | None,
        exc: BaseException | None,
    ) -> None:
        sent.finished = True
        try:
            if reply is None:
                if not isinstance(exc, HttpClientError):
                    raise RuntimeError("load probe failed") from exc
                self.judge.failed(st, exc, sent_s)
                return
            st.misses = 0
            self._load_answered(st, reply)
        except Exception:  # a bug in one probe must not stop polling
            log.exception("probe failed")

    def _load_answered(self, st: BackendState, resp: Reply) -> None:
        name = st.spec.name
        if resp.status != 200:
            self.registry.eject(name, f"load endpoint answered {resp.status}")
            return
        try:
            report = LoadReport.model_validate_json(resp.body)
        except ValidationError as exc:
            self.registry.eject(name, f"bad load report: {exc.errors()[0]['msg']}")
            return
        if not report.ready:
            self.registry.eject(name, "not-ready")
            return
        st.models_version = report.models_version
        st.device, st.device_kind = report.device, report.device_kind
        st.device_slice = report.device_slice
        st.engine_utilization = report.engine_utilization
        now = self.clock.now()
        self.registry.router.observe(name, report.to_sample(now))
        llm = self.llm
        if llm is not None and (report.llm_by_model or name in llm.by_backend):
            llm.observe_report(name, report.llm_by_model, now)
        self.registry.admit(name)

    async def probe_metrics(self, st: BackendState) -> None:
        name = st.spec.name
        sig = st.spec.signals
        assert sig.mapping is not None
        url = sig.url or st.spec.url + METRICS_PATH
        try:
            # Metrics are advisory here: readiness decides health; signals just go stale.
            resp = await self.fetch(url, self.cfg.signals.timeout_ms / 1000.0)
            if resp.status != 200:
                raise PrometheusParseError(f"metrics endpoint answered {resp.status}")
            text = resp.body.decode("utf-8", errors="replace")
            sample = sample_from_text(text, sig.mapping, self.clock.now())
        except (HttpClientError, PrometheusParseError) as exc:
            self.registry.states[name].last_error = f"metrics: {type(exc).__name__} {exc}"
            return
        if sample is not None:
            self.registry.router.observe(name, sample)

    async def probe_openai_models(self, st: BackendState) -> None:
        """A ``kind: openai`` backend's readiness and models: ``GET /v1/models``."""
        name = st.spec.name
        resp = await self._get(st, st.spec.url + OPENAI_MODELS_PATH, self.cfg.health.timeout_ms)
        if resp is None:
            return
        if resp.status != 200:
            self.registry.eject(name, f"not-ready ({OPENAI_MODELS_PATH} answered {resp.status})")
            return
        models = openai_models(resp.body)
        if models is None:
            self.registry.eject(name, f"bad model list: {OPENAI_MODELS_PATH} is no OpenAI list")
            return
        if st.spec.models is not None:  # the configured ones stand for those it lists too
            models = sorted(set(models) | set(st.spec.models))
        self.registry.set_index(name, dict.fromkeys(models, READY))
        if self.llm is not None:
            self.llm.set_openai_models(name, models, st.spec.kv_tokens)
        self.registry.admit(name)

    async def probe_llm_metrics(self, st: BackendState) -> None:
        """A ``kind: openai`` backend's ``/metrics``, read through its engine's LLM mapping."""
        name = st.spec.name
        url = st.spec.signals.url or st.spec.url + METRICS_PATH
        taken = self.clock.now()
        try:
            resp = await self.fetch(url, self.cfg.signals.timeout_ms / 1000.0)
            if resp.status != 200:
                raise PrometheusParseError(f"metrics endpoint answered {resp.status}")
            text = resp.body.decode("utf-8", errors="replace")
            engine = st.spec.engine if st.spec.engine != "auto" else self._engines.get(name)
            if engine is None:
                engine = detect_engine(text)
                if engine is None:
                    raise PrometheusParseError(
                        "no LLM server's metrics (vllm, sglang, tgi, trtllm)"
                    )
                self._engines[name] = engine
            samples = llm_samples_from_text(text, LLM_MAPPINGS[engine], taken)
        except (HttpClientError, PrometheusParseError) as exc:
            self.registry.states[name].last_error = f"metrics: {type(exc).__name__} {exc}"
            return
        if not samples:
            self.registry.states[name].last_error = f"metrics: no {engine} waiting metric"
            return
        now = self.clock.now()
        if self.llm is not None:
            for model, sample in samples.items():
                self.llm.observe(name, model, sample, now)
        by_model = {m: float(s.waiting) for m, s in samples.items() if m is not None}
        self.registry.router.observe(
            name,
            LoadSample(
                timestamp_s=now,
                queue_depth=float(sum(s.waiting for s in samples.values())),
                in_flight=float(sum(s.running for s in samples.values())),
                queued_by_model=by_model,
            ),
        )

    async def probe_ready(self, st: BackendState) -> None:
        name = st.spec.name
        resp = await self._get(st, st.spec.url + HEALTH_READY_PATH, self.cfg.health.timeout_ms)
        if resp is None:
            return
        if resp.status == 200:
            self.registry.admit(name)
        else:
            self.registry.eject(name, f"not-ready ({resp.status})")

    async def probe_index(self, st: BackendState) -> None:
        """Learn the backend's models from its repository index (never judges health). A
        backend whose load reports carry a models version is read again only when it moved
        since the last read, or ``INDEX_REFRESH_S`` after it (a backend without one: every
        time)."""
        name = st.spec.name
        version = st.models_version
        now = self.clock.now()
        if not index_due(st, now):
            return
        epoch = self.registry.index_epochs.get(name, 0)
        st.index_started += 1
        started = st.index_started
        try:
            resp = await self.index(
                st.spec.url + REPOSITORY_INDEX_PATH, self.cfg.health.timeout_ms / 1000.0
            )
        except HttpClientError as exc:
            st.last_error = f"index: {type(exc).__name__} {exc}"
            return
        if resp.status in (404, 405):  # no model repository extension: the configured set
            if not st.learned and not st.index and name not in self._no_index:
                self._no_index.add(name)  # said once: it hosts nothing the gateway can learn
                log.warning(
                    "backend %s: no models configured and its repository index answered %d; "
                    "it gets no requests (list its models in the config)",
                    name,
                    resp.status,
                )
            return
        try:
            if resp.status != 200:
                raise BadIndex(f"answered {resp.status}")
            index = parse_index(resp.body)
        except BadIndex as exc:
            st.last_error = f"index: {exc}"
            return
        if started < st.index_applied:
            return  # a read started after this one was applied first: this one is older
        st.index_applied = started
        if self.registry.index_epochs.get(name, 0) != epoch:
            return  # the gateway changed it meanwhile (placement): this read is stale
        st.index_version, st.index_read_s = version, now
        self.registry.set_index(name, index)
        if self.registry.on_index_read is not None:
            self.registry.on_index_read(name)

    def load_due(self, st: BackendState, now_s: float) -> bool:
        """Whether ``st``'s load is to be probed at this tick: always, unless it is idle as
        far as the gateway can tell (healthy, its last report without queued, running or busy
        work, nothing of this gateway's in flight there) and no other gateway sends there
        (``gateway.replicas`` is 1: the others' sends are seen only in reports), in which
        case once every
        ``signals.idle_interval_ms`` (kept under half of ``stale_after_ms``, so an idle
        backend's signals never go stale between probes). A send there makes it due at the
        next tick again."""
        sig = self.cfg.signals
        router = self.registry.router
        if st.healthy and router.replicas == 1:
            v = router.view(st.spec.name)
            if v.in_flight == 0 and v.queue_depth <= 0.0 and v.busy_remaining_s <= 0.0:
                idle_s = min(sig.idle_interval_ms, sig.stale_after_ms / 2.0) / 1000.0
                if now_s - st.load_sent_s < idle_s:
                    return False
        st.load_sent_s = now_s
        return True

    def _probes(self, st: BackendState) -> list[tuple[float, Probe]]:
        """A backend's probes with their periods (seconds), by its signal source; every
        backend's index is read on the health period."""
        own_s = (st.spec.signals.interval_ms or self.cfg.signals.interval_ms) / 1000.0
        health_s = self.cfg.health.interval_ms / 1000.0
        src = st.spec.signals.source
        if st.spec.kind == "openai":
            ps: list[tuple[float, Probe]] = [(health_s, partial(self.probe_openai_models, st))]
            if src == "llm":
                ps.append((own_s, partial(self.probe_llm_metrics, st)))
            return ps
        index = (health_s, partial(self.probe_index, st))
        if src == "evenserve":
            return [(own_s, partial(self.probe_load, st)), index]
        probes: list[tuple[float, Probe]] = [(health_s, partial(self.probe_ready, st)), index]
        if src == "prometheus":
            probes.append((own_s, partial(self.probe_metrics, st)))
        return probes

    async def probe_all(self) -> None:
        """One round of every probe, concurrently (used once at startup)."""
        states = self.registry.states.values()
        await asyncio.gather(*(probe() for st in states for _, probe in self._probes(st)))

    # -- loops ------------------------------------------------------------------------------
    async def _guarded(self, probe: Probe) -> None:
        try:
            await probe()
        except Exception:  # a bug in one probe must not stop polling
            log.exception("probe failed")

    def _spawn(self, probe: Probe) -> asyncio.Task[None]:
        t = asyncio.get_running_loop().create_task(self._guarded(probe))
        self._probing.add(t)
        t.add_done_callback(self._probing.discard)
        return t

    def _starter(self, st: BackendState, probe: Probe) -> Callable[[], _Running]:
        """How ``_tick`` starts ``probe``: the load probe by callback where it can
        (``send_load``), every other one as a task."""
        func = getattr(probe, "func", None)
        if func == self.probe_load:

            def start_load() -> _Running:
                # The ticks' own time (the loop's), as the period is: an injected clock may
                # stand still (a test's).
                if not self.load_due(st, asyncio.get_running_loop().time()):
                    return _DONE
                return self.send_load(st) or self._spawn(probe)

            return start_load
        if func == self.probe_index:  # most ticks have nothing to read: no task for them
            return lambda: self._spawn(probe) if index_due(st, self.clock.now()) else _DONE
        return lambda: self._spawn(probe)

    async def _tick(
        self, period_s: float, probes: list[Callable[[], _Running]], expire: bool
    ) -> None:
        """Every ``period_s``: start each probe whose previous one has finished (a backend
        slow to answer delays no other's), and with ``expire`` age out stale signals. One
        wake-up per period for all the backends that share it, not one per backend. The
        first round is one period after the start: ``probe_all`` has just read everything
        (a second read at once would drop the router's count of what it sent since)."""
        loop = asyncio.get_running_loop()
        running: list[_Running | None] = [None] * len(probes)
        next_t = loop.time() + period_s
        await asyncio.sleep(period_s)
        while True:
            for i, start in enumerate(probes):
                t = running[i]
                if t is None or t.done():
                    running[i] = start()
            if expire:
                now = self.clock.now()
                self.registry.router.expire(now)
                if self.llm is not None:
                    self.llm.expire(now)
            next_t += period_s
            delay = next_t - loop.time()
            if delay < 0:  # fell behind (CPU starved): skip missed ticks, do not burst
                next_t = loop.time()
                delay = 0.0
            await asyncio.sleep(delay)

    def start(self) -> None:
        spawn = asyncio.get_running_loop().create_task
        by_period: dict[float, list[Callable[[], _Running]]] = {}
        for st in self.registry.states.values():
            for period_s, probe in self._probes(st):
                by_period.setdefault(period_s, []).append(self._starter(st, probe))
        signals_s = self.cfg.signals.interval_ms / 1000.0
        by_period.setdefault(signals_s, [])
        for period_s, probes in by_period.items():
            self._tasks.append(spawn(self._tick(period_s, probes, period_s == signals_s)))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._probing]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        self._probing.clear()
        for c in self._clients.values():
            c.close()
        self._clients.clear()


def openai_models(body: bytes) -> list[str] | None:
    """The model ids of an OpenAI ``/v1/models`` answer (None: not such a list)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    ids = [m.get("id") for m in data if isinstance(m, dict)]
    return sorted({i for i in ids if isinstance(i, str) and i})
