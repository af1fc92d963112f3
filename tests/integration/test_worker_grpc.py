"""NVIDIA's tritonclient (gRPC) against the worker's KServe v2 gRPC endpoint: health,
metadata, config, typed and raw inference, statistics and metrics shared with HTTP, and the
bad-input, unknown-model and refusal cases with their status codes."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
triton = pytest.importorskip("tritonclient.grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from evenserve.core.load import LoadReport  # noqa: E402
from evenserve.core.wire import LOAD_PATH  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.app import Worker  # noqa: E402
from evenserve.worker.options import WorkerOptions  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402

from .worker_repo import MODELS, metric_samples, write_repo  # noqa: E402

BODY_LIMIT = 16 * 1024


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("worker-grpc"))
    service = Worker(
        load_repository(repo),
        WorkerOptions(device=parse_device("cpu"), max_body_bytes=BODY_LIMIT),
    )
    with BackgroundWorker(service, grpc_port=0) as w:
        yield w


@pytest.fixture
def client(worker: BackgroundWorker) -> Iterator[Any]:
    c = triton.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
    yield c
    c.close()


@pytest.fixture
def stub(worker: BackgroundWorker) -> Iterator[Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{worker.grpc_port}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _input(name: str, arr: np.ndarray, dtype: str) -> Any:
    i = triton.InferInput(name, list(arr.shape), dtype)
    i.set_data_from_numpy(arr)  # raw_input_contents
    return i


def _error(fn: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        fn(*args, **kwargs)
    return err.value


def _rpc_error(fn: Any, request: Any) -> Any:
    with pytest.raises(grpc.RpcError) as err:
        fn(request, timeout=30)
    return err.value


def test_health_and_server_metadata(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "evenserve"
    assert "statistics" in meta["extensions"]
    assert client.is_model_ready("em")
    assert client.is_model_ready("em", model_version="1")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("em", model_version="7")
    index = client.get_model_repository_index(as_json=True)
    assert {m["name"] for m in index["models"]} == {"em", "pair", "waits"}
    assert {m["state"] for m in index["models"]} == {"READY"}


def test_model_metadata_and_config(client: Any) -> None:
    meta = client.get_model_metadata("pair", as_json=True)
    assert meta["inputs"] == [
        {"name": "ids", "datatype": "INT64", "shape": ["-1", "-1"]},
        {"name": "mask", "datatype": "INT64", "shape": ["-1", "-1"]},
    ]
    assert meta["versions"] == ["1"]
    cfg = client.get_model_config("em").config
    assert cfg.name == "em" and cfg.max_batch_size == 16
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.input] == [
        ("x", triton.model_config_pb2.TYPE_FP32, [4])
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.output] == [
        ("y", triton.model_config_pb2.TYPE_FP32, [2])
    ]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000


def test_infer_raw_contents(client: Any) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = client.infer("em", [_input("x", x, "FP32")], request_id="r1")
    y = result.as_numpy("y")
    # The emulated runtime answers zeros of the declared output shape.
    assert y.dtype == np.float32 and y.shape == (3, 2)
    assert np.array_equal(y, np.zeros((3, 2), dtype=np.float32))
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "em" and response.model_version == "1"
    ids = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    result = client.infer("pair", [_input("ids", ids, "INT64"), _input("mask", ids, "INT64")])
    assert np.array_equal(result.as_numpy("logits"), np.zeros((2, 2), dtype=np.float32))


def test_infer_typed_contents(stub: Any) -> None:
    req = service_pb2.ModelInferRequest(model_name="em")
    x = req.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    x.contents.fp32_contents.extend([float(v) for v in range(8)])
    resp = stub.ModelInfer(req, timeout=30)
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [("y", "FP32", [2, 2])]
    (raw,) = resp.raw_output_contents
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), np.zeros(4, dtype=np.float32))
    # Typed outputs when the request asks for them.
    req.parameters["binary_data_output"].bool_param = False
    resp = stub.ModelInfer(req, timeout=30)
    assert not resp.raw_output_contents
    assert list(resp.outputs[0].contents.fp32_contents) == [0.0] * 4


def test_priority_and_deadline_parameters(stub: Any) -> None:
    req = service_pb2.ModelInferRequest(model_name="em")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([0.0] * 4)
    req.parameters["priority"].string_param = "online"
    req.parameters["deadline_ms"].int64_param = 10_000
    assert list(stub.ModelInfer(req, timeout=30).outputs[0].shape) == [1, 2]
    req.parameters["deadline_ms"].int64_param = -5
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameters.deadline_ms" in err.details()
    # A deadline the profile (4 ms at batch 1) says cannot be met: refused at once.
    req.parameters["deadline_ms"].double_param = 0.5
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.details().startswith("deadline-infeasible")
    assert dict(err.trailing_metadata())["x-evenserve-reason"] == "deadline-infeasible"


def test_deadline_expired_while_waiting(stub: Any) -> None:
    # ``waits`` waits for a batch of 4 that never comes: the deadline passes in the queue.
    req = service_pb2.ModelInferRequest(model_name="waits")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([0.0] * 4)
    req.parameters["deadline_ms"].int64_param = 50
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.details().startswith("deadline-expired: model 'waits'")
    assert dict(err.trailing_metadata())["x-evenserve-reason"] == "deadline-expired"


def test_unknown_model_and_version_are_not_found(client: Any) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    err = _error(client.infer, "nope", [_input("x", x, "FP32")])
    assert err.status() == "StatusCode.NOT_FOUND" and "'nope' is not served here" in err.message()
    err = _error(client.infer, "em", [_input("x", x, "FP32")], model_version="7")
    assert err.status() == "StatusCode.NOT_FOUND" and "no version '7'" in err.message()
    for call in (client.get_model_metadata, client.get_model_config):
        assert _error(call, "nope").status() == "StatusCode.NOT_FOUND"
    assert _error(client.get_inference_statistics, "nope").status() == "StatusCode.NOT_FOUND"


#: A name far over grpc's 8 KiB metadata limit if an error message echoed it whole.
LONG_NAME = "m" * 10_000


def test_long_unknown_names_are_cut_in_messages(stub: Any) -> None:
    """A model name or version the worker does not serve is cut in the error message
    (``wire.shown``): the client sees NOT_FOUND, not RESOURCE_EXHAUSTED for a message over
    its metadata limit."""
    for rpc, request in (
        (stub.ModelInfer, service_pb2.ModelInferRequest(model_name=LONG_NAME)),
        (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=LONG_NAME)),
        (stub.ModelConfig, service_pb2.ModelConfigRequest(name=LONG_NAME)),
        (stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name=LONG_NAME)),
        (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="em", version=LONG_NAME)),
        (stub.ModelInfer, service_pb2.ModelInferRequest(model_name="em", model_version=LONG_NAME)),
    ):
        err = _rpc_error(rpc, request)
        assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
        assert len(err.details()) < 300 and "(10002 characters)" in err.details()


def test_rpcs_not_served_are_unimplemented_without_a_traceback(
    stub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        stream = stub.ModelStreamInfer(iter([service_pb2.ModelInferRequest(model_name="em")]))
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "ModelStreamInfer" in err.value.details() and "use ModelInfer" in err.value.details()
        for rpc, request in (
            (stub.TraceSetting, service_pb2.TraceSettingRequest()),
            (stub.LogSettings, service_pb2.LogSettingsRequest()),
            (stub.SystemSharedMemoryStatus, service_pb2.SystemSharedMemoryStatusRequest()),
            (stub.CudaSharedMemoryRegister, service_pb2.CudaSharedMemoryRegisterRequest()),
        ):
            e = _rpc_error(rpc, request)
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "is not implemented by this server" in e.details()
    logged = [
        r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR or "grpc" in r.name
    ]
    assert not logged, [r.getMessage() for r in logged]


def test_bytes_that_are_not_the_request_message_are_invalid_argument(
    worker: BackgroundWorker, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO),
        grpc.insecure_channel(f"127.0.0.1:{worker.grpc_port}") as channel,
    ):
        for rpc, what in (("ModelInfer", "ModelInferRequest"), ("ModelReady", "ModelReadyRequest")):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")
            with pytest.raises(grpc.RpcError) as err:
                call(b"\x0a\x05ab", timeout=30)  # a name cut short
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"the request is not a {what}" in err.value.details()
    logged = [
        r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR or "grpc" in r.name
    ]
    assert not logged, [r.getMessage() for r in logged]


def test_bad_inputs_are_invalid_argument_naming_the_input(client: Any, stub: Any) -> None:
    def bad(model: str, inputs: list[Any]) -> str:
        err = _error(client.infer, model, inputs)
        assert err.status() == "StatusCode.INVALID_ARGUMENT", err.message()
        return str(err.message())

    x = np.ones((1, 4), dtype=np.float32)
    assert "input 'x': shape [1, 5]" in bad(
        "em", [_input("x", np.ones((1, 5), np.float32), "FP32")]
    )
    assert "input 'x': datatype 'FP64'" in bad("em", [_input("x", x.astype(np.float64), "FP64")])
    ids = np.ones((1, 3), dtype=np.int64)
    assert "input 'mask': missing" in bad("pair", [_input("ids", ids, "INT64")])
    assert "input 'z': unexpected" in bad("em", [_input("z", x, "FP32")])
    assert "batch dimension 17" in bad("em", [_input("x", np.ones((17, 4), np.float32), "FP32")])
    # Typed contents: the wrong field, or the wrong count.
    req = service_pb2.ModelInferRequest(model_name="em")
    t = req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    t.contents.int_contents.extend([1, 2, 3, 4])
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': int_contents given for datatype FP32" in err.details()
    t.contents.ClearField("int_contents")
    t.contents.fp32_contents.extend([1.0, 2.0])
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': contents hold 2 elements" in err.details()
    # Raw contents of the wrong size.
    req = service_pb2.ModelInferRequest(model_name="em")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(b"\0" * 12)
    err = _rpc_error(stub.ModelInfer, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': raw_input_contents[0] holds 12 bytes" in err.details()


def test_message_over_the_limit_is_resource_exhausted(client: Any) -> None:
    x = np.ones((16, 4), dtype=np.float32)
    # 16 x 4 floats are far under the limit; a huge unexpected input is over it.
    big = np.ones((1, BODY_LIMIT), dtype=np.float32)
    err = _error(client.infer, "em", [_input("x", x, "FP32"), _input("huge", big, "FP32")])
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_statistics_and_metrics_count_grpc_requests(worker: BackgroundWorker, client: Any) -> None:
    before = client.get_inference_statistics("pair", as_json=True)["model_stats"][0]
    ok_before = int(before["inference_stats"]["success"].get("count", 0))
    ids = np.ones((1, 3), dtype=np.int64)
    for _ in range(3):
        client.infer("pair", [_input("ids", ids, "INT64"), _input("mask", ids, "INT64")])
    stats = client.get_inference_statistics("pair", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == ok_before + 3
    assert int(stats["inference_count"]) >= 3
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in everything} == {"em", "pair", "waits"}
    # The HTTP side reports the same figures: one set of metrics and statistics.
    http = httpx.get(f"{worker.url}/v2/models/pair/stats").json()["model_stats"][0]
    assert http["inference_stats"]["success"]["count"] == ok_before + 3
    counts = metric_samples(
        httpx.get(worker.url + "/metrics").text, "evenserve_worker_requests_total"
    )
    assert counts['evenserve_worker_requests_total{model="pair",outcome="success"}'] >= 3
    assert counts['evenserve_worker_requests_total{model="_unknown",outcome="not_found"}'] >= 1


def test_graceful_stop_turns_grpc_unavailable(tmp_path: Any) -> None:
    repo = write_repo(tmp_path)
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    worker = BackgroundWorker(service, grpc_port=0).start()
    port = worker.grpc_port
    c = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert c.is_server_ready()
        worker.stop()
        with pytest.raises(InferenceServerException) as err:
            c.is_server_live(client_timeout=5)
        assert "UNAVAILABLE" in str(err.value.status())
    finally:
        c.close()


def test_queue_full_is_resource_exhausted_and_the_stop_answers_the_queued(
    tmp_path: Path,
) -> None:
    """Two calls fill the queue of ``waits`` (a static batch of 4 that never comes), a third
    is refused; stopping the worker drains the queue, so the two open calls are answered."""
    repo = write_repo(tmp_path, {"waits": MODELS["waits"]})
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    req = service_pb2.ModelInferRequest(model_name="waits")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([0.0] * 4)
    worker = BackgroundWorker(service, grpc_port=0).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{worker.grpc_port}")
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        held = [stub.ModelInfer.future(req, timeout=120) for _ in range(2)]
        deadline = time.monotonic() + 60  # a hang guard only
        while (
            LoadReport.model_validate(httpx.get(worker.url + LOAD_PATH).json()).queued_by_model[
                "waits"
            ]
            < 2
        ):
            assert time.monotonic() < deadline, "the two calls never queued"
            time.sleep(0.01)
        err = _rpc_error(stub.ModelInfer, req)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue full (2 requests waiting)" in err.details()
        meta = dict(err.trailing_metadata())
        assert meta["x-evenserve-reason"] == "queue-full" and int(meta["retry-after"]) >= 1
        counts = metric_samples(
            httpx.get(worker.url + "/metrics").text, "evenserve_worker_requests_total"
        )
        key = 'evenserve_worker_requests_total{model="waits",outcome="rejected_queue_full"}'
        assert counts[key] == 1
        assert not any(f.done() for f in held)
        worker.stop()
        for f in held:
            assert list(f.result(timeout=60).outputs[0].shape) == [1, 2]
    finally:
        worker.stop()
        channel.close()
