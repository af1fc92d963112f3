"""The gateway's Prometheus collectors (names and labels: ``metrics.names``).

Each gateway builds its own ``CollectorRegistry``, so several gateways in one process (tests)
do not collide; the per-backend gauges are read at scrape time. Label values are bounded by
the cluster file: a request for a model no backend hosts is counted under
``UNKNOWN_MODEL_LABEL`` (``observe_request``), never under the name the client sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Container, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from evenserve.metrics import names
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL

#: The dispatcher's outcome for a model no backend hosts (names.GATEWAY_OUTCOMES).
UNKNOWN_MODEL_OUTCOME = "unknown_model"

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


def model_label(model: str, known: Container[str]) -> str:
    """The ``model`` label of a request for ``model``: itself when the gateway serves it
    (``known``: every model a configured backend hosts), else UNKNOWN_MODEL_LABEL."""
    return model if model in known else UNKNOWN_MODEL_LABEL


class GatewayMetrics:
    """``models``: the models the cluster serves (``BackendRegistry.models``); without it only
    the outcome ``unknown_model`` tells an unknown model."""

    def __init__(
        self,
        backends: Callable[[], Iterable[BackendFigures]],
        models: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self._models = models
        self._counted: dict[tuple[str, str, str], Any] = {}
        self._timed: dict[str, Any] = {}
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

    def model_label(self, model: str, outcome: str | None = None) -> str:
        """``model`` as a label value: UNKNOWN_MODEL_LABEL for a model nobody serves."""
        if outcome == UNKNOWN_MODEL_OUTCOME:
            return UNKNOWN_MODEL_LABEL
        return model if self._models is None else model_label(model, self._models())

    def observe_request(
        self, backend: str | None, model: str, outcome: str, seconds: float | None
    ) -> None:
        """One answered inference request: its count by backend (``none`` when no backend
        answered), model and outcome, and its latency by model (None: not timed, as for a
        request the HTTP server refused before it was read whole)."""
        label = self.model_label(model, outcome)
        key = (backend or "none", label, outcome)
        counter = self._counted.get(key)
        if counter is None:  # labels() costs more than the increment: once per key
            counter = self._counted[key] = self.requests.labels(*key)
        counter.inc()
        if seconds is None:
            return
        timer = self._timed.get(label)
        if timer is None:
            timer = self._timed[label] = self.latency.labels(label)
        timer.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
