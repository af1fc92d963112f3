"""What a finding is: its kinds and severities, where each detector fires (``Thresholds``),
the finding itself and the changes it proposes (``Candidate``), and a run's window."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Severities, most severe first.
SEVERITIES = ("critical", "warning", "info")

#: The kinds of finding, in the order they are reported. ``slo-at-risk`` is an outcome (the
#: model's latency against its SLO); the others name causes.
KINDS = (
    "slow-device",
    "hot-node",
    "scheduling-imbalance",
    "overload-shedding",
    "transfer-stall",
    "memory-pressure",
    "compute-bound-waiting",
    "window-too-long",
    "static-batch-wait",
    "batching-sawtooth",
    "memory-bound-small-batches",
    "slo-at-risk",
)


@dataclass(frozen=True)
class Thresholds:
    """Where each detector fires (the defaults are the labelled set's; bench/diagnose_set.py)."""

    #: hot-node: a device's mean queue depth at least this many times the others' mean ...
    hot_ratio: float = 3.0
    #: ... and at least this deep, for at least this share of the run's 1 s bins.
    hot_min_depth: float = 2.0
    hot_time_share: float = 0.5
    #: scheduling-imbalance: between two hosts of one model, the busier's mean queue depth
    #: at least this many times the idler's, or its utilization this much higher ...
    imbalance_queue_ratio: float = 2.0
    imbalance_spread: float = 0.3
    #: ... while at least this much waits on the busier one.
    imbalance_min_depth: float = 1.0
    #: overload-shedding: requests refused or shed / requests arrived.
    shed_share: float = 0.01
    #: transfer-stall: input staging / busy time.
    staging_share: float = 0.2
    #: memory-pressure: peak memory in use / total (the batchers cap batches at 85 %).
    memory_share: float = 0.8
    #: slow-device: measured compute / the profile's expected time.
    slow_ratio: float = 1.3
    #: held work: a device idle with a model's requests waiting, this share of the run.
    held_share: float = 0.1
    #: compute-bound: per-item time at batch 8 / per-item time at batch 1 at least this.
    compute_bound: float = 0.8
    #: memory-bound: that ratio at most this (batching pays).
    memory_bound: float = 0.5
    #: batching-sawtooth / memory-bound-small-batches: a device at least this busy ...
    busy: float = 0.5
    #: ... with at least this much waiting (mean queue depth).
    waiting_depth: float = 0.5
    #: slo-at-risk: P99 at least this share of the SLO, or attainment below this.
    slo_p99_share: float = 0.8
    slo_attainment: float = 0.99


DEFAULT = Thresholds()


@dataclass
class Finding:
    kind: str
    severity: str
    summary: str
    evidence: dict[str, Any]
    device: str | None = None
    model: str | None = None
    #: Changes to try (``Candidate.to_json``), best guess first.
    candidates: list[Candidate] = field(default_factory=list)

    def to_json(self, window_s: tuple[float, float]) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "device": self.device,
            "model": self.model,
            "window_s": list(window_s),
            "summary": self.summary,
            "evidence": self.evidence,
            "candidates": [c.to_json() for c in self.candidates],
        }


@dataclass(frozen=True)
class Candidate:
    """One change to try. ``params``: a partial parameter set (``policy.params``; pushable
    live); ``placement``: models to add to devices ({device: [models]}); ``devices``: device
    fields to change in the simulator only (what a fix outside evenserve would do, e.g. no
    input staging), never pushable."""

    change: str
    params: dict[str, Any] | None = None
    placement: dict[str, list[str]] | None = None
    devices: dict[str, dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "params": self.params,
            "placement": self.placement,
            "devices": self.devices,
            "pushable": self.params is not None and not self.placement and not self.devices,
        }


def window_of(arm: Mapping[str, Any]) -> tuple[float, float]:
    w = arm.get("window_s") or {}
    return float(w.get("start", 0.0)), float(w.get("end", 0.0))
