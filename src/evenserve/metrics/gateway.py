"""The gateway's Prometheus collectors (names and labels: ``metrics.names``).

Each gateway builds its own ``CollectorRegistry``, so several gateways in one process (tests)
do not collide; the per-backend gauges are read at scrape time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from evenserve.metrics import names

#: One backend's live figures for the scrape-time collector:
#: (name, healthy, signal age in seconds or None, in-flight count, queue estimate).
BackendFigures = tuple[str, bool, float | None, int, float]

#: The scrape-time gauges, in the order of BackendFigures after the name.
BACKEND_GAUGES = (
    (names.GATEWAY_BACKEND_HEALTHY, "1 if the backend is routable, 0 if ejected"),
    (
        names.GATEWAY_BACKEND_SIGNAL_AGE,
        "seconds since the newest load sample (NaN before the first)",
    ),
    (names.GATEWAY_BACKEND_IN_FLIGHT, "requests the gateway has outstanding"),
    (names.GATEWAY_BACKEND_QUEUE_DEPTH, "router's queue estimate for the backend"),
)


class _BackendCollector(Collector):
    """Reads backend state at scrape time, so gauges are never stale between polls."""

    def __init__(self, source: Callable[[], Iterable[BackendFigures]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        families = [GaugeMetricFamily(n, doc, labels=["backend"]) for n, doc in BACKEND_GAUGES]
        for name, ok, age_s, in_flight, q in self._source():
            age = math.nan if age_s is None else age_s
            for family, value in zip(families, (float(ok), age, float(in_flight), q), strict=True):
                family.add_metric([name], value)
        yield from families

    def describe(self) -> Iterator[Metric]:
        return iter(())


class GatewayMetrics:
    def __init__(self, backends: Callable[[], Iterable[BackendFigures]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # prometheus_client adds ``_total`` to a counter's name itself.
        self.requests = Counter(
            names.GATEWAY_REQUESTS,
            "requests answered by the gateway",
            ["backend", "model", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            names.GATEWAY_REQUEST_DURATION,
            "end-to-end latency at the gateway",
            ["model"],
            buckets=names.TIME_BUCKETS_S,
            registry=r,
        )
        self.decision = Histogram(
            names.GATEWAY_ROUTING_DECISION,
            "time inside the routing policy per decision",
            buckets=names.GATEWAY_DECISION_BUCKETS_S,
            registry=r,
        )
        self.retries = Counter(
            names.GATEWAY_RETRIES, "requests sent to a second backend", ["model"], registry=r
        )
        self.ejections = Counter(
            names.GATEWAY_BACKEND_EJECTIONS,
            "times a backend was taken out of routing",
            ["backend", "reason"],
            registry=r,
        )
        self.registry.register(_BackendCollector(backends))

    def render(self) -> bytes:
        return generate_latest(self.registry)
