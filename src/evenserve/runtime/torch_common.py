"""What the torch-based runtimes (transformers, TorchScript / torch.export) share.

:class:`TorchModuleRuntime` holds one loaded ``torch.nn.Module`` on one device: the device
and thread checks before loading, numpy <-> torch conversion at the declared precision, the
inference-mode call with a device synchronisation, its parameter bytes and the provenance
both report (the weights' bytes and INT8 coverage are ``torch_weights``'). Imported only by
those runtimes (and the worker, for CUDA memory), and it imports torch only inside
functions, so the core install never needs torch.

Cheaper variants of the same module (chosen per model by ``evenserve optimize``):

- ``precision: int8``: dynamic INT8 quantization of every ``nn.Linear`` (weights stored as
  qint8, activations quantized per batch; torch's eager-mode ``quantize_dynamic``, CPU only).
  A model with few Linear layers (a CNN) stays mostly fp32: ``precision_evidence`` says how
  much of the weights the quantization covered, so a gate can tell; one with none (a
  torch.export program's layers are graph calls) is refused at load, as it would run fp32.
- ``compile: {mode, dynamic, cache_dir}``: ``torch.compile`` (inductor). Compilation happens
  on the first batch of each new shape (the load's warm-up batch, then the worker's warm-up
  of every batch size); inductor's caches live in ``cache_dir`` (relative to the model
  folder; ``TORCHINDUCTOR_CACHE_DIR`` in the environment wins), so a later load of the same
  model reuses the compiled kernels. ``describe()`` reports the first batch's seconds and the
  cache's hits and misses.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict
from evenserve.runtime.base import Array, RuntimeContext, TensorSpec, output_array, require
from evenserve.runtime.torch_weights import dynamic_linears, matmul_weights, weight_bytes

log = logging.getLogger(__name__)

#: Build warnings already logged (once per process: every load of a variant repeats them).
_LOGGED: set[str] = set()

#: The inductor cache the user named, read before torch runs (inductor writes its own default
#: into the environment on first use).
_USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

Precision = Literal["fp32", "fp16", "bf16", "int8"]
#: The torch float dtype of each precision (int8: dynamic quantization keeps fp32 activations).
TORCH_FLOATS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "float32"}


class CompileParams(Strict):
    """``compile:`` of a torch-based runtime's section: ``torch.compile`` settings."""

    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"
    )
    dynamic: bool | None = Field(
        default=None, description="torch.compile's dynamic (None: dynamic after a recompile)"
    )
    cache_dir: str | None = Field(
        default=".cache/inductor",
        description="inductor's cache, relative to the model folder (None: torch's default)",
    )


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
        #: What the variant's build reported (quantization, compilation), for ``describe``.
        self._variant: dict[str, Any] = {}
        self._variant_notes: list[str] = []

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
        self._resident = float(sum(weight_bytes(self._torch, self._eager()).values()))

    def _eager(self) -> Any:
        """The module as built (a compiled one's original): parameters, hooks, evidence."""
        return getattr(self._module, "_orig_mod", self._module)

    def _variant_module(
        self, module: Any, precision: Precision, compile: CompileParams | None
    ) -> Any:
        """``module`` (loaded at ``precision``'s float dtype) as the variant asked for: INT8
        dynamically quantized, compiled, or as it is."""
        torch = self._torch
        if precision == "int8":
            if self.ctx.device.kind != "cpu":
                raise ConfigError(
                    f"model {self.ctx.model!r}: precision int8: torch's dynamic quantization "
                    f"runs on the CPU only, not on {self.ctx.device.name}"
                )
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = torch.ao.quantization.quantize_dynamic(
                    module, {torch.nn.Linear}, dtype=torch.qint8
                )
            self._note(caught)
            converted = dynamic_linears(torch, module)
            if converted == 0:
                raise ConfigError(
                    f"model {self.ctx.model!r}: precision int8: the model has no nn.Linear "
                    "layers for dynamic quantization to convert (a torch.export program's "
                    "layers are graph calls): it would run fp32"
                )
            self._variant["quantization"] = {
                "method": "torch dynamic (nn.Linear, qint8 weights)",
                "engine": str(torch.backends.quantized.engine),
                "linear_layers": converted,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        if compile is not None:
            cache = _compile_cache(self.ctx.model_dir, compile.cache_dir)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = torch.compile(module, mode=compile.mode, dynamic=compile.dynamic)
            self._note(caught)
            self._variant["compile"] = {
                "backend": "inductor",
                "mode": compile.mode,
                "dynamic": compile.dynamic,
                "cache_dir": cache,
            }
        return module

    def _note(self, caught: list[warnings.WarningMessage]) -> None:
        """Deprecation and other warnings of a variant's build: logged once, kept as notes."""
        for w in caught:
            text = str(w.message).strip().splitlines()[0]
            if text not in self._variant_notes:
                self._variant_notes.append(text)
            if text not in _LOGGED:
                _LOGGED.add(text)
                log.warning("model %r: %s", self.ctx.model, text)

    def _first_batch(self, warm: Callable[[], None]) -> None:
        """Run the load's warm-up batch; for a compiled module, time it (the first compile)
        and count inductor's cache hits and misses during it."""
        info = self._variant.get("compile")
        if info is None:
            warm()
            return
        before = _inductor_counters(self._torch)
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warm()
        self._note(caught)
        info["first_batch_seconds"] = round(time.perf_counter() - t0, 3)
        after = _inductor_counters(self._torch)
        for key in ("fxgraph_cache_hit", "fxgraph_cache_miss"):
            info[key] = int(after.get(key, 0) - before.get(key, 0))

    def precision_evidence(self, inputs: Mapping[str, Array]) -> dict[str, Any]:
        """What precision ran: bytes of the weights by dtype (qint8 for dynamically quantized
        Linear layers), the fraction of the matmul and convolution weights (Linear and Conv
        layers, by element count; embeddings are lookups and do not count) that are
        quantized, and the dtypes of the floating outputs of every leaf module during one
        batch of ``inputs`` (run eagerly). Where layers cannot be observed (a TorchScript
        module takes no hooks, a torch.export program has no leaf modules), the module's
        own outputs stand in: ``activation_source`` says which (layers | outputs)."""
        torch = self._torch
        module = self._eager()
        weights = weight_bytes(torch, module)
        quantized, dense = matmul_weights(torch, module)
        layers: Counter[str] = Counter()
        outputs: Counter[str] = Counter()

        def count(into: Counter[str], out: Any) -> None:
            if isinstance(out, Mapping):
                out = list(out.values())
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    into[str(t.dtype).removeprefix("torch.")] += 1

        def record(_m: Any, _i: Any, out: Any) -> None:
            count(layers, out)

        def observed(*args: Any, **kwargs: Any) -> Any:
            out = module(*args, **kwargs)
            count(outputs, out)
            return out

        hooks: list[Any] = []
        try:
            for m in module.modules():
                if not list(m.children()):
                    hooks.append(m.register_forward_hook(record))
        except RuntimeError:  # a ScriptModule: no hooks
            pass
        compiled, self._module = self._module, observed
        run: Callable[[Mapping[str, Array]], Any] = getattr(self, "run")  # noqa: B009
        try:
            run(inputs)
        finally:
            self._module = compiled
            for h in hooks:
                h.remove()
        both = quantized + dense
        return {
            "weights_bytes": dict(sorted(weights.items())),
            "quantized_weight_fraction": round(quantized / both, 4) if both else 0.0,
            "linear_conv_weights": quantized + dense,
            "activation_dtypes": dict(sorted((layers or outputs).items())),
            "activation_source": "layers" if layers else "outputs",
        }

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
        """Provenance: the runtime's ``own`` fields, then device, versions, threads, bytes,
        and what a variant's build did (quantization, compilation)."""
        torch = self._torch or require("torch", self.extra)
        described = {
            **own,
            "device": self.ctx.device.name,
            "torch_version": str(torch.__version__),
            **versions,
            "torch_threads": int(torch.get_num_threads()),
            "parameters_bytes": self._resident,
            **self._variant,
        }
        if self._variant_notes:
            described["variant_notes"] = "; ".join(self._variant_notes)
        return described

    def resident_bytes(self) -> float:
        return self._resident

    def batch_memory_bytes(self, batch: int) -> float | None:
        return None

    def close(self) -> None:
        self._module = None


def _compile_cache(model_dir: Path, cache_dir: str | None) -> str | None:
    """Point inductor's cache at the model's cache folder (unless the environment already
    names one); the folder in use, or None for torch's default."""
    if _USER_INDUCTOR_CACHE:
        return _USER_INDUCTOR_CACHE
    if cache_dir is None:
        return None
    path = model_dir / cache_dir  # an absolute folder stays as it is
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("compile cache %s: %s; using torch's default", path, exc)
        return None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return str(path)


def _inductor_counters(torch: Any) -> Mapping[str, int]:
    try:
        return dict(torch._dynamo.utils.counters["inductor"])
    except (AttributeError, KeyError):
        return {}
