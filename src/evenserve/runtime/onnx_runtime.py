"""onnx: ONNX Runtime, with the CUDA execution provider when the device is a GPU and it exists.

Declared input and output names are the graph's names unless ``input_map`` / ``output_map``
say otherwise (``evenserve.runtime.onnx_export`` writes graphs with the declared names). fp16
and INT8 models are served as they are (no conversion here; declare FP16 inputs for an fp16
graph). ``graph_optimization`` sets ONNX Runtime's graph optimization level (disabled, basic,
extended or all, the default). ``describe()`` reports it and the graph's precision as read
from the file at load time (``onnx_precision.graph_precision``: int8 when it holds quantized
weights and operators, fp16, or fp32).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict
from evenserve.runtime.base import Array, RuntimeContext, output_array, require, warm_up
from evenserve.runtime.onnx_precision import graph_precision

GraphOptimization = Literal["disabled", "basic", "extended", "all"]
#: Each graph_optimization value's onnxruntime.GraphOptimizationLevel member.
GRAPH_OPTIMIZATION_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


class OnnxParams(Strict):
    """The ``onnx:`` section of model.yaml."""

    file: str = Field(min_length=1, description="model.onnx, relative to the model folder")
    intra_op_threads: int | None = Field(default=None, ge=1)
    input_map: dict[str, str] = Field(default_factory=dict)
    output_map: dict[str, str] = Field(default_factory=dict)
    graph_optimization: GraphOptimization = Field(
        default="all", description="ONNX Runtime graph optimization level"
    )


class OnnxRuntime:
    def __init__(self, ctx: RuntimeContext) -> None:
        if not isinstance(ctx.params, OnnxParams):
            raise ConfigError(f"model {ctx.model!r}: onnx: section required")
        self.ctx = ctx
        self.params: OnnxParams = ctx.params
        self._session: Any = None
        self._ort: Any = None
        self._providers: list[str] = []
        self._resident = 0.0
        self._precision: dict[str, Any] = {}

    def load(self) -> None:
        ort = require("onnxruntime", "onnx")
        ctx = self.ctx
        path = ctx.model_dir / self.params.file  # an absolute file stays as it is
        if not path.is_file():
            raise ConfigError(f"model {ctx.model!r}: onnx.file: not found: {path}")
        available = ort.get_available_providers()
        if ctx.device.kind == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise ConfigError(
                    f"--device {ctx.device.name}: onnxruntime has no CUDAExecutionProvider "
                    f"(available: {', '.join(available)}); install onnxruntime-gpu"
                )
            providers: list[Any] = [
                ("CUDAExecutionProvider", {"device_id": ctx.device.cuda_index}),
                "CPUExecutionProvider",
            ]
        else:
            providers = ["CPUExecutionProvider"]
        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[self.params.graph_optimization]
        )
        threads = self.params.intra_op_threads or ctx.cpu_threads
        if threads:
            opts.intra_op_num_threads = threads
        try:
            session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as exc:
            raise ConfigError(f"model {ctx.model!r}: onnx.file: cannot load {path}: {exc}") from exc
        for kind, specs, graph, renamed in (
            ("input", ctx.inputs, session.get_inputs(), self.params.input_map),
            ("output", ctx.outputs, session.get_outputs(), self.params.output_map),
        ):
            known = {t.name for t in graph}
            for s in specs:
                name = renamed.get(s.name, s.name)
                if name not in known:
                    raise ConfigError(
                        f"model {ctx.model!r}: {kind}s.{s.name}: the ONNX graph has no {kind} "
                        f"{name!r} (graph {kind}s: {', '.join(sorted(known))})"
                    )
        self._ort = ort
        self._session = session
        self._providers = list(session.get_providers())
        # Weights are the bulk of an ONNX file; the file size is an honest upper bound.
        self._resident = float(path.stat().st_size)
        try:
            self._precision = graph_precision(path)
        except Exception as exc:  # the graph loaded in ORT; its evidence is best effort
            self._precision = {"precision": "unknown", "error": f"{type(exc).__name__}: {exc}"}
        warm_up(self, ctx)

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        feed = {self.params.input_map.get(k, k): np.ascontiguousarray(v) for k, v in inputs.items()}
        names = [self.params.output_map.get(s.name, s.name) for s in self.ctx.outputs]
        values = self._session.run(names, feed)
        batch = int(next(iter(inputs.values())).shape[0])
        return {
            s.name: output_array(s, v, batch) for s, v in zip(self.ctx.outputs, values, strict=True)
        }

    def resident_bytes(self) -> float:
        return self._resident

    def batch_memory_bytes(self, batch: int) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        ort = self._ort or require("onnxruntime", "onnx")
        return {
            "runtime": "onnx",
            "file": self.params.file,
            "device": self.ctx.device.name,
            "onnxruntime_version": str(ort.__version__),
            "providers": self._providers,
            "intra_op_threads": self.params.intra_op_threads or self.ctx.cpu_threads,
            "weights_bytes_estimate": self._resident,
            "graph_optimization": self.params.graph_optimization,
            "precision": self._precision.get("precision", "unknown"),
            "graph_precision": self._precision,
        }

    def close(self) -> None:
        self._session = None
