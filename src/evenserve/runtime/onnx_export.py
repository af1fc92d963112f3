"""ONNX variants of a loaded torch-based model: export, INT8 quantization, precision evidence.

``export_onnx`` writes the module of a loaded ``transformers`` or ``torch`` runtime (fp32) to
an ONNX file whose graph inputs and outputs carry model.yaml's declared names, so the ``onnx``
runtime serves it with no ``input_map``; the batch dimension and every ``-1`` dimension are
dynamic. torch's dynamo exporter needs ``onnxscript``; without it the TorchScript-based
exporter (deprecated upstream, still working) is used, and the provenance says which. Its
deprecation and tracer warnings are logged once per message and recorded, not raised.

``quantize_dynamic`` (weights INT8, activations quantized at run time) and ``quantize_static``
(QDQ, weights and activations INT8, activation ranges calibrated on given batches) wrap ONNX
Runtime's quantization tools, after its pre-processing (shape inference, graph optimization;
symbolic shape inference merges conflicting symbolic dimensions, and is left out when it
still fails; it runs in a temporary folder, where a failure leaves its partial model).
Dynamic quantization covers the node types ONNX Runtime's dynamic quantizer supports (Conv,
MatMul, Gather, attention...) unless ``op_types`` narrows them; the tools' own log warnings
are kept in the provenance's ``notes`` instead of being logged.

The precision a graph runs at is read from it by ``onnx_precision.graph_precision``.

torch, onnx and onnxruntime are imported inside the functions: the core install needs none.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, TensorSpec, require

log = logging.getLogger(__name__)

_warned: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


@contextlib.contextmanager
def _recorded_warnings(into: list[str]) -> Iterator[None]:
    """Catch the warnings of a block, log each distinct message once per process and append
    the distinct ones (first line, shortened) to ``into``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = f"{w.category.__name__}: {str(w.message).strip().splitlines()[0][:300]}"
        if text not in into:
            into.append(text)
            _log_once(text)


def _dynamic_axes(specs: Sequence[TensorSpec]) -> dict[str, dict[int, str]]:
    """Axis 0 (the batch) and every declared -1 dimension of each tensor, named."""
    return {
        s.name: {
            0: "batch",
            **{i + 1: f"{s.name}_dim{i + 1}" for i, d in enumerate(s.shape) if d == -1},
        }
        for s in specs
    }


