"""transformers: an architecture built from a config (random weights) or a local checkpoint.

``architecture`` names a transformers model class (``BertForSequenceClassification``,
``ResNetForImageClassification``, ``BertModel``...). Weights come from ``pretrained_dir`` (a
local ``save_pretrained`` folder; nothing is ever downloaded) or, when it is absent, are
initialised at random (seeded) from ``config_class`` with ``config`` overrides: the default
``BertConfig()`` is BERT-base and the default ``ResNetConfig()`` ResNet-50, so benchmarks
measure the real architectures without fetching weights. Request inputs map to ``forward``
keyword arguments and declared outputs to attributes of the model's output (by default the
same names). Precision: fp32, fp16 or bf16; the model is warmed up at load time, so a
precision the device cannot run fails at startup with a clear error, not on the first request.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, RuntimeContext, output_array, require
from evenserve.runtime.torch_common import (
    Precision,
    check_device,
    configure_threads,
    import_torch,
    module_bytes,
    synchronize,
    to_numpy,
    to_torch,
    torch_dtype,
)


class TransformersParams(BaseModel):
    """The ``transformers:`` section of model.yaml."""

    model_config = ConfigDict(extra="forbid")

    architecture: str = Field(min_length=1, description="transformers model class name")
    config_class: str | None = Field(
        default=None, description="transformers config class, e.g. BertConfig (random weights)"
    )
    config: dict[str, Any] = Field(default_factory=dict, description="config overrides")
    pretrained_dir: str | None = Field(
        default=None, description="local from_pretrained folder, relative to the model folder"
    )
    precision: Precision = "fp32"
    seed: int = 0
    input_map: dict[str, str] = Field(
        default_factory=dict, description="request input name -> forward() argument"
    )
    output_map: dict[str, str] = Field(
        default_factory=dict, description="declared output name -> model output attribute"
    )


class TransformersRuntime:
    def __init__(self, ctx: RuntimeContext) -> None:
        if not isinstance(ctx.params, TransformersParams):
            raise ConfigError(f"model {ctx.model!r}: transformers: section required")
        if ctx.params.pretrained_dir is None and ctx.params.config_class is None:
            raise ConfigError(
                f"model {ctx.model!r}: transformers.config_class: required when "
                "transformers.pretrained_dir is not given"
            )
        self.ctx = ctx
        self.params: TransformersParams = ctx.params
        self._torch: Any = None
        self._model: Any = None
        self._float_dtype: Any = None
        self._resident = 0.0

    def load(self) -> None:
        torch = import_torch("transformers")
        transformers = require("transformers", "transformers")
        p = self.params
        ctx = self.ctx
        check_device(torch, ctx.device)
        configure_threads(torch, ctx.options)
        try:
            arch = getattr(transformers, p.architecture)
        except AttributeError:
            raise ConfigError(
                f"model {ctx.model!r}: transformers.architecture: transformers has no "
                f"class {p.architecture!r}"
            ) from None
        dtype = torch_dtype(torch, p.precision)
        if p.pretrained_dir is not None:
            path = Path(p.pretrained_dir)
            path = path if path.is_absolute() else ctx.model_dir / path
            if not path.is_dir():
                raise ConfigError(
                    f"model {ctx.model!r}: transformers.pretrained_dir: not a folder: {path}"
                )
            model = arch.from_pretrained(str(path), local_files_only=True)
        else:
            assert p.config_class is not None
            try:
                config_cls = getattr(transformers, p.config_class)
            except AttributeError:
                raise ConfigError(
                    f"model {ctx.model!r}: transformers.config_class: transformers has no "
                    f"class {p.config_class!r}"
                ) from None
            try:
                config = config_cls(**p.config)
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
        self._torch = torch
        self._model = model
        self._float_dtype = dtype
        self._resident = module_bytes(model)
        self._warm_up()

    def _warm_up(self) -> None:
        batch: dict[str, Array] = {}
        for spec in self.ctx.inputs:
            dims = [8 if d == -1 else d for d in spec.shape]
            batch[spec.name] = np.zeros([1, *dims], dtype=spec.dtype)
        try:
            self.run(batch)
        except Exception as exc:
            raise ConfigError(
                f"model {self.ctx.model!r}: warm-up batch failed on {self.ctx.device.name} at "
                f"precision {self.params.precision}: {type(exc).__name__}: {exc}"
            ) from exc

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        torch = self._torch
        dev = self.ctx.device.torch_device
        kwargs = {
            self.params.input_map.get(name, name): to_torch(torch, arr, dev, self._float_dtype)
            for name, arr in inputs.items()
        }
        batch = int(next(iter(inputs.values())).shape[0])
        with torch.inference_mode():
            result = self._model(**kwargs)
            synchronize(torch, self.ctx.device)
        out: dict[str, Array] = {}
        for spec in self.ctx.outputs:
            attr = self.params.output_map.get(spec.name, spec.name)
            value = getattr(result, attr, None)
            if value is None and isinstance(result, Mapping):
                value = result.get(attr)
            if value is None:
                raise RuntimeError(f"output {spec.name!r}: model output has no {attr!r}")
            out[spec.name] = output_array(spec, to_numpy(torch, value), batch)
        return out

    def resident_bytes(self) -> float:
        return self._resident

    def batch_memory_bytes(self, batch: int) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        torch = self._torch or import_torch("transformers")
        transformers = require("transformers", "transformers")
        return {
            "runtime": "transformers",
            "architecture": self.params.architecture,
            "weights": "pretrained:" + self.params.pretrained_dir
            if self.params.pretrained_dir
            else f"random (seed {self.params.seed}) from {self.params.config_class}",
            "precision": self.params.precision,
            "device": self.ctx.device.name,
            "torch_version": str(torch.__version__),
            "transformers_version": str(transformers.__version__),
            "torch_threads": int(torch.get_num_threads()),
            "parameters_bytes": self._resident,
        }

    def close(self) -> None:
        self._model = None
