"""Runtime kinds by name, their model.yaml sections, and building one for a device.

On an ``emulated:PROFILE_SET`` device every model runs emulated, whatever its declared
runtime: the same repository can be served for real on a GPU or emulated on a laptop.
Modules of the optional runtimes are cheap to import (torch and friends load in ``load``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from evenserve.runtime.base import Runtime, RuntimeContext
from evenserve.runtime.emulated import (
    EmulatedDevice,
    EmulatedParams,
    EmulatedRuntime,
    resolve_profile,
)
from evenserve.runtime.onnx_runtime import OnnxParams, OnnxRuntime
from evenserve.runtime.torch_runtime import TorchParams, TorchRuntime
from evenserve.runtime.transformers_runtime import TransformersParams, TransformersRuntime

#: Runtime name -> the pydantic model of its model.yaml section (the section has its name).
RUNTIME_PARAMS: dict[str, type[BaseModel]] = {
    "emulated": EmulatedParams,
    "transformers": TransformersParams,
    "torch": TorchParams,
    "onnx": OnnxParams,
}


def create_runtime(
    kind: str,
    ctx: RuntimeContext,
    *,
    emulated_params: EmulatedParams | None = None,
    profile_sets_dir: Path | None = None,
    emulated_device: EmulatedDevice | None = None,
) -> Runtime:
    """Build (not load) the runtime for one model on ``ctx.device``.

    ``emulated_device``: the device an emulated model shares with the worker's other models
    when it runs several batches at once (None: one batch at a time, no sharing)."""
    if ctx.device.kind == "emulated" or kind == "emulated":
        params = emulated_params
        if params is None and isinstance(ctx.params, EmulatedParams):
            params = ctx.params
        profile = resolve_profile(ctx, params, profile_sets_dir)
        fail_value = None if params is None else params.fail_value
        load_ms = None if params is None else params.load_ms
        warm_ms = None if params is None else params.warm_load_ms
        return EmulatedRuntime(ctx, profile, emulated_device, fail_value, load_ms, warm_ms)
    if kind == "transformers":
        return TransformersRuntime(ctx)
    if kind == "torch":
        return TorchRuntime(ctx)
    if kind == "onnx":
        return OnnxRuntime(ctx)
    raise ValueError(f"unknown runtime {kind!r}")
