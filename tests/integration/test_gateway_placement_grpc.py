"""Placement's miss path with a real worker under explicit model control: a gRPC request and
an HTTP request for models the worker has not loaded are each answered after the gateway
loaded the model there (the worker's own load API, over loopback)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from evenserve.cluster.file import parse_cluster  # noqa: E402
from evenserve.core.wire import BACKEND_HEADER  # noqa: E402
from evenserve.gateway.placement_catalogue import DeviceSetup  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402
from evenserve.policy.placement import ModelInfo  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402
from evenserve.worker.service import WorkerOptions, WorkerService  # noqa: E402

from .fake_v2 import serving  # noqa: E402
from .worker_repo import write_repo  # noqa: E402

GIB = 1024.0**3


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path)
    opts = WorkerOptions(device=parse_device("cpu"), model_control="explicit", repository=repo)
    with contextlib.ExitStack() as stack:
        yield stack.enter_context(BackgroundWorker(WorkerService([], opts), grpc_port=0))


async def test_grpc_and_http_misses_load_on_a_real_worker(worker: BackgroundWorker) -> None:
    raw = {
        "gateway": {
            "routing": "round-robin",
            "grpc_port": 0,
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
            "health": {"interval_ms": 50, "timeout_ms": 10_000},
            "placement": {"policy": "static", "interval_ms": 100},
        },
        "backends": [
            {"name": "w0", "url": worker.url, "grpc_url": f"127.0.0.1:{worker.grpc_port}"}
        ],
    }
    models = {m: ModelInfo(m, 0.1 * GIB, 0.05, 0.01, 0.01, 1) for m in ("em", "pair")}
    g = Gateway(
        parse_cluster(raw, Path(".")),
        placement_models=models,
        placement_devices=[DeviceSetup("w0", 1.0 * GIB, ())],
    )
    g.placement_loop = False
    async with serving(g) as served:
        assert g.registry.router.candidates("em") == ()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{g.grpc.port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            req = service_pb2.ModelInferRequest(model_name="em")
            req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
            req.raw_input_contents.append(x.tobytes())
            call = stub.ModelInfer(req, timeout=60)
            resp = await call
            assert resp.model_name == "em"
            assert dict(await call.trailing_metadata())[BACKEND_HEADER] == "w0"
        assert g.placement is not None
        assert g.placement.controller.devices["w0"].models == {"em": "READY"}
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as c:
            body = {
                "inputs": [
                    {"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                    {"name": "mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]},
                ]
            }
            r = await c.post("/v2/models/pair/infer", json=body)
        assert r.status_code == 200, r.text
        assert g.placement.controller.devices["w0"].models == {"em": "READY", "pair": "READY"}
        assert g.placement.controller.counts.loads == 2
