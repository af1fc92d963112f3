"""The worker's Prometheus metrics: histograms and counters updated as work happens, gauges
read from the live driver at scrape time (so a scrape always sees the current queue).

The series every request or batch touches (requests, latency, batch sizes, queue and compute
times, held and expected seconds, refusals) are ``metrics.hot`` series: plain dicts updated
on the event loop, turned into families at scrape time. The rare ones (model loads and
unloads, load waits) are prometheus_client's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from evenserve.core import wire
from evenserve.metrics import names
from evenserve.metrics.hot import HotCollector, HotCounter, HotHistogram
from evenserve.metrics.nvml import NvmlSampler
from evenserve.metrics.read_counter import ReadCounter


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
    #: Each model's batch cap now (its policy's ``max_batch_size``).
    cap_by_model: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DcgmLabels:
    """The device as dcgm-exporter labels its series, on ``DEVICE_INFO``: ``gpu`` (the NVML
    index), ``UUID`` (``GPU-...``), ``modelName`` (the product name). A CUDA device NVML does
    not answer for keeps its index and empty UUID and modelName; the CPU and emulated devices
    have ``gpu=""`` and ``UUID=""`` (so they join no DCGM series) and ``modelName`` their
    device string (``cpu``, ``emulated:a10-trt-fp16``)."""

    gpu: str = ""
    uuid: str = ""
    model_name: str = ""


Family = type[GaugeMetricFamily | CounterMetricFamily]


def _one(kind: Family, name: str, doc: str, label: str, key: str, value: float) -> Metric:
    """A family of one series, ``label=key``."""
    family = kind(name, doc, labels=[label])
    family.add_metric([key], value)
    return family


class _LiveCollector(Collector):
    def __init__(
        self,
        device: str,
        snapshot: Callable[[], DeviceSnapshot],
        nvml: NvmlSampler | None,
        kind: str = "",
        slice_label: str = "",
        dcgm: DcgmLabels | None = None,
    ) -> None:
        self.device = device
        self.kind = kind
        self.slice_label = slice_label
        self.dcgm = dcgm or DcgmLabels()
        self.snapshot = snapshot
        self.nvml = nvml

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        info = GaugeMetricFamily(
            names.DEVICE_INFO,
            "The device: its string, kind (cpu, cuda, emulated), slice (mig-..., share-KofM) "
            "and dcgm-exporter's labels (gpu, UUID, modelName) to join its series on.",
            labels=["device", "kind", "slice", *names.DCGM_LABELS],
        )
        d = self.dcgm
        info.add_metric(
            [self.device, self.kind, self.slice_label, d.gpu, d.uuid, d.model_name], 1.0
        )
        yield info
        for name, doc, by_model in (
            (names.QUEUE_DEPTH, "Requests waiting, per model.", s.queued_by_model),
            (names.IN_FLIGHT, "Requests inside running batches, per model.", s.in_flight_by_model),
            (names.BATCH_CAP, "The batching policy's batch cap now, per model.", s.cap_by_model),
        ):
            per_model = GaugeMetricFamily(name, doc, labels=["model"])
            for m, v in by_model.items():
                per_model.add_metric([m], v)
            yield per_model
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        device: list[tuple[Family, str, str, float | None]] = [
            (
                gauge,
                names.DEVICE_BUSY_RATIO,
                "Busy fraction of the device's batch slots over the utilization window.",
                s.busy_ratio,
            ),
            (
                counter,
                names.DEVICE_BUSY_SECONDS,
                "Seconds the device ran batches, summed over its slots.",
                s.busy_seconds_total,
            ),
            (
                gauge,
                names.DEVICE_INSTANCES,
                "Batch slots (concurrent batches) of the device.",
                s.instances,
            ),
            (gauge, names.DEVICE_MEMORY_USED, "Device memory in use.", s.memory_used_bytes),
            (gauge, names.DEVICE_MEMORY_TOTAL, "Device memory.", s.memory_total_bytes),
        ]
        for kind, name, doc, value in device:
            if value is not None:  # memory an unmeasured device does not know is left out
                yield _one(kind, name, doc, "device", self.device, value)
        if self.nvml is not None:
            yield from self._nvml(self.nvml)

    def _nvml(self, nvml: NvmlSampler) -> Iterator[Metric]:
        ns = nvml.sample()
        if ns is None:
            return
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
            if value is not None:
                yield _one(GaugeMetricFamily, name, doc, "gpu", nvml.label, value)


class WorkerMetrics:
    """One worker's registry (not the global one: tests run many workers in one process)."""

    def __init__(
        self,
        device: str,
        models: Sequence[str],
        snapshot: Callable[[], DeviceSnapshot],
        nvml: NvmlSampler | None = None,
        *,
        kind: str = "",
        slice_label: str = "",
        dcgm: DcgmLabels | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry

        def per_model(
            name: str, doc: str, buckets: Sequence[float] = names.TIME_BUCKETS_S
        ) -> HotHistogram:
            return HotHistogram(name, doc, ["model"], buckets)

        def counter(name: str, doc: str, labels: Sequence[str] = ("model",)) -> HotCounter:
            return HotCounter(name, doc, labels)

        self.batch_size = per_model(names.BATCH_SIZE, "Items per batch.", names.BATCH_SIZE_BUCKETS)
        self.queue_time = per_model(
            names.QUEUE_TIME, "Time from arrival to the start of the request's batch."
        )
        self.compute_time = per_model(
            names.COMPUTE_TIME, "Time one batch took on the device (assemble, run, split)."
        )
        self.latency = per_model(
            names.REQUEST_LATENCY, "Time from receiving a request to answering it."
        )
        self.requests = counter(
            names.REQUESTS, "Requests answered, by outcome.", ["model", "outcome"]
        )
        self.batches = counter(names.BATCHES, "Batches run.")
        self.held = counter(
            names.BATCH_HELD,
            "Seconds a batch's instance sat idle while its oldest request waited (the batching "
            "policy held it), summed over batches.",
        )
        self.expected = counter(
            names.BATCH_EXPECTED,
            "Seconds the latency profile expected the batches to take, summed (batches with "
            "a profile only).",
        )
        self.compute_input = counter(
            names.COMPUTE_INPUT,
            "Seconds batches spent staging their inputs (the compute_input phase), summed.",
        )
        self.refusals = counter(
            names.REFUSALS,
            "Requests refused (not run), by reason: queue-full, shed, deadline-infeasible, "
            "deadline-expired.",
            ["model", "reason"],
        )
        self.load_wait = per_model(
            names.LOAD_WAIT,
            "Time an inference request waited for its model's load (requests that arrived "
            "while it was LOADING).",
        )
        r.register(
            HotCollector(
                [
                    self.load_wait,
                    self.batch_size,
                    self.queue_time,
                    self.compute_time,
                    self.latency,
                    self.requests,
                    self.batches,
                    self.held,
                    self.expected,
                    self.compute_input,
                    self.refusals,
                ]
            )
        )
        self.loads = Counter(
            names.MODEL_LOADS,
            "Model loads asked for (repository extension, poll), by outcome.",
            ["model", "outcome"],
            registry=r,
        )
        self.unloads = Counter(names.MODEL_UNLOADS, "Model unloads done.", ["model"], registry=r)
        self.load_sources = Counter(
            names.MODEL_LOAD_SOURCES,
            "Model loads done, by source: host (the host's warm pool) or disk (the repository).",
            ["model", "source"],
            registry=r,
        )
        r.register(_LiveCollector(device, snapshot, nvml, kind, slice_label, dcgm))
        for m in models:
            self.add_model(m)

    def add_model(self, m: str) -> None:
        """Every series of a served model exists from its load on, at zero."""
        key = (m,)
        for h in (self.batch_size, self.queue_time, self.compute_time, self.latency):
            h.get(key)
        for c in (self.batches, self.held, self.expected, self.compute_input):
            c.touch(key)
        for o in names.OUTCOMES:
            self.requests.touch((m, o))
        for reason in wire.REFUSAL_REASONS:
            self.refusals.touch((m, reason))

    def observe_load(self, model: str, outcome: str) -> None:
        self.loads.labels(model, outcome).inc()

    def observe_load_source(self, model: str, source: str) -> None:
        self.load_sources.labels(model, source).inc()

    def observe_load_wait(self, model: str, waited_s: float) -> None:
        self.load_wait.observe((model,), waited_s)

    def observe_unload(self, model: str) -> None:
        self.unloads.labels(model).inc()

    def observe_batch(
        self,
        model: str,
        items: int,
        queue_times_s: Sequence[float],
        held_s: float = 0.0,
        expected_s: float | None = None,
    ) -> None:
        """A batch started: its size, its requests' queue times, the seconds its instance
        was held idle, and the profile's expected seconds (None: no profile)."""
        key = (model,)
        self.batch_size.observe(key, items)
        self.batches.inc(key)
        if held_s > 0:
            self.held.inc(key, held_s)
        if expected_s is not None and expected_s > 0:
            self.expected.inc(key, expected_s)
        h = self.queue_time.get(key)
        for q in queue_times_s:
            h.observe(q)

    def observe_refusal(self, model: str, reason: str) -> None:
        self.refusals.inc((model, reason))

    def observe_compute(self, model: str, compute_s: float, input_s: float = 0.0) -> None:
        """A batch ended: its compute time, ``input_s`` of it staging its inputs."""
        self.compute_time.observe((model,), compute_s)
        if input_s > 0:
            self.compute_input.inc((model,), input_s)

    def observe_request(self, model: str, outcome: str, latency_s: float | None) -> None:
        """Count one answered request; ``model`` may be a name not served (for 404s)."""
        self.requests.inc((model, outcome))
        if latency_s is not None and outcome == "success":
            self.latency.observe((model,), latency_s)

    def count_record_drops(self, read: Callable[[], int]) -> None:
        """Export the request log's lost records (``core.requestlog.Recorder.dropped``)."""
        self.registry.register(
            ReadCounter(
                names.WORKER_RECORD_DROPPED,
                "request-log records lost because the writer fell behind",
                read,
            )
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
