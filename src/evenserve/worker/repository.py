"""The model repository: one folder per model with a ``model.yaml`` (Triton-like), or a
Triton model folder (``config.pbtxt`` and version folders: see ``triton_config``).

``model.yaml`` fields (every error names the file and the field):

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
  has a ``max_batch_size`` parameter gets the model's when the spec does not set it.
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

``variant.yaml`` beside ``model.yaml`` (written by ``evenserve optimize``) names the variant
the model is served as: its ``runtime`` and that runtime's section replace model.yaml's, its
``profile`` replaces model.yaml's, and ``provenance`` says how it was chosen. ``use_variant:
false`` in model.yaml serves model.yaml as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.options import ModelOptions
from evenserve.core.profile import LatencyProfile, load_profile
from evenserve.core.tensors import DATATYPES
from evenserve.core.validation import Strict, format_validation_error, read_yaml, validate_document
from evenserve.policy.batching import BatchingPolicy
from evenserve.runtime.base import Runtime, RuntimeContext, TensorSpec
from evenserve.runtime.device import DeviceTarget
from evenserve.runtime.emulated import EmulatedDevice, EmulatedParams
from evenserve.runtime.factory import RUNTIME_PARAMS, create_runtime
from evenserve.sched.setup import Batching, batching_setup
from evenserve.worker import triton_config

RuntimeName = Literal["emulated", "transformers", "torch", "onnx"]

MODEL_FILE = "model.yaml"
#: The variant ``evenserve optimize`` chose, beside model.yaml.
VARIANT_FILE = "variant.yaml"
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


@dataclass
class ModelEntry:
    """One validated model of the repository."""

    config: ModelConfig
    directory: Path
    source: Path
    runtime_params: BaseModel | None
    emulated_params: EmulatedParams | None
    #: What the model's config sets that evenserve ignores, one line each naming the field.
    notes: list[str] = field(default_factory=list)
    #: A Triton-repository model's original config (Triton's JSON), served as its config.
    triton_config: dict[str, Any] | None = None
    #: The variant served (variant.yaml): ``{"name", "file", "provenance"}``; None: as written.
    variant: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.config.inputs)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t.spec() for t in self.config.outputs)

    def create_runtime(
        self,
        device: DeviceTarget,
        *,
        cpu_threads: int | None,
        profiles_dir: Path | None,
        emulated_device: EmulatedDevice | None = None,
        params: BaseModel | None = None,
    ) -> Runtime:
        """Build (not load) this model's runtime on ``device``; ``params`` replaces the
        model.yaml section of its runtime (the profiler's ``--precision``)."""
        ctx = RuntimeContext(
            model=self.name,
            model_dir=self.directory,
            device=device,
            inputs=self.inputs,
            outputs=self.outputs,
            params=self.runtime_params if params is None else params,
            cpu_threads=cpu_threads,
        )
        return create_runtime(
            self.config.runtime,
            ctx,
            emulated_params=self.emulated_params,
            profile_sets_dir=profiles_dir,
            emulated_device=emulated_device,
        )

    def batching(self, override: Any = None) -> Batching:
        """The model's batching (``override``: the worker's ``--batching``; default
        ``DEFAULT_BATCHING``) under the batch-cap rule (``sched.setup``): the model's
        max_batch_size filled in where the policy has one, a larger batch refused."""
        spec = override if override is not None else self.config.batching
        if spec is None:
            spec = DEFAULT_BATCHING
        return batching_setup(spec, self.config.max_batch_size, f"{self.source}: batching")

    def batching_spec(self, override: Any = None) -> Any:
        """The policy spec as the model runs it (``batching``)."""
        return self.batching(override).spec

    def build_policy(self, override: Any = None) -> BatchingPolicy:
        return self.batching(override).policy

    def latency_profile(self) -> LatencyProfile | None:
        if self.config.profile is None:
            return None
        try:
            return load_profile(self.directory / self.config.profile)  # absolute: as it is
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: profile: {exc}") from exc


def _validate_section(source: Path, section: str, raw: dict[str, Any] | None) -> BaseModel | None:
    if raw is None:
        return None
    try:
        return RUNTIME_PARAMS[section].model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc, section)}") from exc


#: The model.yaml fields that name a file (or, the last, a folder) in the model folder.
OVERRIDE_PATHS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("profile",), False),
    (("emulated", "profile"), False),
    (("torch", "file"), False),
    (("onnx", "file"), False),
    (("transformers", "pretrained_dir"), True),
)


def check_override_paths(directory: Path, override: Mapping[str, Any], where: str) -> None:
    """The files a load's config override names (``OVERRIDE_PATHS``) must be in the model
    folder and exist: ConfigError naming the field (``{where}.emulated.profile``) otherwise,
    with the path as the client gave it (never the repository's). A Triton folder's
    override (Triton's config JSON) names none."""
    if triton_config.is_triton_folder(directory, MODEL_FILE):
        return
    inside = directory.resolve()
    for keys, folder in OVERRIDE_PATHS:
        value: Any = override
        for k in keys:
            value = value.get(k) if isinstance(value, Mapping) else None
        if not isinstance(value, str) or not value:
            continue  # absent, or the wrong type: the validation names it
        field_name = f"{where}.{'.'.join(keys)}"
        path = Path(value)
        if path.is_absolute() or not (directory / path).resolve().is_relative_to(inside):
            raise ConfigError(f"{field_name}: {value!r} is not a path inside the model folder")
        full = directory / path
        if not (full.is_dir() if folder else full.is_file()):
            kind = "folder" if folder else "file"
            raise ConfigError(
                f"{field_name}: no {kind} {value!r} in the model folder {directory.name!r}"
            )


