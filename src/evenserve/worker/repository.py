"""The model repository: one folder per model with a ``model.yaml`` (Triton-like), or a
Triton model folder (``config.pbtxt`` and version folders: see ``triton_config``).

``model.yaml``: its fields are ``model_config``'s (every error names the file and the field).

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

from pydantic import BaseModel, Field, ValidationError

from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile, load_profile
from evenserve.core.validation import Strict, format_validation_error, read_yaml, validate_document
from evenserve.policy.batching import BatchingPolicy
from evenserve.runtime.base import Runtime, RuntimeContext, TensorSpec
from evenserve.runtime.device import DeviceTarget
from evenserve.runtime.emulated import EmulatedDevice, EmulatedParams
from evenserve.runtime.factory import RUNTIME_PARAMS, create_runtime
from evenserve.sched.setup import Batching, batching_setup
from evenserve.worker import triton_config
from evenserve.worker.model_config import (
    DEFAULT_BATCHING,
    ModelConfig,
)

MODEL_FILE = "model.yaml"
#: The variant ``evenserve optimize`` chose, beside model.yaml.
VARIANT_FILE = "variant.yaml"


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
    from evenserve.worker.llm.config import is_llm_folder

    if is_llm_folder(directory):
        raise ConfigError(
            f"{directory / MODEL_FILE}: kind: llm: an LLM is served from the worker's start "
            "(--model-control none, or explicit with --load-model); only an emulated one with "
            "a placement: section is put to sleep and woken while serving"
        )
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
    from evenserve.worker.llm.config import is_llm_folder

    folders = [d for d in model_folders(repo) if only is None or d.name in only]
    llms = {d.name for d in folders if is_llm_folder(d)}
    models = [load_model(d, check_profiles) for d in folders if d.name not in llms]
    if only is not None:
        missing = sorted(set(only) - {m.name for m in models} - llms)
        if missing:
            raise ConfigError(f"--models: no model folder {missing[0]!r} in {repo}")
    if not models and not llms:
        raise ConfigError(f"--repo: {repo} holds no model folders")
    return models


def load_llm_repository(repo: Path, only: list[str] | None = None) -> list[Any]:
    """The LLM folders (``kind: llm``) of ``repo`` (``worker.llm.config.LlmEntry``)."""
    from evenserve.worker.llm.config import is_llm_folder, load_llm_model

    return [
        load_llm_model(d)
        for d in model_folders(repo)
        if (only is None or d.name in only) and is_llm_folder(d)
    ]
