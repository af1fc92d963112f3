"""A Triton model repository served by the worker: an ONNX model (written at test time by
scripts/make_triton_example.py, random weights) and a TorchScript one, each with a
config.pbtxt and several version folders; inference through tritonclient HTTP and gRPC, the
config Triton clients read, the ignored-field notes (logged and served), and versions that are
not served answering 404 / NOT_FOUND."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("tritonclient.grpc.model_config_pb2")
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "triton-repo" / "tiny_mlp" / "config.pbtxt"

TORCH_PBTXT = """
name: "tiny_ts"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
model_warmup [ { name: "w" batch_size: 1 } ]
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_triton_example", ROOT / "scripts" / "make_triton_example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchscript(path: Path) -> Any:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; still supported here
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(lin), str(path))
    return lin


def write_triton_repo(repo: Path) -> dict[str, Any]:
    """tiny_mlp: versions 1 and 3 with model.onnx, 2 too, 4 without a file (latest 2 serves
    3); tiny_ts: TorchScript version 1."""
    script = _script()
    mlp = repo / "tiny_mlp"
    mlp.mkdir(parents=True)
    pbtxt = EXAMPLE.read_text().replace("num_versions: 1", "num_versions: 3")
    (mlp / "config.pbtxt").write_text(pbtxt)
    for v, seed in (("1", 1), ("2", 2), ("3", 3)):
        script.write_tiny_mlp(mlp / v / "model.onnx", seed=seed)
    (mlp / "4").mkdir()
    (repo / "tiny_ts").mkdir()
    (repo / "tiny_ts" / "config.pbtxt").write_text(TORCH_PBTXT)
    lin = _torchscript(repo / "tiny_ts" / "1" / "model.pt")
    return {"script": script, "linear": lin}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundWorker, Any]]:
    repo = tmp_path_factory.mktemp("triton-repo")
    made = write_triton_repo(repo)
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    with BackgroundWorker(service, grpc_port=0) as w:
        yield w, made


@pytest.fixture(scope="module")
def worker(served: tuple[BackgroundWorker, Any]) -> BackgroundWorker:
    return served[0]


def _expected(x: np.ndarray, model_file: Path) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(["OUTPUT0"], {"INPUT0": x})[0]
    return out


def test_onnx_infer_http_and_grpc_serves_the_highest_allowed_version(
    worker: BackgroundWorker,
) -> None:
    x = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)
    model_dir = Path(worker.worker.models["tiny_mlp"].entry.directory)
    want = _expected(x, model_dir / "3" / "model.onnx")
    assert not np.allclose(want, _expected(x, model_dir / "2" / "model.onnx"))

    http = triton_http.InferenceServerClient(f"127.0.0.1:{worker.port}", network_timeout=30)
    i = triton_http.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    for version in ("", "3"):
        res = http.infer("tiny_mlp", [i], model_version=version)
        np.testing.assert_allclose(res.as_numpy("OUTPUT0"), want, rtol=1e-5, atol=1e-6)
        assert res.get_response()["model_version"] == "3"
    http.close()

    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
    g = triton_grpc.InferInput("INPUT0", list(x.shape), "FP32")
    g.set_data_from_numpy(x)
    res = grpc.infer("tiny_mlp", [g], model_version="3")
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), want, rtol=1e-5, atol=1e-6)
    grpc.close()


