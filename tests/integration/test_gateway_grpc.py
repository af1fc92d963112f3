"""gRPC through the gateway: two workers behind an in-process gateway; health, inference
spread over both (x-evenserve-backend), unknown model, a bad input's status and message from
the worker; ModelInfer translated to HTTP (``grpc_forward: http``, the default) and relayed
as bytes to the workers' gRPC endpoints (``grpc_forward: grpc``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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

from evenserve.cluster.file import parse_cluster  # noqa: E402
from evenserve.core.wire import BACKEND_HEADER  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402
from evenserve.worker.service import WorkerOptions, WorkerService  # noqa: E402

from .fake_v2 import FakeBackend, serving  # noqa: E402
from .grpc_servers import SERVER, grpc_server  # noqa: E402, F401
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
async def gateway(
    backends: list[dict[str, Any]], forward: str = "http"
) -> AsyncIterator[tuple[Gateway, str]]:
    raw = {
        "gateway": {
            "routing": "round-robin",
            "grpc_port": 0,
            "grpc_forward": forward,
            "grpc_server": SERVER[0],
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


FORWARDS = pytest.mark.parametrize("forward", ["http", "grpc"])


@FORWARDS
async def test_health_inference_spread_and_errors(
    workers: list[BackgroundWorker], forward: str
) -> None:
    async with gateway(specs(workers), forward) as (g, addr):
        client = triton_aio.InferenceServerClient(addr)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("em")
            assert not await client.is_model_ready("nope")
            meta = await client.get_server_metadata()
            assert "statistics" in meta.extensions  # perf_analyzer's server-side figures
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


#: A model name far over grpc's 8 KiB metadata limit if an error message echoed it whole.
LONG_NAME = "m" * 1_000_000


async def test_long_unknown_names_are_cut_and_rpcs_not_served_log_nothing(
    workers: list[BackgroundWorker], caplog: pytest.LogCaptureFixture
) -> None:
    """A 1 MB model name no backend hosts is cut in the message (``wire.shown_name``): the
    client sees NOT_FOUND (and model control UNIMPLEMENTED), not RESOURCE_EXHAUSTED for a
    message over its metadata limit. The RPCs the gateway does not serve answer
    UNIMPLEMENTED naming themselves, and nothing is logged."""
    async with gateway(specs(workers)) as (_g, addr), grpc.aio.insecure_channel(addr) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with caplog.at_level(logging.INFO):
            for rpc, req, code in (
                (stub.ModelInfer, _request(LONG_NAME), grpc.StatusCode.NOT_FOUND),
                (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=LONG_NAME),
                 grpc.StatusCode.NOT_FOUND),
                (stub.ModelConfig, service_pb2.ModelConfigRequest(name=LONG_NAME),
                 grpc.StatusCode.NOT_FOUND),
                (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name=LONG_NAME),
                 grpc.StatusCode.NOT_FOUND),
                (stub.RepositoryModelLoad,
                 service_pb2.RepositoryModelLoadRequest(model_name=LONG_NAME),
                 grpc.StatusCode.UNIMPLEMENTED),
            ):  # fmt: skip
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await rpc(req, timeout=30)
                assert err.value.code() == code, err.value.details()
                details = err.value.details() or ""
                assert len(details) < 400 and "(1000002 characters)" in details

            call = stub.ModelStreamInfer(iter([_request()]), timeout=30)
            assert await call.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "ModelStreamInfer" in (await call.details() or "")
            for rpc, req in (
                (stub.TraceSetting, service_pb2.TraceSettingRequest()),
                (stub.SystemSharedMemoryStatus, service_pb2.SystemSharedMemoryStatusRequest()),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await rpc(req, timeout=30)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert "is not implemented by this server" in (err.value.details() or "")
        logged = [
            r
            for r in caplog.records
            if r.exc_info or r.levelno >= logging.ERROR or "grpc" in r.name
        ]
        assert not logged, [r.getMessage()[:300] for r in logged]


@FORWARDS
async def test_bytes_that_are_not_a_request_are_invalid_argument(
    workers: list[BackgroundWorker], caplog: pytest.LogCaptureFixture, forward: str
) -> None:
    """Refused by the gateway when it cannot read the model name, or (translating to HTTP)
    when the bytes are malformed anywhere; relayed as bytes, refused by the backend when
    they are malformed further in, where the gateway does not look."""
    cut = b"\x0a\x05ab"  # a name cut short
    bad_input = b"\x0a\x02em" + b"\x2a\x04" + cut  # model "em", an input cut short
    async with (
        gateway(specs(workers), forward) as (_g, addr),
        grpc.aio.insecure_channel(addr) as channel,
    ):
        with caplog.at_level(logging.INFO):
            for rpc, raw, what, relayed in (
                ("ModelInfer", cut, "ModelInferRequest", False),
                ("ModelInfer", bad_input, "ModelInferRequest", forward == "grpc"),
                ("ModelMetadata", cut, "ModelMetadataRequest", False),
            ):
                call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(raw, timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert f"is not a {what}" in (err.value.details() or "")
                backend = dict(err.value.trailing_metadata() or ()).get(BACKEND_HEADER)
                assert (backend in ("w0", "w1")) if relayed else backend is None
        logged = [
            r
            for r in caplog.records
            if r.exc_info or r.levelno >= logging.ERROR or "grpc" in r.name
        ]
        assert not logged, [r.getMessage()[:300] for r in logged]


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
    async with gateway(backends, "grpc") as (g, addr):
        assert await _answered_by(addr, 4) == {"w1": 4}
        # The request that tried w0 first was sent on to w1, and w0 was ejected at once, as
        # over HTTP (its HTTP side being healthy, the poller readmits it: it may be tried again).
        assert g.metrics.retries.labels("em")._value.get() >= 1
        assert any(
            e.backend == "w0" and e.event == "ejected" and e.reason == "connect-refused"
            for e in g.registry.events
        )


async def test_a_readmitted_backend_gets_a_fresh_channel(workers: list[BackgroundWorker]) -> None:
    """A backend's gRPC side that was down when the gateway started: its kept channel is in
    grpc's reconnect backoff (1 s, growing to 2 min), and would fail every call at once
    until its next attempt. Once the backend is readmitted, the next call uses a fresh
    channel, which connects at once: the first call after the gRPC side is up is served."""
    port = dead_port()
    backends = specs(workers)[:1]
    backends[0]["grpc_url"] = f"127.0.0.1:{port}"  # its HTTP side is healthy
    async with (
        gateway(backends, "grpc") as (g, addr),
        grpc.aio.insecure_channel(addr) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ModelInfer(_request(), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # refused: w0 ejected
        assert not g.registry.states["w0"].healthy
        server = _raw_backend(b"\x0a\x02em", port)
        await server.start()
        try:
            for _ in range(600):  # the poller readmits w0 (its HTTP side is healthy)
                if g.registry.states["w0"].healthy:
                    break
                await asyncio.sleep(0.05)
            assert g.registry.states["w0"].healthy
            call = stub.ModelInfer(_request(), timeout=30)
            assert (await call).model_name == "em"
            assert dict(await call.trailing_metadata())[BACKEND_HEADER] == "w0"
        finally:
            await server.stop(0)


async def test_backends_relayed_to_without_grpc_are_not_candidates(
    workers: list[BackgroundWorker],
) -> None:
    backends = specs(workers)
    del backends[0]["grpc_url"]
    # An HTTP-only backend without a repository index: its configured models stand.
    http_only = FakeBackend("h", ["http-only"])
    async with serving(http_only.app()) as h:
        backends.append({"name": "h", "url": h.url, "models": ["http-only"]})
        async with gateway(backends, "grpc") as (_g, addr):
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


@FORWARDS
async def test_metadata_config_statistics_and_index(
    workers: list[BackgroundWorker], forward: str
) -> None:
    async with (
        gateway(specs(workers), forward) as (g, addr),
        grpc.aio.insecure_channel(addr) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="em"), timeout=30)
        meta = await call
        assert meta.name == "em" and [t.name for t in meta.inputs] == ["x"]
        assert dict(await call.trailing_metadata())[BACKEND_HEADER] in ("w0", "w1")
        conf = await stub.ModelConfig(service_pb2.ModelConfigRequest(name="em"), timeout=30)
        assert conf.config.name == "em" and conf.config.max_batch_size == 16

        for rpc, req in (
            (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="nope")),
            (stub.ModelConfig, service_pb2.ModelConfigRequest(name="nope")),
            (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name="nope")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rpc(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "'nope'" in (err.value.details() or "")

        def counts() -> list[int]:
            return [w.service.stats["em"].inference_count for w in workers]

        before = counts()
        for _ in range(4):  # round-robin: two requests of 3 rows on each worker
            await stub.ModelInfer(_request(rows=3), timeout=30)
        after = counts()
        assert [a - b for a, b in zip(after, before, strict=True)] == [6, 6]
        stats = await stub.ModelStatistics(
            service_pb2.ModelStatisticsRequest(name="em"), timeout=30
        )
        (entry,) = stats.model_stats
        assert entry.name == "em" and entry.inference_count == sum(after)
        summed = sum(w.service.stats["em"].success.count for w in workers)
        assert entry.inference_stats.success.count == summed
        assert entry.inference_stats.queue.count >= 4
        assert sum(b.compute_infer.count for b in entry.batch_stats) == entry.execution_count
        every = await stub.ModelStatistics(service_pb2.ModelStatisticsRequest(), timeout=30)
        # The workers' indexes also list ``waits``, which the cluster file does not name.
        assert sorted(e.name for e in every.model_stats) == ["em", "pair", "waits"]

        index = await stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=30)
        got = [{"name": m.name, "state": m.state} for m in index.models]
        both = {"w0": "READY", "w1": "READY"}
        assert g.registry.repository_index() == [
            {"name": m, "state": "READY", "backends": both} for m in ("em", "pair", "waits")
        ]
        assert got == [{"name": m, "state": "READY"} for m in ("em", "pair", "waits")]

        load = service_pb2.RepositoryModelLoadRequest(model_name="em")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RepositoryModelLoad(load, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        details = err.value.details() or ""
        assert "model control goes to a worker" in details and "w0 (" in details
        unload = service_pb2.RepositoryModelUnloadRequest(model_name="em")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RepositoryModelUnload(unload, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "does not unload" in (err.value.details() or "")


@FORWARDS
async def test_no_healthy_backend_is_unavailable(forward: str) -> None:
    backends = [
        {
            "name": "gone",
            "url": f"http://127.0.0.1:{dead_port()}",
            "grpc_url": f"127.0.0.1:{dead_port()}",
            "models": ["em"],
        }
    ]
    async with (
        gateway(backends, forward) as (_g, addr),
        grpc.aio.insecure_channel(addr) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for rpc, req in (
            (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="em")),
            (stub.ModelConfig, service_pb2.ModelConfigRequest(name="em")),
            (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name="em")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rpc(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "'em'" in (err.value.details() or "")
        index = await stub.RepositoryIndex(
            service_pb2.RepositoryIndexRequest(ready=True), timeout=30
        )
        assert list(index.models) == []


class _Recorder(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """A backend's gRPC side that records each ModelInfer call's metadata."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        return service_pb2.ModelInferResponse(model_name=request.model_name)


