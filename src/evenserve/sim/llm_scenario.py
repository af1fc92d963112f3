"""An LLM scenario (``kind: llm``): one device hosting an LLM engine next to classic models.

    kind: llm
    name: llm-mix
    seed: 1
    duration_s: 120          # arrivals stop here; what arrived is answered
    warmup_s: 10             # figures count requests scheduled in [warmup_s, duration_s)
    device: {profiles: h100-llm}   # a profile set: the LLM's step profile, classic profiles
    llm:
      model: llama-3.1-8b
      engine: {mode: continuous, max_num_seqs: 256, max_num_batched_tokens: 8192}
      workloads:             # each: workload.llm.LlmWorkloadSpec (model filled in)
        - {rate_rps: 6, prompt_tokens: {...}, output_tokens: {...}, ttft_ms: 1000, tpot_ms: 50}
    classic:
      - {model: resnet50, rate_rps: 300, slo_ms: 25,
         batching: {policy: fixed-window, max_batch_delay_ms: 2}, max_batch_size: 32}
    arms:                    # each arm: engine overrides, and which sides run
      request-level: {engine: {mode: request-level}, classic: false}
      continuous: {engine: {mode: continuous}, classic: false}

Every error names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.core.wire import ONLINE
from evenserve.workload.llm import LlmWorkloadSpec


class EngineSpec(Strict):
    """An engine's settings (``sched.engine.EngineSetup``); all optional in an arm."""

    mode: Literal["request-level", "continuous", "continuous-chunked"] | None = None
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    chunk_tokens: int | None = Field(default=None, ge=1)
    prefix_caching: bool | None = None
    max_waiting: int | None = Field(default=None, ge=1)
    #: KV blocks (default: what the device's memory holds after weights and classic models).
    num_blocks: int | None = Field(default=None, ge=1)

    def merged(self, over: EngineSpec | None) -> EngineSpec:
        if over is None:
            return self
        return self.model_copy(update=over.model_dump(exclude_none=True))


class LlmSection(Strict):
    model: str = Field(min_length=1)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    #: The class of its requests that bring none (for the interleaving with classic models).
    priority: int = ONLINE
    workloads: list[dict[str, Any]] = Field(min_length=1)


class ClassicSection(Strict):
    model: str = Field(min_length=1)
    rate_rps: float = Field(gt=0)
    slo_ms: float = Field(gt=0)
    batching: dict[str, Any] = Field(
        default_factory=lambda: {"policy": "fixed-window", "max_batch_delay_ms": 0}
    )
    max_batch_size: int = Field(default=32, ge=1)
    priority: int = ONLINE


class DeviceSection(Strict):
    #: A profile set: bundled (``h100-llm``) or a folder relative to the scenario file.
    profiles: str


class ArmSection(Strict):
    engine: EngineSpec | None = None
    #: Which sides run in this arm (co-location on: both).
    llm: bool = True
    classic: bool = True


class LlmScenarioFile(Strict):
    kind: Literal["llm"]
    name: str
    seed: int = 1
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    #: After arrivals stop, the longest the run goes on answering what arrived.
    drain_s: float = Field(default=600.0, ge=0)
    device: DeviceSection
    llm: LlmSection | None = None
    classic: list[ClassicSection] = Field(default_factory=list)
    arms: dict[str, ArmSection] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> LlmScenarioFile:
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        if self.llm is None and any(a.llm for a in self.arms.values()):
            raise ValueError("arms: an arm runs the LLM but the scenario has no llm section")
        return self


class LlmScenario:
    """A validated LLM scenario with its workloads parsed and its profile set found."""

    def __init__(self, doc: LlmScenarioFile, source: str, base_dir: Path) -> None:
        self.doc = doc
        self.source = source
        self.base_dir = base_dir
        self.workloads: list[LlmWorkloadSpec] = []
        if doc.llm is not None:
            for i, raw in enumerate(doc.llm.workloads):
                where = f"{source}: llm.workloads.{i}"
                if not isinstance(raw, dict):
                    raise ConfigError(f"{where}: expected a mapping")
                self.workloads.append(
                    validate_document(LlmWorkloadSpec, {"model": doc.llm.model, **raw}, where)
                )

    def profile_dir(self) -> Path:
        return find_profile_set(
            self.doc.device.profiles, self.base_dir, self.source, "device.profiles"
        )


def find_profile_set(name: str, base_dir: Path, source: str, field: str) -> Path:
    """A scenario's profile set: a folder next to the scenario file, else a bundled one;
    ConfigError naming ``source`` and ``field`` when neither exists."""
    from evenserve.core.profile import bundled_profile_set

    local = base_dir / name
    if local.is_dir():
        return local
    found = bundled_profile_set(name)
    if found is None:
        raise ConfigError(f"{source}: {field}: no profile set {name!r}")
    return found


def is_llm_scenario(path: Path) -> bool:
    """Whether ``path`` holds an LLM scenario (``kind: llm``)."""
    try:
        raw = read_yaml(path, f"scenario file not found: {path}")
    except ConfigError:
        return False
    return isinstance(raw, dict) and raw.get("kind") == "llm"


def load_llm_scenario(path: Path) -> LlmScenario:
    raw = read_yaml(path, f"scenario file not found: {path}")
    doc = validate_document(LlmScenarioFile, raw, str(path))
    return LlmScenario(doc, str(path), path.parent)
