"""The gateway's Prometheus collectors, on a registry the gateway owns (names: metrics.names).

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

from evenserve.metrics import names

# prometheus_client adds ``_total`` to counters itself.
REQUESTS_TOTAL = names.GATEWAY_REQUESTS + "_total"
REQUEST_DURATION_SECONDS = names.GATEWAY_REQUEST_DURATION
ROUTING_DECISION_SECONDS = names.GATEWAY_ROUTING_DECISION
RETRIES_TOTAL = names.GATEWAY_RETRIES + "_total"
BACKEND_HEALTHY = names.GATEWAY_BACKEND_HEALTHY
BACKEND_EJECTIONS_TOTAL = names.GATEWAY_BACKEND_EJECTIONS + "_total"
BACKEND_SIGNAL_AGE_SECONDS = names.GATEWAY_BACKEND_SIGNAL_AGE
BACKEND_IN_FLIGHT = names.GATEWAY_BACKEND_IN_FLIGHT
BACKEND_QUEUE_DEPTH = names.GATEWAY_BACKEND_QUEUE_DEPTH
LATENCY_BUCKETS_S = names.GATEWAY_LATENCY_BUCKETS_S
DECISION_BUCKETS_S = names.GATEWAY_DECISION_BUCKETS_S

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
