"""torch: a TorchScript file (``torch.jit.save``) or a torch.export program (``torch.export.save``).

Inputs are passed positionally in the order model.yaml declares them. The module may return a
tensor (one declared output), a tuple/list (matched to the declared outputs in order) or a
dict (matched by name). ``format: auto`` picks torch.export for ``.pt2`` files, TorchScript
otherwise.

The host pool (``runtime.host_pool``): the entry is the model file itself, copied into the
pool after a cold load (its serialized program and weights, as torch saved them); a warm
load reads that copy (tmpfs: host memory) instead of the repository's file. The entry's
digest includes the file's size and modification time, so a changed file is never read
stale.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict
from evenserve.runtime.base import Array, RuntimeContext, warm_up
from evenserve.runtime.torch_common import CompileParams, Precision, TorchModuleRuntime

log = logging.getLogger(__name__)


class TorchParams(Strict):
    """The ``torch:`` section of model.yaml."""

    file: str = Field(min_length=1, description="model file, relative to the model folder")
    format: Literal["auto", "torchscript", "export"] = "auto"
    precision: Precision = "fp32"
    compile: CompileParams | None = Field(default=None, description="torch.compile settings")


class TorchRuntime(TorchModuleRuntime):
    def __init__(self, ctx: RuntimeContext) -> None:
        if not isinstance(ctx.params, TorchParams):
            raise ConfigError(f"model {ctx.model!r}: torch: section required")
        super().__init__(ctx)
        self.params: TorchParams = ctx.params
        self._format = ""
        self._notes: list[str] = []

    @property
    def path(self) -> Path:
        """The model file (relative to the model folder; an absolute one stays as it is)."""
        return self.ctx.model_dir / self.params.file

    def load(self) -> None:
        path = self.path
        if not path.is_file():
            raise ConfigError(f"model {self.ctx.model!r}: torch.file: not found: {path}")
        self._load_file(path, path)

    def load_warm(self, entry: Path) -> None:
        """A load from the host pool: the copy of the model file there."""
        self._load_file(entry, self.path)

    def pool_bytes(self) -> float:
        return float(self.path.stat().st_size)

    def pool_tag(self) -> str:
        try:
            st = self.path.stat()
        except OSError:
            return str(self.path)
        return f"{self.path.resolve()}|{st.st_size}|{st.st_mtime_ns}"

    def write_pool_entry(self, path: Path) -> None:
        shutil.copyfile(self.path, path)

    def _load_file(self, path: Path, named: Path) -> None:
        """Load the program of ``path`` (``named``: the repository's file, which decides the
        format and is named in errors)."""
        torch, dtype = self._prepare(self.params.precision)
        ctx = self.ctx
        fmt = self.params.format
        if fmt == "auto":
            fmt = "export" if named.suffix == ".pt2" else "torchscript"
        dev = ctx.device.torch_device
        try:
            if fmt == "export":
                module = torch.export.load(str(path)).module()
            else:
                # TorchScript is deprecated upstream (torch >= 2.10 warns on every load); it is
                # still served, the warning is logged once here instead of raised per process.
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", DeprecationWarning)
                    module = torch.jit.load(str(path), map_location=dev)
                for w in caught:
                    log.warning("model %r: %s", ctx.model, w.message)
                    self._notes.append(str(w.message))
        except Exception as exc:
            raise ConfigError(
                f"model {ctx.model!r}: torch.file: cannot load {path} as {fmt}: {exc}"
            ) from exc
        module = module.to(dev)
        if self.params.precision != "fp32":
            module = module.to(dtype)
        if fmt == "torchscript":
            module = module.eval()
            if self.params.precision == "int8":
                raise ConfigError(
                    f"model {ctx.model!r}: torch.precision int8: a TorchScript module cannot "
                    "be dynamically quantized here (its layers are scripted)"
                )
            if self.params.compile is not None:
                raise ConfigError(
                    f"model {ctx.model!r}: torch.compile needs a torch.export program "
                    "(.pt2), not TorchScript"
                )
        self._format = fmt
        self._loaded(self._variant_module(module, self.params.precision, self.params.compile))
        self._first_batch(lambda: warm_up(self, ctx))

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        args = [self._tensor(inputs[s.name]) for s in self.ctx.inputs]
        batch = int(args[0].shape[0])
        result = self._call(*args)
        specs = self.ctx.outputs
        values: Sequence[Any]
        if isinstance(result, Mapping):
            missing = [s.name for s in specs if s.name not in result]
            if missing:
                raise RuntimeError(f"module returned no output named {missing[0]!r}")
            values = [result[s.name] for s in specs]
        elif isinstance(result, list | tuple):
            if len(result) < len(specs):
                raise RuntimeError(
                    f"module returned {len(result)} outputs, model.yaml declares {len(specs)}"
                )
            values = result
        else:
            values = [result]
        return {s.name: self._output(s, v, batch) for s, v in zip(specs, values, strict=False)}

    def describe(self) -> dict[str, Any]:
        own = {
            "runtime": "torch",
            "format": self._format or self.params.format,
            "file": self.params.file,
            "precision": self.params.precision,
            "engine": "compile" if self.params.compile is not None else "eager",
        }
        described = self._describe(own, {})
        if self._notes:
            described["notes"] = "; ".join(self._notes)
        return described

    def export_module(self) -> Any:
        """The loaded program as a ``torch.nn.Module`` for export: it takes the declared inputs
        positionally (as ``run`` passes them) and returns a tuple of the declared outputs in
        model.yaml's order (from a tensor, a tuple/list or a dict, as ``run`` matches them)."""
        if self._module is None:
            raise ConfigError(f"model {self.ctx.model!r}: export_module needs a loaded model")
        torch = self._torch
        program = self._module
        fmt = self._format
        names = [s.name for s in self.ctx.outputs]
        if fmt == "torchscript":
            # The TorchScript exporter takes a ScriptModule as it is (traced inside a wrapper
            # it is "not part of the active trace"); its outputs keep the program's order.
            return program

        class Positional(torch.nn.Module):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                super().__init__()
                # A torch.export module refuses train(), which exporters call on every
                # submodule: it is held outside the module tree, its weights (served
                # without gradients anyway) traced as constants.
                for weight in program.parameters():
                    weight.requires_grad_(False)
                self.__dict__["program"] = program

            def forward(self, *args: Any) -> tuple[Any, ...]:
                result = self.program(*args)
                if isinstance(result, Mapping):
                    return tuple(result[n] for n in names)
                if isinstance(result, list | tuple):
                    return tuple(result[: len(names)])
                return (result,)

        return Positional().eval()
