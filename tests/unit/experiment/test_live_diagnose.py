"""The gateway's counters and histogram over a window: request counts, latency estimates and
SLO attainment only where the SLO is a bucket edge."""

from __future__ import annotations

import pytest

from evenserve.experiment.live_diagnose import histogram_quantile, request_figures


def test_histogram_quantile_is_linear_within_a_bucket() -> None:
    h = {0.01: 50.0, 0.02: 90.0, 0.05: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, h) == pytest.approx(0.01)
    assert histogram_quantile(0.7, h) == pytest.approx(0.015)
    assert histogram_quantile(0.25, h) == pytest.approx(0.005)
    assert histogram_quantile(0.5, {0.01: 0.0, float("inf"): 0.0}) is None
    # In the +Inf bucket: the highest finite bound.
    assert histogram_quantile(0.99, {0.01: 1.0, float("inf"): 10.0}) == pytest.approx(0.01)


def _page(ok_a: int, shed_a: int, ok_b: int, le: dict[float, int], total: float) -> str:
    lines = [
        "# TYPE evenserve_gateway_requests_total counter",
        f'evenserve_gateway_requests_total{{backend="gpu0",model="a",outcome="ok"}} {ok_a}',
        f'evenserve_gateway_requests_total{{backend="none",model="a",outcome="overloaded"}} '
        f"{shed_a}",
        f'evenserve_gateway_requests_total{{backend="gpu1",model="b",outcome="ok"}} {ok_b}',
        "# TYPE evenserve_gateway_request_duration_seconds histogram",
    ]
    n = 0
    for bound, c in le.items():
        n = c
        lines.append(
            f'evenserve_gateway_request_duration_seconds_bucket{{le="{bound}",model="a"}} {c}'
        )
    lines.append(f'evenserve_gateway_request_duration_seconds_bucket{{le="+Inf",model="a"}} {n}')
    lines.append(f'evenserve_gateway_request_duration_seconds_count{{model="a"}} {n}')
    lines.append(f'evenserve_gateway_request_duration_seconds_sum{{model="a"}} {total}')
    return "\n".join(lines) + "\n"


def test_request_figures_are_the_windows_deltas() -> None:
    before = _page(10, 0, 5, {0.01: 4, 0.05: 10}, 0.2)
    # In the window: 40 ok and 10 overloaded of a, 20 ok of b; of a's 50, 30 within 10 ms.
    after = _page(50, 10, 25, {0.01: 34, 0.05: 60}, 1.2)
    per_model, counts, latency = request_figures(before, after, 10.0, {"a": 10.0, "b": 15.0})
    assert counts == {
        "arrived": 70,
        "completed": 60,
        "dropped": 10,
        "dropped_by_reason": {"overloaded": 10},
    }
    a, b = per_model["a"], per_model["b"]
    assert a["throughput_rps"] == pytest.approx(4.0) and a["dropped"] == 10
    assert a["slo_attainment"] == pytest.approx(30 / 50)  # 10 ms is an edge
    assert b["slo_attainment"] is None  # 15 ms is no edge (and b has no histogram)
    assert a["latency_ms"]["p50"] == pytest.approx(10.0 * 25 / 30)  # 25th of 50, linear
    assert latency["p50"] == a["latency_ms"]["p50"]
