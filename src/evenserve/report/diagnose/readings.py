"""One arm's summary as the detectors read it (``Run``: devices, models, policies, queue
series), the figures they share (a profile's per-item ratio), and the changes several
detectors propose (better routing, a replica on the idlest device, a batch cap)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from evenserve.policy.batching import BATCHING
from evenserve.report.diagnose.findings import Candidate


def num(x: Any) -> float | None:
    """``x`` as a finite float; None when it is not a number (a figure not measured)."""
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def mean(xs: Iterable[float]) -> float:
    v = list(xs)
    return sum(v) / len(v) if v else 0.0


def per_item_ratio(profile: Mapping[str, Any] | None, batch: int = 8) -> float | None:
    """Per-item time at ``batch`` / per-item time at 1, from a profile's points (linear
    between them, the last segment beyond): 1 = compute-bound (batching gains nothing),
    small = memory-bound (a batch costs little more than one request)."""
    if not profile:
        return None
    bs = [int(b) for b in profile.get("batches", [])]
    ms = [float(x) for x in profile.get("latency_ms", [])]
    if len(bs) < 2 or len(bs) != len(ms):
        return None

    def at(b: float) -> float:
        if b <= bs[0]:
            return ms[0]
        for i in range(1, len(bs)):
            if b <= bs[i] or i == len(bs) - 1:
                a0, a1, t0, t1 = bs[i - 1], bs[i], ms[i - 1], ms[i]
                return t0 + (t1 - t0) * (b - a0) / (a1 - a0)
        return ms[-1]

    return (at(batch) / batch) / at(1)


BETTER_ROUTING: dict[str, Any] = {"policy": "least-expected-work"}
GREEDY = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0.0}
#: Every parameter spelled out: a worker fills a missing ``max_batch_size`` from the model's
#: config (which may exceed the cap), so what is pushed is exactly what was simulated.
ADAPTIVE = BATCHING.resolved({"policy": "adaptive"})


class Run:
    """Readings of one arm's summary that several detectors share."""

    def __init__(self, arm: Mapping[str, Any]) -> None:
        self.arm = arm
        self.devices: dict[str, Mapping[str, Any]] = dict(arm.get("devices") or {})
        self.models: dict[str, Mapping[str, Any]] = dict(arm.get("models") or {})
        self.routing: Mapping[str, Any] = arm.get("routing_spec") or {}
        self.batching: Mapping[str, Mapping[str, Any]] = arm.get("batching_spec") or {}
        ts = arm.get("timeseries") or {}
        self.queue_ts: dict[str, list[float]] = dict(ts.get("queue_depth") or {})
        #: Devices slower than their profile for a reason already named (slower batches,
        #: input staging): not also reported hot or imbalanced.
        self.slow: set[str] = set()

    def util(self, d: str) -> float | None:
        return num(self.devices[d].get("utilization"))

    def depth(self, d: str) -> float:
        return num(self.devices[d].get("mean_queue_depth")) or 0.0

    def hosts(self, model: str) -> list[str]:
        return [d for d, v in self.devices.items() if model in (v.get("models") or [])]

    def least_busy(self, exclude: Iterable[str], model: str | None = None) -> str | None:
        """The idlest device (by utilization) outside ``exclude`` (not hosting ``model``)."""
        ex = set(exclude)
        pool = [
            d
            for d in self.devices
            if d not in ex
            and self.util(d) is not None
            and (model is None or model not in (self.devices[d].get("models") or []))
        ]
        return min(pool, key=lambda d: (self.util(d) or 0.0, d)) if pool else None

    def policy(self, model: str) -> Mapping[str, Any]:
        return self.batching.get(model) or {}

    def routing_name(self) -> str:
        return str(self.routing.get("policy", ""))


def routing_candidate(run: Run) -> list[Candidate]:
    if run.routing_name() in ("least-expected-work", "central-queue", ""):
        return []
    return [
        Candidate(
            f"route by predicted finish (least-expected-work) instead of {run.routing_name()}",
            params={"routing": BETTER_ROUTING},
        )
    ]


def replicate(run: Run, d: str, model: str) -> Candidate | None:
    to = run.least_busy([d], model)
    if to is None:
        return None
    return Candidate(
        f"place a copy of {model} on {to} (the idlest device)", placement={to: [model]}
    )


def cap_update(run: Run, model: str, cap: int) -> dict[str, Any]:
    """The model's policy with batches of up to ``cap`` (a static size becomes dynamic
    batching with no window: a static batch of ``cap`` would wait to fill)."""
    spec = dict(run.policy(model))
    if spec.get("policy", "static") == "static":
        spec = {**GREEDY, "max_batch_size": cap}
    else:
        spec["max_batch_size"] = cap
    return {"batching_per_model": {model: spec}}