def _opset_of(model: Any) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def export_onnx(
    runtime: Any,
    example: Mapping[str, Array],
    path: Path,
    *,
    opset: int | None = None,
) -> dict[str, Any]:
    """Export the loaded fp32 module of a ``transformers`` or ``torch`` runtime to ``path``.

    ``example``: one batch of the declared inputs (batch >= 2, so the exporter cannot fold
    the batch dimension into a constant). Returns provenance: ``exporter``, ``opset``,
    ``seconds``, ``bytes``, ``torch_version``, ``onnx_version``, ``inputs``, ``outputs``,
    ``dynamic_axes``, ``warnings``."""
    torch = require("torch", "torch")
    onnx = require("onnx", "onnx")
    ctx = runtime.ctx
    if getattr(runtime, "_module", None) is None or not hasattr(runtime, "export_module"):
        raise ConfigError(
            f"model {ctx.model!r}: export to ONNX needs a loaded transformers or torch runtime"
        )
    precision = getattr(runtime.params, "precision", "fp32")
    if precision != "fp32":
        raise ConfigError(f"model {ctx.model!r}: export to ONNX from fp32 only, not {precision}")
    missing = [s.name for s in ctx.inputs if s.name not in example]
    if missing:
        raise ConfigError(f"model {ctx.model!r}: example batch has no input {missing[0]!r}")
    module = runtime.export_module()
    staged = runtime.stage({s.name: example[s.name] for s in ctx.inputs})
    args = tuple(staged[s.name] for s in ctx.inputs)
    input_names = [s.name for s in ctx.inputs]
    output_names = [s.name for s in ctx.outputs]
    axes = {**_dynamic_axes(ctx.inputs), **_dynamic_axes(ctx.outputs)}
    dynamo = importlib.util.find_spec("onnxscript") is not None
    exporter = "torch.onnx dynamo" if dynamo else "torch.onnx torchscript (legacy)"
    path.parent.mkdir(parents=True, exist_ok=True)
    caught: list[str] = []
    start = time.perf_counter()
    with _recorded_warnings(caught), torch.no_grad():
        kwargs: dict[str, Any] = {
            "input_names": input_names,
            "output_names": output_names,
            "dynamic_axes": axes,
            "dynamo": dynamo,
        }
        if opset is not None:
            kwargs["opset_version"] = opset
        if not dynamo:
            kwargs["do_constant_folding"] = True
        try:
            torch.onnx.export(module, args, str(path), **kwargs)
        except Exception as exc:
            raise ConfigError(
                f"model {ctx.model!r}: ONNX export ({exporter}) failed: {type(exc).__name__}: {exc}"
            ) from exc
    seconds = time.perf_counter() - start
    onnx.checker.check_model(str(path))
    model = onnx.load(str(path), load_external_data=False)
    graph_inputs = [i.name for i in model.graph.input]
    graph_outputs = [o.name for o in model.graph.output]
    if graph_inputs[: len(input_names)] != input_names or graph_outputs != output_names:
        raise ConfigError(
            f"model {ctx.model!r}: exported graph has inputs {graph_inputs} and outputs "
            f"{graph_outputs}, model.yaml declares {input_names} and {output_names}"
        )
    return {
        "exporter": exporter,
        "opset": _opset_of(model),
        "seconds": round(seconds, 3),
        "bytes": _file_bytes(path, model),
        "torch_version": str(torch.__version__),
        "onnx_version": str(onnx.__version__),
        "inputs": input_names,
        "outputs": output_names,
        "dynamic_axes": {k: {str(a): n for a, n in v.items()} for k, v in axes.items()},
        "warnings": caught,
    }


def _file_bytes(path: Path, model: Any) -> int:
    """Bytes of an ONNX file and of the external data files it names."""
    external: set[str] = {
        str(e.value)
        for t in model.graph.initializer
        if t.data_location == 1
        for e in t.external_data
        if e.key == "location"
    }
    return path.stat().st_size + sum(
        (path.parent / f).stat().st_size for f in external if (path.parent / f).is_file()
    )


class _Collect(logging.Filter):
    """Drops the warnings ONNX Runtime's quantization tools log (to the root logger, mostly)
    and keeps their distinct messages."""

    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root" and not record.name.startswith("onnxruntime"):
            return True
        if record.name == "root" and "onnxruntime" not in record.pathname:
            return True
        text = record.getMessage().strip().splitlines()[0][:300] if record.msg else ""
        if text and text not in self.into:
            self.into.append(text)
            log.debug("onnxruntime quantization: %s", text)
        return False


@contextlib.contextmanager
def _quiet_quantization(into: list[str]) -> Iterator[None]:
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.tools.symbolic_shape_infer")]
    collect = _Collect(into)
    for lg in loggers:
        lg.addFilter(collect)
    try:
        with _recorded_warnings(into):
            yield
    finally:
        for lg in loggers:
            lg.removeFilter(collect)


def _pre_process(src: Path, workdir: Path, notes: list[str]) -> tuple[Path, str]:
    """ONNX Runtime's quantization pre-processing (shape inference and graph optimization)
    into ``workdir``: with symbolic shape inference, else without it; ``src`` itself when
    both fail. Returns the model to quantize and what was done."""
    shape_inference = require("onnxruntime.quantization.shape_inference", "onnx")
    out = workdir / "preprocessed.onnx"
    source = src.resolve()
    for skip_symbolic, label in ((False, "full"), (True, "without symbolic shape inference")):
        try:
            # In workdir: a failed symbolic shape inference leaves its partial model in the
            # current folder.
            with _quiet_quantization(notes), contextlib.chdir(workdir):
                shape_inference.quant_pre_process(
                    str(source), str(out), skip_symbolic_shape=skip_symbolic, auto_merge=True
                )
        except Exception as exc:
            notes.append(f"pre-processing ({label}) failed: {type(exc).__name__}: {exc}"[:300])
            continue
        return out, label
    return src, "skipped"


