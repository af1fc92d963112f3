"""The pure parts of bench/perf_analyzer.py (its CSV read into figures) and
bench/grpc_overhead.py (its payloads, its summary). Nothing here starts a process."""

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


def test_grpc_overhead_payloads_carry_the_same_tensors_each_way() -> None:
    import json

    import numpy as np
    from tritonclient.grpc import service_pb2

    go = load("grpc_overhead")
    for name, nbytes in (("tiny", 16), ("resnet", 3 * 224 * 224 * 4), ("bert", 2 * 128 * 8)):
        model = go.MODELS[name]
        arrays = go.tensors(model, seed=1)
        req = service_pb2.ModelInferRequest.FromString(go.grpc_body(model, arrays))
        raw = b"".join(req.raw_input_contents)
        assert req.model_name == model.name and len(raw) == nbytes
        assert [list(t.shape) for t in req.inputs] == [[1, *t.dims] for t in model.inputs]
        body, headers = go.http_binary_body(model, arrays)
        head_len = int(headers["inference-header-content-length"])
        assert body[head_len:] == raw  # the binary extension: the same bytes after the header
        sizes = [i["parameters"]["binary_data_size"] for i in json.loads(body[:head_len])["inputs"]]
        assert sum(sizes) == nbytes
        body, _ = go.http_json_body(model, arrays)
        data = [np.asarray(i["data"]) for i in json.loads(body)["inputs"]]
        assert all(np.array_equal(d, a.reshape(-1)) for d, a in zip(data, arrays, strict=True))


def test_grpc_overhead_summary_compares_added_latency_and_rates() -> None:
    go = load("grpc_overhead")

    def cell(p50: float, rate: float, cpu: float | None = None) -> dict[str, float | None]:
        return {"p50_ms": p50, "rate_rps": rate, "gateway_cpu_us": cpu}

    cells = {
        "grpc/direct": cell(1.0, 1000.0),
        "grpc/gateway": cell(1.6, 800.0, 300.0),
        "http-bin/direct": cell(0.5, 2000.0),
        "http-bin/gateway": cell(0.9, 1000.0, 150.0),
        "http-json/direct": cell(0.6, 1500.0),
        "http-json/gateway": cell(1.1, 1200.0, 200.0),
        "grpc/floor-echo": {"p50_ms": 0.7, "rate_rps": 1.0},
        "grpc/floor-proxy": {"p50_ms": 1.3, "rate_rps": 1.0, "floor-proxy_cpu_us": 500.0},
    }
    s = go.summarize(cells)
    assert s["protocols"]["grpc"]["added_p50_ms"] == pytest.approx(0.6)
    vs = s["grpc_vs"]["http-bin"]
    assert vs["added_ratio"] == pytest.approx(0.6 / 0.4)
    assert vs["rate_ratio"] == pytest.approx(0.8)
    assert vs["normalized_rate_ratio"] == pytest.approx((800 / 1000) / (1000 / 2000))
    assert vs["gateway_cpu_ratio"] == pytest.approx(2.0)
    assert s["grpcio_floor"]["added_p50_ms"] == pytest.approx(0.6)
    assert s["grpcio_floor"]["over_http_bin_added"] == pytest.approx(1.5)
    assert go.median([3.0, None, 1.0, 2.0]) == 2.0 and go.median([None]) is None
