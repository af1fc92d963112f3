"""The gateway's gRPC front over the HTTP data plane (``grpc_forward: http``): what a backend
receives for a ModelInfer (the binary tensor extension, the class and deadline headers),
what the client gets back (raw or typed outputs, parameters, every refusal as the worker's
own gRPC front would give it, trailing metadata), retry-once, mixed backends (some relayed
over gRPC), and the same requests sent to a real worker directly and through the gateway
answered alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import struct
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from evenserve.cluster.file import parse_cluster  # noqa: E402
from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES  # noqa: E402
from evenserve.core.wire import BACKEND_HEADER, LOAD_WAIT_HEADER, REASON_HEADER  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402
from evenserve.worker.service import WorkerOptions, WorkerService  # noqa: E402

from .fake_v2 import serving  # noqa: E402
from .grpc_servers import SERVER, grpc_server  # noqa: E402, F401
from .worker_repo import write_repo  # noqa: E402

S = grpc.StatusCode


@dataclass
class Seen:
    """One inference request as the backend got it."""

    path: str
    headers: dict[str, str]
    head: dict[str, Any]
    binary: bytes


@dataclass
class EchoBackend:
    """A KServe v2 HTTP backend that answers each input back as an output (``<name>_out``,
    binary, or as JSON data with ``json_data``), or a set refusal; it records every
    inference request. Its model metadata and config are fixed JSON documents."""

    name: str
    models: list[str] = field(default_factory=lambda: ["echo"])
    status: int | None = None
    message: str = "refused"
    headers: dict[str, str] = field(default_factory=dict)
    json_data: bool = False
    garbage: bool = False
    #: When set, every inference waits for it (a test releases it).
    gate: asyncio.Event | None = None
    seen: list[Seen] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v2/health/live", self._ok),
                Route("/v2/health/ready", self._ok),
                Route("/v2/models/{model}", self._meta),
                Route("/v2/models/{model}/config", self._config),
                Route("/v2/models/{model}/infer", self._infer, methods=["POST"]),
                Route("/v2/models/{model}/versions/{v}/infer", self._infer, methods=["POST"]),
            ]
        )

    async def _ok(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _meta(self, request: Request) -> Response:
        m = request.path_params["model"]
        if m not in self.models:
            return JSONResponse({"error": f"unknown model {m!r}"}, status_code=404)
        return JSONResponse(
            {
                "name": m,
                "versions": ["1"],
                "platform": "echo",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1, 4]}],
                "extra_field": "ignored",
            }
        )

    async def _config(self, request: Request) -> Response:
        if self.garbage:
            return Response(b"{not json", media_type="application/json")
        m = request.path_params["model"]
        return JSONResponse({"name": m, "max_batch_size": 8, "backend": "echo", "x": 1})

    async def _infer(self, request: Request) -> Response:
        body = await request.body()
        n = int(request.headers.get("inference-header-content-length", len(body)))
        head = json.loads(body[:n])
        self.seen.append(Seen(request.url.path, dict(request.headers), head, body[n:]))
        if self.gate is not None:
            await self.gate.wait()
        if self.status is not None:
            return JSONResponse(
                {"error": self.message}, status_code=self.status, headers=self.headers
            )
        if self.garbage:
            return Response(b"\x00garbage", media_type="application/octet-stream")
        outputs, blobs, offset = [], [], 0
        for t in head["inputs"]:
            size = t["parameters"]["binary_data_size"]
            blob = body[n + offset : n + offset + size]
            offset += size
            out: dict[str, Any] = {
                "name": f"{t['name']}_out",
                "datatype": t["datatype"],
                "shape": t["shape"],
            }
            if self.json_data:
                out["data"] = np.frombuffer(blob, DATATYPES[t["datatype"]]).tolist()
            else:
                out["parameters"] = {"binary_data_size": size}
                blobs.append(blob)
            outputs.append(out)
        answer: dict[str, Any] = {
            "model_name": request.path_params["model"],
            "model_version": request.path_params.get("v", "1"),
            "outputs": outputs,
            "parameters": {"backend": self.name, "inputs": len(outputs)},
        }
        if "id" in head:
            answer["id"] = head["id"]
        h = json.dumps(answer).encode()
        headers = {"content-type": "application/octet-stream", **self.headers}
        if blobs:
            headers["inference-header-content-length"] = str(len(h))
        return Response(h + b"".join(blobs), headers=headers)


@contextlib.asynccontextmanager
async def gateway(backends: list[dict[str, Any]], **gw: Any) -> AsyncIterator[tuple[Gateway, Any]]:
    """A gateway over ``backends`` (no load signals: readiness and in-flight counts) and a
    stub on its gRPC port."""
    raw = {
        "gateway": {
            "routing": "round-robin",
            "grpc_port": 0,
            "grpc_server": SERVER[0],
            "health": {"interval_ms": 50, "timeout_ms": 10_000},
            **gw,
        },
        "backends": [{"signals": {"source": "none"}, **b} for b in backends],
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with serving(g), grpc.aio.insecure_channel(f"127.0.0.1:{g.grpc.port}") as ch:
        yield g, service_pb2_grpc.GRPCInferenceServiceStub(ch)


@contextlib.asynccontextmanager
async def echoes(*backends: EchoBackend) -> AsyncIterator[list[dict[str, Any]]]:
    """The echo backends served, as the cluster file's backend entries."""
    async with contextlib.AsyncExitStack() as stack:
        specs = []
        for b in backends:
            s = await stack.enter_async_context(serving(b.app()))
            specs.append({"name": b.name, "url": s.url, "models": list(b.models)})
        yield specs


