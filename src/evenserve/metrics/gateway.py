"""The gateway's Prometheus collectors (names and labels: ``metrics.names``).

Each gateway builds its own ``CollectorRegistry``, so several gateways in one process (tests)
do not collide; the per-backend gauges are read at scrape time. Label values are bounded by
the cluster file: a request for a model no backend hosts is counted under
``UNKNOWN_MODEL_LABEL`` (``observe_request``), never under the name the client sent.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Collection, Container, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from evenserve.metrics import names
from evenserve.metrics.hot import Hist
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL
from evenserve.metrics.read_counter import ReadCounter

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
    (``known``: every model some backend has, as learned from their indexes), else
    UNKNOWN_MODEL_LABEL."""
    return model if model in known else UNKNOWN_MODEL_LABEL


class _HotPath(Collector):
    """The per-request series (requests by backend/model/outcome, latency by model, routing
    decision time), kept in plain dicts and lists and turned into Prometheus families at
    scrape time: prometheus_client's own counter and histogram take a lock and a Python
    bucket search per observation, several microseconds on the gateway's forwarding path."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.latency: dict[str, Hist] = {}
        self.decision = Hist(tuple(names.GATEWAY_DECISION_BUCKETS_S))

    def collect(self) -> Iterator[Metric]:
        req = CounterMetricFamily(
            names.GATEWAY_REQUESTS,
            "requests answered by the gateway",
            labels=["backend", "model", "outcome"],
        )
        for key, n in self.requests.items():
            req.add_metric(list(key), n)
        yield req
        lat = HistogramMetricFamily(
            names.GATEWAY_REQUEST_DURATION, "end-to-end latency at the gateway", labels=["model"]
        )
        for model, h in self.latency.items():
            lat.add_metric([model], h.buckets(), h.total)
        yield lat
        dec = HistogramMetricFamily(
            names.GATEWAY_ROUTING_DECISION, "time inside the routing policy per decision"
        )
        dec.add_metric([], self.decision.buckets(), self.decision.total)
        yield dec

    def describe(self) -> Iterator[Metric]:
        return iter(())


class GatewayMetrics:
    """``models``: the models the cluster serves (``BackendRegistry.models``); without it only
    the outcome ``unknown_model`` tells an unknown model."""

    def __init__(
        self,
        backends: Callable[[], Iterable[BackendFigures]],
        models: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self._models = models
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._hot = _HotPath()
        r.register(self._hot)
        #: Routing decision time (seconds): ``decision.observe(s)``.
        self.decision = self._hot.decision
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
        hot = self._hot
        hot.requests[key] = hot.requests.get(key, 0) + 1
        if seconds is None:
            return
        h = hot.latency.get(label)
        if h is None:
            h = hot.latency[label] = Hist(tuple(names.TIME_BUCKETS_S))
        h.observe(seconds)

    def observe_served(self, backend: str, model: str, outcome: str, seconds: float) -> None:
        """``observe_request`` for a backend's answer to a request admitted for ``model``:
        the gateway serves that model (admission said so), so its label is its name."""
        hot = self._hot
        key = (backend, model, outcome)
        hot.requests[key] = hot.requests.get(key, 0) + 1
        h = hot.latency.get(model)
        if h is None:
            h = hot.latency[model] = Hist(tuple(names.TIME_BUCKETS_S))
        h.counts[bisect_left(h.bounds, seconds)] += 1  # Hist.observe, inlined
        h.total += seconds

    def count_record_drops(self, read: Callable[[], int]) -> None:
        """Export the request log's lost records (``core.requestlog.Recorder.dropped``)."""
        self.registry.register(
            ReadCounter(
                names.GATEWAY_RECORD_DROPPED,
                "request-log records lost because the writer fell behind",
                read,
            )
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
