"""gRPC through the gateway: two workers serving gRPC behind an in-process gateway; health,
inference spread over both (x-evenserve-backend), unknown model, a bad input's status and
message relayed from the worker."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
triton_aio = pytest.importorskip("tritonclient.grpc.aio")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from evenserve.core.wire import BACKEND_HEADER  # noqa: E402
from evenserve.gateway.config import parse_cluster  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402
from evenserve.worker.service import WorkerOptions, WorkerService  # noqa: E402

from .fake_v2 import FakeBackend, serving  # noqa: E402
from .worker_repo import write_repo  # noqa: E402


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BackgroundWorker]]:
    repo = write_repo(tmp_path_factory.mktemp("gw-grpc"))
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(2):
            svc = WorkerService(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
            out.append(stack.enter_context(BackgroundWorker(svc, grpc_port=0)))
        yield out


def specs(workers: list[BackgroundWorker]) -> list[dict[str, Any]]:
    return [
        {
            "name": f"w{i}",
            "url": w.url,
            "grpc_url": f"127.0.0.1:{w.grpc_port}",
            "models": ["em", "pair"],
        }
        for i, w in enumerate(workers)
    ]


def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def gateway(backends: list[dict[str, Any]]) -> AsyncIterator[tuple[Gateway, str]]:
    raw = {
        "gateway": {
            "routing": "round-robin",
            "grpc_port": 0,
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
            "health": {"interval_ms": 50, "timeout_ms": 10_000},
        },
        "backends": backends,
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with serving(g):
        yield g, f"127.0.0.1:{g.grpc.port}"


def _request(model: str = "em", rows: int = 1) -> Any:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


async def test_health_inference_spread_and_errors(workers: list[BackgroundWorker]) -> None:
    async with gateway(specs(workers)) as (g, addr):
        client = triton_aio.InferenceServerClient(addr)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("em")
            assert not await client.is_model_ready("nope")
        finally:
            await client.close()
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            seen: Counter[str] = Counter()
            for _ in range(6):
                call = stub.ModelInfer(_request(rows=3), timeout=30)
                resp = await call
                y = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32)
                assert resp.model_name == "em" and y.shape == (6,)
                trailing = dict(await call.trailing_metadata())
                seen[trailing[BACKEND_HEADER]] += 1
            assert seen == {"w0": 3, "w1": 3}

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(_request("nope"), timeout=30)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "nope" in (err.value.details() or "")

            bad = service_pb2.ModelInferRequest(model_name="em")
            bad.inputs.add(name="x", datatype="INT32", shape=[1, 4])
            bad.raw_input_contents.append(b"\0" * 16)
            call = stub.ModelInfer(bad, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "datatype 'INT32', model 'em' expects FP32" in (err.value.details() or "")
            assert dict(err.value.trailing_metadata() or ())[BACKEND_HEADER] in ("w0", "w1")
            text = g.metrics.render().decode()
            assert 'backend="w0",model="em",outcome="ok"' in text
            assert 'model="em",outcome="client_error"' in text


async def _answered_by(addr: str, n: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(n):
            call = stub.ModelInfer(_request(), timeout=30)
            await call
            seen[dict(await call.trailing_metadata())[BACKEND_HEADER]] += 1
    return seen


async def test_unreachable_grpc_endpoint_is_retried_elsewhere(
    workers: list[BackgroundWorker],
) -> None:
    backends = specs(workers)
    backends[0]["grpc_url"] = f"127.0.0.1:{dead_port()}"  # its HTTP side is healthy
    async with gateway(backends) as (g, addr):
        assert await _answered_by(addr, 4) == {"w1": 4}
        # Every request that tried w0 first was sent on to w1 (a retry each).
        assert g.metrics.retries.labels("em")._value.get() >= 2


async def test_backends_without_grpc_are_not_candidates(workers: list[BackgroundWorker]) -> None:
    backends = specs(workers)
    del backends[0]["grpc_url"]
    # An HTTP-only backend without a repository index: its configured models stand.
    http_only = FakeBackend("h", ["http-only"])
    async with serving(http_only.app()) as h:
        backends.append({"name": "h", "url": h.url, "models": ["http-only"]})
        async with gateway(backends) as (_g, addr):
            assert await _answered_by(addr, 3) == {"w1": 3}
            async with grpc.aio.insecure_channel(addr) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ModelInfer(_request("http-only"), timeout=30)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "'http-only'" in (err.value.details() or "")


async def test_a_model_learned_from_the_workers_index_is_served_over_grpc(
    workers: list[BackgroundWorker],
) -> None:
    """The cluster file names only ``pair``; the workers' indexes also list ``em``, so the
    gateway routes ``em`` (HTTP and gRPC) without a config change."""
    backends = specs(workers)
    for b in backends:
        b["models"] = ["pair"]
    async with gateway(backends) as (g, addr):
        assert g.registry.router.models_of("w0") >= {"em", "pair"}
        assert all(g.registry.states[n].learned for n in ("w0", "w1"))
        assert await _answered_by(addr, 4) == {"w0": 2, "w1": 2}
