"""The kinds of variant ``evenserve optimize`` builds (precision, engine, quantization) and
which of them a device can run."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evenserve.core.errors import ConfigError
from evenserve.runtime.device import DeviceTarget


@dataclass(frozen=True)
class VariantKind:
    """One kind of variant: its precision, its engine, where it runs."""

    name: str
    precision: str
    engine: str  # eager | compile | onnxruntime
    quantization: str | None = None  # dynamic | static
    description: str = ""


VARIANTS: dict[str, VariantKind] = {
    v.name: v
    for v in (
        VariantKind("fp32", "fp32", "eager", description="the model as built (the reference)"),
        VariantKind("fp16", "fp16", "eager", description="weights and activations in fp16"),
        VariantKind("bf16", "bf16", "eager", description="weights and activations in bf16"),
        VariantKind(
            "int8-dynamic",
            "int8",
            "eager",
            "dynamic",
            "torch dynamic quantization of Linear layers (CPU)",
        ),
        VariantKind("compile", "fp32", "compile", description="torch.compile (inductor)"),
        VariantKind(
            "onnxruntime", "fp32", "onnxruntime", description="ONNX Runtime, all graph opts"
        ),
        VariantKind(
            "onnxruntime-int8",
            "int8",
            "onnxruntime",
            "dynamic",
            "ONNX Runtime, dynamic INT8 quantization",
        ),
        VariantKind(
            "onnxruntime-int8-static",
            "int8",
            "onnxruntime",
            "static",
            "ONNX Runtime, static INT8 (QDQ) calibrated on the calibration set",
        ),
    )
}


def default_variants(device: DeviceTarget, calibration: Path | None) -> list[str]:
    """The variants built when none are named: what the device can run."""
    if device.kind == "cuda":
        names = ["fp32", "fp16", "bf16", "compile", "onnxruntime"]
    else:
        names = ["fp32", "bf16", "fp16", "int8-dynamic", "compile", "onnxruntime"]
        names.append("onnxruntime-int8")
    if calibration is not None:
        names.append("onnxruntime-int8-static")
    return names


def parse_variants(names: Sequence[str], where: str = "--variants") -> list[str]:
    """Known variant names, fp32 first (the reference), without repeats."""
    out = ["fp32"]
    for n in names:
        if n not in VARIANTS:
            raise ConfigError(f"{where}: unknown variant {n!r} (known: {', '.join(VARIANTS)})")
        if n not in out:
            out.append(n)
    return out


def unsupported(kind: VariantKind, device: DeviceTarget, has_calibration: bool) -> str | None:
    """Why ``kind`` cannot be built on ``device`` (None: it can)."""
    if kind.engine == "eager" and kind.quantization == "dynamic" and device.kind != "cpu":
        return "torch's dynamic quantization runs on the CPU only"
    if kind.quantization == "static" and not has_calibration:
        return "static quantization needs a calibration set (optimize.calibration or --calibration)"
    if kind.engine == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed (pip install 'evenserve[onnx]')"
        if device.kind == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"
        try:
            import onnx  # noqa: F401
        except ImportError:
            return "onnx is not installed (pip install 'evenserve[onnx]')"
    if kind.engine == "compile" and shutil.which("cc") is None and device.kind == "cpu":
        return "torch.compile on the CPU needs a C compiler (cc), none found"
    return None
