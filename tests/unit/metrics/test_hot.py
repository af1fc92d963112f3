"""The request path's counters and histograms read out as prometheus_client's would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from evenserve.metrics.hot import HotCollector, HotCounter, HotHistogram

BUCKETS = (0.001, 0.01, 0.1)


def _samples(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_hot_series_expose_what_prometheus_client_exposes() -> None:
    ref = CollectorRegistry()
    c = Counter("x_requests", "doc", ["model", "outcome"], registry=ref)
    h = Histogram("x_latency_seconds", "doc", ["model"], buckets=BUCKETS, registry=ref)
    hot = CollectorRegistry()
    hc = HotCounter("x_requests", "doc", ["model", "outcome"])
    hh = HotHistogram("x_latency_seconds", "doc", ["model"], BUCKETS)
    hot.register(HotCollector([hc, hh]))
    for v in (0.0005, 0.001, 0.002, 0.05, 0.5, 3.0):
        h.labels("m").observe(v)
        hh.observe(("m",), v)
        c.labels("m", "success").inc()
        hc.inc(("m", "success"))
    c.labels("m", "error").inc(2.5)
    hc.inc(("m", "error"), 2.5)
    hc.touch(("n", "success"))
    c.labels("n", "success")
    assert _samples(generate_latest(hot)) == _samples(generate_latest(ref))
