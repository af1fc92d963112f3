"""Scrape every backend while the load runs: queue depth and busy time over time.

Two sources per backend, both timestamped on the generator's clock when the answer arrives:
- the load endpoint (``GET /v2/evenserve/load``) every ``interval_s`` (100 ms, the router's
  signal period): queue depth (requests waiting), in flight, and the worker's busy fraction;
- the Prometheus text (``GET /metrics``) every ``metrics_interval_s``: the cumulative
  ``evenserve_worker_device_busy_seconds_total``, from which utilization over any window is
  exact (busy seconds between two scrapes / seconds between them).

Each ``/metrics`` reading also keeps the diagnosis figures (design 0012) as a time series
(``metrics_t_s``, ``metrics``): per model the worker's cumulative held, expected and input
staging seconds, its compute-time and batch-size histograms' sums and counts, its batch cap;
per device the memory in use and its total and the instances. ``loadgen.records`` turns
their deltas over the measured window into the summary's per-device diagnosis fields.

A backend without our load endpoint (Triton, MLServer) still gets its ``/metrics`` scraped;
one without the busy counter gets its utilization from the load endpoint's busy fraction,
integrated over time (an approximation, flagged in the records).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from evenserve.core.wire import LOAD_PATH, METRICS_PATH

# The worker's series (``metrics.names``, spelled out: the load generator is read by the
# experiments, which do not import the metrics layer).
BUSY_COUNTER = "evenserve_worker_device_busy_seconds_total"
INSTANCES_GAUGE = "evenserve_worker_device_instances"
#: Per-model series of a diagnosis reading: the key each is kept under.
PER_MODEL_SERIES = {
    "evenserve_worker_batch_held_seconds_total": "held_s",
    "evenserve_worker_batch_expected_seconds_total": "expected_s",
    "evenserve_worker_compute_input_seconds_total": "input_s",
    "evenserve_worker_compute_time_seconds_sum": "compute_s",
    "evenserve_worker_compute_time_seconds_count": "computed",
    "evenserve_worker_batch_size_sum": "items",
    "evenserve_worker_batch_size_count": "batches",
    "evenserve_worker_batch_cap": "cap",
}
#: Per-device series of a diagnosis reading.
DEVICE_SERIES = {
    "evenserve_worker_device_memory_used_bytes": "memory_used_bytes",
    "evenserve_worker_device_memory_total_bytes": "memory_total_bytes",
    INSTANCES_GAUGE: "instances",
}
_MODEL_LABEL = re.compile(r'(?:^|[{,])model="((?:[^"\\]|\\.)*)"')


@dataclass
class BackendScrape:
    """What was seen of one backend; times are seconds from the run start."""

    name: str
    url: str
    queue_t_s: list[float] = field(default_factory=list)
    queue_depth: list[float] = field(default_factory=list)
    in_flight: list[float] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)
    busy_t_s: list[float] = field(default_factory=list)
    busy_total_s: list[float] = field(default_factory=list)
    #: Diagnosis readings of ``/metrics`` (``parse_diagnosis``) and when each arrived.
    metrics_t_s: list[float] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    errors: int = 0
    last_error: str = ""

    def busy_series(self) -> tuple[list[float], list[float]]:
        """Cumulative busy seconds over time: the counter, else the integrated busy fraction."""
        if len(self.busy_t_s) >= 2:
            return self.busy_t_s, self.busy_total_s
        if len(self.queue_t_s) < 2:
            return [], []
        t, acc, cum = self.queue_t_s, 0.0, [0.0]
        for i in range(1, len(t)):
            acc += self.utilization[i] * (t[i] - t[i - 1])
            cum.append(acc)
        return list(t), cum


def _sum_samples(text: str, metric: str) -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(metric):
            rest = line[len(metric) :]
            if rest and rest[0] not in " {":
                continue
            try:
                value = float(line.rsplit(" ", 1)[-1])
            except ValueError:
                continue
            total = value if total is None else total + value
    return total


def parse_busy_counter(text: str) -> float | None:
    """Busy seconds of the backend's device per instance, or None if the counter is absent.

    The worker's counter sums busy time over its instances (batches run at once); divided
    by the instances gauge it is the device's busy time, as the simulator counts it."""
    total = _sum_samples(text, BUSY_COUNTER)
    if total is None:
        return None
    instances = _sum_samples(text, INSTANCES_GAUGE)
    return total / instances if instances and instances > 1 else total


