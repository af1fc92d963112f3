"""Counters and histograms for the request path, in plain dicts, turned into Prometheus
families at scrape time.

prometheus_client's own counter and histogram take a lock per observation and search the
buckets in a Python loop: several microseconds per observation, and a request on the worker
or the gateway makes several. These series are updated from one thread (the event loop that
serves the scrape as well), so they need no lock: an observation is a dict lookup, a bisect
and an add. The exposition is prometheus_client's (``CounterMetricFamily``,
``HistogramMetricFamily``): names, labels and buckets read as before.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class Hist:
    """One histogram series: counts per bucket (the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts by upper bound, as an exposition's ``_bucket`` series."""
        out: list[tuple[str, float]] = []
        running = 0
        for le, n in zip([*map(repr, self.bounds), "+Inf"], self.counts, strict=True):
            running += n
            out.append((le, float(running)))
        return out


class HotCounter:
    """A labelled counter: ``inc(labels, v)``; ``labels`` a tuple of the label values."""

    __slots__ = ("doc", "labels", "name", "series")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.series: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], v: float = 1.0) -> None:
        s = self.series
        s[key] = s.get(key, 0.0) + v

    def touch(self, key: tuple[str, ...]) -> None:
        """Make the series exist at zero (a model's series from its load on)."""
        self.series.setdefault(key, 0.0)

    def family(self) -> Metric:
        f = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, v in self.series.items():
            f.add_metric(list(key), v)
        return f


class HotHistogram:
    """A labelled histogram: ``observe(labels, v)``."""

    __slots__ = ("bounds", "doc", "labels", "name", "series")

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]):
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.bounds = tuple(float(b) for b in buckets)
        self.series: dict[tuple[str, ...], Hist] = {}

    def get(self, key: tuple[str, ...]) -> Hist:
        h = self.series.get(key)
        if h is None:
            h = self.series[key] = Hist(self.bounds)
        return h

    def observe(self, key: tuple[str, ...], v: float) -> None:
        h = self.series.get(key)
        if h is None:
            h = self.series[key] = Hist(self.bounds)
        h.observe(v)

    def family(self) -> Metric:
        f = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, h in self.series.items():
            f.add_metric(list(key), h.buckets(), h.total)
        return f


class HotCollector(Collector):
    """Exposes a set of hot series (register it in a ``CollectorRegistry``)."""

    def __init__(self, series: Sequence[HotCounter | HotHistogram]) -> None:
        self.series = list(series)

    def collect(self) -> Iterator[Metric]:
        for s in self.series:
            yield s.family()

    def describe(self) -> Iterator[Metric]:
        return iter(())
