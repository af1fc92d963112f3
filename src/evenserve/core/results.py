"""Raw records of one run (simulated or live), from which every report figure is computed.

One schema for both sources keeps the simulator's and the live bench's figures comparable:
the simulator fills it from its event loop, the load generator from its samples and scrapes.
"""

from __future__ import annotations

import math
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestLog:
    """Column-wise per-request records; ``finish_s`` is NaN while a request is unfinished.
    The time columns are lists, or typed arrays of doubles (``array('d')``: the simulator's,
    a million requests without a float object each); read them as sequences of floats."""

    model: list[str] = field(default_factory=list)
    arrival_s: MutableSequence[float] = field(default_factory=list)
    finish_s: MutableSequence[float] = field(default_factory=list)
    device: list[str] = field(default_factory=list)
    drop_reason: list[str | None] = field(default_factory=list)
    priority: list[int] = field(default_factory=list)
    #: Seconds a request waited for its model to load (request index -> seconds; only the
    #: requests that waited for a load: until it was done, or until they timed out).
    load_wait_s: dict[int, float] = field(default_factory=dict)

    def add(self, model: str, arrival_s: float, priority: int = 10) -> int:
        self.model.append(model)
        self.priority.append(priority)
        self.arrival_s.append(arrival_s)
        self.finish_s.append(math.nan)
        self.device.append("")
        self.drop_reason.append(None)
        return len(self.model) - 1

    def __len__(self) -> int:
        return len(self.model)


@dataclass
class DeviceTrace:
    """What a device did: busy intervals, sampled queue depth, and exact queue figures if known.
    The per-batch time columns are lists, or typed arrays of doubles (``array('d')``: the
    simulator's); read them as sequences of floats."""

    name: str
    busy_start_s: MutableSequence[float] = field(default_factory=list)
    busy_end_s: MutableSequence[float] = field(default_factory=list)
    queue_t_s: list[float] = field(default_factory=list)
    queue_depth: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    #: Per batch, in start order like ``batch_sizes`` (the simulator; empty live, where the
    #: worker's counters carry the same figures): its model, the seconds its instance sat
    #: idle while its oldest request waited (``sched.Batch.held_s``), its policy's cap, the
    #: profile's expected seconds, the input staging seconds, and the device memory in use
    #: (weights and running batches) as a fraction of the total once it started (NaN:
    #: total unknown).
    batch_models: list[str] = field(default_factory=list)
    batch_held_s: MutableSequence[float] = field(default_factory=list)
    batch_cap: list[int] = field(default_factory=list)
    batch_expected_s: MutableSequence[float] = field(default_factory=list)
    batch_staging_s: MutableSequence[float] = field(default_factory=list)
    batch_memory_fraction: MutableSequence[float] = field(default_factory=list)
    #: Exact time-weighted mean and max queue depth over the measured window, when the source
    #: saw every change (the simulator does; a live scrape only sees samples).
    exact_mean_queue_depth: float | None = None
    exact_max_queue_depth: float | None = None
    #: Samples of a cumulative busy-time counter (a live run scrapes the worker's
    #: ``evenserve_worker_device_busy_seconds_total``): times and busy seconds so far. Used
    #: for utilization when busy intervals are not known; linear between samples.
    busy_t_s: list[float] = field(default_factory=list)
    busy_total_s: list[float] = field(default_factory=list)
    #: Batches the device runs at once; busy intervals overlap up to this many deep and
    #: utilization is their total over ``instances`` x time.
    instances: int = 1
    #: The models it hosted, and each one's profile here as (batch sizes, ms per batch).
    models: list[str] = field(default_factory=list)
    profiles: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    #: Seconds the device was on (turned on to turned off; the cost a user pays), over the
    #: whole run; None when not known (a live run).
    active_s: float | None = None
    #: The diagnosis figures (``report.device_figures.device_diagnostics``'s keys) measured some
    #: other way than per batch: a live run computes them from the worker's counters over
    #: the window (``loadgen.records``). None: computed from the per-batch records.
    measured_diagnostics: dict[str, Any] | None = None


@dataclass
class RunRecords:
    scenario: str
    arm: str
    routing: str
    batching: str
    seed: int
    warmup_s: float
    end_s: float
    slo_ms: dict[str, float]
    requests: RequestLog
    devices: list[DeviceTrace]
    timeseries_interval_s: float = 1.0
    #: Queue depth of a central queue (central-queue arm): exact max and mean in the window.
    central_max_queue_depth: float | None = None
    central_mean_queue_depth: float | None = None
    #: Every device's ``active_s`` summed over the whole run (the simulator: all devices
    #: on for the whole run unless the arm has placement with autoscaling); None: not known.
    device_seconds: float | None = None
    #: Placement (an arm with ``placement``; 0 otherwise): model loads started (cold: from
    #: disk; warm: from host memory) and evictions (unloads, to make room or by rebalance).
    loads: int = 0
    warm_loads: int = 0
    evictions: int = 0
    #: Per model, the bound a cold request's latency is held to: its cold load time plus
    #: two of its batch times (seconds; placement arms only, {} otherwise).
    load_bound_s: dict[str, float] = field(default_factory=dict)
    #: The policies in force, every parameter spelled out (``Registry.resolved``): routing,
    #: and batching per model ({} when not known).
    routing_spec: dict[str, object] = field(default_factory=dict)
    batching_spec: dict[str, dict[str, object]] = field(default_factory=dict)
    #: Times of the autoscaler's ScaleUp decisions (simulator; empty live or without one).
    scale_ups_s: list[float] = field(default_factory=list)
    #: Per ScaleUp decided in a burst: seconds from the burst's first request to it (the
    #: burst clock of policy.placement.burst, the gateway's scale-up decision-time gauge).
    scale_up_decisions_s: list[float] = field(default_factory=list)
    #: The placement controller's decisions (``policy.placement.controller.Decision``:
    #: time, source, kind, model, device, rate_rps, utilization), oldest first (simulator;
    #: [] live).
    placement_decisions: list[tuple[float, str, str, str, str, float, float]] = field(
        default_factory=list
    )
