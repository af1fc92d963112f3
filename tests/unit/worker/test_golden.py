"""Golden test: one arrival trace, the same batch decisions in the simulator and the live driver.

The simulator's devices (sim.device, event heap, virtual clock) and the worker's BatchDriver
(asyncio callbacks, FakeClock + FakeTimer, a virtual executor) are both thin drivers of one
DeviceScheduler (sched); for the same arrivals they must start the same batches, in the
same order, at the same times.

The second test adds what issue 6 brought: two priority classes (per model and per request),
deadlines, a queue bound (queue-full refusals and sheds), a starvation bound, the class
headroom, and the step-down / adaptive / deadline policies. There every request's fate must
also agree: completed, or refused with the same reason.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from evenserve.core.results import RunRecords
from evenserve.policy.batching import BATCHING
from evenserve.sched import DeviceScheduler
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import load_scenario
from evenserve.worker.batch import PendingRequest
from evenserve.worker.refusals import RefusedError

from .fakes import make_driver, profile

PROFILES = {
    "fast": {1: 2.0, 4: 4.0, 8: 6.0},
    "slow": {1: 7.0, 4: 15.0, 8: 24.0},
}

ARMS = {
    "fixed": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 4},
    "static": {"policy": "static", "batch_size": 4, "max_wait_ms": 6},
    "none": "none",
}


def _trace(path: Path, n: int = 400, seed: int = 11) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        # Bursty arrivals: mostly dense, sometimes a pause longer than any window.
        t += rng.expovariate(900.0) if rng.random() < 0.9 else rng.uniform(0.02, 0.05)
        out.append((round(t, 9), rng.choice(["fast", "slow"])))
    path.write_text("".join(json.dumps({"t_s": t, "model": m}) + "\n" for t, m in out))
    return out


def simulate_on_the_scheduler(tmp_path: Path, arm: str) -> RunRecords:
    sim = Simulation(load_scenario(tmp_path / "sc.yaml"), arm)
    assert [type(d.sched) for d in sim.devices] == [DeviceScheduler]
    return sim.run()


def _write_profiles(tmp_path: Path) -> None:
    prof_dir = tmp_path / "profiles"
    prof_dir.mkdir(exist_ok=True)
    for m, pts in PROFILES.items():
        (prof_dir / f"{m}.yaml").write_text(
            yaml.safe_dump(
                {
                    "model": m,
                    "device": "toy",
                    "runtime": "test",
                    "precision": "fp32",
                    "source": "test",
                    "points": [{"batch": b, "latency_ms": v} for b, v in pts.items()],
                }
            )
        )


@pytest.mark.parametrize("instances", [1, 2, 3])
@pytest.mark.parametrize("arm", sorted(ARMS))
async def test_simulator_and_live_driver_make_the_same_batches(
    tmp_path: Path, arm: str, instances: int
) -> None:
    """With several instances, concurrent batches share the device (core.contention) on both
    sides: the simulator's device and the driver's virtual executor."""
    _write_profiles(tmp_path)
    trace = _trace(tmp_path / "trace.jsonl")
    end = trace[-1][0] + 1.0
    (tmp_path / "sc.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "golden",
                "seed": 0,
                "duration_s": end,
                "profile_sets": {"toy": "profiles"},
                "devices": [{"name": "dev0", "models": ["fast", "slow"], "instances": instances}],
                "models": {"fast": {"slo_ms": 100}, "slow": {"slo_ms": 100}},
                "workload": {"type": "trace", "path": "trace.jsonl"},
                "arms": {arm: {"routing": "round-robin", "batching": ARMS[arm]}},
            }
        )
    )
    records = simulate_on_the_scheduler(tmp_path, arm)
    sim_dev = records.devices[0]

    profiles = {m: profile(m, pts) for m, pts in PROFILES.items()}
    h = make_driver({m: ARMS[arm] for m in PROFILES}, profiles, instances=instances)
    assert type(h.driver.sched) is DeviceScheduler
    for t, m in trace:
        h.timer.advance_to(t)
        h.driver.submit(m, None)
    h.timer.run_until_idle()

    live_sizes = [n for _, _, n in h.rec.started]
    live_starts = [t for t, _, _ in h.rec.started]
    assert len(live_sizes) > 50
    assert max(live_sizes) > 1 or arm == "none"  # the trace does exercise batching
    assert live_sizes == sim_dev.batch_sizes
    assert live_starts == pytest.approx(sim_dev.busy_start_s, abs=1e-9)
    assert sum(live_sizes) == len(trace)
    assert _overlapping(sim_dev.busy_start_s, sim_dev.busy_end_s) == (instances > 1)
    BATCHING.build(ARMS[arm])  # the spec is a registered policy, as both sides used


CLASS_POLICIES = {
    "fixed": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 4},
    "step-down": {"policy": "step-down", "max_batch_size": 8, "delays_ms": [8, 4, 2]},
    "adaptive": {"policy": "adaptive", "max_batch_size": 4, "max_batch_cap": 8},
    "adaptive-wait": {
        "policy": "adaptive",
        "max_batch_size": 4,
        "max_batch_cap": 8,
        "max_delay_ms": 3,
    },
    "deadline": {"policy": "deadline", "max_batch_size": 8, "max_delay_ms": 3},
}
#: Device options of the arm: queue bound, starvation bound, class headroom.
CLASS_OPTIONS = {
    "bound+starvation": {"max_queue_per_model": 12, "starvation_ms": 40},
    "bound+starvation+headroom": {
        "max_queue_per_model": 12,
        "starvation_ms": 40,
        "class_headroom": 0.1,
    },
}
#: Default class of each model (a request may bring its own).
MODEL_PRIORITY = {"fast": 10, "slow": 0}


DENSE_RPS = 2000.0


def _class_trace(
    path: Path, n: int = 500, seed: int = 5, dense_rps: float = DENSE_RPS
) -> list[dict[str, object]]:
    """Two classes, some deadlines, dense stretches that overload the device and pauses."""
    rng = random.Random(seed)
    t = 0.0
    out: list[dict[str, object]] = []
    for i in range(n):
        phase = (i // 100) % 2  # 100 dense arrivals, then 100 lighter ones
        rate = dense_rps if phase == 0 else 150.0
        t += rng.expovariate(rate) if rng.random() < 0.95 else rng.uniform(0.02, 0.06)
        model = rng.choice(["fast", "slow"])
        e: dict[str, object] = {"t_s": round(t, 9), "model": model}
        x = rng.random()
        if model == "fast" and x < 0.2:  # slow stays offline: the headroom has work to hold
            e["priority"] = "offline"
        elif x < 0.25:
            e["priority"] = 5 if model == "fast" else "offline"
        if rng.random() < 0.4:
            e["deadline_ms"] = rng.choice([12.0, 25.0, 40.0, 80.0])
        out.append(e)
    path.write_text("".join(json.dumps(e) + "\n" for e in out))
    return out


def _overlapping(starts: list[float], ends: list[float]) -> bool:
    """Whether any two batches ran at once (so the shared-device model was exercised)."""
    spans = sorted(zip(starts, ends, strict=True))
    return any(nxt[0] < cur[1] - 1e-12 for cur, nxt in itertools.pairwise(spans))


def _reason(req: PendingRequest) -> str | None:
    assert req.future is not None and req.future.done()
    exc = req.future.exception()
    if exc is None:
        return None
    assert isinstance(exc, RefusedError), exc
    return exc.reason


@pytest.mark.parametrize("instances", [1, 2])
@pytest.mark.parametrize("options", sorted(CLASS_OPTIONS))
@pytest.mark.parametrize("policy", sorted(CLASS_POLICIES))
async def test_classes_deadlines_and_bounds_make_the_same_decisions(
    tmp_path: Path, policy: str, options: str, instances: int
) -> None:
    _write_profiles(tmp_path)
    # More instances serve more: denser stretches still overload the device.
    trace = _class_trace(tmp_path / "trace.jsonl", dense_rps=DENSE_RPS * instances)
    last_t = float(trace[-1]["t_s"])  # type: ignore[arg-type]
    opts = CLASS_OPTIONS[options]
    spec = CLASS_POLICIES[policy]
    slo_ms = 30.0
    (tmp_path / "sc.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "golden-classes",
                "seed": 0,
                "duration_s": last_t + 2.0,
                "profile_sets": {"toy": "profiles"},
                "devices": [{"name": "dev0", "models": ["fast", "slow"], "instances": instances}],
                "models": {m: {"slo_ms": slo_ms, "priority": p} for m, p in MODEL_PRIORITY.items()},
                "workload": {"type": "trace", "path": "trace.jsonl"},
                "arms": {"arm": {"routing": "round-robin", "batching": spec, **opts}},
            }
        )
    )
    records = simulate_on_the_scheduler(tmp_path, "arm")
    sim_dev = records.devices[0]
    sim_log = records.requests

    profiles = {m: profile(m, pts) for m, pts in PROFILES.items()}
    starvation_ms = opts.get("starvation_ms")
    h = make_driver(
        {m: spec for m in PROFILES},
        profiles,
        max_queue=int(opts["max_queue_per_model"]),
        priorities=MODEL_PRIORITY,
        slos_s={m: slo_ms / 1000.0 for m in PROFILES},
        starvation_s=None if starvation_ms is None else float(starvation_ms) / 1000.0,
        class_headroom=None if "class_headroom" not in opts else float(opts["class_headroom"]),
        instances=instances,
    )
    assert type(h.driver.sched) is DeviceScheduler
    fates: list[PendingRequest | str] = []
    for e in trace:
        h.timer.advance_to(float(e["t_s"]))  # type: ignore[arg-type]
        prio = e.get("priority")
        deadline_ms = e.get("deadline_ms")
        try:
            fates.append(
                h.driver.submit(
                    str(e["model"]),
                    None,
                    priority={"online": 10, "offline": 0}.get(prio, prio),  # type: ignore[arg-type]
                    deadline_in_s=None if deadline_ms is None else float(deadline_ms) / 1000.0,  # type: ignore[arg-type]
                )
            )
        except RefusedError as exc:
            fates.append(exc.reason)
    h.timer.run_until_idle()

    live_sizes = [n for _, _, n in h.rec.started]
    assert live_sizes == sim_dev.batch_sizes
    assert [t for t, _, _ in h.rec.started] == pytest.approx(sim_dev.busy_start_s, abs=1e-9)
    live_fate = [f if isinstance(f, str) else _reason(f) for f in fates]
    assert live_fate == list(sim_log.drop_reason)
    # The trace exercises what it is meant to: every refusal reason, sheds, starvation.
    reasons = {r for r in live_fate if r is not None}
    assert reasons == {"queue-full", "shed", "deadline-infeasible", "deadline-expired"}
    assert max(live_sizes) > 1
    assert _overlapping(sim_dev.busy_start_s, sim_dev.busy_end_s) == (instances > 1)
    assert h.driver.idle and h.driver.sched.waiting == 0
    # Refusals are reported to the observer once each, with the same reasons.
    assert sorted(r for _, r in h.rec.dropped) == sorted(r for r in live_fate if r is not None)
