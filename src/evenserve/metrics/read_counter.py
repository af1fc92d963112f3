"""A counter whose value is read at scrape time from its owner (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


class ReadCounter(Collector):
    """``name`` (exported as ``name_total``) with the value ``read()`` returns when scraped."""

    def __init__(self, name: str, doc: str, read: Callable[[], int]) -> None:
        self._name = name
        self._doc = doc
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._doc, value=float(self._read()))

    def describe(self) -> Iterator[Metric]:
        return iter(())
