"""The findings about devices and the cluster: a device slower than its profile or stalled
on input staging, a hot node, an imbalance between a model's hosts, overload shedding,
memory pressure."""

from __future__ import annotations

from evenserve.report.diagnose.findings import Candidate, Finding, Thresholds
from evenserve.report.diagnose.readings import (
    Run,
    cap_update,
    mean,
    num,
    replicate,
    routing_candidate,
)


def detect_slow_device(run: Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        r = num(v.get("observed_vs_profile"))
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


def staging_devices(run: Run, th: Thresholds) -> set[str]:
    """Devices whose input staging is a transfer stall (``detect_transfer_stall``'s rule)."""
    return {
        d
        for d, v in run.devices.items()
        if (s := num(v.get("staging_fraction"))) is not None and s >= th.staging_share
    }


def detect_hot_node(run: Run, th: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    if len(run.devices) < 2:
        return out
    for d in run.devices:
        if d in run.slow:
            continue  # the slow device is the cause; reported once
        others = [o for o in run.devices if o != d]
        q = run.depth(d)
        rest = mean(run.depth(o) for o in others)
        if q < th.hot_min_depth or q < th.hot_ratio * max(rest, 0.2):
            continue
        series = run.queue_ts.get(d) or []
        share = None
        if series and all(run.queue_ts.get(o) for o in others):
            hot_bins = 0
            for i, x in enumerate(series):
                rest_i = mean(run.queue_ts[o][i] for o in others if i < len(run.queue_ts[o]))
                hot_bins += x >= th.hot_ratio * max(rest_i, 0.2) and x >= th.hot_min_depth
            share = hot_bins / len(series)
            if share < th.hot_time_share:
                continue
        models = list(run.devices[d].get("models") or [])
        only_here = [m for m in models if run.hosts(m) == [d]]
        cands = routing_candidate(run)
        for m in sorted(models, key=lambda m: (len(run.hosts(m)), m)):
            c = replicate(run, d, m)
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
                    "others_utilization": round(mean(run.util(o) or 0.0 for o in others), 6),
                    "models": models,
                    "served_only_here": only_here,
                    "routing": run.routing_name() or None,
                },
                device=d,
                candidates=cands,
            )
        )
    return out


def detect_imbalance(run: Run, th: Thresholds, hot: set[str]) -> list[Finding]:
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
                candidates=routing_candidate(run),
            )
        )
    return out


#: Drop reasons that mean the system turned work away under load.
SHED_REASONS = frozenset(
    {"overloaded", "queue-full", "shed", "deadline-expired", "deadline-infeasible"}
)


def detect_shedding(run: Run, th: Thresholds) -> list[Finding]:
    req = run.arm.get("requests") or {}
    arrived = int(req.get("arrived") or 0)
    reasons = {k: int(v) for k, v in (req.get("dropped_by_reason") or {}).items()}
    shed = sum(v for k, v in reasons.items() if k in SHED_REASONS)
    if not arrived or shed / arrived < th.shed_share:
        return []
    worst = max(run.models, key=lambda m: int(run.models[m].get("dropped") or 0), default=None)
    cands = routing_candidate(run)
    if worst is not None:
        hosts = run.hosts(worst)
        if hosts:
            c = replicate(run, hosts[0], worst)
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


def detect_transfer_stall(run: Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        s = num(v.get("staging_fraction"))
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


def detect_memory_pressure(run: Run, th: Thresholds) -> list[Finding]:
    out = []
    for d, v in run.devices.items():
        mem = num(v.get("memory_peak_fraction"))
        if mem is None or mem < th.memory_share:
            continue
        pm = v.get("per_model") or {}
        biggest = max(pm, key=lambda m: (pm[m].get("cap") or 0, m), default=None)
        cands = []
        if biggest is not None and (pm[biggest].get("cap") or 0) > 1:
            cap = max(1, int(pm[biggest]["cap"]) // 2)
            cands.append(
                Candidate(
                    f"halve {biggest}'s batch cap to {cap}", params=cap_update(run, biggest, cap)
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
