"""The gateway's Prometheus metrics: names and collectors, on a registry the gateway owns.

Names follow Prometheus conventions (``_total``, ``_seconds``). Each gateway builds its own
``CollectorRegistry`` so several gateways in one process (tests) do not collide.

- ``evenserve_gateway_requests_total{backend,model,outcome}``: requests answered, by the backend
  that answered (``none`` when no backend did) and the outcome (``ok``, ``client_error``,
  ``backend_error``, ``backend_overloaded``, ``overloaded``, ``unavailable``, ``timeout``,
  ``unknown_model``).
- ``evenserve_gateway_request_duration_seconds{model}``: end-to-end latency at the gateway.
- ``evenserve_gateway_routing_decision_seconds``: time inside the routing policy per decision.
- ``evenserve_gateway_retries_total{model}``: requests sent to a second backend.
- ``evenserve_gateway_backend_healthy{backend}``: 1 routable, 0 ejected.
- ``evenserve_gateway_backend_ejections_total{backend,reason}``.
- ``evenserve_gateway_backend_signal_age_seconds{backend}``: age of the newest load sample
  (NaN before the first one).
- ``evenserve_gateway_backend_in_flight{backend}``: requests the gateway has outstanding there.
- ``evenserve_gateway_backend_queue_depth{backend}``: the router's queue estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

REQUESTS_TOTAL = "evenserve_gateway_requests_total"
REQUEST_DURATION_SECONDS = "evenserve_gateway_request_duration_seconds"
ROUTING_DECISION_SECONDS = "evenserve_gateway_routing_decision_seconds"
RETRIES_TOTAL = "evenserve_gateway_retries_total"
BACKEND_HEALTHY = "evenserve_gateway_backend_healthy"
BACKEND_EJECTIONS_TOTAL = "evenserve_gateway_backend_ejections_total"
BACKEND_SIGNAL_AGE_SECONDS = "evenserve_gateway_backend_signal_age_seconds"
BACKEND_IN_FLIGHT = "evenserve_gateway_backend_in_flight"
BACKEND_QUEUE_DEPTH = "evenserve_gateway_backend_queue_depth"

#: End-to-end latency buckets (seconds): sub-ms overheads up to multi-second queueing.
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
#: Routing decision buckets (seconds): the budget is 0.5 ms.
DECISION_BUCKETS_S = (
    5e-6,
    1e-5,
    2e-5,
    5e-5,
    1e-4,
    2e-4,
    5e-4,
    1e-3,
    2e-3,
    5e-3,
)

#: One backend's live figures for the scrape-time collector:
#: (name, healthy, signal age in seconds or None, in-flight count, queue estimate).
BackendFigures = tuple[str, bool, float | None, int, float]


class _BackendCollector(Collector):
    """Reads backend state at scrape time, so gauges are never stale between polls."""

    def __init__(self, source: Callable[[], Iterable[BackendFigures]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            BACKEND_HEALTHY, "1 if the backend is routable, 0 if ejected", labels=["backend"]
        )
        age = GaugeMetricFamily(
            BACKEND_SIGNAL_AGE_SECONDS,
            "seconds since the newest load sample (NaN before the first)",
            labels=["backend"],
        )
        in_flight = GaugeMetricFamily(
            BACKEND_IN_FLIGHT, "requests the gateway has outstanding", labels=["backend"]
        )
        queue = GaugeMetricFamily(
            BACKEND_QUEUE_DEPTH, "router's queue estimate for the backend", labels=["backend"]
        )
        for name, ok, age_s, n, q in self._source():
            healthy.add_metric([name], 1.0 if ok else 0.0)
            age.add_metric([name], math.nan if age_s is None else age_s)
            in_flight.add_metric([name], float(n))
            queue.add_metric([name], q)
        yield healthy
        yield age
        yield in_flight
        yield queue

    def describe(self) -> Iterator[Metric]:
        return iter(())


class GatewayMetrics:
    def __init__(self, backends: Callable[[], Iterable[BackendFigures]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            REQUESTS_TOTAL,
            "requests answered by the gateway",
            ["backend", "model", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            REQUEST_DURATION_SECONDS,
            "end-to-end latency at the gateway",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.decision = Histogram(
            ROUTING_DECISION_SECONDS,
            "time inside the routing policy per decision",
            buckets=DECISION_BUCKETS_S,
            registry=self.registry,
        )
        self.retries = Counter(
            RETRIES_TOTAL, "requests sent to a second backend", ["model"], registry=self.registry
        )
        self.ejections = Counter(
            BACKEND_EJECTIONS_TOTAL,
            "times a backend was taken out of routing",
            ["backend", "reason"],
            registry=self.registry,
        )
        self.registry.register(_BackendCollector(backends))

    def render(self) -> bytes:
        return generate_latest(self.registry)
