"""Building a variant: a torch runtime at another precision or compiled, or the model exported
to ONNX once and (maybe) quantized, loaded on the device; and the runtime section that serves
it (``variant.yaml``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.device import DeviceTarget
from evenserve.runtime.onnx_runtime import OnnxParams
from evenserve.runtime.torch_common import CompileParams
from evenserve.worker.optimize.checks import REFERENCE_BATCH, split_batches
from evenserve.worker.optimize.variants import VARIANTS, VariantKind
from evenserve.worker.repository import ModelEntry


def torch_params(entry: ModelEntry, kind: VariantKind) -> BaseModel:
    params = entry.runtime_params
    assert params is not None
    update: dict[str, Any] = {"precision": kind.precision}
    update["compile"] = CompileParams() if kind.engine == "compile" else None
    return params.model_copy(update=update)


def torch_variant(entry: ModelEntry, name: str) -> dict[str, Any]:
    """A variant.yaml document serving a torch-engine variant (``fp16``, ``int8-dynamic``,
    ``compile``...) of ``entry`` as it is, without measuring it (benchmarks of one variant)."""
    kind = VARIANTS.get(name)
    if kind is None or kind.engine == "onnxruntime":
        torch_ones = [n for n, k in VARIANTS.items() if k.engine != "onnxruntime"]
        raise ConfigError(f"variant {name!r}: not one of {', '.join(torch_ones)}")
    runtime = entry.config.runtime
    return {
        "variant": name,
        "runtime": runtime,
        runtime: section_of(torch_params(entry, kind)),
        "provenance": {"written_by": "a benchmark, unmeasured"},
    }


def section_of(params: BaseModel) -> dict[str, Any]:
    return params.model_dump(mode="json", exclude_defaults=True)


def _onnx_entry(entry: ModelEntry, params: OnnxParams) -> ModelEntry:
    cfg = entry.config.model_copy(
        update={"runtime": "onnx", "onnx": params.model_dump(), entry.config.runtime: None}
    )
    return ModelEntry(cfg, entry.directory, entry.source, params, None)


def relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def ensure_export(
    entry: ModelEntry,
    device: DeviceTarget,
    cpu_threads: int | None,
    root: Path,
    done: Path | None,
    batches: Sequence[Mapping[str, Array]],
) -> Path:
    """The fp32 model exported to ONNX once (``variants/onnxruntime/model.onnx``)."""
    if done is not None:
        return done
    from evenserve.runtime import onnx_export

    params = entry.runtime_params
    assert params is not None
    base = params.model_copy(update={"precision": "fp32", "compile": None})
    runtime = entry.create_runtime(device, cpu_threads=cpu_threads, profiles_dir=None, params=base)
    runtime.load()
    try:
        path = root / "onnxruntime" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx_export.export_onnx(runtime, batches[0], path)
        return path
    finally:
        runtime.close()


def build_onnx(
    entry: ModelEntry,
    device: DeviceTarget,
    cpu_threads: int | None,
    kind: VariantKind,
    root: Path,
    exported: Path,
    inputs: Mapping[str, Array],
    notes: list[str],
) -> tuple[Runtime, OnnxParams, dict[str, Any]]:
    from evenserve.runtime import onnx_export

    artifacts: dict[str, Any] = {"exported": relative(exported, entry.directory)}
    path = exported
    if kind.quantization is not None:
        path = root / kind.name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind.quantization == "dynamic":
            artifacts["quantization"] = onnx_export.quantize_dynamic(exported, path)
        else:
            # Calibrate on the first quarter of the set (at most 128 items), in batches.
            n = next(iter(inputs.values())).shape[0]
            take = max(1, min(128, n // 4))
            cal = split_batches(inputs, min(REFERENCE_BATCH, entry.config.max_batch_size), take)
            artifacts["quantization"] = onnx_export.quantize_static(exported, path, cal)
            notes.append(f"calibrated on the first {take} items of the gate set")
    artifacts["file"] = relative(path, entry.directory)
    # Threads come from the runtime context (--cpu-threads here, the worker's when served),
    # not from the section: variant.yaml must not pin optimize's setting.
    params = OnnxParams(file=str(path.resolve()))
    onnx = _onnx_entry(entry, params)
    runtime = onnx.create_runtime(device, cpu_threads=cpu_threads, profiles_dir=None)
    runtime.load()
    return runtime, params, artifacts
