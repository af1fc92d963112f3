"""The pure parts of bench/perf_analyzer.py (its CSV read into figures) and
bench/grpc_overhead.py (the arrival schedule). Nothing here starts a process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


def load(stem: str) -> ModuleType:
    pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    name = f"bench_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCH))  # the scripts import their sibling gateway_overhead
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{stem}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


HEAD = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency"
)


def test_perf_analyzer_csv_becomes_figures_in_ms() -> None:
    pa = load("perf_analyzer")
    keys = HEAD.split(",")
    line = "8,724.5,29,1216,4096,20,5653,11,0,10821,11819,12925,16337"
    values = line.split(",")
    row = dict(zip(keys, values, strict=True))
    (fig,) = pa.summarize("worker", "http", [row])
    assert fig["concurrency"] == 8 and fig["throughput_infer_s"] == 724.5
    assert fig["p50_ms"] == pytest.approx(10.821) and fig["p99_ms"] == pytest.approx(16.337)
    assert fig["server_queue_ms"] == pytest.approx(4.096)
    assert fig["server_compute_ms"] == pytest.approx((20 + 5653 + 11) / 1e3)
    # Without server-side columns (a server that does not list the statistics extension).
    client_only = {k: row[k] for k in ("Concurrency", "Inferences/Second", "p50 latency",
                                       "p99 latency")}  # fmt: skip
    (fig,) = pa.summarize("gateway", "grpc", [client_only])
    assert fig["server_queue_ms"] is None and fig["server_compute_ms"] is None


def test_grpc_overhead_arrivals_are_seeded_and_inside_the_phase() -> None:
    go = load("grpc_overhead")
    a = go.arrivals(500.0, 2.0, seed=3)
    assert a == go.arrivals(500.0, 2.0, seed=3) != go.arrivals(500.0, 2.0, seed=4)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 2.0
    assert 500 < len(a) < 1500  # about 1000 arrivals: a Poisson count, far from its bounds
