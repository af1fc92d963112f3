"""The gateway's router sees a request's class and deadline, over HTTP and over gRPC: parsed
at admission from ``x-evenserve-priority`` / ``x-evenserve-deadline-ms`` (a gRPC call's
metadata, its own deadline counting) into the ``RequestInfo`` the routing policy gets."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from evenserve.cluster.file import parse_cluster  # noqa: E402
from evenserve.core.types import RequestInfo  # noqa: E402
from evenserve.core.wire import DEADLINE_HEADER, OFFLINE, ONLINE, PRIORITY_HEADER  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402

from .fake_v2 import FakeBackend, serving  # noqa: E402

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def _grpc_request() -> Any:
    req = service_pb2.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return req


async def test_the_router_receives_class_and_deadline_over_http_and_grpc() -> None:
    async with serving(FakeBackend("a", ["m"]).app()) as backend:
        raw = {
            "gateway": {
                "routing": "round-robin",
                "grpc_port": 0,
                "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
                "health": {"interval_ms": 50, "timeout_ms": 10_000},
            },
            "backends": [{"name": "a", "url": backend.url, "models": ["m"]}],
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        router = g.registry.router
        choose = router.choose
        seen: list[RequestInfo] = []

        def spy(request: RequestInfo, now_s: float, exclude: Any = ()) -> Any:
            seen.append(request)
            return choose(request, now_s, exclude)

        router.choose = spy  # type: ignore[method-assign]
        async with (
            serving(g) as served,
            httpx.AsyncClient(base_url=served.url, timeout=60) as client,
        ):
            # HTTP: the class by name, the deadline in ms; then neither (the defaults).
            r = await client.post(
                "/v2/models/m/infer",
                json=BODY,
                headers={PRIORITY_HEADER: "offline", DEADLINE_HEADER: "250"},
            )
            assert r.status_code == 200
            await client.post("/v2/models/m/infer", json=BODY)
            # gRPC: the class as metadata; the call's own deadline (sooner than the header).
            async with grpc.aio.insecure_channel(f"127.0.0.1:{g.grpc.port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelInfer(
                    _grpc_request(),
                    timeout=20.0,
                    metadata=((PRIORITY_HEADER, "3"), (DEADLINE_HEADER, "60000")),
                )
                # The fake backend's answer is no v2 tensor answer: not the point here.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await call
    http_class, http_plain, over_grpc = seen
    assert http_class.priority == OFFLINE
    assert http_class.deadline_s == pytest.approx(http_class.arrival_s + 0.25)
    assert (http_plain.priority, http_plain.deadline_s) == (ONLINE, None)
    assert over_grpc.priority == 3
    assert over_grpc.deadline_s is not None
    assert 0.0 < over_grpc.deadline_s - over_grpc.arrival_s <= 20.0
