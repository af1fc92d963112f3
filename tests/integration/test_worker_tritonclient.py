"""NVIDIA's tritonclient (HTTP) against the worker: health, metadata, config, JSON and binary
inference, statistics, and every bad-input and overload case of the issue."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

from .worker_repo import MODELS, metric_samples, write_repo

BODY_LIMIT = 16 * 1024


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("worker"))
    service = Worker(
        load_repository(repo),
        WorkerOptions(device=parse_device("cpu"), max_body_bytes=BODY_LIMIT),
    )
    with BackgroundWorker(service) as w:
        yield w


@pytest.fixture
def client(worker: BackgroundWorker) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(f"127.0.0.1:{worker.port}", network_timeout=30)
    yield c
    c.close()


def _input(name: str, arr: np.ndarray, dtype: str, binary: bool = True) -> triton.InferInput:
    i = triton.InferInput(name, list(arr.shape), dtype)
    i.set_data_from_numpy(arr, binary_data=binary)
    return i


def _error(fn: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        fn(*args, **kwargs)  # type: ignore[operator]
    return err.value


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "evenserve"
    assert "binary_tensor_data" in meta["extensions"] and "statistics" in meta["extensions"]
    assert client.is_model_ready("em")
    assert client.is_model_ready("em", model_version="1")
    assert not client.is_model_ready("nope")
    index = client.get_model_repository_index()
    assert {m["name"] for m in index} == {"em", "pair", "waits"}


def test_model_metadata_and_config(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("pair")
    assert meta["inputs"] == [
        {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
    ]
    assert meta["versions"] == ["1"]
    cfg = client.get_model_config("em")
    assert cfg["max_batch_size"] == 16
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert cfg["instance_group"][0]["count"] == 1


@pytest.mark.parametrize("binary", [False, True])
def test_infer_json_and_binary(client: triton.InferenceServerClient, binary: bool) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = triton.InferRequestedOutput("y", binary_data=binary)
    res = client.infer("em", [_input("x", x, "FP32", binary)], outputs=[out], request_id="r-1")
    y = res.as_numpy("y")
    assert y.shape == (3, 2) and y.dtype == np.float32
    assert res.get_response()["id"] == "r-1"
    assert res.get_response()["model_name"] == "em"
    # No outputs requested: tritonclient asks for binary outputs of everything.
    ids = np.ones((2, 5), dtype=np.int64)
    res = client.infer("pair", [_input("ids", ids, "INT64", binary), _input("mask", ids, "INT64")])
    assert res.as_numpy("logits").shape == (2, 2)


def test_infer_with_gzip_request(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    res = client.infer("em", [_input("x", x, "FP32")], request_compression_algorithm="gzip")
    assert res.as_numpy("y").shape == (1, 2)


def test_statistics(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    client.infer("em", [_input("x", x, "FP32")])
    stats = client.get_inference_statistics("em")["model_stats"][0]
    assert stats["name"] == "em" and stats["version"] == "1"
    inf = stats["inference_stats"]
    assert inf["success"]["count"] >= 1 and inf["success"]["ns"] > 0
    assert inf["compute_infer"]["count"] >= 1 and inf["queue"]["count"] >= 1
    assert stats["execution_count"] >= 1 and stats["inference_count"] >= 1
    assert all(b["compute_infer"]["count"] >= 1 for b in stats["batch_stats"])
    everything = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} == {"em", "pair", "waits"}


def test_unknown_model_is_404(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    err = _error(client.infer, "nope", [_input("x", x, "FP32")])
    assert err.status() == "404" and "'nope' is not served here" in err.message()
    assert _error(client.get_model_metadata, "nope").status() == "404"
    assert _error(client.get_model_config, "nope").status() == "404"
    err = _error(client.infer, "em", [_input("x", x, "FP32")], model_version="7")
    assert err.status() == "404" and "no version '7'" in err.message()


def test_bad_inputs_are_400_naming_the_input(client: triton.InferenceServerClient) -> None:
    ids = np.ones((1, 3), dtype=np.int64)
    err = _error(client.infer, "pair", [_input("ids", ids, "INT64")])
    assert err.status() == "400" and "input 'mask': missing" in err.message()
    err = _error(
        client.infer,
        "pair",
        [_input("ids", ids, "INT64"), _input("mask", ids, "INT64"), _input("extra", ids, "INT64")],
    )
    assert err.status() == "400" and "input 'extra': unexpected" in err.message()
    x64 = np.ones((1, 4), dtype=np.float64)
    err = _error(client.infer, "em", [_input("x", x64, "FP64")])
    assert err.status() == "400" and "input 'x': datatype 'FP64'" in err.message()
    x5 = np.ones((1, 5), dtype=np.float32)
    err = _error(client.infer, "em", [_input("x", x5, "FP32", binary=False)])
    assert err.status() == "400" and "input 'x': shape [1, 5]" in err.message()
    big = np.ones((17, 4), dtype=np.float32)
    err = _error(client.infer, "em", [_input("x", big, "FP32")])
    assert err.status() == "400" and "batch dimension 17 must be in 1..16" in err.message()


def test_malformed_json_and_binary_header_are_400(worker: BackgroundWorker) -> None:
    with httpx.Client(base_url=worker.url) as c:
        url = "/v2/models/em/infer"
        r = c.post(url, content=b'{"inputs": [', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "parameters": {"binary_data_size": 16},
                    }
                ]
            }
        ).encode()
        body = head + np.ones(4, np.float32).tobytes()
        for hl in ("abc", "0", str(len(body) + 5), str(len(head) - 2)):
            r = c.post(url, content=body, headers={"Inference-Header-Content-Length": hl})
            assert r.status_code == 400, hl
            assert (
                "Inference-Header-Content-Length" in r.json()["error"]
                or "JSON" in (r.json()["error"])
            )
        r = c.post(
            url, content=body[:-3], headers={"Inference-Header-Content-Length": str(len(head))}
        )
        assert r.status_code == 400 and "input 'x': binary data ends" in r.json()["error"]
        r = c.post(url, content=b"\x00\x01", headers={"content-encoding": "gzip"})
        assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
        ok = c.post(url, content=body, headers={"Inference-Header-Content-Length": str(len(head))})
        assert ok.status_code == 200  # the server is unharmed


def test_body_over_the_limit_is_413(client: triton.InferenceServerClient) -> None:
    x = np.ones((16, 400), dtype=np.float32)  # 25.6 kB > 16 KiB
    err = _error(client.infer, "em", [_input("x", x, "FP32")])
    assert err.status() == "413" and "over the limit of 16384 bytes" in err.message()


def test_queue_full_is_429_with_retry_after(tmp_path: Path) -> None:
    """Two requests fill the queue of ``waits`` (a static batch of 4 that never comes), a
    third is refused. A worker of its own, so its shutdown can answer the two: no deadline
    has to outlast this machine's speed at sending the refused ones."""
    repo = write_repo(tmp_path, {"waits": MODELS["waits"]})
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
    statuses: list[int] = []
    with BackgroundWorker(service) as worker:

        def hold() -> None:
            r = httpx.post(f"{worker.url}/v2/models/waits/infer", json=body, timeout=120)
            statuses.append(r.status_code)

        holders = [threading.Thread(target=hold) for _ in range(2)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 60  # a hang guard only
        while (
            LoadReport.model_validate(httpx.get(worker.url + LOAD_PATH).json()).queued_by_model[
                "waits"
            ]
            < 2
        ):
            assert time.monotonic() < deadline, "the two requests never queued"
            time.sleep(0.01)
        client = triton.InferenceServerClient(f"127.0.0.1:{worker.port}", network_timeout=60)
        x = np.ones((1, 4), dtype=np.float32)
        err = _error(client.infer, "waits", [_input("x", x, "FP32")])
        client.close()
        assert err.status() == "429" and "queue full (2 requests waiting)" in err.message()
        r = httpx.post(f"{worker.url}/v2/models/waits/infer", json=body, timeout=60)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.headers["x-evenserve-reason"] == "queue-full"
        text = httpx.get(worker.url + "/metrics").text
        counts = metric_samples(text, "evenserve_worker_requests_total")
        key = 'evenserve_worker_requests_total{model="waits",outcome="rejected_queue_full"}'
        assert counts[key] == 2
        assert statuses == []  # still queued: the batch of 4 never formed
    # Leaving the block stops the worker: the drain runs what is queued, so both are answered.
    for t in holders:
        t.join(60)
    assert statuses == [200, 200]


def test_deadline_passed_is_504_and_counted(
    worker: BackgroundWorker, client: triton.InferenceServerClient
) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    err = _error(client.infer, "waits", [_input("x", x, "FP32")], timeout=50_000)
    assert err.status() == "504"
    assert err.message().startswith("deadline-expired: model 'waits'")
    text = httpx.get(worker.url + "/metrics").text
    samples = metric_samples(text, "evenserve_worker_requests_total")
    assert samples['evenserve_worker_requests_total{model="waits",outcome="deadline_expired"}'] >= 1


def test_every_request_was_answered_and_counted(worker: BackgroundWorker) -> None:
    # After all the cases above: nothing is left queued or running, the server is healthy.
    load = LoadReport.model_validate(httpx.get(worker.url + LOAD_PATH).json())
    assert load.queue_depth == 0 and load.in_flight == 0 and load.ready
    text = httpx.get(worker.url + "/metrics").text
    counts = metric_samples(text, "evenserve_worker_requests_total")
    for outcome in (
        "success",
        "bad_request",
        "too_large",
        "deadline_expired",
    ):
        assert sum(v for k, v in counts.items() if f'outcome="{outcome}"' in k) >= 1, outcome
    assert counts['evenserve_worker_requests_total{model="_unknown",outcome="not_found"}'] >= 1
