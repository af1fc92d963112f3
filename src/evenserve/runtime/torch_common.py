"""What the torch-based runtimes (transformers, TorchScript / torch.export) share.

:class:`TorchModuleRuntime` holds one loaded ``torch.nn.Module`` on one device: the device
and thread checks before loading, numpy <-> torch conversion at the declared precision, the
inference-mode call with a device synchronisation, its parameter bytes and the provenance
both report. Imported only by those runtimes (and the worker, for CUDA memory), and it imports
torch only inside functions, so the core install never needs torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, RuntimeContext, TensorSpec, output_array, require

Precision = Literal["fp32", "fp16", "bf16"]
#: The torch float dtype of each precision.
TORCH_FLOATS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def cuda_memory_bytes(index: int) -> tuple[float, float]:
    """(used, total) bytes of one CUDA device as its driver reports them (other processes on
    the same GPU included)."""
    torch = require("torch", "torch")
    free, total = torch.cuda.mem_get_info(index)
    return float(total - free), float(total)


def cuda_process_memory_bytes(index: int) -> float:
    """Bytes this process holds on one CUDA device (torch's caching allocator: reserved, which
    includes what it caches): a time-sliced share's used memory, not the other workers'."""
    torch = require("torch", "torch")
    return float(torch.cuda.memory_reserved(index))


def release_cuda_cache() -> bool:
    """Give torch's cached, unused CUDA blocks back to the driver (after a model is unloaded:
    its tensors are freed into the caching allocator, not to the device). False when torch
    is not imported or CUDA never initialized (nothing to give back)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    torch.cuda.empty_cache()
    return True


class TorchModuleRuntime:
    """One torch module on one device; subclasses build it in ``load`` and map its outputs."""

    #: The optional extra that brings what this runtime imports (named in install hints).
    extra = "torch"

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx
        self._torch: Any = None
        self._module: Any = None
        self._float_dtype: Any = None
        self._resident = 0.0

    def _prepare(self, precision: Precision) -> tuple[Any, Any]:
        """torch, checked against the device and set to the configured threads, and the
        float dtype of ``precision``."""
        torch = require("torch", self.extra)
        device = self.ctx.device
        if device.kind == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"--device {device.name}: torch sees no CUDA device")
            if device.cuda_index >= torch.cuda.device_count():
                raise ConfigError(
                    f"--device {device.name}: only {torch.cuda.device_count()} CUDA device(s)"
                )
        if self.ctx.cpu_threads:
            torch.set_num_threads(self.ctx.cpu_threads)
        self._torch = torch
        self._float_dtype = getattr(torch, TORCH_FLOATS[precision])
        return torch, self._float_dtype

    def _loaded(self, module: Any) -> None:
        self._module = module
        # Bytes of the module's parameters and buffers.
        tensors = [*module.parameters(), *module.buffers()]
        self._resident = float(sum(t.numel() * t.element_size() for t in tensors))

    def stage(self, inputs: Mapping[str, Array]) -> dict[str, Any]:
        """One batch's inputs as tensors on the device, the copy finished: the executor calls
        it before ``run`` and times it as the batch's compute_input (input staging, the
        host-to-device transfer), apart from the compute. ``run`` takes them as they are."""
        staged = {n: self._tensor(a) for n, a in inputs.items()}
        device = self.ctx.device
        if device.kind == "cuda":
            self._torch.cuda.synchronize(device.cuda_index)
        return staged

    def _tensor(self, arr: Any) -> Any:
        if isinstance(arr, self._torch.Tensor):
            return arr  # staged already
        arr = np.ascontiguousarray(arr)
        if not arr.flags.writeable:
            # Binary request tensors are read-only views of the body; torch wants writable memory.
            arr = arr.copy()
        t = self._torch.from_numpy(arr)
        if t.is_floating_point():
            t = t.to(dtype=self._float_dtype)
        return t.to(self.ctx.device.torch_device, non_blocking=False)

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """The module on one batch, finished on the device before it returns."""
        torch, device = self._torch, self.ctx.device
        with torch.inference_mode():
            result = self._module(*args, **kwargs)
            if device.kind == "cuda":
                torch.cuda.synchronize(device.cuda_index)
        return result

    def _output(self, spec: TensorSpec, value: Any, batch: int) -> Array:
        t = value.detach()
        if t.dtype in (self._torch.float16, self._torch.bfloat16):
            t = t.float()
        return output_array(spec, t.cpu().numpy(), batch)

    def _describe(self, own: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
        """Provenance: the runtime's ``own`` fields, then device, versions, threads, bytes."""
        torch = self._torch or require("torch", self.extra)
        return {
            **own,
            "device": self.ctx.device.name,
            "torch_version": str(torch.__version__),
            **versions,
            "torch_threads": int(torch.get_num_threads()),
            "parameters_bytes": self._resident,
        }

    def resident_bytes(self) -> float:
        return self._resident

    def batch_memory_bytes(self, batch: int) -> float | None:
        return None

    def close(self) -> None:
        self._module = None