@contextlib.contextmanager
def _quantizing(src: Path, dst: Path, notes: list[str]) -> Iterator[tuple[Path, str]]:
    """Around one quantization of ``src`` into ``dst``: the pre-processed model (in a
    temporary folder beside ``dst``, removed after) and what pre-processing did, with the
    tools' log lines and warnings collected into ``notes``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        model_in, preprocessed = _pre_process(src, Path(tmp).resolve(), notes)
        with _quiet_quantization(notes):
            yield model_in, preprocessed


def quantize_dynamic(
    src: Path, dst: Path, *, op_types: Sequence[str] | None = None
) -> dict[str, Any]:
    """ONNX Runtime dynamic INT8 quantization of ``src`` into ``dst``: INT8 weights of the
    ``op_types`` nodes (None: every type the dynamic quantizer supports), activations
    quantized at run time. Returns provenance: ``method``,
    ``weight_type``, ``op_types``, ``preprocessed`` (full, without symbolic shape inference
    or skipped), ``seconds``, ``bytes``, ``notes`` (what the tools warned about)."""
    quantization = require("onnxruntime.quantization", "onnx")
    registry = require("onnxruntime.quantization.registry", "onnx")
    types = sorted(op_types if op_types is not None else registry.IntegerOpsRegistry)
    notes: list[str] = []
    start = time.perf_counter()
    with _quantizing(src, dst, notes) as (model_in, preprocessed):
        quantization.quantize_dynamic(
            str(model_in),
            str(dst),
            weight_type=quantization.QuantType.QInt8,
            op_types_to_quantize=types,
        )
    return {
        "method": "onnxruntime dynamic",
        "weight_type": "QInt8",
        "op_types": types,
        "preprocessed": preprocessed,
        "seconds": round(time.perf_counter() - start, 3),
        "bytes": dst.stat().st_size,
        "notes": notes,
    }


def _input_names(path: Path) -> list[str]:
    ort = require("onnxruntime", "onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()]


def quantize_static(
    src: Path, dst: Path, calibration: Sequence[Mapping[str, Array]]
) -> dict[str, Any]:
    """Static INT8 quantization of ``src`` into ``dst`` (QDQ format, INT8 weights per output
    channel, INT8 activations) with activation ranges calibrated (min/max) on the
    ``calibration`` batches. Returns provenance: ``method``, ``quant_format``,
    ``per_channel``, ``activation_type``, ``weight_type``, ``calibrate_method``,
    ``calibration_batches``, ``calibration_items``, ``preprocessed``, ``seconds``,
    ``bytes``, ``notes``."""
    quantization = require("onnxruntime.quantization", "onnx")
    if not calibration:
        raise ConfigError("static quantization needs at least one calibration batch")
    names = _input_names(src)
    batches = [{n: np.ascontiguousarray(b[n]) for n in names if n in b} for b in calibration]
    absent = [n for n in names if n not in batches[0]]
    if absent:
        raise ConfigError(f"calibration batches have no input {absent[0]!r} (graph: {names})")

    class _Reader(quantization.CalibrationDataReader):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            self._it = iter(batches)

        def get_next(self) -> dict[str, Array] | None:
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(batches)

    notes: list[str] = []
    start = time.perf_counter()
    with _quantizing(src, dst, notes) as (model_in, preprocessed):
        quantization.quantize_static(
            str(model_in),
            str(dst),
            _Reader(),
            quant_format=quantization.QuantFormat.QDQ,
            per_channel=True,
            activation_type=quantization.QuantType.QInt8,
            weight_type=quantization.QuantType.QInt8,
            calibrate_method=quantization.CalibrationMethod.MinMax,
        )
    return {
        "method": "onnxruntime static",
        "quant_format": "QDQ",
        "per_channel": True,
        "activation_type": "QInt8",
        "weight_type": "QInt8",
        "calibrate_method": "MinMax",
        "calibration_batches": len(batches),
        "calibration_items": sum(int(next(iter(b.values())).shape[0]) for b in batches),
        "preprocessed": preprocessed,
        "seconds": round(time.perf_counter() - start, 3),
        "bytes": dst.stat().st_size,
        "notes": notes,
    }
