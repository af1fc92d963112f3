"""The worker's telemetry: its Prometheus metrics and each model's statistics, fed by the
driver's batches and refusals and by the data plane's answers.

:class:`Telemetry` is the driver's observer (batches started and finished, requests dropped)
and joins the model registry's hooks (a model's metrics appear when it loads and its unload
is counted); ``count_infer`` is the one place an answered inference request is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from evenserve.core.wire import REFUSAL_REASONS
from evenserve.metrics.worker import DeviceSnapshot, WorkerMetrics
from evenserve.worker.batch import BatchResult, DriverObserver, RunningBatch
from evenserve.worker.device import Device
from evenserve.worker.driver import BatchDriver
from evenserve.worker.models.registry import HostedModel, ModelRegistry


def worker_metrics(models: ModelRegistry, device: Device) -> WorkerMetrics:
    """The worker's metrics, whose device figures are read at each scrape."""
    return WorkerMetrics(
        device.name,
        list(models),
        partial(_snapshot, models, device),
        device.nvml,
        kind=device.target.kind,
        slice_label=device.target.slice_label or "",
        dcgm=device.dcgm,
    )


def _snapshot(models: ModelRegistry, device: Device) -> DeviceSnapshot:
    d = device.driver
    if d is None:
        return _snapshot_of(models, device, None)
    with d.lock:
        return _snapshot_of(models, device, d)


def _snapshot_of(models: ModelRegistry, device: Device, d: BatchDriver | None) -> DeviceSnapshot:
    used, total = device.memory_bytes()
    now = d.clock.now() if d else 0.0
    return DeviceSnapshot(
        busy_ratio=d.sched.busy.fraction(now) if d else 0.0,
        busy_seconds_total=d.sched.busy.total_s(now) if d else 0.0,
        memory_used_bytes=used,
        memory_total_bytes=total,
        instances=device.options.run.instances,
        queued_by_model=d.sched.queued_by_model() if d else {m: 0 for m in models},
        in_flight_by_model=d.sched.in_flight_by_model() if d else {m: 0 for m in models},
        cap_by_model=dict(d.sched.max_batch_size)
        if d
        else {m: h.policy.max_batch_size for m, h in models.items()},
    )


class Telemetry(DriverObserver):
    """Feeds metrics and statistics, then any extra observers (tests, tracing)."""

    def __init__(self, metrics: WorkerMetrics, models: Mapping[str, HostedModel]) -> None:
        self.metrics = metrics
        #: The models served (the registry): their statistics and whether they have a profile.
        self.models = models
        self.extra: list[DriverObserver] = []

    # -- the registry's hooks ----------------------------------------------------------------
    def on_load(self, model: HostedModel) -> None:
        self.metrics.add_model(model.name)

    def on_unload(self, model: HostedModel) -> None:
        self.metrics.observe_unload(model.name)

    # -- answers -----------------------------------------------------------------------------
    def count_infer(self, model: str, outcome: str, elapsed_s: float) -> None:
        """One inference request answered (HTTP or gRPC): its metrics, and the model's
        statistics unless it never reached the model or was cancelled."""
        self.metrics.observe_request(model, outcome, elapsed_s)
        hosted = self.models.get(model)  # None: unloaded since
        if outcome not in ("not_found", "cancelled") and hosted is not None:
            hosted.stats.record_request(outcome == "success", elapsed_s)

    # -- the driver's observer ---------------------------------------------------------------
    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        hosted = self.models.get(batch.model)
        self.metrics.observe_batch(
            batch.model,
            batch.items,
            [now_s - r.arrival_s for r in batch.requests],
            held_s=batch.held_s,
            # A batch's expected seconds count only for a model with a profile.
            expected_s=batch.solo_s if hosted is not None and hosted.profile is not None else None,
        )
        for o in self.extra:
            o.batch_started(batch, now_s)

    def request_dropped(self, model: str, reason: str, waited_s: float) -> None:
        if reason in REFUSAL_REASONS:
            self.metrics.observe_refusal(model, reason)
        for o in self.extra:
            o.request_dropped(model, reason, waited_s)

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        for o in self.extra:
            o.batch_finished(batch, result, now_s)
        hosted = self.models.get(batch.model)
        if result.error is None and hosted is not None:
            self.metrics.observe_compute(batch.model, result.compute_s, result.compute_input_s)
            hosted.stats.record_batch(
                batch.items,
                len(batch.requests),
                [batch.started_s - r.arrival_s for r in batch.requests],
                result.compute_input_s,
                result.compute_infer_s,
                result.compute_output_s,
            )