def load_model(
    directory: Path, check_profile: bool = True, override: Mapping[str, Any] | None = None
) -> ModelEntry:
    """Read and validate ``directory/model.yaml`` (and its ``profile``, if ``check_profile``),
    or a Triton folder's ``config.pbtxt``. ``override`` (a load request's config): for a
    model.yaml folder, model.yaml fields replacing the file's top-level ones; for a Triton
    folder, Triton's config JSON replacing config.pbtxt. Validated the same way; its errors
    name the field."""
    if triton_config.is_triton_folder(directory, MODEL_FILE):
        return _load_triton(directory, override)
    source = directory / MODEL_FILE
    raw = read_yaml(source, f"{directory}: no {MODEL_FILE} in this model folder")
    where = str(source)
    if override is not None and isinstance(raw, dict):
        raw = {**raw, **override}
        where = f"{source} with the load's config override"
    variant = None
    if isinstance(raw, dict):
        raw.setdefault("name", directory.name)
        if raw.get("use_variant", True) is not False:
            raw, variant, where = _with_variant(directory, raw, where)
    cfg = validate_document(ModelConfig, raw, where)
    if cfg.name != directory.name:
        raise ConfigError(
            f"{source}: name: {cfg.name!r} differs from its folder {directory.name!r}"
        )
    runtime_params = _validate_section(source, cfg.runtime, getattr(cfg, cfg.runtime))
    emulated = _validate_section(source, "emulated", cfg.emulated)
    assert emulated is None or isinstance(emulated, EmulatedParams)
    entry = ModelEntry(cfg, directory, source, runtime_params, emulated, variant=variant)
    entry.build_policy()  # fail at load time on a bad batching spec
    if check_profile:
        entry.latency_profile()
    return entry


class VariantFile(Strict):
    """``variant.yaml``: the runtime, its section and the profile of the chosen variant (a
    real runtime: ``evenserve optimize`` builds no emulated variant)."""

    variant: str = Field(min_length=1)
    runtime: Literal["transformers", "torch", "onnx"]
    profile: str | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)
    transformers: dict[str, Any] | None = None
    torch: dict[str, Any] | None = None
    onnx: dict[str, Any] | None = None


def _with_variant(
    directory: Path, raw: dict[str, Any], where: str
) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """model.yaml's fields with the folder's variant.yaml applied (when there is one): the
    fields, the variant's description, and where the merged document comes from."""
    path = directory / VARIANT_FILE
    if not path.is_file():
        return raw, None, where
    doc = validate_document(VariantFile, read_yaml(path, f"{path}: cannot read"), str(path))
    section = getattr(doc, doc.runtime)
    if section is None:
        raise ConfigError(f"{path}: {doc.runtime}: section required for runtime {doc.runtime}")
    merged = {k: v for k, v in raw.items() if k not in RUNTIME_PARAMS or k == "emulated"}
    merged.update(runtime=doc.runtime, **{doc.runtime: section})
    if doc.profile is not None:
        merged["profile"] = doc.profile
    described = {"name": doc.variant, "file": str(path), "provenance": doc.provenance}
    return merged, described, f"{where} with {path}"


def model_folders(repo: Path) -> list[Path]:
    """The model folders of ``repo`` in name order (folders starting with '.' or '_' are
    skipped); ConfigError when ``repo`` is not a folder."""
    if not repo.is_dir():
        raise ConfigError(f"--repo: not a folder: {repo}")
    return sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _load_triton(directory: Path, override: Mapping[str, Any] | None) -> ModelEntry:
    """A Triton model folder (see ``triton_config``) validated as model.yaml would be."""
    mapped = triton_config.read_triton(directory, override)
    where = f"{directory}: override" if override is not None else str(mapped.source)
    cfg = validate_document(ModelConfig, mapped.raw, where)
    params = _validate_section(mapped.source, cfg.runtime, getattr(cfg, cfg.runtime))
    entry = ModelEntry(
        cfg, directory, mapped.source, params, None, mapped.notes, mapped.triton_json
    )
    entry.build_policy()
    return entry


def load_repository(
    repo: Path, only: list[str] | None = None, check_profiles: bool = True
) -> list[ModelEntry]:
    """Every model folder of ``repo`` (folders starting with '.' or '_' are skipped)."""
    models = [
        load_model(d, check_profiles) for d in model_folders(repo) if only is None or d.name in only
    ]
    if only is not None:
        missing = sorted(set(only) - {m.name for m in models})
        if missing:
            raise ConfigError(f"--models: no model folder {missing[0]!r} in {repo}")
    if not models:
        raise ConfigError(f"--repo: {repo} holds no model folders")
    return models
