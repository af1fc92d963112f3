"""The findings about one model's batching on one device: compute-bound-waiting,
window-too-long, static-batch-wait, batching-sawtooth, memory-bound-small-batches (one per
device-model pair at most)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evenserve.report.diagnose.findings import Candidate, Finding, Thresholds
from evenserve.report.diagnose.readings import (
    ADAPTIVE,
    GREEDY,
    Run,
    cap_update,
    num,
    per_item_ratio,
)


def _window(spec: Mapping[str, Any]) -> tuple[str, float] | None:
    """A batching spec's window: its parameter's name and ms (None: the policy has none)."""
    for k in ("max_batch_delay_ms", "max_delay_ms", "max_wait_ms"):
        x = num(spec.get(k))
        if x is not None:
            return k, x
    return None


def detect_batching(run: Run, th: Thresholds) -> list[Finding]:
    """The per device-model batching findings: compute-bound-waiting, window-too-long,
    static-batch-wait, batching-sawtooth, memory-bound-small-batches (one per pair)."""
    out = []
    for d, v in run.devices.items():
        u = run.util(d)
        q = run.depth(d)
        for m, pm in sorted((v.get("per_model") or {}).items()):
            spec = run.policy(m)
            name = str(spec.get("policy", ""))
            held = num(pm.get("held_fraction"))
            size = num(pm.get("mean_batch_size"))
            cap = num(pm.get("cap"))
            ratio = per_item_ratio(pm.get("profile"))
            if not pm.get("batches"):
                continue
            ev: dict[str, Any] = {
                "policy": dict(spec) or None,
                "held_fraction": held,
                "held_ms_mean": num(pm.get("held_ms_mean")),
                "mean_batch_size": size,
                "cap": cap,
                "fill": num(pm.get("fill")),
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
                            "idle_bins": num(burst.get("idle_bins")),
                            "full_bins": num(burst.get("full_bins")),
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
                                params=cap_update(run, m, new),
                            )
                        ],
                    )
                )
    return out
