"""Helpers shared by the torch-based runtimes (transformers, TorchScript / torch.export).

Imported only by those runtimes, and it imports torch only inside functions, so the core
install never needs torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, require
from evenserve.runtime.device import DeviceTarget

Precision = Literal["fp32", "fp16", "bf16"]


def import_torch(extra: str = "torch") -> Any:
    return require("torch", extra)


def torch_dtype(torch: Any, precision: Precision) -> Any:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def check_device(torch: Any, device: DeviceTarget) -> None:
    if device.kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device.name}: torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {device.name}: only {torch.cuda.device_count()} CUDA device(s)"
            )


def configure_threads(torch: Any, options: Mapping[str, Any]) -> None:
    threads = options.get("cpu_threads")
    if threads:
        torch.set_num_threads(int(threads))


def to_torch(torch: Any, arr: Array, device: str, float_dtype: Any) -> Any:
    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:
        # Binary request tensors are read-only views of the body; torch wants writable memory.
        arr = arr.copy()
    t = torch.from_numpy(arr)
    if t.is_floating_point():
        t = t.to(dtype=float_dtype)
    return t.to(device, non_blocking=False)


def to_numpy(torch: Any, value: Any) -> Array:
    t = value.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    out: Array = t.cpu().numpy()
    return out


def module_bytes(module: Any) -> float:
    """Bytes of a module's parameters and buffers."""
    total = 0
    for p in module.parameters():
        total += p.numel() * p.element_size()
    for b in module.buffers():
        total += b.numel() * b.element_size()
    return float(total)


def synchronize(torch: Any, device: DeviceTarget) -> None:
    if device.kind == "cuda":
        torch.cuda.synchronize(device.index)


def cuda_memory_bytes(index: int) -> tuple[float, float]:
    """(used, total) bytes of one CUDA device as its driver reports them (other processes on
    the same GPU included)."""
    torch = require("torch", "torch")
    free, total = torch.cuda.mem_get_info(index)
    return float(total - free), float(total)
