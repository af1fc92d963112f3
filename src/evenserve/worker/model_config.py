"""A model folder's ``model.yaml``, typed and validated.

Its fields (every error names the file and the field):

- ``name`` (default: the folder's name; must match it), ``version`` ("1"): both are path
  segments of the model's routes, so ``[A-Za-z0-9_.-]``, at most 128, not ``.`` or ``..``
- ``runtime``: emulated | transformers | torch | onnx, and a section of the same name holding
  that runtime's parameters (see ``evenserve.runtime``)
- ``inputs`` / ``outputs``: ``{name, datatype, shape}`` with the KServe datatype (FP32, INT64,
  ...) and the per-request shape *without* the batch dimension; ``-1`` is a variable size.
  Inputs may give ``example_shape`` (concrete dims for synthetic data, used by the profiler)
  and ``synthetic: {low, high}`` (value range of synthetic data).
- ``max_batch_size``: the most items one batch may hold (a request carries 1 or more items
  along its leading dimension)
- ``batching``: a batching policy spec (``{policy: fixed-window, max_batch_delay_ms: 5}``);
  default: fixed-window with no delay, i.e. work-conserving dynamic batching. A policy that
  has a ``max_batch_size`` parameter gets the model's when the spec does not set it, and
  one over the model's is refused (the batch-cap rule, ``sched.setup``).
- ``slo_ms`` (requests without a deadline are ordered by arrival + SLO within their class),
  ``priority`` (the class of requests that bring none: an integer or online/offline),
  ``deadline_ms`` (the deadline of requests that bring none: they must finish within this
  many ms of arriving or are refused; ``queue_timeout_ms`` is its older name, one of the two),
  ``max_queue_size`` (default: the worker's bound; when full, a request of a higher class
  sheds the lowest-class one)
- ``profile``: a latency profile YAML for this model on this device (used by profile-aware
  batching policies and the load report's estimates), relative to the model folder
- ``optimize``: what ``evenserve optimize`` checks a cheaper variant against
  (``min_top1_agreement``, ``min_cosine``, ``gate_output``, ``calibration``,
  ``calibration_items``, ``variants``, ``batch_sizes``: see ``OptimizeConfig``)
- ``use_variant`` (default true): serve the variant ``evenserve optimize`` chose
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from evenserve.core import wire
from evenserve.core.options import ModelOptions
from evenserve.core.tensors import DATATYPES
from evenserve.core.validation import Strict
from evenserve.runtime.base import TensorSpec
from evenserve.runtime.factory import RUNTIME_PARAMS

RuntimeName = Literal["emulated", "transformers", "torch", "onnx"]

#: The batching of a model.yaml without one: work-conserving dynamic batching.
DEFAULT_BATCHING: dict[str, Any] = {"policy": "fixed-window", "max_batch_delay_ms": 0}


class SyntheticRange(Strict):
    low: float = 0.0
    high: float = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> SyntheticRange:
        if self.high <= self.low:
            raise ValueError("high must be greater than low")
        return self


class TensorConfig(Strict):
    name: str = Field(min_length=1)
    datatype: str
    shape: list[int]
    example_shape: list[int] | None = None
    synthetic: SyntheticRange | None = None

    @field_validator("datatype", mode="before")
    @classmethod
    def _datatype(cls, v: Any) -> Any:
        if isinstance(v, str):
            up = v.strip().upper().removeprefix("TYPE_")
            if up not in DATATYPES:
                raise ValueError(f"unknown datatype {v!r} (known: {', '.join(DATATYPES)})")
            return up
        return v

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        for d in v:
            if d != -1 and d < 1:
                raise ValueError(f"dimension {d}: must be -1 (variable) or >= 1")
        return v

    @model_validator(mode="after")
    def _example(self) -> TensorConfig:
        ex = self.example_shape
        if ex is not None and (
            len(ex) != len(self.shape)
            or any(e < 1 or (d != -1 and d != e) for d, e in zip(self.shape, ex, strict=True))
        ):
            raise ValueError(f"example_shape {ex} does not fit shape {self.shape}")
        return self

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, tuple(self.shape))


class OptimizeConfig(Strict):
    """``optimize:`` of model.yaml: the correctness gate a cheaper variant must pass."""

    min_top1_agreement: float = Field(
        default=0.99, ge=0.0, le=1.0, description="top-1 agreement with fp32 on the gate set"
    )
    min_cosine: float = Field(
        default=0.99, ge=-1.0, le=1.0, description="mean per-item cosine of outputs vs fp32"
    )
    gate_output: str | None = Field(
        default=None, description="the output compared (default: the first declared)"
    )
    calibration: str | None = Field(
        default=None,
        description="a .npz of input arrays (named like the inputs, leading dim = items), "
        "relative to the model folder; default: synthetic from the input spec",
    )
    calibration_items: int = Field(
        default=512, ge=1, le=1_000_000, description="synthetic gate items (no calibration)"
    )
    variants: list[str] | None = Field(default=None, description="variants to build")
    batch_sizes: list[int] | None = Field(default=None, description="batch sizes profiled")


class ModelConfig(ModelOptions):
    """``model.yaml``; the class, deadline and SLO fields are the scenario's (ModelOptions)."""

    name: str = Field(min_length=1)
    version: str = "1"
    description: str | None = None
    runtime: RuntimeName
    max_batch_size: int = Field(ge=1, le=65536)
    inputs: list[TensorConfig] = Field(min_length=1)
    outputs: list[TensorConfig] = Field(min_length=1)
    batching: Any = None
    queue_timeout_ms: float | None = Field(default=None, gt=0, description="deadline_ms's old name")
    max_queue_size: int | None = Field(default=None, ge=1)
    profile: str | None = None
    optimize: OptimizeConfig = Field(default_factory=OptimizeConfig)
    use_variant: bool = True
    emulated: dict[str, Any] | None = None
    transformers: dict[str, Any] | None = None
    torch: dict[str, Any] | None = None
    onnx: dict[str, Any] | None = None

    @field_validator("name", "version")
    @classmethod
    def _routable(cls, v: str) -> str:
        if not wire.is_safe_name(v):
            raise ValueError(
                f"{v!r} is no path segment of a route: use {wire.NAME_CHARS}, at most "
                f"{wire.MAX_NAME_LENGTH}, not '.' or '..'"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        for kind in ("inputs", "outputs"):
            names = [t.name for t in getattr(self, kind)]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{kind}: name {sorted(dup)[0]!r} used twice")
        gate = self.optimize.gate_output
        if gate is not None and gate not in {t.name for t in self.outputs}:
            raise ValueError(f"optimize.gate_output: {gate!r} is not a declared output")
        if self.deadline_ms is not None and self.queue_timeout_ms is not None:
            raise ValueError("deadline_ms, queue_timeout_ms: give one (both are the deadline)")
        for other in RUNTIME_PARAMS:
            if other not in ("emulated", self.runtime) and getattr(self, other) is not None:
                raise ValueError(f"{other}: section given but runtime is {self.runtime!r}")
        return self

    @property
    def deadline_s(self) -> float | None:
        ms = self.deadline_ms if self.deadline_ms is not None else self.queue_timeout_ms
        return None if ms is None else ms / 1000.0
