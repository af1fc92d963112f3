"""The core install needs none of the optional frameworks; a missing one names its extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evenserve.runtime import base
from evenserve.runtime.base import RuntimeContext, RuntimeMissingError, TensorSpec, require
from evenserve.runtime.device import parse_device
from evenserve.runtime.onnx_runtime import OnnxParams, OnnxRuntime
from evenserve.runtime.transformers_runtime import TransformersParams, TransformersRuntime


def test_require_names_the_extra() -> None:
    with pytest.raises(RuntimeMissingError, match=r"pip install 'evenserve\[onnx\]'"):
        require("surely_not_a_module_xyz", "onnx")


def _ctx(params: object) -> RuntimeContext:
    return RuntimeContext(
        model="m",
        model_dir=Path("."),
        device=parse_device("cpu"),
        inputs=(TensorSpec("x", "FP32", (2,)),),
        outputs=(TensorSpec("y", "FP32", (2,)),),
        params=params,
    )


def test_missing_frameworks_fail_at_load_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = base.importlib.import_module

    def fake_import(name: str, package: str | None = None) -> object:
        if name.split(".")[0] in ("torch", "transformers", "onnxruntime"):
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(base.importlib, "import_module", fake_import)
    rt = TransformersRuntime(
        _ctx(TransformersParams(architecture="BertModel", config_class="BertConfig"))
    )
    with pytest.raises(RuntimeMissingError, match=r"evenserve\[transformers\]"):
        rt.load()
    with pytest.raises(RuntimeMissingError, match=r"evenserve\[onnx\]"):
        OnnxRuntime(_ctx(OnnxParams(file="m.onnx"))).load()


def test_core_modules_import_without_heavy_frameworks() -> None:
    # A fresh interpreter in which torch, transformers and onnxruntime cannot be imported.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers', 'onnxruntime', 'onnx'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import evenserve.cli.main, evenserve.worker.server, evenserve.worker.profiler\n"
        "import evenserve.runtime.factory, evenserve.metrics.worker\n"
        "from evenserve.runtime.emulated import EmulatedRuntime\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert np is not None
