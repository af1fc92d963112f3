"""Optional NVML sampling: SM utilization, memory and PCIe throughput of one GPU.

pynvml is optional: ``NvmlSampler.open`` returns None when it is missing or no GPU answers,
and the worker exports its own busy-time figures either way. NVML's "utilization" is the
fraction of time any kernel ran, which is not the same as how busy the worker kept the
device; both are exported, side by side, so the difference is visible.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True, slots=True)
class NvmlSample:
    sm_utilization_ratio: float
    memory_used_bytes: float
    memory_total_bytes: float
    pcie_tx_bytes_per_second: float | None
    pcie_rx_bytes_per_second: float | None


class NvmlSampler:
    def __init__(self, nvml: ModuleType, handle: Any, index: int) -> None:
        self._nvml = nvml
        self._handle = handle
        self.index = index

    @classmethod
    def open(cls, index: int, module: ModuleType | None = None) -> NvmlSampler | None:
        """A sampler for GPU ``index``, or None when NVML is unavailable."""
        try:
            nvml = module or importlib.import_module("pynvml")
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            return None
        return cls(nvml, handle, index)

    def sample(self) -> NvmlSample | None:
        n = self._nvml
        try:
            util = n.nvmlDeviceGetUtilizationRates(self._handle)
            mem = n.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            return None
        tx = rx = None
        with contextlib.suppress(Exception):
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            tx = 1024.0 * n.nvmlDeviceGetPcieThroughput(self._handle, n.NVML_PCIE_UTIL_TX_BYTES)
            rx = 1024.0 * n.nvmlDeviceGetPcieThroughput(self._handle, n.NVML_PCIE_UTIL_RX_BYTES)
        return NvmlSample(
            sm_utilization_ratio=float(util.gpu) / 100.0,
            memory_used_bytes=float(mem.used),
            memory_total_bytes=float(mem.total),
            pcie_tx_bytes_per_second=tx,
            pcie_rx_bytes_per_second=rx,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
