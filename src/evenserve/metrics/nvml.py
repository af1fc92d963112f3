"""Optional NVML sampling: SM utilization, memory and PCIe throughput of one GPU.

pynvml is optional: ``NvmlSampler.open`` returns None when it is missing or no GPU answers,
and the worker exports its own busy-time figures either way. NVML's "utilization" is the
fraction of time any kernel ran, which is not the same as how busy the worker kept the
device; both are exported, side by side, so the difference is visible.

A MIG slice (``NvmlSampler.open_mig``): the handle is the slice's own
(``nvmlDeviceGetHandleByUUID`` on its ``MIG-...`` UUID), so memory used and total are the
slice's, never the parent GPU's. NVML reports no utilization (nor PCIe throughput) per MIG
instance, so neither is read: the worker's own busy time is the slice's utilization.

``NvmlSampler.identity`` reads what dcgm-exporter labels its series with (``gpu``: the NVML
index, ``UUID``: ``GPU-...``, ``modelName``: the product name); for a MIG slice, the parent
GPU's, as dcgm-exporter does.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True, slots=True)
class NvmlSample:
    #: None for a MIG slice (NVML has no per-instance utilization).
    sm_utilization_ratio: float | None
    memory_used_bytes: float
    memory_total_bytes: float
    pcie_tx_bytes_per_second: float | None
    pcie_rx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """A GPU as dcgm-exporter names it; a field NVML did not give is None."""

    index: int | None
    uuid: str | None
    name: str | None


def _text(value: Any) -> str:
    """NVML strings: ``bytes`` in older pynvml, ``str`` in newer."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSampler:
    def __init__(
        self, nvml: ModuleType, handle: Any, index: int, mig_uuid: str | None = None
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self.index = index
        #: The MIG slice sampled (its handle is the slice's), or None for a whole GPU.
        self.mig_uuid = mig_uuid

    @property
    def label(self) -> str:
        """The ``gpu`` label of its metrics: the index, or the MIG slice's UUID."""
        return self.mig_uuid or str(self.index)

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

    @classmethod
    def open_mig(cls, uuid: str, module: ModuleType | None = None) -> NvmlSampler | None:
        """A sampler for the MIG slice ``uuid`` (``MIG-...``), or None when NVML is
        unavailable or no slice has that UUID."""
        try:
            nvml = module or importlib.import_module("pynvml")
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            return None
        return cls(nvml, handle, 0, mig_uuid=uuid)

    def identity(self) -> GpuIdentity:
        """The GPU's NVML index, UUID and product name (a MIG slice's parent GPU's); each
        field None where NVML does not answer."""
        n, handle = self._nvml, self._handle
        if self.mig_uuid is not None:
            try:
                handle = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            except Exception:
                return GpuIdentity(None, None, None)
        index: int | None = None if self.mig_uuid is not None else self.index
        uuid = name = None
        with contextlib.suppress(Exception):
            index = int(n.nvmlDeviceGetIndex(handle))
        with contextlib.suppress(Exception):
            uuid = _text(n.nvmlDeviceGetUUID(handle))
        with contextlib.suppress(Exception):
            name = _text(n.nvmlDeviceGetName(handle))
        return GpuIdentity(index, uuid, name)

    def memory(self) -> tuple[float, float] | None:
        """(used, total) bytes of the device or slice, or None when NVML fails."""
        try:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            return None
        return float(mem.used), float(mem.total)

    def sample(self) -> NvmlSample | None:
        n = self._nvml
        mem = self.memory()
        if mem is None:
            return None
        if self.mig_uuid is not None:
            return NvmlSample(
                sm_utilization_ratio=None,
                memory_used_bytes=mem[0],
                memory_total_bytes=mem[1],
                pcie_tx_bytes_per_second=None,
                pcie_rx_bytes_per_second=None,
            )
        try:
            util = n.nvmlDeviceGetUtilizationRates(self._handle)
        except Exception:
            return None
        tx = rx = None
        with contextlib.suppress(Exception):
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            tx = 1024.0 * n.nvmlDeviceGetPcieThroughput(self._handle, n.NVML_PCIE_UTIL_TX_BYTES)
            rx = 1024.0 * n.nvmlDeviceGetPcieThroughput(self._handle, n.NVML_PCIE_UTIL_RX_BYTES)
        return NvmlSample(
            sm_utilization_ratio=float(util.gpu) / 100.0,
            memory_used_bytes=mem[0],
            memory_total_bytes=mem[1],
            pcie_tx_bytes_per_second=tx,
            pcie_rx_bytes_per_second=rx,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