def lengths(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


async def call(stub: Any, req: Any, **kw: Any) -> tuple[Any, dict[str, str]]:
    """The response and the trailing metadata."""
    c = stub.ModelInfer(req, timeout=30, **kw)
    resp = await c
    return resp, dict(await c.trailing_metadata())


async def refused(stub: Any, req: Any, **kw: Any) -> tuple[Any, str, dict[str, str]]:
    """The status code, message and trailing metadata of a refused call."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(req, timeout=kw.pop("timeout", 30), **kw)
    e = err.value
    return e.code(), e.details() or "", dict(e.trailing_metadata() or ())


# -- what the backend gets, what the client gets -----------------------------------------------
async def test_raw_and_typed_inputs_of_every_datatype_round_trip() -> None:
    """Several inputs of every datatype, raw and typed, asked back raw and typed: the
    backend gets each tensor's bytes after the JSON header, the client gets them back."""
    arrays = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
        "d": np.array([[1e300, -0.5]]),
        "i8": np.array([[-128, 127]], dtype=np.int8),
        "u16": np.array([[0, 65535]], dtype=np.uint16),
        "i64": np.array([[-(2**63), 2**63 - 1]], dtype=np.int64),
        "u64": np.array([[2**64 - 1]], dtype=np.uint64),
        "b": np.array([[True, False]]),
    }
    dts = {"f": "FP32", "d": "FP64", "i8": "INT8", "u16": "UINT16", "i64": "INT64",
           "u64": "UINT64", "b": "BOOL"}  # fmt: skip
    texts = [b"ab", b"", "\u00e9".encode()]
    backend = EchoBackend("e0")
    async with echoes(backend) as specs, gateway(specs) as (_g, stub):
        for typed in (False, True):
            req = service_pb2.ModelInferRequest(model_name="echo", id=f"typed-{typed}")
            for name, arr in arrays.items():
                t = req.inputs.add(name=name, datatype=dts[name], shape=list(arr.shape))
                if typed:
                    getattr(t.contents, CONTENTS_FIELD[dts[name]]).extend(arr.reshape(-1).tolist())
                else:
                    req.raw_input_contents.append(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
            t = req.inputs.add(name="s", datatype="BYTES", shape=[1, 3])
            if typed:
                t.contents.bytes_contents.extend(texts)
            else:
                req.raw_input_contents.append(lengths(texts))
            resp, trailing = await call(stub, req)
            assert trailing[BACKEND_HEADER] == "e0"
            seen = backend.seen[-1]
            assert seen.path == "/v2/models/echo/infer"
            assert seen.headers["content-type"] == "application/octet-stream"
            raws = [a.astype(a.dtype.newbyteorder("<")).tobytes() for a in arrays.values()]
            assert seen.binary == b"".join(raws) + lengths(texts)
            assert resp.id == f"typed-{typed}" and resp.model_name == "echo"
            assert [o.name for o in resp.outputs] == [f"{n}_out" for n in [*arrays, "s"]]
            assert list(resp.raw_output_contents) == [*raws, lengths(texts)]
            assert resp.parameters["backend"].string_param == "e0"
            assert resp.parameters["inputs"].int64_param == 8

        # The same outputs as typed contents.
        req.parameters["binary_data_output"].bool_param = False
        resp, _ = await call(stub, req)
        assert not resp.raw_output_contents
        for o, (name, arr) in zip(resp.outputs, arrays.items(), strict=False):
            got = list(getattr(o.contents, CONTENTS_FIELD[dts[name]]))
            assert got == arr.reshape(-1).tolist(), name
        assert list(resp.outputs[-1].contents.bytes_contents) == texts
        # FP16 has no typed contents: refused after the answer, as the worker does.
        half = service_pb2.ModelInferRequest(model_name="echo")
        half.inputs.add(name="h", datatype="FP16", shape=[1, 2])
        half.raw_input_contents.append(np.ones(2, dtype="<f2").tobytes())
        resp, _ = await call(stub, half)
        assert list(resp.raw_output_contents) == [np.ones(2, dtype="<f2").tobytes()]
        half.parameters["binary_data_output"].bool_param = False
        code, message, _ = await refused(stub, half)
        assert code == S.INVALID_ARGUMENT and "output 'h_out': 'FP16' has no typed" in message


async def test_version_id_parameters_class_and_deadline_reach_the_backend() -> None:
    backend = EchoBackend("e0")
    async with echoes(backend) as specs, gateway(specs) as (_g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo", model_version="2", id="r7")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend(
            [1.0, 2.0]
        )
        req.parameters["priority"].string_param = "online"
        req.parameters["timeout"].int64_param = 250_000
        req.parameters["deadline_ms"].double_param = math.nan
        req.outputs.add(name="x_out").parameters["custom"].string_param = "c"
        meta = (("x-evenserve-priority", "offline"), ("x-evenserve-deadline-ms", "80"))
        resp, _ = await call(stub, req, metadata=meta)
        assert resp.model_version == "2" and resp.id == "r7"
        seen = backend.seen[-1]
        assert seen.path == "/v2/models/echo/versions/2/infer"
        assert seen.head["id"] == "r7"
        assert seen.head["parameters"] == {
            "priority": "online", "timeout": 250_000, "deadline_ms": "nan",
            "binary_data_output": True,
        }  # fmt: skip
        assert seen.head["outputs"] == [
            {"name": "x_out", "parameters": {"custom": "c", "binary_data": True}}
        ]
        assert seen.headers["x-evenserve-priority"] == "offline"
        assert seen.headers["x-evenserve-deadline-ms"] == "80"  # sooner than the 30 s
        # Without the header, the client's gRPC deadline is the request's deadline (30 s;
        # grpcio may round the deadline it sends up a little).
        await call(stub, req)
        assert 0 < float(backend.seen[-1].headers["x-evenserve-deadline-ms"]) < 31_000
        assert "x-evenserve-priority" not in backend.seen[-1].headers
        await stub.ModelInfer(req)  # no deadline at all
        assert "x-evenserve-deadline-ms" not in backend.seen[-1].headers


async def test_an_answer_as_json_data_is_translated() -> None:
    backend = EchoBackend("e0", json_data=True)
    async with echoes(backend) as specs, gateway(specs) as (_g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo")
        req.inputs.add(name="x", datatype="INT32", shape=[1, 3]).contents.int_contents.extend(
            [1, -2, 3]
        )
        resp, _ = await call(stub, req)
        assert list(resp.raw_output_contents) == [np.array([1, -2, 3], dtype="<i4").tobytes()]


# The worker's own gRPC status for each HTTP refusal (worker/grpc_api.py, core/wire.py).
REFUSALS = [
    (400, {}, S.INVALID_ARGUMENT),
    (404, {}, S.NOT_FOUND),
    (413, {}, S.RESOURCE_EXHAUSTED),
    (422, {}, S.INVALID_ARGUMENT),
    (429, {REASON_HEADER: "shed", "retry-after": "1"}, S.RESOURCE_EXHAUSTED),
    (429, {REASON_HEADER: "queue-full", "retry-after": "2"}, S.RESOURCE_EXHAUSTED),
    (500, {}, S.INTERNAL),
    (501, {}, S.UNIMPLEMENTED),
    (503, {"retry-after": "3", LOAD_WAIT_HEADER: "12.000"}, S.UNAVAILABLE),
    (504, {REASON_HEADER: "deadline-expired"}, S.DEADLINE_EXCEEDED),
    (418, {}, S.INTERNAL),
]


@pytest.mark.parametrize(("status", "headers", "code"), REFUSALS)
async def test_every_refusal_is_the_workers_grpc_status_with_its_metadata(
    status: int, headers: dict[str, str], code: Any
) -> None:
    backend = EchoBackend("e0", status=status, message=f"says {status}", headers=headers)
    async with echoes(backend) as specs, gateway(specs) as (g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo")
        req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
        got, message, trailing = await refused(stub, req)
        assert got == code and message == f"says {status}"
        assert trailing[BACKEND_HEADER] == "e0"
        for k, v in headers.items():
            assert trailing[k] == v
        # Only one backend: a 503 or queue-full is tried once, nowhere else to go.
        assert len(backend.seen) == 1
        assert g.metrics.render().decode().count('backend="e0",model="echo"') >= 1


async def test_a_refusal_that_did_not_take_the_work_is_retried_once_elsewhere() -> None:
    """503 and 429 ``queue-full`` go to the other backend; 429 ``shed`` does not; when both
    refuse, the last refusal is the answer."""
    a, b = EchoBackend("a", status=503, message="a not ready"), EchoBackend("b")
    async with echoes(a, b) as specs, gateway(specs) as (g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo")
        req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
        served: Counter[str] = Counter()
        for _ in range(4):  # round-robin: every other request tries a first
            _, trailing = await call(stub, req)
            served[trailing[BACKEND_HEADER]] += 1
        # Each call that tried a first was sent on to b, once.
        assert served == {"b": 4} and len(a.seen) >= 2
        assert g.metrics.retries.labels("echo")._value.get() == len(a.seen)

        a.status, a.headers = 429, {REASON_HEADER: "queue-full", "retry-after": "1"}
        for _ in range(2):
            _, trailing = await call(stub, req)
            assert trailing[BACKEND_HEADER] == "b"
        a.headers = {REASON_HEADER: "shed"}
        codes = Counter()
        for _ in range(2):
            try:
                await call(stub, req)
                codes["ok"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                assert dict(exc.trailing_metadata())[REASON_HEADER] == "shed"
        assert codes == {"ok": 1, "RESOURCE_EXHAUSTED": 1}

        b.status, b.message, b.headers = 503, "b not ready", {"retry-after": "4"}
        a.status, a.headers = 503, {}
        code, message, trailing = await refused(stub, req)
        assert code == S.UNAVAILABLE and message in ("a not ready", "b not ready")
        assert trailing[BACKEND_HEADER] in ("a", "b")


async def test_an_answer_that_is_no_inference_response_is_internal_naming_the_backend() -> None:
    async with echoes(EchoBackend("e0", garbage=True)) as specs, gateway(specs) as (_g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo")
        req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
        code, message, trailing = await refused(stub, req)
        assert code == S.INTERNAL
        assert message.startswith("backend e0 answered what is not a v2 inference response")
        assert trailing[BACKEND_HEADER] == "e0"
        for rpc, r in ((stub.ModelConfig, service_pb2.ModelConfigRequest(name="echo")),):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rpc(r, timeout=30)
            assert err.value.code() == S.INTERNAL
            assert "backend e0: its model config is not readable" in (err.value.details() or "")


async def test_requests_the_gateway_cannot_translate_are_refused_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing reaches the backend; INVALID_ARGUMENT (NOT_FOUND for a version no route can
    name) naming the field; counted as the client's error; nothing logged."""
    backend = EchoBackend("e0")
    async with echoes(backend) as specs, gateway(specs) as (g, stub):
        bad_typed = service_pb2.ModelInferRequest(model_name="echo")
        bad_typed.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.int_contents.extend(
            [1, 2]
        )
        bad_raw = service_pb2.ModelInferRequest(model_name="echo")
        bad_raw.inputs.add(name="x", datatype="FP32", shape=[1])
        bad_raw.inputs.add(name="y", datatype="FP32", shape=[1])
        bad_raw.raw_input_contents.append(bytes(4))
        bad_flag = service_pb2.ModelInferRequest(model_name="echo")
        bad_flag.inputs.add(name="x", datatype="FP32", shape=[1])
        bad_flag.raw_input_contents.append(bytes(4))
        bad_flag.parameters["binary_data_output"].int64_param = 1
        long_version = service_pb2.ModelInferRequest(model_name="echo", model_version="v" * 5000)
        with caplog.at_level(logging.INFO):
            for req, code, words, meta in (
                (bad_typed, S.INVALID_ARGUMENT, "input 'x': int_contents given", ()),
                (bad_raw, S.INVALID_ARGUMENT, "raw_input_contents: 1 given for 2 inputs", ()),
                (bad_flag, S.INVALID_ARGUMENT, "parameters.binary_data_output", ()),
                (long_version, S.NOT_FOUND, "has no version 'vvvv", ()),
            ):
                got, message, trailing = await refused(stub, req, metadata=meta)
                assert got == code and words in message, message
                assert BACKEND_HEADER not in trailing
                assert len(message) < 400
        assert backend.seen == []
        text = g.metrics.render().decode()
        assert 'model="echo",outcome="client_error"} 4.0' in text
        logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
        assert not logged, [r.getMessage()[:300] for r in logged]


async def test_a_call_given_up_by_its_client_is_answered_once_and_nothing_breaks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's deadline passes while the backend holds the request: the client gets
    DEADLINE_EXCEEDED from grpc; the backend's later answer is dropped quietly; the next
    call is served."""
    backend = EchoBackend("e0", gate=asyncio.Event())
    async with echoes(backend) as specs, gateway(specs) as (g, stub):
        req = service_pb2.ModelInferRequest(model_name="echo")
        req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
        with caplog.at_level(logging.INFO):
            code, _, _ = await refused(stub, req, timeout=0.3)
            assert code == S.DEADLINE_EXCEEDED
            assert backend.gate is not None
            backend.gate.set()
            for _ in range(100):  # the dispatcher settles the first request
                if g.registry.router.view("e0").in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            resp, _ = await call(stub, req)
            assert len(resp.raw_output_contents) == 1 and len(backend.seen) == 2
        logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
        assert not logged, [r.getMessage()[:300] for r in logged]


async def test_metadata_and_config_are_read_over_http() -> None:
    async with echoes(EchoBackend("e0")) as specs, gateway(specs) as (_g, stub):
        c = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="echo"), timeout=30)
        meta = await c
        assert meta.name == "echo" and meta.platform == "echo"
        assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
            ("x", "FP32", [-1, 4])
        ]
        assert dict(await c.trailing_metadata())[BACKEND_HEADER] == "e0"
        conf = await stub.ModelConfig(service_pb2.ModelConfigRequest(name="echo"), timeout=30)
        assert conf.config.name == "echo" and conf.config.max_batch_size == 8
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(name="echo", version="x" * 300), timeout=30
            )
        assert err.value.code() == S.NOT_FOUND


# -- backends relayed to over gRPC, next to backends over HTTP ---------------------------------
class _GrpcEcho(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """A backend's gRPC side: each raw input back as an output, counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.calls += 1
        resp = service_pb2.ModelInferResponse(model_name=request.model_name, id="via-grpc")
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            resp.outputs.add(name=f"{t.name}_out", datatype=t.datatype, shape=list(t.shape))
            resp.raw_output_contents.append(raw)
        return resp


async def test_a_model_on_backends_of_both_kinds_is_served_by_each_its_own_way() -> None:
    """``r`` is relayed to over gRPC (``grpc_forward: grpc``), ``h`` takes HTTP: round-robin
    sends every other call to each, and each answers the same tensors."""
    relayed, http = EchoBackend("r"), EchoBackend("h")
    echo = _GrpcEcho()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(echo, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with echoes(relayed, http) as specs:
            specs[0].update(grpc_url=f"127.0.0.1:{port}", grpc_forward="grpc")
            async with gateway(specs) as (_g, stub):
                x = np.arange(4, dtype=np.float32).reshape(1, 4)
                req = service_pb2.ModelInferRequest(model_name="echo")
                req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
                req.raw_input_contents.append(x.tobytes())
                served: Counter[str] = Counter()
                for _ in range(4):
                    resp, trailing = await call(stub, req)
                    assert list(resp.raw_output_contents) == [x.tobytes()]
                    served[trailing[BACKEND_HEADER]] += 1
                assert served == {"r": 2, "h": 2}
                assert echo.calls == 2 and len(http.seen) == 2 and relayed.seen == []
                # A request the HTTP side cannot take is refused at once, wherever it goes.
                bad = service_pb2.ModelInferRequest(model_name="echo")
                bad.inputs.add(name="x", datatype="FP16", shape=[1]).contents.fp32_contents.append(
                    1.0
                )
                code, message, _ = await refused(stub, bad)
                assert code == S.INVALID_ARGUMENT and "'FP16' has no typed contents" in message
    finally:
        await server.stop(0)


# -- a real worker: directly and through the gateway, the same answers ------------------------
@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("gw-grpc-codec"))
    svc = WorkerService(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    with BackgroundWorker(svc, grpc_port=0) as w:
        yield w


def _em(rows: int = 1, typed: bool = False, **params: Any) -> Any:
    req = service_pb2.ModelInferRequest(model_name="em", id="e")
    t = req.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    values = [float(v) for v in range(rows * 4)]
    if typed:
        t.contents.fp32_contents.extend(values)
    else:
        req.raw_input_contents.append(np.array(values, dtype="<f4").tobytes())
    for k, v in params.items():
        p = req.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = v
    return req


def _pair(typed: bool) -> Any:
    req = service_pb2.ModelInferRequest(model_name="pair")
    ids = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    for name in ("ids", "mask"):
        t = req.inputs.add(name=name, datatype="INT64", shape=[2, 3])
        if typed:
            t.contents.int64_contents.extend(ids.reshape(-1).tolist())
        else:
            req.raw_input_contents.append(ids.tobytes())
    return req


def _edit(req: Any, fn: Any) -> Any:
    fn(req)
    return req


SAME = [
    ("raw", _em(3)),
    ("typed", _em(2, typed=True)),
    ("typed-out", _em(2, typed=True, binary_data_output=False)),
    ("two-inputs", _pair(False)),
    ("two-inputs-typed", _pair(True)),
    ("output-named", _edit(_em(), lambda r: r.outputs.add(name="y"))),
    ("output-typed", _edit(_em(), lambda r: r.outputs.add(name="y").parameters[
        "binary_data"].__setattr__("bool_param", False))),
    ("version", _edit(_em(), lambda r: r.__setattr__("model_version", "1"))),
    ("priority", _em(priority="online", deadline_ms=10_000)),
    # Refusals: the worker's and the gateway's (translating) are the same status.
    ("unknown-model", _edit(_em(), lambda r: r.__setattr__("model_name", "nope"))),
    ("unknown-version", _edit(_em(), lambda r: r.__setattr__("model_version", "7"))),
    ("unsafe-version", _edit(_em(), lambda r: r.__setattr__("model_version", "a/b"))),
    ("datatype", _edit(_em(), lambda r: r.inputs[0].__setattr__("datatype", "FP64"))),
    ("shape", _edit(_em(), lambda r: r.inputs[0].shape.__setitem__(1, 5))),
    ("batch", _em(17)),
    ("unexpected", _edit(_em(), lambda r: r.inputs[0].__setattr__("name", "z"))),
    ("missing", _edit(_pair(True), lambda r: r.inputs.pop())),
    ("wrong-field", _edit(_em(typed=True), lambda r: r.inputs[0].contents.int_contents.append(1))),
    ("count", _edit(_em(typed=True), lambda r: r.inputs[0].contents.fp32_contents.append(1.0))),
    ("raw-size", _edit(_em(), lambda r: r.raw_input_contents.__setitem__(0, bytes(12)))),
    ("raw-count", _edit(_em(), lambda r: r.raw_input_contents.append(bytes(16)))),
    ("unknown-output", _edit(_em(), lambda r: r.outputs.add(name="w"))),
    ("classification", _edit(_em(), lambda r: r.outputs.add(name="y").parameters[
        "classification"].__setattr__("int64_param", 2))),
    ("flag", _em(binary_data_output="yes")),
    ("priority-bad", _em(priority="urgent")),
    ("deadline-bad", _em(deadline_ms=-5)),
    ("deadline-nan", _em(deadline_ms=math.nan)),
    ("timeout-float", _em(timeout=5.0)),
    ("sequence", _em(sequence_id=3)),
    ("infeasible", _em(deadline_ms=0.5)),
]  # fmt: skip


#: The refusals the gateway words otherwise than the worker's gRPC front (the same status):
#: a model no backend hosts (the gateway's own NOT_FOUND, as over HTTP), a version no HTTP
#: route can name (the gateway does not know the versions), raw contents of the wrong size
#: (the worker's HTTP words: binary_data_size), a non-finite double (its text in JSON).
WORDED_APART = {
    "unknown-model": "model 'nope'",
    "unsafe-version": "model 'em' has no version 'a/b'",
    "raw-size": "input 'x': ",
    "deadline-nan": "parameters.deadline_ms: must be a number of milliseconds > 0, got ",
}


@pytest.mark.parametrize(("case", "req"), SAME, ids=[c for c, _ in SAME])
async def test_a_worker_answers_alike_directly_and_through_the_gateway(
    worker: BackgroundWorker, case: str, req: Any
) -> None:
    backends = [{"name": "w0", "url": worker.url, "models": ["em", "pair", "waits"]}]
    async with (
        gateway(backends) as (_g, stub),
        grpc.aio.insecure_channel(f"127.0.0.1:{worker.grpc_port}") as channel,
    ):
        direct = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = []
        for s in (direct, stub):
            try:
                answers.append(("ok", await s.ModelInfer(req, timeout=30), {}))
            except grpc.aio.AioRpcError as exc:
                meta = dict(exc.trailing_metadata() or ())
                meta.pop(BACKEND_HEADER, None)
                answers.append((exc.code(), exc.details() or "", meta))
        (want_code, want, want_meta), (got_code, got, got_meta) = answers
        assert got_code == want_code, (want, got)
        if want_code == "ok":
            assert got == want
        else:
            assert got_meta == want_meta
            shared = WORDED_APART.get(case)
            if shared is None:
                assert got == want
            else:  # the same field named, in other words
                assert shared in got and shared in want, (want, got)
