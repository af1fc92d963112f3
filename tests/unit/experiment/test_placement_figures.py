"""A live placement run's figures from the gateway's metrics, and the simulator's match."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.scenario import OpenLoop, Phase, Stream
from evenserve.experiment.placement_figures import (
    burst_starts_s,
    compare_decisions,
    live_decisions,
    live_placement_clock,
    parse_placement_metrics,
    run_placement_figures,
    scale_up_after_burst_s,
    sim_scale_up_decision_s,
)
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario
from evenserve.sim.placement import PlacementClock

from .scenarios import scenario, write

METRICS = """\
# TYPE evenserve_gateway_model_loads counter
evenserve_gateway_model_loads_total{backend="g0",model="a"} 3.0
evenserve_gateway_model_loads_total{backend="g1",model="b"} 2.0
# TYPE evenserve_gateway_evictions counter
evenserve_gateway_evictions_total{backend="g0",model="c"} 4.0
# TYPE evenserve_gateway_device_active_seconds counter
evenserve_gateway_device_active_seconds_total{backend="g0"} 12.5
evenserve_gateway_device_active_seconds_total{backend="sp"} 2.5
# TYPE evenserve_gateway_scale_decisions counter
evenserve_gateway_scale_decisions_total{direction="up"} 1.0
evenserve_gateway_scale_decisions_total{direction="down"} 0.0
# TYPE evenserve_gateway_scale_up_decision_seconds gauge
evenserve_gateway_scale_up_decision_seconds 1.25
"""


def test_the_gateways_counters_summed_and_differenced() -> None:
    after = parse_placement_metrics(METRICS)
    assert after == {
        "device_seconds": 15.0,
        "loads": 5.0,
        "evictions": 4.0,
        "scale_up": 1.0,
        "scale_down": 0.0,
        "scale_up_decision_s": 1.25,
    }
    before = parse_placement_metrics(
        'evenserve_gateway_device_active_seconds_total{backend="g0"} 2.0\n'
        "evenserve_gateway_scale_up_decision_seconds NaN\n"
    )
    assert before["scale_up_decision_s"] is None and before["loads"] == 0.0
    run = run_placement_figures(before, after)
    assert run == {
        "device_seconds": 13.0,
        "loads": 5,
        "evictions": 4,
        "scale_ups": 1,
        "scale_downs": 0,
        "scale_up_decision_s": 1.25,
    }
    assert run_placement_figures(None, after)["device_seconds"] is None


def test_the_simulator_runs_the_same_burst_clock(tmp_path: Path) -> None:
    """A burst on one device with a spare: the simulator records the ScaleUp and its
    burst-clock time (first request of the burst's interval -> ScaleUp)."""
    over = {
        "duration_s": 12,
        "warmup_s": 1,
        "devices": [
            {"name": "g0", "models": ["resnet50", "bert-base"]},
            {"name": "sp", "active": False, "start_ms": 500},
        ],
        "workload": {
            "type": "open-loop",
            "rates_rps": {"resnet50": 300, "bert-base": 50},
            "phases": [{"start_s": 4, "end_s": 10, "multiplier": 6.0}],
        },
        "arms": {
            "scale": {
                "routing": "least-expected-work",
                "batching": "fixed-window",
                "placement": {"policy": "lru"},
                "autoscaling": {"policy": "demand", "target_utilization": 0.5},
                "placement_interval_ms": 500,
            }
        },
    }
    loaded = load_scenario(write(tmp_path, scenario(**over)))
    rec = simulate(loaded, "scale", 1)
    assert rec.scale_ups_s and len(rec.scale_up_decisions_s) >= 1
    took = sim_scale_up_decision_s(rec)
    assert took is not None and 0 <= took <= rec.scale_ups_s[-1]
    assert took == pytest.approx(rec.scale_up_decisions_s[-1], abs=1e-4)
    # The honest figure: from the phase start (4 s) to the first ScaleUp after it.
    after = scale_up_after_burst_s(burst_starts_s(loaded.scenario.workload), rec.scale_ups_s)
    assert after == pytest.approx(min(t for t in rec.scale_ups_s if t >= 4.0) - 4.0, abs=1e-4)
    assert after is not None and 0.0 < after <= 2.0
    # The decision log: each ScaleUp carried out, at its time, with the demand then.
    ups = [d for d in rec.placement_decisions if d[1:3] == ("autoscale", "up")]
    assert [d[0] for d in ups] == rec.scale_ups_s
    assert all(d[4] == "sp" and d[5] > 300 and d[6] >= 0 for d in ups)
    # A live gateway's clock replayed: its estimates started 1.5 s before the load, its
    # rebalances fall at 0.3 s + n x 0.5 s and its autoscaler checks at 0.05 s + n x 0.125 s.
    clock = PlacementClock(-1.5, 0.3, 0.05)
    replay = simulate(loaded, "scale", 1, clock)
    for t, source, *_ in replay.placement_decisions:
        if source == "rebalance":
            assert (t - 0.3) / 0.5 == pytest.approx(round((t - 0.3) / 0.5), abs=1e-6)
        elif source == "autoscale":
            assert (t - 0.05) / 0.125 == pytest.approx(round((t - 0.05) / 0.125), abs=1e-6)
    assert replay.scale_ups_s and replay.scale_ups_s != rec.scale_ups_s
    # Laid beside itself, a run never parts.
    same = compare_decisions(rec.placement_decisions, rec.placement_decisions)
    assert not same["parted"] and same["agreed"] == len(rec.placement_decisions)
    assert same["lag_s"] == {"median": 0.0, "min": 0.0, "max": 0.0}


def test_burst_starts_are_the_edges_where_the_offered_rate_rises() -> None:
    wl = OpenLoop(
        type="open-loop",
        rates_rps={"a": 10.0},
        phases=[Phase(start_s=25, end_s=45, multiplier=3)],
        streams=[  # b only in the burst, then once more alone from 60 s
            Stream(
                model="b",
                rate_rps=5.0,
                phases=[
                    Phase(start_s=0, end_s=25, multiplier=0),
                    Phase(start_s=25, end_s=45, multiplier=3),
                    Phase(start_s=45, end_s=60, multiplier=0),
                ],
            )
        ],
    )
    assert burst_starts_s(wl) == [25.0, 60.0]  # 45 s is a fall
    assert burst_starts_s(wl, end_s=60.0) == [25.0]  # an edge at the run's end is none


def test_scale_up_after_burst_takes_the_first_scale_up_of_each_burst_the_worst() -> None:
    assert scale_up_after_burst_s([25.0, 60.0], [10.0, 25.75, 27.0, 61.5]) == 1.5
    assert scale_up_after_burst_s([25.0], [10.0]) is None  # none after the burst
    assert scale_up_after_burst_s([], [1.0]) is None


def test_decisions_compared_in_order_a_swap_agrees_and_the_first_difference_is_named() -> None:
    live = [
        [0.5, "miss", "load", "a", "g0", 3.0],
        [2.1, "rebalance", "unload", "b", "g1", 0.1],
        [2.1, "rebalance", "load", "c", "g1", 5.0],
        [4.0, "autoscale", "up", "", "sp", 40.0],
        [6.0, "miss", "load", "d", "sp", 1.0],
    ]
    sim = [
        [0.4, "miss", "load", "a", "g0", 3.1],
        [2.0, "rebalance", "load", "c", "g1", 5.1],  # the same two, the other order
        [2.0, "rebalance", "unload", "b", "g1", 0.1],
        [3.0, "rebalance", "unload", "c", "g1", 0.5],  # here they part
        [3.5, "autoscale", "up", "", "sp", 41.0],
    ]
    tr = compare_decisions(live, sim, context=1)
    assert tr["decisions"] == {"live": 5, "sim": 5}
    assert (tr["agreed"], tr["reordered"], tr["parted"]) == (3, 1, True)
    assert tr["lag_s"] == {"median": 0.1, "min": 0.1, "max": 0.1}
    assert tr["live"] == {
        "t_s": 4.0,
        "source": "autoscale",
        "kind": "up",
        "model": "",
        "device": "sp",
        "rate_rps": 40.0,
        "utilization": None,
    }
    assert tr["sim"] is not None and tr["sim"]["kind"] == "unload" and tr["sim"]["t_s"] == 3.0
    assert [d["model"] for d in tr["before"]] == ["c"]
    assert [d["device"] for d in tr["live_next"]] == ["sp"]
    assert [d["kind"] for d in tr["sim_next"]] == ["up"]
    assert tr["counts"]["live"] == {
        "autoscale up": 1,
        "miss load": 2,
        "rebalance load": 1,
        "rebalance unload": 1,
    }
    # One side runs out first: the other's next decision is where they part.
    short = compare_decisions(live[:1], live)
    assert short["parted"] and short["live"] is None and short["sim"]["model"] == "b"
    assert compare_decisions([], [])["parted"] is False


def test_live_decisions_are_timed_from_the_loads_start() -> None:
    view = {"decisions": [[1000.5, "miss", "load", "a", "g0", 2.0], [999.0, "x", "y", "", "", 0]]}
    assert live_decisions(view, 1000.0) == [
        [0.5, "miss", "load", "a", "g0", 2.0],
        [-1.0, "x", "y", "", "", 0],
    ]
    assert live_decisions(view, None) is None
    assert live_decisions({}, 1000.0) is None
    assert live_decisions(None, 1000.0) is None


def test_the_live_clock_is_rolled_forward_to_the_loads_start() -> None:
    view = {
        "clock": {
            "started_unix_s": 998.2,
            "next_rebalance_unix_s": 998.7,
            "next_scale_unix_s": 998.45,
            "interval_s": 1.0,
            "scale_interval_s": 0.25,
        }
    }

    # Read at 998.3; the load began at 1000.0: rebalances at 998.7 + n, checks every 0.25 s.
    def near(c: PlacementClock | None, want: tuple[float, float, float]) -> bool:
        return c is not None and (c.start_s, c.rebalance_s, c.scale_s) == pytest.approx(want)

    assert near(live_placement_clock(view, 1000.0), (-1.8, 0.7, 0.2))
    assert near(live_placement_clock(view, 998.5), (-0.3, 0.2, 0.2))
    # The rebalance lands on the checks' grid exactly (a replay's tick finds it due).
    c = live_placement_clock(view, 1000.0)
    assert c is not None and c.rebalance_s == c.scale_s + 2 * 0.25
    no_scaler = {"clock": {**view["clock"], "next_scale_unix_s": None}}
    assert near(live_placement_clock(no_scaler, 1000.0), (-1.8, 0.7, 0.7))
    # Read at the end of the run: the fixed schedule moved back by whole periods.
    end = {"clock": {**view["clock"], "next_rebalance_unix_s": 1360.7,
                     "next_scale_unix_s": 1360.45}}  # fmt: skip
    assert near(live_placement_clock(end, 1000.0), (-1.8, 0.7, 0.2))
    # Estimates that started after t = 0 (at the first arrival): left to the simulator.
    late = {"clock": {**view["clock"], "started_unix_s": 1000.08}}
    c = live_placement_clock(late, 1000.0)
    assert c is not None and c.start_s is None and c.scale_s == pytest.approx(0.2)
    not_ticked = {"clock": {**view["clock"], "started_unix_s": None}}
    assert live_placement_clock(not_ticked, 1000.0) is None
    assert live_placement_clock(view, None) is None
    assert live_placement_clock({}, 1000.0) is None
