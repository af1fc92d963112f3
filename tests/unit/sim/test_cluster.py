from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evenserve.report.summary import run_summary, summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario


def load(tmp_path: Path, **over: object):  # type: ignore[no-untyped-def]
    return load_scenario(write_scenario(tmp_path, toy_scenario(tmp_path, **over)))


def test_every_request_is_accounted_for(tmp_path: Path) -> None:
    ld = load(tmp_path)
    for arm in ld.scenario.arms:
        s = summarize(simulate(ld, arm))
        r = s["requests"]
        assert r["arrived"] > 5000
        assert r["arrived"] == r["completed"] + r["dropped"] + r["in_flight"]
        for d in s["devices"].values():
            assert 0.0 <= d["utilization"] <= 1.0


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    ld = load(tmp_path)

    def dump(seed: int) -> str:
        arms = {a: summarize(simulate(ld, a, seed)) for a in ld.scenario.arms}
        return json.dumps(run_summary("toy", seed, arms), sort_keys=True)

    assert dump(5) == dump(5)
    assert dump(5) != dump(6)


def trace_run(
    tmp_path: Path, lines: list[str], instances: int = 1
) -> tuple[list[float], dict[str, Any]]:
    """One device hosting fast and slow, batching 'none', a trace: latencies (ms), summary."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(line + "\n" for line in lines))
    ld = load(
        tmp_path,
        duration_s=3,
        warmup_s=0,
        devices=[{"name": "d0", "models": ["fast", "slow"], "instances": instances}],
        workload={"type": "trace", "path": str(trace)},
        arms={"one": {"routing": "round-robin", "batching": "none"}},
    )
    rec = simulate(ld, "one")
    lat = [
        round((f - a) * 1000, 6)
        for a, f in zip(rec.requests.arrival_s, rec.requests.finish_s, strict=True)
    ]
    return lat, summarize(rec)


def test_hand_checked_single_device_trace(tmp_path: Path) -> None:
    """One device, batching 'none', three requests: latencies follow from the profile."""
    lat, s = trace_run(
        tmp_path,
        [
            '{"t_s": 1.0, "model": "slow"}',
            '{"t_s": 1.0, "model": "slow"}',
            '{"t_s": 1.5, "model": "fast"}',
        ],
    )
    # slow b1 = 10 ms each, back to back; fast arrives later to an idle device: 2 ms
    assert lat == [10.0, 20.0, 2.0]
    assert s["devices"]["d0"]["utilization"] == pytest.approx(0.022 / 3.0, abs=1e-6)


def test_two_instances_share_the_device(tmp_path: Path) -> None:
    """Two batches at once run slower each (core.contention); utilization counts instances."""
    from evenserve.core.contention import occupancy

    both = ['{"t_s": 1.0, "model": "slow"}', '{"t_s": 1.0, "model": "fast"}']
    # one instance: slow (10 ms) first, then fast (2 ms) behind it
    assert trace_run(tmp_path, both)[0] == [10.0, 12.0]
    # two: both start at once, each at 0.75 speed (occupancies 0.375 + 0.375 <= 1); fast ends
    # at 2 / 0.75 ms; slow did 2 ms of its 10 by then and runs the rest alone
    ld = load(tmp_path)
    prof = ld.profiles_for(ld.scenario.devices[0])
    assert occupancy(prof["fast"], 1) + occupancy(prof["slow"], 1) <= 1.0
    lat, s = trace_run(tmp_path, both, instances=2)
    assert lat[1] == pytest.approx(2.0 / 0.75, abs=1e-6)
    assert lat[0] == pytest.approx(2.0 / 0.75 + 8.0, abs=1e-6)
    # busy instance-seconds over 2 instances: (10.667 + 2.667) ms / 2 over 3 s
    util = s["devices"]["d0"]["utilization"]
    assert util == pytest.approx((lat[0] + lat[1]) / 1000 / 2 / 3.0, abs=1e-6)


def test_static_batch_waits_for_exactly_n(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(f'{{"t_s": {t}, "model": "fast"}}\n' for t in (0.1, 0.2, 0.3, 0.4, 0.5))
    )
    ld = load(
        tmp_path,
        duration_s=2,
        warmup_s=0,
        devices=[{"name": "d0", "models": ["fast", "slow"]}],
        workload={"type": "trace", "path": str(trace)},
        arms={"s4": {"routing": "round-robin", "batching": {"policy": "static", "batch_size": 4}}},
    )
    s = summarize(simulate(ld, "s4"))
    assert s["requests"] == {
        "arrived": 5,
        "completed": 4,
        "dropped": 0,
        "in_flight": 1,
        "dropped_by_reason": {},
    }
    assert s["devices"]["d0"]["mean_batch_size"] == 4.0


def test_queue_bound_drops_with_reason(tmp_path: Path) -> None:
    ld = load(tmp_path)
    sc = ld.scenario
    sc.arms["baseline"].max_queue_per_model = 2
    s = summarize(simulate(ld, "baseline"))
    assert s["requests"]["dropped"] > 0
    assert set(s["requests"]["dropped_by_reason"]) == {"queue-full"}


def test_closed_loop_users_never_exceed_population(tmp_path: Path) -> None:
    ld = load(
        tmp_path,
        workload={"type": "closed-loop", "users": 7, "think_ms": 5, "mix": {"fast": 3, "slow": 1}},
    )
    rec = simulate(ld, "optimized")
    # at any time at most 7 requests are outstanding: check at every arrival
    events = sorted(
        [(a, 1) for a in rec.requests.arrival_s]
        + [(f, -1) for f in rec.requests.finish_s if f == f],
        key=lambda e: (e[0], e[1]),
    )
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 7


def test_central_queue_is_work_conserving(tmp_path: Path) -> None:
    ld = load(tmp_path)
    s = summarize(simulate(ld, "central-queue"))
    assert s["central_queue"]["max_queue_depth"] >= 1
    assert s["requests"]["in_flight"] <= 20


def test_optimized_beats_baseline_on_toy(tmp_path: Path) -> None:
    ld = load(tmp_path)
    base = summarize(simulate(ld, "baseline"))
    opt = summarize(simulate(ld, "optimized"))
    # static batches of 4 make the rare 'slow' model wait for four arrivals: P99 explodes
    assert opt["latency_ms"]["p99"] < 0.5 * base["latency_ms"]["p99"]
    assert opt["models"]["slow"]["slo_attainment"] > base["models"]["slow"]["slo_attainment"]


def test_request_overhead_adds_to_every_answered_request_and_nothing_else(
    tmp_path: Path,
) -> None:
    """``request_overhead_ms`` (the live path's HTTP cost): each answered request's latency
    is the same run's plus exactly the overhead; the devices do the same work."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = load(tmp_path / "a")
    slow = load(tmp_path / "b", request_overhead_ms=2.5)
    arm = next(iter(plain.scenario.arms))
    a, b = simulate(plain, arm, 1), simulate(slow, arm, 1)
    ra, rb = a.requests, b.requests
    assert ra.arrival_s == rb.arrival_s and ra.device == rb.device
    lat_a = [f - t for f, t in zip(ra.finish_s, ra.arrival_s, strict=True)]
    lat_b = [f - t for f, t in zip(rb.finish_s, rb.arrival_s, strict=True)]
    done = [(x, y) for x, y in zip(lat_a, lat_b, strict=True) if x == x]  # answered ones
    assert done and all(y - x == pytest.approx(0.0025) for x, y in done)
