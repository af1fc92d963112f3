"""Findings from one run's summary: a named cause, its evidence and severity, and the changes
that might fix it (pure: reads the summary dict that ``report.summary.summarize`` writes, or a
live collection of the same shape; docs/design/0012-diagnose.md).

Each detector reads figures the run measured and stays quiet when a figure is missing (None):
a live run without a figure cannot show the cause, and a finding is never made of a 0 that
was not measured. One cause is reported once: a device slower than its profile (or stalled
on input staging) is not also reported hot or imbalanced, a compute-bound model that waits
is not also "window too long".

A finding's ``candidates`` are concrete changes (a partial parameter set, a placement change,
or a device change) that ``experiment.diagnose`` tries in the simulator on the same
arrivals; the best one becomes the finding's ``recommendation``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evenserve.policy.batching import BATCHING

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


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def _mean(xs: Iterable[float]) -> float:
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


#: Routing policies that read the devices' queues or predicted work.
QUEUE_AWARE = frozenset({"queue-aware", "least-expected-work", "power-of-two", "least-connections"})
BETTER_ROUTING: dict[str, Any] = {"policy": "least-expected-work"}
GREEDY = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0.0}
#: Every parameter spelled out: a worker fills a missing ``max_batch_size`` from the model's
#: config (which may exceed the cap), so what is pushed is exactly what was simulated.
ADAPTIVE = BATCHING.resolved({"policy": "adaptive"})


class _Run:
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
        return _num(self.devices[d].get("utilization"))

    def depth(self, d: str) -> float:
        return _num(self.devices[d].get("mean_queue_depth")) or 0.0

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


def _routing_candidate(run: _Run) -> list[Candidate]:
    if run.routing_name() in ("least-expected-work", "central-queue", ""):
        return []
    return [
        Candidate(
            f"route by predicted finish (least-expected-work) instead of {run.routing_name()}",
            params={"routing": BETTER_ROUTING},
        )
    ]


def _replicate(run: _Run, d: str, model: str) -> Candidate | None:
    to = run.least_busy([d], model)
    if to is None:
        return None
    return Candidate(
        f"place a copy of {model} on {to} (the idlest device)", placement={to: [model]}
    )


def detect_slow_device(run: _Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        r = _num(v.get("observed_vs_profile"))
        if r is None or r < th.slow_ratio:
            continue
        run.slow.add(d)
        out.append(
            Finding(
                "slow-device",
                "warning",
                f"{d} runs its batches {r:.2f}x slower than its profile says; routing and "
                f"batching plan with the profile",
                {"observed_vs_profile": r, "utilization": run.util(d)},
                device=d,
                candidates=[
                    Candidate(
                        "learn each device's profile from its measured batch times",
                        params={"learn_profiles": True},
                    )
                ],
            )
        )
    return out


def staging_devices(run: _Run, th: Thresholds) -> set[str]:
    """Devices whose input staging is a transfer stall (``detect_transfer_stall``'s rule)."""
    return {
        d
        for d, v in run.devices.items()
        if (s := _num(v.get("staging_fraction"))) is not None and s >= th.staging_share
    }


def detect_hot_node(run: _Run, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    if len(run.devices) < 2:
        return out
    for d in run.devices:
        if d in run.slow:
            continue  # the slow device is the cause; reported once
        others = [o for o in run.devices if o != d]
        q = run.depth(d)
        rest = _mean(run.depth(o) for o in others)
        if q < th.hot_min_depth or q < th.hot_ratio * max(rest, 0.2):
            continue
        series = run.queue_ts.get(d) or []
        share = None
        if series and all(run.queue_ts.get(o) for o in others):
            hot_bins = 0
            for i, x in enumerate(series):
                rest_i = _mean(run.queue_ts[o][i] for o in others if i < len(run.queue_ts[o]))
                hot_bins += x >= th.hot_ratio * max(rest_i, 0.2) and x >= th.hot_min_depth
            share = hot_bins / len(series)
            if share < th.hot_time_share:
                continue
        models = list(run.devices[d].get("models") or [])
        only_here = [m for m in models if run.hosts(m) == [d]]
        cands = _routing_candidate(run)
        for m in sorted(models, key=lambda m: (len(run.hosts(m)), m)):
            c = _replicate(run, d, m)
            if c is not None:
                cands.append(c)
                break
        out.append(
            Finding(
                "hot-node",
                "critical",
                f"{d}'s queue ({q:.1f} deep on average) stays over {th.hot_ratio:g}x the "
                f"others' ({rest:.1f})"
                + (f"; {', '.join(only_here)} is served only here" if only_here else ""),
                {
                    "mean_queue_depth": q,
                    "others_mean_queue_depth": round(rest, 6),
                    "share_of_time_hot": None if share is None else round(share, 6),
                    "utilization": run.util(d),
                    "others_utilization": round(_mean(run.util(o) or 0.0 for o in others), 6),
                    "models": models,
                    "served_only_here": only_here,
                    "routing": run.routing_name() or None,
                },
                device=d,
                candidates=cands,
            )
        )
    return out


def detect_imbalance(run: _Run, th: Thresholds, hot: set[str]) -> list[Finding]:
    """Work waits on one host of a model while another host of it has little: the busier
    host's queue at least ``imbalance_min_depth`` and ``imbalance_queue_ratio`` times the
    idler's (a work-conserving batcher keeps both busy, so queues show it, not utilization),
    or its utilization ``imbalance_spread`` above the idler's. Not where hot-node or
    slow-device already names the cause."""
    seen: set[str] = set()
    out = []
    for m in sorted(run.models):
        hosts = [h for h in run.hosts(m) if run.util(h) is not None]
        if len(hosts) < 2:
            continue
        busy = max(hosts, key=lambda h: (run.depth(h), h))
        idle = min(hosts, key=lambda h: (run.depth(h), h))
        ub, ui = run.util(busy) or 0.0, run.util(idle) or 0.0
        qb, qi = run.depth(busy), run.depth(idle)
        if busy in hot or busy in run.slow or idle in run.slow or busy in seen:
            continue
        if qb < th.imbalance_min_depth:
            continue
        by_queue = qb >= th.imbalance_queue_ratio * max(qi, 0.1)
        by_util = ub - ui >= th.imbalance_spread
        if not by_queue and not by_util:
            continue
        seen.add(busy)
        out.append(
            Finding(
                "scheduling-imbalance",
                "warning",
                f"work waits on {busy} (queue {qb:.1f}, {ub:.0%} busy) while {idle}, which "
                f"also serves {m}, has {qi:.1f} waiting ({ui:.0%} busy)",
                {
                    "busy_device": busy,
                    "busy_utilization": ub,
                    "busy_mean_queue_depth": qb,
                    "idle_device": idle,
                    "idle_utilization": ui,
                    "idle_mean_queue_depth": qi,
                    "routing": run.routing_name() or None,
                },
                device=busy,
                model=m,
                candidates=_routing_candidate(run),
            )
        )
    return out


#: Drop reasons that mean the system turned work away under load.
SHED_REASONS = frozenset(
    {"overloaded", "queue-full", "shed", "deadline-expired", "deadline-infeasible"}
)


def detect_shedding(run: _Run, th: Thresholds) -> list[Finding]:
    req = run.arm.get("requests") or {}
    arrived = int(req.get("arrived") or 0)
    reasons = {k: int(v) for k, v in (req.get("dropped_by_reason") or {}).items()}
    shed = sum(v for k, v in reasons.items() if k in SHED_REASONS)
    if not arrived or shed / arrived < th.shed_share:
        return []
    worst = max(run.models, key=lambda m: int(run.models[m].get("dropped") or 0), default=None)
    cands = _routing_candidate(run)
    if worst is not None:
        hosts = run.hosts(worst)
        if hosts:
            c = _replicate(run, hosts[0], worst)
            if c is not None:
                cands.append(c)
    return [
        Finding(
            "overload-shedding",
            "critical",
            f"{shed} of {arrived} requests ({shed / arrived:.1%}) were refused or shed",
            {
                "refused": shed,
                "arrived": arrived,
                "share": round(shed / arrived, 6),
                "by_reason": {k: v for k, v in sorted(reasons.items()) if k in SHED_REASONS},
                "most_refused_model": worst,
            },
            model=worst,
            candidates=cands,
        )
    ]


def detect_transfer_stall(run: _Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        s = _num(v.get("staging_fraction"))
        if s is None or s < th.staging_share:
            continue
        out.append(
            Finding(
                "transfer-stall",
                "warning",
                f"{d} spends {s:.0%} of its busy time staging inputs onto the device, not "
                f"computing: use pinned host memory and overlap the copy with compute, or "
                f"send smaller inputs (uint8 images, token ids)",
                {"staging_fraction": s, "utilization": run.util(d)},
                device=d,
                candidates=[
                    Candidate(
                        "no input staging stall (pinned memory, overlapped copies): what it "
                        "would gain; a change to the model's input path, not a parameter",
                        devices={d: {"staging_ms_per_item": 0.0}},
                    )
                ],
            )
        )
    return out


def _cap_update(run: _Run, model: str, cap: int) -> dict[str, Any]:
    """The model's policy with batches of up to ``cap`` (a static size becomes dynamic
    batching with no window: a static batch of ``cap`` would wait to fill)."""
    spec = dict(run.policy(model))
    if spec.get("policy", "static") == "static":
        spec = {**GREEDY, "max_batch_size": cap}
    else:
        spec["max_batch_size"] = cap
    return {"batching_per_model": {model: spec}}


def detect_memory_pressure(run: _Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        mem = _num(v.get("memory_peak_fraction"))
        if mem is None or mem < th.memory_share:
            continue
        pm = v.get("per_model") or {}
        biggest = max(pm, key=lambda m: (pm[m].get("cap") or 0, m), default=None)
        cands = []
        if biggest is not None and (pm[biggest].get("cap") or 0) > 1:
            cap = max(1, int(pm[biggest]["cap"]) // 2)
            cands.append(
                Candidate(
                    f"halve {biggest}'s batch cap to {cap}", params=_cap_update(run, biggest, cap)
                )
            )
        out.append(
            Finding(
                "memory-pressure",
                "warning",
                f"{d}'s batches reach {mem:.0%} of its memory (batches are capped at 85 %)",
                {"memory_peak_fraction": mem, "models": list(v.get("models") or [])},
                device=d,
                model=biggest,
                candidates=cands,
            )
        )
    return out


def _window(spec: Mapping[str, Any]) -> tuple[str, float] | None:
    """A batching spec's window: its parameter's name and ms (None: the policy has none)."""
    for k in ("max_batch_delay_ms", "max_delay_ms", "max_wait_ms"):
        x = _num(spec.get(k))
        if x is not None:
            return k, x
    return None


def detect_batching(run: _Run, th: Thresholds) -> list[Finding]:
    """The per device-model batching findings: compute-bound-waiting, window-too-long,
    static-batch-wait, batching-sawtooth, memory-bound-small-batches (one per pair)."""
    out = []
    for d, v in run.devices.items():
        u = run.util(d)
        q = run.depth(d)
        for m, pm in sorted((v.get("per_model") or {}).items()):
            spec = run.policy(m)
            name = str(spec.get("policy", ""))
            held = _num(pm.get("held_fraction"))
            size = _num(pm.get("mean_batch_size"))
            cap = _num(pm.get("cap"))
            ratio = per_item_ratio(pm.get("profile"))
            if not pm.get("batches"):
                continue
            ev: dict[str, Any] = {
                "policy": dict(spec) or None,
                "held_fraction": held,
                "held_ms_mean": _num(pm.get("held_ms_mean")),
                "mean_batch_size": size,
                "cap": cap,
                "fill": _num(pm.get("fill")),
                "per_item_ratio_b8": None if ratio is None else round(ratio, 4),
                "utilization": u,
                "mean_queue_depth": q,
            }
            holds = held is not None and held >= th.held_share
            if holds and ratio is not None and ratio >= th.compute_bound:
                out.append(
                    Finding(
                        "compute-bound-waiting",
                        "warning",
                        f"{m} on {d} is compute-bound (a batch of 8 costs "
                        f"{ratio:.0%} per item of a batch of one), yet its batches wait while "
                        f"the device idles {held:.0%} of the time",
                        ev,
                        device=d,
                        model=m,
                        candidates=[
                            Candidate(
                                f"{m}: no batching window (dispatch at once)",
                                params={"batching_per_model": {m: GREEDY}},
                            )
                        ],
                    )
                )
                continue
            if holds and name == "static":
                out.append(
                    Finding(
                        "static-batch-wait",
                        "warning",
                        f"{m} on {d}: static batches of {spec.get('batch_size')} wait to fill "
                        f"while the device sits idle {held:.0%} of the time",
                        ev,
                        device=d,
                        model=m,
                        candidates=[
                            Candidate(
                                f"{m}: dynamic batching (up to 8, no window) instead of "
                                f"static batches",
                                params={"batching_per_model": {m: GREEDY}},
                            ),
                            Candidate(
                                f"{m}: adaptive batching",
                                params={"batching_per_model": {m: ADAPTIVE}},
                            ),
                        ],
                    )
                )
                continue
            found = _window(spec)
            if holds and found is not None and found[1]:
                key, window = found
                out.append(
                    Finding(
                        "window-too-long",
                        "warning",
                        f"{m} on {d}: batches wait in a {window:g} ms window while the device "
                        f"sits idle {held:.0%} of the time",
                        ev | {"window_ms": window},
                        device=d,
                        model=m,
                        candidates=[
                            Candidate(
                                f"{m}: no batching window",
                                params={"batching_per_model": {m: {**dict(spec), key: 0.0}}},
                            ),
                            Candidate(
                                f"{m}: adaptive batching",
                                params={"batching_per_model": {m: ADAPTIVE}},
                            ),
                        ],
                    )
                )
                continue
            gains = ratio is not None and ratio <= th.memory_bound
            loaded = u is not None and u >= th.busy and q >= th.waiting_depth
            if gains and loaded and cap is not None and cap <= 1:
                burst = v.get("burst") or {}
                out.append(
                    Finding(
                        "batching-sawtooth",
                        "warning",
                        f"{m} on {d} runs one request at a time while requests wait; a "
                        f"batch of 8 would cost {ratio:.0%} per item",
                        ev
                        | {
                            "idle_bins": _num(burst.get("idle_bins")),
                            "full_bins": _num(burst.get("full_bins")),
                        },
                        device=d,
                        model=m,
                        candidates=[
                            Candidate(
                                f"{m}: dynamic batching (up to 8, no window)",
                                params={"batching_per_model": {m: GREEDY}},
                            ),
                            Candidate(
                                f"{m}: adaptive batching",
                                params={"batching_per_model": {m: ADAPTIVE}},
                            ),
                        ],
                    )
                )
                continue
            if (
                gains
                and loaded
                and cap is not None
                and 1 < cap < 8
                and size is not None
                and size >= 0.8 * cap
            ):
                new = int(cap) * 4
                out.append(
                    Finding(
                        "memory-bound-small-batches",
                        "warning",
                        f"{m} on {d} is memory-bound (a batch of 8 costs {ratio:.0%} per "
                        f"item) but its batches are capped at {cap:g} while work waits",
                        ev,
                        device=d,
                        model=m,
                        candidates=[
                            Candidate(
                                f"{m}: raise the batch cap to {new}",
                                params=_cap_update(run, m, new),
                            )
                        ],
                    )
                )
    return out


def detect_slo(run: _Run, th: Thresholds) -> list[Finding]:
    out = []
    for m, v in sorted(run.models.items()):
        slo = _num(v.get("slo_ms"))
        p99 = _num((v.get("latency_ms") or {}).get("p99"))
        att = _num(v.get("slo_attainment"))
        if slo is None:
            continue
        late = p99 is not None and p99 >= th.slo_p99_share * slo
        missed = att is not None and att < th.slo_attainment
        if not late and not missed:
            continue
        out.append(
            Finding(
                "slo-at-risk",
                "critical" if missed else "warning",
                f"{m}: P99 {p99:.1f} ms against its {slo:g} ms SLO"
                if p99 is not None
                else f"{m}: SLO attainment {att:.1%}",
                {"p99_ms": p99, "slo_ms": slo, "slo_attainment": att},
                model=m,
            )
        )
    return out


def diagnose_arm(arm: Mapping[str, Any], th: Thresholds = DEFAULT) -> list[Finding]:
    """Every finding of one arm's summary, most severe first (then in ``KINDS`` order)."""
    run = _Run(arm)
    found = detect_slow_device(run, th)
    run.slow |= staging_devices(run, th)
    hot = detect_hot_node(run, th)
    found += hot
    found += detect_imbalance(run, th, {f.device for f in hot if f.device})
    steps: list[Callable[[_Run, Thresholds], list[Finding]]] = [
        detect_shedding,
        detect_transfer_stall,
        detect_memory_pressure,
        detect_batching,
        detect_slo,
    ]
    for step in steps:
        found += step(run, th)
    # An outcome with no cause of its own gets the causes' changes to try.
    causes = [c for f in found if f.kind != "slo-at-risk" for c in f.candidates]
    for f in found:
        if f.kind == "slo-at-risk" and not f.candidates:
            f.candidates = _unique(causes) or _routing_candidate(run)
    order = {k: i for i, k in enumerate(KINDS)}
    found.sort(key=lambda f: (SEVERITIES.index(f.severity), order[f.kind], f.device or ""))
    return found


def _unique(cands: list[Candidate]) -> list[Candidate]:
    seen: set[str] = set()
    out = []
    for c in cands:
        if c.change not in seen:
            seen.add(c.change)
            out.append(c)
    return out


def window_of(arm: Mapping[str, Any]) -> tuple[float, float]:
    w = arm.get("window_s") or {}
    return float(w.get("start", 0.0)), float(w.get("end", 0.0))
