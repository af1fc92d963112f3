"""The runtime protocol: load a model, run one batch of named numpy arrays, report memory.

A runtime owns one model on one device. The worker hands it a batch whose leading dimension
is the batch size and expects, for every declared output, an array with the same leading
dimension. Runtimes never see HTTP, queues or clocks; they are called from a worker thread,
one batch at a time per device instance, so ``run`` may block (that is the point).

Heavy frameworks (torch, transformers, onnxruntime) are optional extras: the modules that use
them import them inside functions, and ``require`` turns a missing one into a ConfigError that
names the extra to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from evenserve.core.errors import ConfigError
from evenserve.core.tensors import DATATYPES
from evenserve.runtime.device import DeviceTarget

Array = NDArray[Any]


class RuntimeMissingError(ConfigError):
    """An optional framework a runtime needs is not installed."""


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise a RuntimeMissingError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeMissingError(
            f"{module} is not installed; install the optional extra: "
            f"pip install 'evenserve[{extra}]' ({exc})"
        ) from None


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared input or output: per-item shape (the batch dimension is implied)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype[Any]:
        return DATATYPES[self.datatype]


@dataclass(frozen=True)
class RuntimeContext:
    """What a runtime is told about the model it serves."""

    model: str
    model_dir: Path
    device: DeviceTarget
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: The runtime's own section of model.yaml, already validated by its params model.
    params: Any = None
    #: CPU threads the framework may use (``--cpu-threads``; None: its default).
    cpu_threads: int | None = None


class Runtime(Protocol):
    """One model on one device."""

    def load(self) -> None:
        """Load weights and warm up; raise ConfigError with a clear message on failure."""

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch; every array's leading dimension is the batch size."""

    def resident_bytes(self) -> float:
        """Bytes the loaded model keeps on its device (weights and buffers)."""

    def batch_memory_bytes(self, batch: int) -> float | None:
        """Working memory of one batch of ``batch`` if the runtime knows it, else None."""

    def describe(self) -> dict[str, Any]:
        """Provenance: runtime name, framework versions, precision, device, threads..."""

    def close(self) -> None:
        """Release what ``load`` acquired."""


def output_array(spec: TensorSpec, value: Any, batch: int) -> Array:
    """Check one runtime output against its spec and convert it to the declared dtype."""
    arr = np.asarray(value)
    if arr.ndim == 0 or arr.shape[0] != batch:
        raise RuntimeError(
            f"output {spec.name!r}: runtime returned shape {list(arr.shape)}, expected a leading "
            f"batch dimension of {batch}"
        )
    if len(arr.shape) - 1 != len(spec.shape) or any(
        d != -1 and d != a for d, a in zip(spec.shape, arr.shape[1:], strict=False)
    ):
        raise RuntimeError(
            f"output {spec.name!r}: runtime returned per-item shape {list(arr.shape[1:])}, "
            f"model.yaml declares {list(spec.shape)}"
        )
    return arr.astype(spec.dtype, copy=False)


def warm_up(runtime: Runtime, ctx: RuntimeContext, where: str = "") -> None:
    """Run one batch of zeros (variable dims set to 8) so a model that cannot run fails at
    load time with a clear error, not on the first request; ``where`` adds to the message."""
    batch = {
        s.name: np.zeros([1, *[8 if d == -1 else d for d in s.shape]], dtype=s.dtype)
        for s in ctx.inputs
    }
    try:
        runtime.run(batch)
    except Exception as exc:
        raise ConfigError(
            f"model {ctx.model!r}: warm-up batch failed{where}: {type(exc).__name__}: {exc}"
        ) from exc
