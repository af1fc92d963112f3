"""Signal and readiness polling: keeps the Router's view of every backend fresh and honest.

Theory of operation. One loop per probe period (all backends that share it probe in the same
tick, each probe a task of its own so that a slow backend delays no other).
- ``evenserve`` backends (our workers): every ``signals.interval_ms`` (100 ms) GET the load
  endpoint (core.wire.LOAD_PATH). A 200 with ``ready: true`` is fed to ``Router.observe`` as a
  LoadSample stamped with the gateway's receive time (two processes' clocks are not comparable)
  and readmits the backend if it was ejected; ``ready: false`` (a draining worker) ejects it.
- ``prometheus`` backends (Triton, MLServer, ...): every signals period GET the metrics URL and
  map it through the configured mapping (prometheus_signals); readiness comes from a separate
  GET ``/v2/health/ready`` every ``health.interval_ms``.
- ``none`` backends: readiness only; the router routes them on its own in-flight counts.
- Ejection needs the backend's own evidence. A refused connection, a not-ready answer or a
  bad load report ejects at once (with the reason); the next successful probe readmits it.
  So a dead worker leaves routing within one period plus the connect failure (refused
  connections fail in well under a millisecond on loopback), and a restarted one is back
  within one period of becoming ready. A probe without an answer in time (a timeout, a lost
  connection) is a *miss*: ``health.misses`` (2) in a row eject. A probe's time limit runs
  from when it was sent, and an answer that came in time but that a busy gateway read late
  still counts (``httpio.client``), so the gateway's own lag cannot eject a healthy backend.
  Nor is a backend ejected for a miss while it is answering requests: one that answered a
  forwarded request (any status) after the missed probe was sent is alive, only slow to
  probe (a worker busy decoding large bodies; counted in ``answering``). A backend that
  hangs answers nothing, and its next miss ejects it. And never all at once without
  evidence: a miss does not eject while every other healthy backend has missed too (that is
  the gateway starving, not every backend failing at once; a hung backend then still leaves
  routing through the data plane's request timeout).
- Every backend, whatever its source: every ``health.interval_ms`` POST its repository
  index (``/v2/repository/index``, body ``{}``: every model with its state, Triton's shape
  ``[{"name", "version", "state", "reason"}]``) and hand the states to
  ``BackendRegistry.set_index``: READY models are routable there, others are known but not
  (503, not 404; entries that say "not loaded" count as absent: 404). The index is
  advisory, never health: a backend that does not answer it
  (refused, timeout, a bad body) keeps its last known set and is not ejected for it; one
  without the extension (404/405) keeps its configured ``models``.
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

from pydantic import ValidationError

from evenserve.cluster.gateway_section import GatewaySection
from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.load import LoadReport
from evenserve.core.wire import HEALTH_READY_PATH, LOAD_PATH, METRICS_PATH, REPOSITORY_INDEX_PATH
from evenserve.gateway.backends import STATES, BackendRegistry, BackendState, best_state
from evenserve.gateway.prometheus_signals import PrometheusParseError, sample_from_text
from evenserve.httpio.client import ConnectFailed, HttpClient, HttpClientError, Reply

log = logging.getLogger("evenserve.gateway.poller")
Probe = Callable[[], Awaitable[None]]
#: GET a URL within a time limit (seconds); raises ``httpio.client`` errors.
Fetch = Callable[[str, float], Awaitable[Reply]]
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


class BadIndex(ValueError):
    """A repository index answer that is not a list of ``{name, state}`` objects."""


#: Reasons an UNAVAILABLE entry gives when the model is simply not loaded there (Triton's
#: ``unloaded``; an evenserve worker's ``not loaded`` and ``unloaded``): the backend does not
#: host it, so the gateway answers 404 for it as the backend itself does, not 503.
NOT_LOADED_REASONS = frozenset({"unloaded", "not loaded"})


def parse_index(body: bytes) -> dict[str, str]:
    """A repository index answer as model -> state (the best over its versions; a state
    Triton does not name counts as UNAVAILABLE; entries with an unroutable name are
    skipped, and so are models that are not loaded: no state at all, as Triton lists a
    folder never loaded, or UNAVAILABLE for a reason in ``NOT_LOADED_REASONS``). BadIndex
    for an answer that is not such a list."""
    try:
        doc = wire.parse_json(body, "index")
    except ValueError as exc:
        raise BadIndex(str(exc)) from None
    if not isinstance(doc, list):
        raise BadIndex(f"expected a list, got {type(doc).__name__}")
    found: dict[str, list[str]] = {}
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadIndex(f"entry {i}: expected an object with a name")
        name = entry["name"]
        if not wire.is_safe_name(name):
            continue
        state = entry.get("state")
        state = state.upper() if isinstance(state, str) else ""
        reason = entry.get("reason")
        if not state or (
            state == "UNAVAILABLE"
            and isinstance(reason, str)
            and reason.strip().lower() in NOT_LOADED_REASONS
        ):
            continue
        found.setdefault(name, []).append(state if state in STATES else "UNAVAILABLE")
    return {m: best_state(states) for m, states in found.items()}


#: How long a backend's index is trusted while its models version has not moved (a safety
#: net: any change the version did not show is seen within this).
INDEX_REFRESH_S = 10.0


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
    ) -> None:
        self.registry = registry
        self.cfg = cfg
        self.clock = clock
        self.fetch: Fetch = fetch or self._http_get
        #: POST a repository index URL (``index``; default: over HTTP when ``fetch`` is the
        #: default too, else ``fetch``, a test's, asked with GET).
        self.index: Fetch = index or (self._http_index if fetch is None else self.fetch)
        self._clients: dict[str, HttpClient] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: set[asyncio.Task[None]] = set()
        #: Misses not acted on because every other backend missed too (the gateway's lag).
        self.held = 0
        #: Misses not acted on because the backend answered a request after the probe went.
        self.answering = 0
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
            self._failed(st, exc, sent_s)
            return None
        st.misses = 0
        return reply

    def _failed(self, st: BackendState, exc: HttpClientError, sent_s: float) -> None:
        """A probe sent at ``sent_s`` got no answer: a refused connection ejects at once,
        anything else is a miss."""
        if isinstance(exc, ConnectFailed):
            if str(exc) == "connect-refused":
                self.registry.eject(st.spec.name, "connect-refused")
            else:
                self._missed(st, f"connect {exc}", sent_s)
            return
        self._missed(st, "timeout" if isinstance(exc, TimeoutError) else "connection-lost", sent_s)

    def _missed(self, st: BackendState, reason: str, sent_s: float) -> None:
        """A probe sent at ``sent_s`` got no answer in time (module docstring)."""
        st.misses += 1
        st.last_error = reason
        if st.misses < self.cfg.health.misses or not st.healthy:
            return
        if st.answered_s >= sent_s:  # it answered a request since: alive, slow to probe
            self.answering += 1
            if self.answering == 1 or self.answering % 100 == 0:
                log.warning(
                    "backend %s missed %d probes in a row but is answering requests: not "
                    "ejected (%d times)",
                    st.spec.name,
                    st.misses,
                    self.answering,
                )
            return
        others = [o for o in self.registry.states.values() if o is not st and o.healthy]
        if others and all(o.misses > 0 for o in others):
            self.held += 1
            if self.held == 1 or self.held % 100 == 0:
                log.warning(
                    "every backend missed its probe at once (%d times): the gateway is "
                    "starved, not every backend down; none ejected",
                    self.held,
                )
            return
        self.registry.eject(st.spec.name, f"{reason} ({st.misses} probes in a row)")

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
                self._failed(st, exc, sent_s)
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
        self.registry.router.observe(name, report.to_sample(self.clock.now()))
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
        if not self.index_due(st, now):
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

    @staticmethod
    def index_due(st: BackendState, now_s: float) -> bool:
        """Whether ``st``'s index is to be read (``probe_index``'s rule)."""
        version = st.models_version
        return not (
            version is not None
            and version == st.index_version
            and now_s - st.index_read_s < INDEX_REFRESH_S
        )

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
        index = (health_s, partial(self.probe_index, st))
        src = st.spec.signals.source
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
            return lambda: self._spawn(probe) if self.index_due(st, self.clock.now()) else _DONE
        return lambda: self._spawn(probe)

    async def _tick(
        self, period_s: float, probes: list[Callable[[], _Running]], expire: bool
    ) -> None:
        """Every ``period_s``: start each probe whose previous one has finished (a backend
        slow to answer delays no other's), and with ``expire`` age out stale signals. One
        wake-up per period for all the backends that share it, not one per backend."""
        loop = asyncio.get_running_loop()
        running: list[_Running | None] = [None] * len(probes)
        next_t = loop.time()
        while True:
            for i, start in enumerate(probes):
                t = running[i]
                if t is None or t.done():
                    running[i] = start()
            if expire:
                self.registry.router.expire(self.clock.now())
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
