"""The worker's Prometheus metrics: histograms and counters updated as work happens, gauges
read from the live driver at scrape time (so a scrape always sees the current queue)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from evenserve.metrics import names
from evenserve.metrics.nvml import NvmlSampler


@dataclass(frozen=True)
class DeviceSnapshot:
    """Live figures of the device and its queues at one instant."""

    busy_ratio: float
    busy_seconds_total: float
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    instances: int
    queued_by_model: Mapping[str, int] = field(default_factory=dict)
    in_flight_by_model: Mapping[str, int] = field(default_factory=dict)


class _LiveCollector(Collector):
    def __init__(
        self, device: str, snapshot: Callable[[], DeviceSnapshot], nvml: NvmlSampler | None
    ) -> None:
        self.device = device
        self.snapshot = snapshot
        self.nvml = nvml

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        dev = [self.device]
        q = GaugeMetricFamily(names.QUEUE_DEPTH, "Requests waiting, per model.", labels=["model"])
        for m, v in s.queued_by_model.items():
            q.add_metric([m], v)
        yield q
        f = GaugeMetricFamily(
            names.IN_FLIGHT, "Requests inside running batches, per model.", labels=["model"]
        )
        for m, v in s.in_flight_by_model.items():
            f.add_metric([m], v)
        yield f
        g = GaugeMetricFamily(
            names.DEVICE_BUSY_RATIO,
            "Busy fraction of the device's batch slots over the utilization window.",
            labels=["device"],
        )
        g.add_metric(dev, s.busy_ratio)
        yield g
        c = CounterMetricFamily(
            names.DEVICE_BUSY_SECONDS,
            "Seconds the device ran batches, summed over its slots.",
            labels=["device"],
        )
        c.add_metric(dev, s.busy_seconds_total)
        yield c
        inst = GaugeMetricFamily(
            names.DEVICE_INSTANCES,
            "Batch slots (concurrent batches) of the device.",
            labels=["device"],
        )
        inst.add_metric(dev, s.instances)
        yield inst
        if s.memory_used_bytes is not None:
            mu = GaugeMetricFamily(
                names.DEVICE_MEMORY_USED, "Device memory in use.", labels=["device"]
            )
            mu.add_metric(dev, s.memory_used_bytes)
            yield mu
        if s.memory_total_bytes is not None:
            mt = GaugeMetricFamily(names.DEVICE_MEMORY_TOTAL, "Device memory.", labels=["device"])
            mt.add_metric(dev, s.memory_total_bytes)
            yield mt
        if self.nvml is not None:
            yield from self._nvml()

    def _nvml(self) -> Iterator[Metric]:
        assert self.nvml is not None
        ns = self.nvml.sample()
        if ns is None:
            return
        gpu = [str(self.nvml.index)]
        for name, doc, value in (
            (
                names.GPU_SM_UTILIZATION,
                "NVML utilization: time any kernel ran.",
                ns.sm_utilization_ratio,
            ),
            (names.GPU_MEMORY_USED, "NVML memory used.", ns.memory_used_bytes),
            (names.GPU_MEMORY_TOTAL, "NVML memory total.", ns.memory_total_bytes),
            (names.GPU_PCIE_TX, "NVML PCIe transmit throughput.", ns.pcie_tx_bytes_per_second),
            (names.GPU_PCIE_RX, "NVML PCIe receive throughput.", ns.pcie_rx_bytes_per_second),
        ):
            if value is None:
                continue
            fam = GaugeMetricFamily(name, doc, labels=["gpu"])
            fam.add_metric(gpu, value)
            yield fam


class WorkerMetrics:
    """One worker's registry (not the global one: tests run many workers in one process)."""

    def __init__(
        self,
        device: str,
        models: Sequence[str],
        snapshot: Callable[[], DeviceSnapshot],
        nvml: NvmlSampler | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.batch_size = Histogram(
            names.BATCH_SIZE,
            "Items per batch.",
            ["model"],
            buckets=names.BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            names.QUEUE_TIME,
            "Time from arrival to the start of the request's batch.",
            ["model"],
            buckets=names.TIME_BUCKETS_S,
            registry=r,
        )
        self.compute_time = Histogram(
            names.COMPUTE_TIME,
            "Time one batch took on the device (assemble, run, split).",
            ["model"],
            buckets=names.TIME_BUCKETS_S,
            registry=r,
        )
        self.latency = Histogram(
            names.REQUEST_LATENCY,
            "Time from receiving a request to answering it.",
            ["model"],
            buckets=names.TIME_BUCKETS_S,
            registry=r,
        )
        self.requests = Counter(
            names.REQUESTS, "Requests answered, by outcome.", ["model", "outcome"], registry=r
        )
        self.batches = Counter(names.BATCHES, "Batches run.", ["model"], registry=r)
        self.refusals = Counter(
            names.REFUSALS,
            "Requests refused (not run), by reason: queue-full, shed, deadline-infeasible, "
            "deadline-expired.",
            ["model", "reason"],
            registry=r,
        )
        self.nvml = nvml
        r.register(_LiveCollector(device, snapshot, nvml))
        for m in models:
            self.batch_size.labels(m)
            self.queue_time.labels(m)
            self.compute_time.labels(m)
            self.latency.labels(m)
            self.batches.labels(m)
            for o in names.OUTCOMES:
                self.requests.labels(m, o)
            for reason in names.REFUSAL_REASONS:
                self.refusals.labels(m, reason)

    def observe_batch(self, model: str, items: int, queue_times_s: Sequence[float]) -> None:
        self.batch_size.labels(model).observe(items)
        self.batches.labels(model).inc()
        h = self.queue_time.labels(model)
        for q in queue_times_s:
            h.observe(q)

    def observe_refusal(self, model: str, reason: str) -> None:
        self.refusals.labels(model, reason).inc()

    def observe_compute(self, model: str, compute_s: float) -> None:
        self.compute_time.labels(model).observe(compute_s)

    def observe_request(self, model: str, outcome: str, latency_s: float | None) -> None:
        """Count one answered request; ``model`` may be a name not served (for 404s)."""
        self.requests.labels(model, outcome).inc()
        if latency_s is not None and outcome == "success":
            self.latency.labels(model).observe(latency_s)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
