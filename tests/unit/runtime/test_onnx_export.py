"""ONNX export, INT8 quantization and graph precision on the tiny example models: the exported
graph computes what the torch module does (dynamic batch and sequence length), quantized
graphs say int8 and stay close to fp32, and the onnx runtime serves an exported file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from evenserve.runtime.device import parse_device
from evenserve.runtime.onnx_runtime import OnnxParams

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from evenserve.runtime.onnx_export import (  # noqa: E402
    export_onnx,
    quantize_dynamic,
    quantize_static,
)
from evenserve.runtime.onnx_precision import graph_precision  # noqa: E402
from evenserve.worker.profiler import build_runtime  # noqa: E402
from evenserve.worker.repository import load_repository  # noqa: E402

TINY = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny"
MODELS = ("tiny-bert", "tiny-resnet")


def _batch(runtime: Any, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: token ids below the vocabulary, masks padded at the end, images."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for s in runtime.ctx.inputs:
        shape = [batch, *[seq if d == -1 else d for d in s.shape]]
        if s.name == "input_ids":
            out[s.name] = rng.integers(0, 100, size=shape).astype(s.dtype)
        elif s.name == "attention_mask":
            lengths = rng.integers(seq // 2, seq + 1, size=batch)
            out[s.name] = (np.arange(seq)[None, :] < lengths[:, None]).astype(s.dtype)
        else:
            out[s.name] = rng.standard_normal(shape).astype(s.dtype)
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ort(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["logits"], feed)[0])


class Exported:
    def __init__(self, runtime: Any, path: Path, provenance: dict[str, Any]) -> None:
        self.runtime, self.path, self.provenance = runtime, path, provenance


@pytest.fixture(scope="module", params=MODELS)
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Exported]:
    name = request.param
    (entry,) = load_repository(TINY, [name])
    runtime = build_runtime(entry, parse_device("cpu"), cpu_threads=1)
    runtime.load()
    path = tmp_path_factory.mktemp(name) / "model.onnx"
    provenance = export_onnx(runtime, _batch(runtime, 2, 16, seed=0), path)
    yield Exported(runtime, path, provenance)
    runtime.close()


def test_export_matches_torch_with_dynamic_batch_and_sequence(exported: Exported) -> None:
    prov = exported.provenance
    assert prov["exporter"].startswith("torch.onnx")
    assert isinstance(prov["opset"], int) and prov["bytes"] == exported.path.stat().st_size
    assert prov["inputs"] == [s.name for s in exported.runtime.ctx.inputs]
    assert prov["outputs"] == ["logits"]
    # Exported at batch 2, sequence 16; run at batch 3, sequence 11, padded masks.
    feed = _batch(exported.runtime, 3, 11, seed=1)
    got = _ort(exported.path, feed)
    want = exported.runtime.run(feed)["logits"]
    assert got.shape == want.shape == (3, want.shape[1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if "input_ids" in feed:
        assert prov["dynamic_axes"]["input_ids"] == {"0": "batch", "1": "input_ids_dim1"}


def test_graph_precision_of_the_fp32_export(exported: Exported) -> None:
    found = graph_precision(exported.path)
    assert found["precision"] == "fp32"
    assert found["initializers"]["float32"] > 0 and found["quantized_ops"] == {}
    assert found["quantized_weight_fraction"] == 0.0


def test_dynamic_and_static_int8_are_int8_and_close_to_fp32(
    exported: Exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the quantization tools leave nothing in the current folder
    folder = exported.path.parent
    runtime = exported.runtime
    dynamic = quantize_dynamic(exported.path, folder / "dynamic.onnx")
    assert dynamic["weight_type"] == "QInt8" and dynamic["bytes"] > 0
    calibration = [_batch(runtime, 4, 16, seed=10 + i) for i in range(3)]
    static = quantize_static(exported.path, folder / "static.onnx", calibration)
    assert static["calibration_batches"] == 3 and static["calibration_items"] == 12
    assert static["quant_format"] == "QDQ" and static["calibrate_method"] == "MinMax"
    found = graph_precision(folder / "dynamic.onnx")
    assert found["precision"] == "int8" and found["initializers"]["int8"] > 0
    assert found["quantized_ops"]["MatMulInteger"] > 0
    assert found["quantized_ops"]["DynamicQuantizeLinear"] > 0
    found = graph_precision(folder / "static.onnx")
    assert found["precision"] == "int8"
    assert found["quantized_ops"]["QuantizeLinear"] > 0
    assert found["quantized_ops"]["DequantizeLinear"] > 0
    for seed in (20, 21, 22):
        feed = _batch(runtime, 4, 16, seed=seed)
        fp32 = _ort(exported.path, feed)
        for name in ("dynamic.onnx", "static.onnx"):
            assert _cosine(_ort(folder / name, feed), fp32) > 0.9, (name, seed)
    assert dynamic["preprocessed"] == static["preprocessed"] == "full"
    assert list(tmp_path.iterdir()) == []


def test_static_quantization_needs_calibration_batches(exported: Exported, tmp_path: Path) -> None:
    from evenserve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="calibration"):
        quantize_static(exported.path, tmp_path / "q.onnx", [])


def test_onnx_runtime_serves_the_exported_file(exported: Exported, tmp_path: Path) -> None:
    ctx = exported.runtime.ctx
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(exported.path.read_bytes())
    config = {
        "runtime": "onnx",
        "max_batch_size": 8,
        "inputs": [
            {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in ctx.inputs
        ],
        "outputs": [
            {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in ctx.outputs
        ],
        "onnx": {"file": "model.onnx", "graph_optimization": "basic"},
    }
    (folder / "model.yaml").write_text(json.dumps(config))  # JSON is YAML
    (entry,) = load_repository(tmp_path, ["exported"])
    served = build_runtime(entry, parse_device("cpu"), cpu_threads=1)
    served.load()
    try:
        feed = _batch(exported.runtime, 3, 9, seed=5)
        got = served.run(feed)["logits"]
        np.testing.assert_allclose(got, exported.runtime.run(feed)["logits"], rtol=1e-4, atol=1e-5)
        described = served.describe()
        assert described["graph_optimization"] == "basic"
        assert described["precision"] == "fp32"
        assert described["onnxruntime_version"] and described["providers"]
    finally:
        served.close()


def test_onnx_params_graph_optimization() -> None:
    assert OnnxParams(file="m.onnx").graph_optimization == "all"
    assert OnnxParams(file="m.onnx", graph_optimization="disabled").graph_optimization == "disabled"
    with pytest.raises(ValidationError, match="graph_optimization"):
        OnnxParams.model_validate({"file": "m.onnx", "graph_optimization": "max"})


def test_export_of_a_torch_runtime_program(tmp_path: Path) -> None:
    import torch

    from evenserve.runtime.base import RuntimeContext, TensorSpec
    from evenserve.runtime.torch_runtime import TorchParams, TorchRuntime

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(net.eval(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "m.pt2"))
    ctx = RuntimeContext(
        "m",
        tmp_path,
        parse_device("cpu"),
        (TensorSpec("x", "FP32", (4,)),),
        (TensorSpec("logits", "FP32", (2,)),),
        TorchParams(file="m.pt2"),
        cpu_threads=1,
    )
    runtime = TorchRuntime(ctx)
    runtime.load()
    rng = np.random.default_rng(0)
    prov = export_onnx(
        runtime, {"x": rng.standard_normal((2, 4), dtype=np.float32)}, tmp_path / "m.onnx"
    )
    assert prov["outputs"] == ["logits"]
    feed = {"x": rng.standard_normal((5, 4), dtype=np.float32)}
    np.testing.assert_allclose(
        _ort(tmp_path / "m.onnx", feed), runtime.run(feed)["logits"], rtol=1e-5, atol=1e-6
    )
    assert graph_precision(tmp_path / "m.onnx")["precision"] == "fp32"
