"""transformers: an architecture built from a config (random weights) or a local checkpoint.

``architecture`` names a transformers model class (``BertForSequenceClassification``,
``ResNetForImageClassification``, ``BertModel``...). Weights come from ``pretrained_dir`` (a
local ``save_pretrained`` folder; nothing is ever downloaded) or, when it is absent, are
initialised at random (seeded) from ``config_class`` with ``config`` overrides: the default
``BertConfig()`` is BERT-base and the default ``ResNetConfig()`` ResNet-50, so benchmarks
measure the real architectures without fetching weights. Request inputs map to ``forward``
keyword arguments and declared outputs to attributes of the model's output (by default the
same names). Precision: fp32, fp16, bf16 or int8 (dynamic quantization, CPU), and ``compile``
for ``torch.compile`` (see ``torch_common``); the model is warmed up at load time, so a
precision the device cannot run fails at startup with a clear error, not on the first request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict
from evenserve.runtime.base import Array, RuntimeContext, require, warm_up
from evenserve.runtime.torch_common import CompileParams, Precision, TorchModuleRuntime


class TransformersParams(Strict):
    """The ``transformers:`` section of model.yaml."""

    architecture: str = Field(min_length=1, description="transformers model class name")
    config_class: str | None = Field(
        default=None, description="transformers config class, e.g. BertConfig (random weights)"
    )
    config: dict[str, Any] = Field(default_factory=dict, description="config overrides")
    pretrained_dir: str | None = Field(
        default=None, description="local from_pretrained folder, relative to the model folder"
    )
    precision: Precision = "fp32"
    compile: CompileParams | None = Field(default=None, description="torch.compile settings")
    seed: int = 0
    input_map: dict[str, str] = Field(
        default_factory=dict, description="request input name -> forward() argument"
    )
    output_map: dict[str, str] = Field(
        default_factory=dict, description="declared output name -> model output attribute"
    )


class TransformersRuntime(TorchModuleRuntime):
    extra = "transformers"

    def __init__(self, ctx: RuntimeContext) -> None:
        if not isinstance(ctx.params, TransformersParams):
            raise ConfigError(f"model {ctx.model!r}: transformers: section required")
        if ctx.params.pretrained_dir is None and ctx.params.config_class is None:
            raise ConfigError(
                f"model {ctx.model!r}: transformers.config_class: required when "
                "transformers.pretrained_dir is not given"
            )
        super().__init__(ctx)
        self.params: TransformersParams = ctx.params

    def load(self) -> None:
        torch, dtype = self._prepare(self.params.precision)
        transformers = require("transformers", "transformers")
        p = self.params
        ctx = self.ctx

        def named_class(field: str, name: str) -> Any:
            try:
                return getattr(transformers, name)
            except AttributeError:
                raise ConfigError(
                    f"model {ctx.model!r}: transformers.{field}: transformers has no class {name!r}"
                ) from None

        arch = named_class("architecture", p.architecture)
        if p.pretrained_dir is not None:
            path = ctx.model_dir / p.pretrained_dir  # an absolute folder stays as it is
            if not path.is_dir():
                raise ConfigError(
                    f"model {ctx.model!r}: transformers.pretrained_dir: not a folder: {path}"
                )
            model = arch.from_pretrained(str(path), local_files_only=True)
        else:
            assert p.config_class is not None
            try:
                config = named_class("config_class", p.config_class)(**p.config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"model {ctx.model!r}: transformers.config: {exc}") from None
            torch.manual_seed(p.seed)
            try:
                model = arch(config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"model {ctx.model!r}: transformers.config: cannot build "
                    f"{p.architecture} from this config: {exc}"
                ) from None
        model = model.to(device=ctx.device.torch_device, dtype=dtype).eval()
        self._loaded(self._variant_module(model, p.precision, p.compile))
        self._first_batch(
            lambda: warm_up(self, ctx, f" on {ctx.device.name} at precision {p.precision}")
        )

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        kwargs = {self.params.input_map.get(n, n): self._tensor(a) for n, a in inputs.items()}
        batch = int(next(iter(inputs.values())).shape[0])
        result = self._call(**kwargs)
        out: dict[str, Array] = {}
        for spec in self.ctx.outputs:
            attr = self.params.output_map.get(spec.name, spec.name)
            value = getattr(result, attr, None)
            if value is None and isinstance(result, Mapping):
                value = result.get(attr)
            if value is None:
                raise RuntimeError(f"output {spec.name!r}: model output has no {attr!r}")
            out[spec.name] = self._output(spec, value, batch)
        return out

    def describe(self) -> dict[str, Any]:
        p = self.params
        own = {
            "runtime": "transformers",
            "architecture": p.architecture,
            "weights": "pretrained:" + p.pretrained_dir
            if p.pretrained_dir
            else f"random (seed {p.seed}) from {p.config_class}",
            "precision": p.precision,
            "engine": "compile" if p.compile is not None else "eager",
        }
        transformers = require("transformers", "transformers")
        return self._describe(own, {"transformers_version": str(transformers.__version__)})

    def export_module(self) -> Any:
        """The loaded model as a ``torch.nn.Module`` for export: it takes the declared inputs
        positionally (model.yaml's order, mapped to ``forward`` arguments by ``input_map``)
        and returns a tuple of the declared outputs (model.yaml's order, by ``output_map``)."""
        if self._module is None:
            raise ConfigError(f"model {self.ctx.model!r}: export_module needs a loaded model")
        torch = self._torch
        model = self._module
        names = [self.params.input_map.get(s.name, s.name) for s in self.ctx.inputs]
        attrs = [self.params.output_map.get(s.name, s.name) for s in self.ctx.outputs]

        class Positional(torch.nn.Module):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> tuple[Any, ...]:
                result = self.model(**dict(zip(names, args, strict=True)))
                out = []
                for attr in attrs:
                    value = getattr(result, attr, None)
                    if value is None and isinstance(result, Mapping):
                        value = result.get(attr)
                    if value is None:
                        raise RuntimeError(f"model output has no {attr!r}")
                    out.append(value)
                return tuple(out)

        return Positional().eval()
