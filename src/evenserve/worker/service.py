"""One worker: the device, its models' runtimes, the batcher driver, metrics and statistics.

Built from a repository and options; ``load`` loads the runtimes (blocking: call it from a
thread or before serving), ``start`` creates the driver on the running loop, ``begin_drain``
and ``stop`` shut it down gracefully. The HTTP layer (``http_api``) only talks to this class.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evenserve.core.clock import Clock, RealClock
from evenserve.core.errors import ConfigError
from evenserve.core.load import LoadReport
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.core.wire import REFUSAL_REASONS
from evenserve.metrics.nvml import NvmlSampler
from evenserve.metrics.worker import DeviceSnapshot, WorkerMetrics
from evenserve.policy.registry import spec_label
from evenserve.runtime.base import Runtime
from evenserve.runtime.device import DeviceTarget, host_memory_bytes
from evenserve.runtime.emulated import EmulatedDevice, EmulatedRuntime
from evenserve.runtime.torch_common import cuda_memory_bytes
from evenserve.sched import ModelSetup
from evenserve.worker.driver import BatchDriver, BatchResult, DriverObserver, RunningBatch
from evenserve.worker.executor import ThreadedExecutor
from evenserve.worker.kserve import ModelSignature
from evenserve.worker.repository import ModelEntry
from evenserve.worker.stats import ModelStats
from evenserve.worker.timer import RealTimer

log = logging.getLogger(__name__)

GIB = 1024.0**3
#: GIL switch interval while emulated runtimes are served (CPython's default is 5 ms).
EMULATED_SWITCH_INTERVAL_S = 0.0002


@dataclass
class WorkerOptions:
    device: DeviceTarget
    #: Instances, interference and (emulated) memory: the scenario's device options.
    run: DeviceOptions = field(default_factory=DeviceOptions)
    #: Queue bound, starvation bound, class headroom: the scenario's arm options; a model's
    #: ``max_queue_size`` overrides the bound.
    queue: QueueOptions = field(default_factory=lambda: QueueOptions(max_queue_per_model=1024))
    max_body_bytes: int = 64 * 1024 * 1024
    batching_override: Any = None
    profiles_dir: Path | None = Path("profiles")
    utilization_window_s: float = 1.0
    cpu_threads: int | None = None
    drain_timeout_s: float = 30.0


class _Telemetry(DriverObserver):
    """Feeds metrics and statistics, then any extra observers (tests, tracing)."""

    def __init__(self, metrics: WorkerMetrics, stats: dict[str, ModelStats]) -> None:
        self.metrics = metrics
        self.stats = stats
        self.extra: list[DriverObserver] = []

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        self.metrics.observe_batch(
            batch.model, batch.items, [now_s - r.arrival_s for r in batch.requests]
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
        if result.error is None:
            self.metrics.observe_compute(batch.model, result.compute_s)
            self.stats[batch.model].record_batch(
                batch.items,
                len(batch.requests),
                [batch.started_s - r.arrival_s for r in batch.requests],
                result.compute_input_s,
                result.compute_infer_s,
                result.compute_output_s,
            )


class WorkerService:
    def __init__(
        self, entries: Sequence[ModelEntry], options: WorkerOptions, clock: Clock | None = None
    ) -> None:
        if not entries:
            raise ConfigError("a worker needs at least one model")
        self.entries = {e.name: e for e in entries}
        for e in entries:
            for note in e.notes:
                log.warning("model %r: %s: %s", e.name, e.source, note)
        self.options = options
        self.device = options.device
        self.clock: Clock = clock or RealClock()
        self.ready = False
        self.draining = False
        self.signatures = {
            e.name: ModelSignature(
                e.name, e.config.version, e.inputs, e.outputs, e.config.max_batch_size
            )
            for e in entries
        }
        self.runtimes: dict[str, Runtime] = {}
        # Emulated models share one device when batches run at once (they slow each other).
        run = options.run
        shared = EmulatedDevice(run.interference) if run.instances > 1 else None
        for e in entries:
            try:
                self.runtimes[e.name] = e.create_runtime(
                    options.device,
                    cpu_threads=options.cpu_threads,
                    profiles_dir=options.profiles_dir,
                    emulated_device=shared,
                )
            except ConfigError as exc:
                raise ConfigError(f"{e.source}: {exc}") from exc
        self.policies = {e.name: e.build_policy(options.batching_override) for e in entries}
        self.batching_specs = {e.name: e.batching_spec(options.batching_override) for e in entries}
        # A model without a profile file of its own has its emulated runtime's, if any.
        self.profiles: dict[str, LatencyProfile | None] = {
            e.name: e.latency_profile() or getattr(self.runtimes[e.name], "profile", None)
            for e in entries
        }
        self.stats = {e.name: ModelStats(e.name, e.config.version) for e in entries}
        self.nvml = (
            NvmlSampler.open(options.device.index or 0) if options.device.kind == "cuda" else None
        )
        self.metrics = WorkerMetrics(
            options.device.name, list(self.entries), self._snapshot, self.nvml
        )
        self._telemetry = _Telemetry(self.metrics, self.stats)
        self._driver: BatchDriver | None = None
        self._executor: ThreadedExecutor | None = None
        self._memory_cache: tuple[float, float | None, float | None] = (-math.inf, None, None)
        self.descriptions: dict[str, dict[str, Any]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._saved_switch_interval: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def load(self) -> None:
        """Load every runtime (blocking)."""
        for name, rt in self.runtimes.items():
            try:
                rt.load()
            except ConfigError as exc:
                raise ConfigError(f"{self.entries[name].source}: {exc}") from exc
            self.descriptions[name] = rt.describe()

    async def start(self) -> None:
        """Create the driver on the running loop; the worker is ready afterwards."""
        self.loop = asyncio.get_running_loop()
        if any(isinstance(rt, EmulatedRuntime) for rt in self.runtimes.values()):
            # An emulated batch ends when its device thread wakes up, which needs the GIL;
            # with CPython's default 5 ms switch interval a busy HTTP thread delays that by
            # up to 5 ms and inflates millisecond batches. A shorter interval bounds it.
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(EMULATED_SWITCH_INTERVAL_S)
        self._executor = ThreadedExecutor(
            self.runtimes,
            {n: [s.name for s in e.inputs] for n, e in self.entries.items()},
            instances=self.options.run.instances,
        )
        models = [
            ModelSetup(
                name=n,
                policy=self.policies[n],
                profile=self.profiles[n],
                max_batch_size=e.config.max_batch_size,
                max_queue=e.config.max_queue_size or self.options.queue.max_queue_per_model,
                priority=e.config.priority_value,
                deadline_s=e.config.deadline_s,
                slo_s=e.config.slo_s,
            )
            for n, e in self.entries.items()
        ]
        emulated = self.device.kind == "emulated"
        self._driver = BatchDriver(
            models,
            self._executor,
            clock=self.clock,
            timer=RealTimer(self.clock),
            device=self.options.run,
            queue=self.options.queue,
            observer=self._telemetry,
            utilization_window_s=self.options.utilization_window_s,
            # An emulated device's memory is the profiles' account; a real one is measured.
            memory_total_bytes=self.options.run.memory_gb * GIB if emulated else None,
            memory_probe=None if emulated else self.memory_bytes,
        )
        self.ready = True

    def count_infer(self, model: str, outcome: str, elapsed_s: float) -> None:
        """One inference request answered (HTTP or gRPC): its metrics, and the model's
        statistics unless it never reached the model or was cancelled."""
        self.metrics.observe_request(model, outcome, elapsed_s)
        if outcome not in ("not_found", "cancelled"):
            self.stats[model].record_request(outcome == "success", elapsed_s)

    def add_observer(self, observer: DriverObserver) -> None:
        """Also tell ``observer`` about every batch (e.g. a trace recorder)."""
        self._telemetry.extra.append(observer)

    @property
    def started(self) -> bool:
        return self._driver is not None

    @property
    def driver(self) -> BatchDriver:
        if self._driver is None:
            raise RuntimeError("worker not started")
        return self._driver

    def begin_drain_threadsafe(self) -> None:
        """``begin_drain`` from a signal handler or another thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin_drain)

    def begin_drain(self) -> None:
        """Stop accepting inference; run what is queued now (called on SIGTERM/Ctrl-C)."""
        self.draining = True
        self.ready = False
        if self._driver is not None:
            self._driver.begin_drain()

    async def stop(self) -> None:
        self.begin_drain()
        if self._driver is not None:
            await self._driver.drain(self.options.drain_timeout_s)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown)
        for rt in self.runtimes.values():
            rt.close()
        if self.nvml is not None:
            self.nvml.close()
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None

    # -- signals -----------------------------------------------------------------------------
    def memory_bytes(self) -> tuple[float | None, float | None]:
        """(used, total) bytes of the device; host/CUDA figures cached for 100 ms."""
        dev = self.device
        if dev.kind == "emulated":
            if self._driver is not None:
                return self._driver.sched.memory.used_total()
            accounted = sum(rt.resident_bytes() for rt in self.runtimes.values())
            return accounted, self.options.run.memory_gb * GIB
        now = time.monotonic()
        if now - self._memory_cache[0] < 0.1:
            return self._memory_cache[1], self._memory_cache[2]
        used: float | None
        total: float | None
        try:
            used, total = (
                cuda_memory_bytes(dev.index or 0) if dev.kind == "cuda" else host_memory_bytes()
            )
        except Exception:
            used = total = None
        self._memory_cache = (now, used, total)
        return used, total

    def _snapshot(self) -> DeviceSnapshot:
        used, total = self.memory_bytes()
        d = self._driver
        now = self.clock.now()
        return DeviceSnapshot(
            busy_ratio=d.sched.busy.fraction(now) if d else 0.0,
            busy_seconds_total=d.sched.busy.total_s(now) if d else 0.0,
            memory_used_bytes=used,
            memory_total_bytes=total,
            instances=self.options.run.instances,
            queued_by_model=d.sched.queued_by_model() if d else {m: 0 for m in self.entries},
            in_flight_by_model=d.sched.in_flight_by_model() if d else {m: 0 for m in self.entries},
        )

    def load_report(self) -> LoadReport:
        d = self.driver
        now = self.clock.now()
        used, total = self.memory_bytes()
        return LoadReport(
            timestamp_s=time.time(),
            device=self.device.name,
            queue_depth=d.sched.waiting,
            in_flight=d.sched.in_flight,
            queued_by_model=d.sched.queued_by_model(),
            in_flight_by_model=d.sched.in_flight_by_model(),
            utilization=d.sched.busy.fraction(now),
            utilization_window_s=self.options.utilization_window_s,
            memory_used_bytes=used,
            memory_total_bytes=total,
            busy_remaining_s=d.sched.busy_remaining_s(now),
            max_batch_size_by_model=d.sched.max_batch_size,
            slo_ms_by_model={m: s * 1000.0 for m, s in d.sched.slo_s.items()},
            max_queue_by_model=d.sched.max_queue,
            ready=self.ready,
        )

    # -- descriptions ------------------------------------------------------------------------
    def model_config_json(self, name: str) -> dict[str, Any]:
        """The model's configuration in the shape of Triton's model config JSON."""
        e = self.entries[name]
        spec = self.batching_specs[name]
        policy = self.policies[name]
        ours = {
            "evenserve_device": {"string_value": self.device.name},
            "evenserve_batching": {"string_value": spec_label(spec)},
            "evenserve_runtime": {
                "string_value": json.dumps(self.descriptions.get(name, {}), default=str)
            },
        }
        if e.notes:
            ours["evenserve_ignored"] = {"string_value": json.dumps(e.notes)}
        if e.triton_config is not None:
            # A Triton repository's model: its own config, as Triton clients expect it.
            triton = copy.deepcopy(e.triton_config)
            triton["name"] = name
            triton["parameters"] = {**triton.get("parameters", {}), **ours}
            return triton
        cfg: dict[str, Any] = {
            "name": name,
            "platform": f"evenserve_{e.config.runtime}",
            "backend": "evenserve",
            "max_batch_size": e.config.max_batch_size,
            **{
                kind: [
                    {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.shape} for t in ts
                ]
                for kind, ts in (("input", e.config.inputs), ("output", e.config.outputs))
            },
            "instance_group": [
                {
                    "name": name,
                    "count": self.options.run.instances,
                    "kind": "KIND_GPU" if self.device.kind == "cuda" else "KIND_CPU",
                }
            ],
            "version_policy": {"specific": {"versions": [e.config.version]}},
            "parameters": ours,
        }
        if policy.max_batch_size > 1:
            delay_ms = spec.get("max_batch_delay_ms", spec.get("max_wait_ms", 0)) or 0
            cfg["dynamic_batching"] = {
                "max_queue_delay_microseconds": int(float(delay_ms) * 1000),
                "preferred_batch_size": [policy.max_batch_size],
            }
        if e.config.slo_ms is not None:
            cfg["parameters"]["evenserve_slo_ms"] = {"string_value": str(e.config.slo_ms)}
        return cfg

    def model_metadata_json(self, name: str) -> dict[str, Any]:
        e = self.entries[name]
        triton = e.triton_config or {}
        return {
            "name": name,
            "versions": [e.config.version],
            "platform": triton.get("platform") or f"evenserve_{e.config.runtime}",
            **{
                kind: [
                    {"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in ts
                ]
                for kind, ts in (("inputs", e.config.inputs), ("outputs", e.config.outputs))
            },
        }
