"""Figures from hand-made records: each definition checked on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from evenserve.core.results import DeviceTrace, RequestLog, RunRecords
from evenserve.report.summary import summarize


def records() -> RunRecords:
    log = RequestLog()
    # (model, arrival, finish or None, dropped?)
    rows = [
        ("a", 0.5, 0.6, False),  # before warm-up: excluded from latency figures
        ("a", 1.0, 1.010, False),  # 10 ms
        ("a", 2.0, 2.030, False),  # 30 ms
        ("a", 3.0, 3.100, False),  # 100 ms > SLO 50
        ("b", 4.0, None, True),  # dropped
        ("b", 9.99, None, False),  # unfinished, younger than its SLO: undecided
        ("b", 5.0, None, False),  # unfinished, older than its SLO: a miss
        ("b", 6.0, 6.020, False),  # 20 ms
    ]
    for m, a, f, dropped in rows:
        i = log.add(m, a)
        if f is not None:
            log.finish_s[i] = f
            log.device[i] = "d0"
        if dropped:
            log.drop_reason[i] = "queue-full"
    d0 = DeviceTrace(
        name="d0",
        busy_start_s=[0.0, 2.0, 9.5],
        busy_end_s=[1.5, 4.0, 10.5],
        queue_t_s=[0.5, 1.0, 2.0, 3.0],
        queue_depth=[9.0, 1.0, 3.0, 2.0],
        batch_sizes=[1, 2, 4],
    )
    d1 = DeviceTrace(name="d1", queue_t_s=[1.0], queue_depth=[0.0])
    return RunRecords(
        scenario="t",
        arm="x",
        routing="r",
        batching="b",
        seed=1,
        warmup_s=1.0,
        end_s=10.0,
        slo_ms={"a": 50.0, "b": 50.0},
        requests=log,
        devices=[d0, d1],
    )


def test_figures() -> None:
    s = summarize(records())
    # completions with finish in [1, 10]: 1.01, 2.03, 3.1, 6.02 -> 4 / 9 s
    assert s["throughput_rps"] == pytest.approx(4 / 9, abs=1e-6)
    a = s["models"]["a"]
    assert a["latency_ms"]["p50"] == pytest.approx(30.0)
    assert a["latency_ms"]["max"] == pytest.approx(100.0)
    assert a["slo_attainment"] == pytest.approx(2 / 3, abs=1e-6)
    assert a["goodput_rps"] == pytest.approx(2 / 9, abs=1e-6)
    b = s["models"]["b"]
    # decided: completed (1) + dropped (1) + aged-out unfinished (1); met: 1
    assert b["slo_attainment"] == pytest.approx(1 / 3, abs=1e-6)
    # busy inside [1, 10]: 0.5 + 2.0 + 0.5 = 3.0 s of 9 s
    assert s["devices"]["d0"]["utilization"] == pytest.approx(3 / 9, abs=1e-6)
    assert s["devices"]["d1"]["utilization"] == 0.0
    assert s["utilization_spread_pts"] == pytest.approx(100 / 3, abs=1e-4)
    # queue samples in the window: 1, 3, 2
    assert s["devices"]["d0"]["mean_queue_depth"] == pytest.approx(2.0)
    assert s["devices"]["d0"]["max_queue_depth"] == 3.0
    assert s["devices"]["d0"]["mean_batch_size"] == pytest.approx(3.0)  # batches at 2.0 and 9.5
    assert s["requests"] == {
        "arrived": 8,
        "completed": 5,
        "dropped": 1,
        "in_flight": 2,
        "dropped_by_reason": {"queue-full": 1},
    }
    ts = s["timeseries"]
    assert len(ts["t_s"]) == 9
    assert ts["utilization"]["d0"][0] == pytest.approx(0.5)  # [1,2): busy 1.0-1.5
    cdf = s["latency_cdf_ms"]
    assert cdf[0] == pytest.approx(10.0) and cdf[-1] == pytest.approx(100.0)
    assert all(not (isinstance(x, float) and math.isnan(x)) for x in cdf)


def test_empty_run_has_no_nan() -> None:
    rec = records()
    rec.requests = RequestLog()
    s = summarize(rec)
    assert s["latency_ms"]["p99"] is None
    assert s["models"]["a"]["slo_attainment"] is None
    assert s["throughput_rps"] == 0.0


def test_sampled_busy_counter_gives_utilization() -> None:
    """A live scrape: cumulative busy seconds sampled; linear between samples."""
    log = RequestLog()
    i = log.add("a", 1.0)
    log.finish_s[i] = 1.01
    d = DeviceTrace(
        name="d0",
        busy_t_s=[0.0, 1.0, 2.0, 3.0, 4.0],
        busy_total_s=[0.0, 0.5, 1.5, 1.5, 2.0],
    )
    rec = RunRecords(
        scenario="s",
        arm="x",
        routing="r",
        batching="b",
        seed=0,
        warmup_s=1.0,
        end_s=4.0,
        slo_ms={"a": 50.0},
        requests=log,
        devices=[d],
    )
    out = summarize(rec)
    assert out["devices"]["d0"]["utilization"] == pytest.approx(1.5 / 3.0)
    assert out["timeseries"]["utilization"]["d0"] == pytest.approx([1.0, 0.0, 0.5])
    # Half a second in: half of the first second's 0.5 s of busy time.
    rec.warmup_s = 0.5
    assert summarize(rec)["devices"]["d0"]["utilization"] == pytest.approx(1.75 / 3.5)
