"""Samples and scrapes -> RunRecords -> the shared summary; the run folder round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.loadgen.records import RunLabels, read_run, to_records, write_run
from evenserve.loadgen.scrape import BackendScrape, parse_busy_counter
from evenserve.loadgen.spec import LoadResult, LoadSpec, Sample
from evenserve.report.summary import summarize

LABELS = RunLabels(
    scenario="t", arm="live", routing="rr", batching="none", seed=3, slo_ms={"a": 50.0}
)


def samples() -> list[Sample]:
    return [
        Sample("a", 0.5, 0.5, 0.51, 200, "ok", "gpu0"),  # warm-up: out of the latency figures
        Sample("a", 1.0, 1.0, 1.010, 200, "ok", "gpu0"),  # 10 ms
        Sample("a", 2.0, 2.0002, 2.030, 200, "ok", "gpu1"),  # 30 ms from the intended time
        Sample("b", 3.0, 3.0, math.nan, 500, "http-500", ""),
        Sample("a", 3.5, 3.5, math.nan, 429, "overloaded", "gpu1"),
        Sample("b", 3.9, 3.9),  # never answered
    ]


def scrapes() -> dict[str, BackendScrape]:
    g0 = BackendScrape("gpu0", "http://127.0.0.1:1")
    g0.queue_t_s, g0.queue_depth = [1.0, 2.0, 3.0], [0.0, 4.0, 2.0]
    g0.busy_t_s, g0.busy_total_s = [0.0, 2.0, 4.0], [10.0, 11.0, 13.0]  # counter starts at 10
    g1 = BackendScrape("gpu1", "http://127.0.0.1:2")
    # No busy counter: the load endpoint's busy fraction, integrated.
    g1.queue_t_s, g1.queue_depth, g1.utilization = [1.0, 2.0, 3.0, 4.0], [1.0] * 4, [0.5] * 4
    return {"gpu1": g1, "gpu0": g0}


def test_to_records_and_summary() -> None:
    rec = to_records(samples(), scrapes(), LABELS, warmup_s=1.0, end_s=4.0)
    log = rec.requests
    assert log.arrival_s == [0.5, 1.0, 2.0, 3.0, 3.5, 3.9]  # intended send times
    assert log.drop_reason == [None, None, None, "http-500", "overloaded", None]
    assert [d.name for d in rec.devices] == ["gpu0", "gpu1"]
    assert rec.slo_ms == {"a": 50.0, "b": math.inf}
    s = summarize(rec)
    assert s["latency_ms"]["max"] == pytest.approx(30.0)
    assert s["requests"] == {
        "arrived": 6,
        "completed": 3,
        "dropped": 2,
        "in_flight": 1,
        "dropped_by_reason": {"http-500": 1, "overloaded": 1},
    }
    # gpu0: counter 10.5 at t=1 and 13 at t=4 -> 2.5 s busy of 3 s.
    assert s["devices"]["gpu0"]["utilization"] == pytest.approx(2.5 / 3.0)
    assert s["devices"]["gpu0"]["max_queue_depth"] == 4.0
    assert s["devices"]["gpu1"]["utilization"] == pytest.approx(0.5)
    assert s["throughput_rps"] == pytest.approx(2 / 3.0)


def test_run_folder_round_trip(tmp_path: Path) -> None:
    spec = LoadSpec(
        target="http://127.0.0.1:9", mix={"a": 1}, duration_s=4.0, warmup_s=1.0, users=2
    )
    result = LoadResult(
        spec=spec,
        samples=samples(),
        scrapes=scrapes(),
        errors={},
        lag_ms={"count": 0},
        started_unix_s=0.0,
        end_s=4.0,
        connections={"opened": 3, "retired_idle": 1, "resent_stale": 1},
    )
    write_run(tmp_path, result, LABELS, {"time_scale": 40})
    rec, meta = read_run(tmp_path)
    assert meta["time_scale"] == 40 and meta["mode"] == "closed-loop"
    assert meta["connections"] == {"opened": 3, "retired_idle": 1, "resent_stale": 1}
    direct = summarize(to_records(samples(), scrapes(), LABELS, 1.0, 4.0))
    again = summarize(rec)
    assert json.dumps(again, sort_keys=True) == json.dumps(direct, sort_keys=True)


def test_read_run_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"labels": {}}))
    with pytest.raises(ConfigError, match=r"run\.json: missing or bad field"):
        read_run(tmp_path)


def test_parse_busy_counter() -> None:
    text = (
        "# TYPE evenserve_worker_device_busy_seconds counter\n"
        'evenserve_worker_device_busy_seconds_total{device="emulated:a10"} 12.5\n'
        'evenserve_worker_device_busy_seconds_created{device="emulated:a10"} 1.7e9\n'
        "evenserve_worker_device_busy_seconds_total_other 99\n"
    )
    assert parse_busy_counter(text) == 12.5
    assert parse_busy_counter("nothing here 1\n") is None
    # summed over 2 instances: the device's busy time is half of it
    two = text + 'evenserve_worker_device_instances{device="emulated:a10"} 2.0\n'
    assert parse_busy_counter(two) == 6.25
