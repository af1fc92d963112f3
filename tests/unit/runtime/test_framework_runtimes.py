"""Real runtimes on tiny models: transformers (config, random weights), TorchScript,
torch.export and ONNX Runtime. Outputs are checked against the framework called directly."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import RuntimeContext, TensorSpec
from evenserve.runtime.device import parse_device
from evenserve.runtime.onnx_runtime import OnnxParams, OnnxRuntime
from evenserve.runtime.torch_runtime import TorchParams, TorchRuntime
from evenserve.runtime.transformers_runtime import TransformersParams, TransformersRuntime
from evenserve.worker.executor import run_batch

torch = pytest.importorskip("torch")

TINY_BERT = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
}


def _ctx(
    params: object,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    model_dir: Path = Path("."),
) -> RuntimeContext:
    return RuntimeContext("m", model_dir, parse_device("cpu"), inputs, outputs, params)


BERT_IO = (
    (TensorSpec("input_ids", "INT64", (-1,)), TensorSpec("attention_mask", "INT64", (-1,))),
    (TensorSpec("logits", "FP32", (2,)),),
)


def test_transformers_bert_from_config_is_deterministic_and_batch_independent() -> None:
    p = TransformersParams(
        architecture="BertForSequenceClassification",
        config_class="BertConfig",
        config=TINY_BERT,
        seed=3,
    )
    rt = TransformersRuntime(_ctx(p, *BERT_IO))
    rt.load()
    ids = np.random.default_rng(0).integers(0, 50, size=(3, 10))
    mask = np.ones_like(ids)
    out = rt.run({"input_ids": ids, "attention_mask": mask})["logits"]
    assert out.shape == (3, 2) and out.dtype == np.float32
    single = rt.run({"input_ids": ids[1:2], "attention_mask": mask[1:2]})["logits"]
    np.testing.assert_allclose(out[1:2], single, rtol=1e-4, atol=1e-5)
    again = TransformersRuntime(_ctx(p, *BERT_IO))
    again.load()
    np.testing.assert_allclose(again.run({"input_ids": ids, "attention_mask": mask})["logits"], out)
    d = rt.describe()
    assert d["runtime"] == "transformers" and d["torch_version"] == torch.__version__
    assert rt.resident_bytes() > 0


def test_transformers_bf16_on_cpu() -> None:
    p = TransformersParams(
        architecture="BertForSequenceClassification",
        config_class="BertConfig",
        config=TINY_BERT,
        precision="bf16",
    )
    rt = TransformersRuntime(_ctx(p, *BERT_IO))
    rt.load()
    out = rt.run(
        {"input_ids": np.zeros((2, 4), np.int64), "attention_mask": np.ones((2, 4), np.int64)}
    )["logits"]
    assert out.dtype == np.float32 and np.isfinite(out).all()


def test_transformers_errors() -> None:
    with pytest.raises(ConfigError, match=r"transformers\.architecture: transformers has no class"):
        TransformersRuntime(
            _ctx(
                TransformersParams(architecture="NoSuchModel", config_class="BertConfig"), *BERT_IO
            )
        ).load()
    with pytest.raises(ConfigError, match=r"transformers\.config_class: required"):
        TransformersRuntime(_ctx(TransformersParams(architecture="BertModel"), *BERT_IO))
    with pytest.raises(ConfigError, match=r"transformers\.config"):
        TransformersRuntime(
            _ctx(
                TransformersParams(
                    architecture="BertModel",
                    config_class="BertConfig",
                    config={"hidden_size": 30, "num_attention_heads": 4},
                ),
                *BERT_IO,
            )
        ).load()
    bad_out = (BERT_IO[0], (TensorSpec("nonsense", "FP32", (2,)),))
    with pytest.raises(ConfigError, match="warm-up batch failed"):
        TransformersRuntime(
            _ctx(
                TransformersParams(
                    architecture="BertForSequenceClassification",
                    config_class="BertConfig",
                    config=TINY_BERT,
                ),
                *bad_out,
            )
        ).load()


class _Tiny(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y, y.sum(dim=1)


IO = (
    (TensorSpec("x", "FP32", (4,)),),
    (TensorSpec("y", "FP32", (3,)), TensorSpec("s", "FP32", ())),
)


def test_torchscript_and_export(tmp_path: Path) -> None:
    torch.manual_seed(0)
    mod = _Tiny().eval()
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; still supported here
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(mod), str(tmp_path / "m.pt"))
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
    rt = TorchRuntime(_ctx(TorchParams(file="m.pt"), *IO, model_dir=tmp_path))
    rt.load()
    out = rt.run({"x": x})
    np.testing.assert_allclose(out["y"], want, rtol=1e-5)
    assert out["s"].shape == (5,)
    assert rt.describe()["format"] == "torchscript"
    assert "deprecated" in rt.describe().get("notes", "deprecated")
    # Staged (the executor's compute_input): tensors on the device, which run takes as they
    # are; the executor times the two apart and gives the same answer.
    staged = rt.stage({"x": x})
    assert isinstance(staged["x"], torch.Tensor) and staged["x"].device.type == "cpu"
    np.testing.assert_allclose(rt.run(staged)["y"], want, rtol=1e-5)
    result = run_batch(rt, ["x"], [{"x": x[:2]}, {"x": x[2:]}])
    np.testing.assert_allclose(np.concatenate([o["y"] for o in result.outputs]), want, rtol=1e-5)
    assert result.compute_input_s > 0 and result.compute_infer_s > 0
    ep = torch.export.export(
        mod, (torch.zeros(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)
    )
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    rt2 = TorchRuntime(_ctx(TorchParams(file="m.pt2"), *IO, model_dir=tmp_path))
    rt2.load()
    np.testing.assert_allclose(rt2.run({"x": x})["y"], want, rtol=1e-5)
    assert rt2.describe()["format"] == "export"
    with pytest.raises(ConfigError, match=r"torch\.file: not found"):
        TorchRuntime(_ctx(TorchParams(file="absent.pt"), *IO, model_dir=tmp_path)).load()


def test_a_torch_model_loads_warm_from_its_host_pool_entry(tmp_path: Path) -> None:
    torch.manual_seed(0)
    mod = _Tiny().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(mod), str(tmp_path / "m.pt"))
    ep = torch.export.export(
        mod, (torch.zeros(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)
    )
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
    for name in ("m.pt", "m.pt2"):
        cold = TorchRuntime(_ctx(TorchParams(file=name), *IO, model_dir=tmp_path))
        cold.load()
        entry = tmp_path / f"{name}.entry"
        cold.write_pool_entry(entry)  # the file's bytes: its program and weights
        assert entry.stat().st_size == cold.pool_bytes() == (tmp_path / name).stat().st_size
        warm = TorchRuntime(_ctx(TorchParams(file=name), *IO, model_dir=tmp_path))
        warm.load_warm(entry)
        np.testing.assert_allclose(warm.run({"x": x})["y"], want, rtol=1e-5)
        assert warm.describe()["format"] == cold.describe()["format"]
        tag = cold.pool_tag()
        os.utime(tmp_path / name, ns=(1, 1))  # a changed file: another digest
        assert cold.pool_tag() != tag


def test_onnx_runtime(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    io = ((TensorSpec("x", "FP32", (4,)),), (TensorSpec("y", "FP32", (3,)),))
    rt = OnnxRuntime(_ctx(OnnxParams(file="m.onnx", intra_op_threads=1), *io, model_dir=tmp_path))
    rt.load()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(rt.run({"x": x})["y"], x @ w, rtol=1e-6)
    assert rt.describe()["providers"] == ["CPUExecutionProvider"]
    wrong = ((TensorSpec("input", "FP32", (4,)),), io[1])
    with pytest.raises(ConfigError, match=r"inputs\.input: the ONNX graph has no input 'input'"):
        OnnxRuntime(_ctx(OnnxParams(file="m.onnx"), *wrong, model_dir=tmp_path)).load()