def test_torchscript_infer(served: tuple[BackgroundWorker, Any]) -> None:
    worker, made = served
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]], np.float32)
    with torch.no_grad():
        want = made["linear"](torch.from_numpy(x)).numpy()
    http = triton_http.InferenceServerClient(f"127.0.0.1:{worker.port}", network_timeout=30)
    i = triton_http.InferInput("INPUT__0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    res = http.infer("tiny_ts", [i])
    np.testing.assert_allclose(res.as_numpy("OUTPUT__0"), want, rtol=1e-5, atol=1e-6)
    http.close()


def test_config_is_the_original_triton_config(worker: BackgroundWorker) -> None:
    http = triton_http.InferenceServerClient(f"127.0.0.1:{worker.port}", network_timeout=30)
    cfg = http.get_model_config("tiny_mlp")
    http.close()
    assert cfg["name"] == "tiny_mlp"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] == 8
    assert cfg["input"] == [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}]
    assert cfg["output"] == [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    db = cfg["dynamic_batching"]
    assert (db["preferred_batch_size"], db["max_queue_delay_microseconds"]) == ([4, 8], 500)
    assert cfg["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    ignored = json.loads(cfg["parameters"]["evenserve_ignored"]["string_value"])
    assert any(n.startswith("dynamic_batching.preferred_batch_size") for n in ignored)
    assert any(n.startswith("version_policy (latest 3)") for n in ignored)
    assert "fixed-window" in cfg["parameters"]["evenserve_batching"]["string_value"]

    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
    g = grpc.get_model_config("tiny_mlp", as_json=True)["config"]
    grpc.close()
    assert g["max_batch_size"] == 8
    assert g["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in g["input"][0]["dims"]] == [16]
    assert g["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert g["instance_group"][0]["kind"] == "KIND_CPU"
    assert "evenserve_ignored" in g["parameters"]


def test_ts_config_notes_the_warmup(worker: BackgroundWorker) -> None:
    cfg = httpx.get(f"{worker.url}/v2/models/tiny_ts/config", timeout=30).json()
    assert cfg["backend"] == "pytorch"
    ignored = json.loads(cfg["parameters"]["evenserve_ignored"]["string_value"])
    assert ignored == [
        "model_warmup: ignored (evenserve warms every runtime up with synthetic inputs of its own)"
    ]


def test_only_the_served_version_answers(worker: BackgroundWorker) -> None:
    base = f"{worker.url}/v2/models/tiny_mlp"
    meta = httpx.get(base, timeout=30).json()
    assert meta["versions"] == ["3"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert httpx.get(f"{base}/versions/3/ready", timeout=30).status_code == 200
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]}
    for v in ("1", "2", "4", "9"):
        assert httpx.get(f"{base}/versions/{v}/ready", timeout=30).status_code == 404
        assert httpx.get(f"{base}/versions/{v}", timeout=30).status_code == 404
        assert httpx.post(f"{base}/versions/{v}/infer", json=body, timeout=30).status_code == 404
    assert httpx.post(f"{base}/versions/3/infer", json=body, timeout=30).status_code == 200

    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{worker.grpc_port}")
    assert grpc.is_model_ready("tiny_mlp", "3")
    assert not grpc.is_model_ready("tiny_mlp", "2")
    with pytest.raises(InferenceServerException) as err:
        grpc.get_model_metadata("tiny_mlp", "2")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    g = triton_grpc.InferInput("INPUT0", [1, 16], "FP32")
    g.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("tiny_mlp", [g], model_version="1")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    grpc.close()


def test_notes_are_logged_at_start_naming_model_and_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_triton_repo(tmp_path)
    with caplog.at_level(logging.WARNING, logger="evenserve.worker.service"):
        Worker(load_repository(tmp_path), WorkerOptions(device=parse_device("cpu")))
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("model 'tiny_ts': ") and "config.pbtxt: model_warmup: ignored" in line
        for line in lines
    )
    mlp = [line for line in lines if line.startswith("model 'tiny_mlp': ")]
    assert len(mlp) == 3  # preferred sizes, instance group, versions not served
    assert all("config.pbtxt: " in line for line in mlp)


def test_the_example_repository_loads(tmp_path: Path) -> None:
    repo = tmp_path / "triton-repo"
    shutil.copytree(EXAMPLE.parent.parent, repo, ignore=shutil.ignore_patterns("[0-9]*"))
    assert _script().main([str(repo)]) == 0
    (entry,) = load_repository(repo)
    assert (entry.name, entry.config.version, entry.config.runtime) == ("tiny_mlp", "1", "onnx")
    assert (entry.config.deadline_ms, entry.config.max_queue_size) == (2000.0, 256)
    service = Worker([entry], WorkerOptions(device=parse_device("cpu")))
    service.load()
    rt = service.models["tiny_mlp"].runtime
    out = rt.run({"INPUT0": np.ones((2, 16), np.float32)})
    assert out["OUTPUT0"].shape == (2, 4)
