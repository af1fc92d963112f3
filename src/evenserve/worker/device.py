"""The worker's device: its identity (NVML, dcgm-exporter's labels), its memory probes, the
threads that run its batches, and what every emulated model on it shares.

Memory. An emulated device's memory is the profiles' account (the scheduler's, once the
driver runs; the runtimes' resident bytes before) against its cap; a real one's is measured
(a MIG slice's from NVML, a time-sliced share's own process's bytes against its part of the
GPU, a whole GPU's or the host's as reported), cached for 100 ms.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping

from evenserve.metrics.nvml import NvmlSampler
from evenserve.metrics.worker import DcgmLabels
from evenserve.runtime.base import Runtime
from evenserve.runtime.device import DeviceTarget, host_memory_bytes
from evenserve.runtime.emulated import EmulatedDevice, EmulatedRuntime, EmulatedSlowdown
from evenserve.runtime.torch_common import cuda_memory_bytes, cuda_process_memory_bytes
from evenserve.worker.driver import BatchDriver
from evenserve.worker.executor import ThreadedExecutor
from evenserve.worker.models.registry import HostedModel, ModelRegistry
from evenserve.worker.options import WorkerOptions

GIB = 1024.0**3
#: GIL switch interval while emulated runtimes are served (CPython's default is 5 ms).
EMULATED_SWITCH_INTERVAL_S = 0.0002


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def open_nvml(device: DeviceTarget) -> NvmlSampler | None:
    """The NVML sampler of a CUDA device: a MIG slice's by its UUID, a GPU's by index."""
    if device.kind != "cuda":
        return None
    if device.mig_uuid is not None:
        return NvmlSampler.open_mig(device.mig_uuid)
    return NvmlSampler.open(device.cuda_index)


def dcgm_labels(device: DeviceTarget, nvml: NvmlSampler | None) -> DcgmLabels:
    """dcgm-exporter's labels for the device (``metrics.worker.DcgmLabels``): NVML's index,
    UUID and name where NVML answers; a whole GPU's index without it (a MIG slice's parent is
    unknown then); none for the CPU or an emulated device, whose modelName is its string."""
    if device.kind != "cuda":
        return DcgmLabels(model_name=device.name)
    if nvml is None:
        return DcgmLabels(gpu="" if device.mig_uuid is not None else str(device.cuda_index))
    ident = nvml.identity()
    return DcgmLabels(
        gpu="" if ident.index is None else str(ident.index),
        uuid=ident.uuid or "",
        model_name=ident.name or "",
    )


class Device:
    """One worker's device (``options.device``) and the threads that run its batches."""

    def __init__(self, options: WorkerOptions, models: ModelRegistry) -> None:
        self.options = options
        self.target = options.device
        self.models = models
        run = options.run
        #: Emulated models share one device when batches run at once (they slow each other).
        self.shared = EmulatedDevice(run.interference) if run.instances > 1 else None
        sd = options.slowdown
        #: One schedule, one origin, for every emulated model here.
        self.slowdown = (
            None
            if sd is None or sd.constant
            else EmulatedSlowdown(sd, options.slowdown_origin_unix_s)
        )
        self.nvml = open_nvml(options.device)
        self.dcgm = dcgm_labels(options.device, self.nvml)
        #: The driver, once started (an emulated device's memory is its scheduler's account).
        self.driver: BatchDriver | None = None
        self.executor: ThreadedExecutor | None = None
        self._memory_cache: tuple[float, float | None, float | None] = (-math.inf, None, None)
        self._saved_switch_interval: float | None = None

    @property
    def name(self) -> str:
        """What the metrics and the load report call the device (``WorkerOptions.name``)."""
        return self.options.name or self.target.name

    # -- memory ------------------------------------------------------------------------------
    def memory_bytes(self) -> tuple[float | None, float | None]:
        """(used, total) bytes of the device; host/CUDA figures cached for 100 ms."""
        if self.target.kind == "emulated":
            if self.driver is not None:
                with self.driver.lock:
                    return self.driver.sched.memory.used_total()
            accounted = sum(m.runtime.resident_bytes() for m in self.models.values())
            return accounted, self.emulated_total()
        now = time.monotonic()
        if now - self._memory_cache[0] < 0.1:
            return self._memory_cache[1], self._memory_cache[2]
        used: float | None
        total: float | None
        try:
            used, total = self._measured_memory()
        except Exception:
            used = total = None
        self._memory_cache = (now, used, total)
        return used, total

    def emulated_total(self) -> float:
        """An emulated device's memory cap: ``memory_gb``, a share's part of it, or a MIG
        profile's own memory."""
        return self.target.memory_cap_bytes(self.options.run.memory_gb * GIB)

    def _measured_memory(self) -> tuple[float, float]:
        dev = self.target
        if dev.kind != "cuda":
            return host_memory_bytes()
        if dev.mig_uuid is not None and self.nvml is not None:
            mem = self.nvml.memory()
            if mem is not None:
                return mem
        used, total = cuda_memory_bytes(dev.cuda_index)
        if dev.slice is not None:  # a time-sliced share
            return cuda_process_memory_bytes(dev.cuda_index), dev.memory_cap_bytes(total)
        return used, total

    # -- threads -----------------------------------------------------------------------------
    def threads(self) -> ThreadedExecutor:
        """The executor whose threads run the batches, made on first use (the startup
        warm-up runs on them before the driver starts)."""
        if self.executor is None:
            runtimes: Mapping[str, Runtime] = {n: m.runtime for n, m in self.models.items()}
            self.executor = ThreadedExecutor(
                runtimes,
                {n: m.input_names for n, m in self.models.items()},
                instances=self.options.run.instances,
            )
        return self.executor

    def on_load(self, model: HostedModel) -> None:
        """A model joins the device threads (the registry's ``on_load`` hook)."""
        self.threads().add(model.name, model.runtime, model.input_names)
        self.fast_switches()

    def on_unload(self, model: HostedModel) -> None:
        if self.executor is not None:
            self.executor.remove(model.name)

    def fast_switches(self) -> None:
        """Shorten the GIL's switch interval once an emulated runtime is served."""
        if self._saved_switch_interval is None and any(
            isinstance(m.runtime, EmulatedRuntime) for m in self.models.values()
        ):
            # An emulated batch ends when its device thread wakes up, which needs the GIL;
            # with CPython's default 5 ms switch interval a busy HTTP thread delays that by
            # up to 5 ms and inflates millisecond batches. A shorter interval bounds it.
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(EMULATED_SWITCH_INTERVAL_S)

    def close(self) -> None:
        """NVML closed and the switch interval given back (after the threads stopped)."""
        if self.nvml is not None:
            self.nvml.close()
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