def parse_diagnosis(text: str) -> dict[str, Any] | None:
    """The diagnosis figures of one worker's ``/metrics`` page: ``{"models": {M: {held_s,
    expected_s, input_s, compute_s, computed, items, batches, cap}}, "memory_used_bytes",
    "memory_total_bytes", "instances"}`` (a series the page lacks is absent), or None when
    the page has none of the per-model series (not our worker). Reads only the lines it
    wants: cheap enough to run every scrape."""
    models: dict[str, dict[str, float]] = {}
    device: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        cut = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        if cut <= 0:
            continue
        name = line[:cut]
        key = PER_MODEL_SERIES.get(name)
        dkey = DEVICE_SERIES.get(name) if key is None else None
        if key is None and dkey is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        if dkey is not None:
            device[dkey] = device.get(dkey, 0.0) + value
            continue
        m = _MODEL_LABEL.search(line, cut)
        if m is None:
            continue
        assert key is not None
        models.setdefault(m.group(1), {})[key] = value
    if not models:
        return None
    return {"models": models, **device}


class Scraper:
    """Polls each backend until stopped."""

    def __init__(
        self,
        backends: dict[str, str],
        t0: float,
        interval_s: float = 0.1,
        metrics_interval_s: float = 1.0,
    ) -> None:
        self.data = {n: BackendScrape(n, u.rstrip("/")) for n, u in backends.items()}
        self.t0 = t0
        self.interval_s = interval_s
        self.metrics_interval_s = metrics_interval_s
        self._tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def _load_loop(self, session: aiohttp.ClientSession, b: BackendScrape) -> None:
        nxt = time.perf_counter()
        while True:
            try:
                async with session.get(b.url + LOAD_PATH) as resp:
                    if resp.status == 404:
                        return  # no load endpoint (not our worker): its /metrics only
                    body = await resp.json(content_type=None)
                t = self.now()
                b.queue_t_s.append(t)
                b.queue_depth.append(float(body.get("queue_depth", 0.0)))
                b.in_flight.append(float(body.get("in_flight", 0.0)))
                b.utilization.append(float(body.get("utilization", 0.0)))
            except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as exc:
                b.errors += 1
                b.last_error = f"{LOAD_PATH}: {type(exc).__name__}: {exc}"[:200]
            nxt += self.interval_s
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

    async def _read_busy(self, session: aiohttp.ClientSession, b: BackendScrape) -> None:
        async with session.get(b.url + METRICS_PATH) as resp:
            text = await resp.text() if resp.status == 200 else ""
        t = self.now()
        value = parse_busy_counter(text)
        if value is not None:
            b.busy_t_s.append(t)
            b.busy_total_s.append(value)
        diag = parse_diagnosis(text)
        if diag is not None:
            b.metrics_t_s.append(t)
            b.metrics.append(diag)

    async def _metrics_loop(self, session: aiohttp.ClientSession, b: BackendScrape) -> None:
        nxt = time.perf_counter()
        while True:
            try:
                await self._read_busy(session, b)
            except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError) as exc:
                b.errors += 1
                b.last_error = f"/metrics: {type(exc).__name__}: {exc}"[:200]
            nxt += self.metrics_interval_s
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))

    def start(self, session: aiohttp.ClientSession) -> None:
        for b in self.data.values():
            self._tasks.append(asyncio.create_task(self._load_loop(session, b)))
            self._tasks.append(asyncio.create_task(self._metrics_loop(session, b)))

    async def final_sample(self, session: aiohttp.ClientSession) -> None:
        """One last busy-counter reading per backend, so the window's end is covered."""
        for b in self.data.values():
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
                await self._read_busy(session, b)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
