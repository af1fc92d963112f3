"""Every finding of one arm's summary: the detectors in order, one cause reported once (a
slow or staging device is not also hot or imbalanced), and the outcome, ``slo-at-risk``,
which takes the causes' changes when it has none of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from evenserve.report.diagnose.batching import detect_batching
from evenserve.report.diagnose.devices import (
    detect_hot_node,
    detect_imbalance,
    detect_memory_pressure,
    detect_shedding,
    detect_slow_device,
    detect_transfer_stall,
    staging_devices,
)
from evenserve.report.diagnose.findings import (
    DEFAULT,
    KINDS,
    SEVERITIES,
    Candidate,
    Finding,
    Thresholds,
)
from evenserve.report.diagnose.readings import Run, num, routing_candidate


def detect_slo(run: Run, th: Thresholds) -> list[Finding]:
    out = []
    for m, v in sorted(run.models.items()):
        slo = num(v.get("slo_ms"))
        p99 = num((v.get("latency_ms") or {}).get("p99"))
        att = num(v.get("slo_attainment"))
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
    run = Run(arm)
    found = detect_slow_device(run, th)
    run.slow |= staging_devices(run, th)
    hot = detect_hot_node(run, th)
    found += hot
    found += detect_imbalance(run, th, {f.device for f in hot if f.device})
    steps: list[Callable[[Run, Thresholds], list[Finding]]] = [
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
            f.candidates = _unique(causes) or routing_candidate(run)
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
