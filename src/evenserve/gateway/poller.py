"""Signal and readiness polling: keeps the Router's view of every backend fresh and honest.

Theory of operation. One asyncio task per backend, on its own period, plus one expiry task.
- ``evenserve`` backends (our workers): every ``signals.interval_ms`` (100 ms) GET the load
  endpoint (core.wire.LOAD_PATH). A 200 with ``ready: true`` is fed to ``Router.observe`` as a
  LoadSample stamped with the gateway's receive time (two processes' clocks are not comparable)
  and readmits the backend if it was ejected; ``ready: false`` (a draining worker) ejects it.
- ``prometheus`` backends (Triton, MLServer, ...): every signals period GET the metrics URL and
  map it through the configured mapping (prometheus_signals); readiness comes from a separate
  GET ``/v2/health/ready`` every ``health.interval_ms``.
- ``none`` backends: readiness only; the router routes them on its own in-flight counts.
- A probe that cannot connect or times out ejects the backend at once (with the reason); the
  next successful probe readmits it. So a dead worker leaves routing within one period plus
  the connect failure (refused connections fail in well under a millisecond on loopback), and
  a restarted one is back within one period of becoming ready.
- The expiry task calls ``Router.expire`` every half signal period: a backend whose newest
  sample is older than ``signals.stale_after_ms`` has unknown signals (never "idle").
Probes use their own small connection pool and short timeouts, apart from the data plane, so
a saturated data plane cannot starve health checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
from pydantic import ValidationError

from evenserve.core.clock import Clock
from evenserve.core.load import LoadReport
from evenserve.core.wire import HEALTH_READY_PATH, LOAD_PATH, METRICS_PATH
from evenserve.gateway.backends import BackendRegistry, BackendState
from evenserve.gateway.config import GatewaySection
from evenserve.gateway.prometheus_signals import PrometheusParseError, sample_from_text

log = logging.getLogger("evenserve.gateway.poller")
Probe = Callable[[], Awaitable[None]]


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connect-refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return "connection-lost"
    return type(exc).__name__


class Poller:
    def __init__(
        self,
        registry: BackendRegistry,
        cfg: GatewaySection,
        clock: Clock,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.registry = registry
        self.cfg = cfg
        self.clock = clock
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=4 * max(1, len(registry.states)) + 4),
            trust_env=False,
        )
        self._tasks: list[asyncio.Task[None]] = []

    # -- one probe of each kind (also used directly by tests) -------------------------------
    async def probe_load(self, st: BackendState) -> None:
        name = st.spec.name
        url = st.spec.signals.url or st.spec.url + LOAD_PATH
        try:
            resp = await self.client.get(url, timeout=self.cfg.signals.timeout_ms / 1000.0)
        except (httpx.HTTPError, OSError) as exc:
            self.registry.eject(name, describe_error(exc))
            return
        if resp.status_code != 200:
            self.registry.eject(name, f"load endpoint answered {resp.status_code}")
            return
        try:
            report = LoadReport.model_validate_json(resp.content)
        except ValidationError as exc:
            self.registry.eject(name, f"bad load report: {exc.errors()[0]['msg']}")
            return
        if not report.ready:
            self.registry.eject(name, "not-ready")
            return
        self.registry.router.observe(name, report.to_sample(self.clock.now()))
        self.registry.admit(name)

    async def probe_metrics(self, st: BackendState) -> None:
        name = st.spec.name
        sig = st.spec.signals
        assert sig.mapping is not None
        url = sig.url or st.spec.url + METRICS_PATH
        try:
            resp = await self.client.get(url, timeout=self.cfg.signals.timeout_ms / 1000.0)
            resp.raise_for_status()
            sample = sample_from_text(resp.text, sig.mapping, self.clock.now())
        except (httpx.HTTPError, OSError, PrometheusParseError) as exc:
            # Metrics are advisory here: readiness decides health; signals just go stale.
            self.registry.states[name].last_error = f"metrics: {describe_error(exc)}"
            return
        if sample is not None:
            self.registry.router.observe(name, sample)

    async def probe_ready(self, st: BackendState) -> None:
        name = st.spec.name
        try:
            resp = await self.client.get(
                st.spec.url + HEALTH_READY_PATH, timeout=self.cfg.health.timeout_ms / 1000.0
            )
        except (httpx.HTTPError, OSError) as exc:
            self.registry.eject(name, describe_error(exc))
            return
        if resp.status_code == 200:
            self.registry.admit(name)
        else:
            self.registry.eject(name, f"not-ready ({resp.status_code})")

    def _probes(self, st: BackendState) -> list[tuple[float, Probe]]:
        """A backend's probes with their periods (seconds), by its signal source."""
        own_s = (st.spec.signals.interval_ms or self.cfg.signals.interval_ms) / 1000.0
        src = st.spec.signals.source
        if src == "evenserve":
            return [(own_s, partial(self.probe_load, st))]
        health_s = self.cfg.health.interval_ms / 1000.0
        probes: list[tuple[float, Probe]] = [(health_s, partial(self.probe_ready, st))]
        if src == "prometheus":
            probes.append((own_s, partial(self.probe_metrics, st)))
        return probes

    async def probe_all(self) -> None:
        """One round of every probe, concurrently (used once at startup)."""
        states = self.registry.states.values()
        await asyncio.gather(*(probe() for st in states for _, probe in self._probes(st)))

    # -- loops ------------------------------------------------------------------------------
    async def _every(self, period_s: float, probe: Probe) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while True:
            try:
                await probe()
            except Exception:  # a bug in one probe must not stop polling
                log.exception("probe failed")
            next_t += period_s
            delay = next_t - loop.time()
            if delay < 0:  # fell behind (CPU starved): skip missed ticks, do not burst
                next_t = loop.time()
                delay = 0.0
            await asyncio.sleep(delay)

    async def _expire_loop(self, period_s: float) -> None:
        while True:
            self.registry.router.expire(self.clock.now())
            await asyncio.sleep(period_s)

    def start(self) -> None:
        spawn = asyncio.get_running_loop().create_task
        for st in self.registry.states.values():
            for period_s, probe in self._probes(st):
                self._tasks.append(spawn(self._every(period_s, probe)))
        self._tasks.append(spawn(self._expire_loop(self.cfg.signals.interval_ms / 1000.0 / 2)))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self._own_client:
            await self.client.aclose()