async def test_client_grpc_deadline_is_relayed_as_the_request_deadline(
    workers: list[BackgroundWorker],
) -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        backends = specs(workers)[:1]
        backends[0]["grpc_url"] = f"127.0.0.1:{port}"
        async with (
            gateway(backends, "grpc") as (_g, addr),
            grpc.aio.insecure_channel(addr) as channel,
        ):
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            await stub.ModelInfer(_request(), timeout=20)
            deadline = (("x-evenserve-deadline-ms", "50"),)
            await stub.ModelInfer(_request(), timeout=20, metadata=deadline)
            await stub.ModelInfer(_request())
    finally:
        await server.stop(0)
    first, second, third = recorder.metadata
    # The client's 20 s (grpcio may round the deadline it sends up a little).
    assert 0 < float(first["x-evenserve-deadline-ms"]) < 30_000
    assert second["x-evenserve-deadline-ms"] == "50"
    assert "x-evenserve-deadline-ms" not in third


class _RawServer:
    """A gRPC server whose ModelInfer answers ``answer`` (bytes), recording each request."""

    def __init__(self, answer: bytes, port: int, seen: list[bytes]) -> None:
        async def infer(raw: bytes, context: Any) -> bytes:
            seen.append(raw)
            return answer

        self.server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(infer)
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "inference.GRPCInferenceService", {"ModelInfer": handler}
                ),
            )
        )
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace: float | None) -> None:
        await self.server.stop(grace)


