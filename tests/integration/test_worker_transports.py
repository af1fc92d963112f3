"""The same requests over HTTP and over gRPC, each to a fresh worker: the same request-log
lines but their ``transport``, and the same counters (Triton's statistics, the Prometheus
counters), since both fronts hand their requests to the one data plane."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from evenserve.core.requestlog import LogQuery, Recorder, RecordSettings  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.app import Worker  # noqa: E402
from evenserve.worker.options import WorkerOptions  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402

from .worker_repo import write_repo  # noqa: E402

#: (datatype, parameters) of each request sent: answered; malformed (a mistyped input, 400 /
#: INVALID_ARGUMENT); refused at once (a deadline no batch can meet: 504 / DEADLINE_EXCEEDED).
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("FP32", {"priority": 1, "deadline_ms": 10_000.0}),
    ("INT32", {"priority": 1}),
    ("FP32", {"deadline_ms": 0.001}),
]
#: What differs between two runs of the same requests (times), not between transports.
TIMES = ("t_s", "unix_s", "latency_ms", "queue_ms", "compute_ms")


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[BackgroundWorker, Recorder]]:
    repo = write_repo(tmp_path)
    recorder = Recorder(RecordSettings(window=100, flush_s=0.05))
    service = Worker(load_repository(repo, ["em"]), WorkerOptions(device=parse_device("cpu")))
    with BackgroundWorker(service, grpc_port=0, recorder=recorder) as w:
        yield w, recorder


def _over_http(url: str) -> list[int]:
    statuses = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for datatype, params in REQUESTS:
            data: list[float] = [0, 0, 0, 0]
            body = {
                "inputs": [{"name": "x", "datatype": datatype, "shape": [1, 4], "data": data}],
                "parameters": params,
            }
            statuses.append(c.post("/v2/models/em/infer", json=body).status_code)
    return statuses


def _over_grpc(port: int) -> list[str]:
    codes = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for datatype, params in REQUESTS:
            req = service_pb2.ModelInferRequest(model_name="em")
            t = req.inputs.add(name="x", datatype=datatype, shape=[1, 4])
            if datatype == "FP32":
                t.contents.fp32_contents.extend([0.0] * 4)
            else:
                t.contents.int_contents.extend([0] * 4)
            for k, v in params.items():
                if isinstance(v, float):
                    req.parameters[k].double_param = v
                else:
                    req.parameters[k].int64_param = v
            try:
                stub.ModelInfer(req, timeout=30)
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(err.code().name)
    return codes


def _log(w: BackgroundWorker, recorder: Recorder) -> list[dict[str, Any]]:
    w.stop()  # the recorder's last flush
    text, _, _ = recorder.lines(LogQuery())
    return [json.loads(line) for line in text.decode().splitlines()]


def _counts(w: BackgroundWorker) -> tuple[dict[str, Any], dict[str, float]]:
    """The model's statistics (counts, no times) and every Prometheus counter and count."""
    stats = httpx.get(f"{w.url}/v2/models/em/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    counted = {
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        **{k: v["count"] for k, v in inference.items()},
        "batch_stats": [
            (b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]
        ],
    }
    page = httpx.get(f"{w.url}/metrics").text
    samples = {}
    for line in page.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name.endswith("_count") or (name.endswith("_total") and "_seconds" not in name):
            samples[key] = float(value)
    return counted, samples


def test_http_and_grpc_requests_are_logged_and_counted_alike(
    worker: tuple[BackgroundWorker, Recorder], tmp_path_factory: pytest.TempPathFactory
) -> None:
    w_http, rec_http = worker
    assert _over_http(w_http.url) == [200, 400, 504]
    http_counts = _counts(w_http)
    http_log = _log(w_http, rec_http)

    repo = write_repo(tmp_path_factory.mktemp("grpc"))
    rec_grpc = Recorder(RecordSettings(window=100, flush_s=0.05))
    service = Worker(load_repository(repo, ["em"]), WorkerOptions(device=parse_device("cpu")))
    w_grpc = BackgroundWorker(service, grpc_port=0, recorder=rec_grpc).start()
    try:
        assert w_grpc.grpc_port is not None
        codes = _over_grpc(w_grpc.grpc_port)
        assert codes == ["OK", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED"]
        grpc_counts = _counts(w_grpc)
    finally:
        grpc_log = _log(w_grpc, rec_grpc)

    assert [r["status"] for r in http_log] == [200, 400, 504]
    assert [r.pop("transport") for r in http_log] == ["http"] * 3
    assert [r.pop("transport") for r in grpc_log] == ["grpc"] * 3
    for h, g in zip(http_log, grpc_log, strict=True):
        for key in TIMES:  # present alike (a batch's figures only where one ran)
            assert (h.pop(key) is None) == (g.pop(key) is None)
    assert http_log == grpc_log
    assert http_log[0]["priority"] == 1 and http_log[0]["deadline_ms"] == 10_000.0
    assert http_counts == grpc_counts
    stats, samples = grpc_counts
    assert stats["success"] == 1 and stats["fail"] == 2  # the malformed and the refused
    outcomes = {
        k: v for k, v in samples.items() if k.startswith("evenserve_worker_requests_total") and v
    }
    assert outcomes == {
        'evenserve_worker_requests_total{model="em",outcome="success"}': 1.0,
        'evenserve_worker_requests_total{model="em",outcome="bad_request"}': 1.0,
        'evenserve_worker_requests_total{model="em",outcome="deadline_infeasible"}': 1.0,
    }