def _raw_backend(answer: bytes, port: int, seen: list[bytes] | None = None) -> _RawServer:
    return _RawServer(answer, port, [] if seen is None else seen)


async def test_request_and_answer_bytes_are_relayed_unchanged(
    workers: list[BackgroundWorker],
) -> None:
    """The gateway forwards ModelInfer's bytes as they came and relays the backend's answer
    bytes as they went, fields out of protobuf's order and unknown fields included (a
    parse and a re-serialization would put the fields in order)."""
    answer = (
        b"\x2a\x06" + b"\x0a\x04out0"  # outputs[0].name, before model_name
        + b"\x0a\x02em"  # model_name
        + b"\xf8\x06\x07"  # field 111, unknown
    )  # fmt: skip
    seen: list[bytes] = []
    server = _raw_backend(answer, 0, seen)
    port = server.port
    await server.start()
    try:
        backends = specs(workers)[:1]
        backends[0]["grpc_url"] = f"127.0.0.1:{port}"
        x = np.arange(4, dtype=np.float32).tobytes()
        sent = (
            b"\x3a\x10" + x  # raw_input_contents[0], before model_name
            + b"\x0a\x02em"  # model_name
            + b"\x2a\x0d" + b"\x0a\x01x\x12\x04FP32\x1a\x02\x01\x04"  # inputs[0]
            + b"\xf8\x06\x05"  # field 111, unknown
        )  # fmt: skip
        async with (
            gateway(backends, "grpc") as (_g, addr),
            grpc.aio.insecure_channel(addr) as channel,
        ):
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            got = await call(sent, timeout=30)
    finally:
        await server.stop(0)
    assert seen == [sent] and got == answer
    # The same bytes parsed and serialized again come out in another order.
    assert service_pb2.ModelInferRequest.FromString(sent).SerializeToString() != sent


async def test_cli_host_applies_to_the_grpc_listener(workers: list[BackgroundWorker]) -> None:
    raw = {"gateway": {"grpc_port": 0, "host": "127.0.0.1"}, "backends": specs(workers)}
    g = Gateway(parse_cluster(raw, Path(".")), host="127.0.0.2")
    async with serving(g):
        assert g.grpc.address.startswith("127.0.0.2:")
        async with grpc.aio.insecure_channel(f"127.0.0.2:{g.grpc.port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            live = await stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30)
            assert live.live
