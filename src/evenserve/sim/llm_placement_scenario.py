"""An LLM-pools scenario (``kind: llm-placement``): an LLM engine and classic models placed on
a pool of devices by a placement policy, by demand, over a day and a night.

    kind: llm-placement
    name: llm-pools-night
    seed: 1
    duration_s: 600          # arrivals stop here; device-seconds count over [0, duration_s)
    warmup_s: 10             # SLO attainment counts requests scheduled in [warmup_s, duration_s)
    profiles: h100-llm       # the LLM's step profile and the classic latency profiles
    llm:
      model: llama-3.1-8b
      kv_tokens: 131072      # the KV cache it holds when placed (>= one max_model_len sequence)
      cold_load_ms: 20000    # from disk (weights through host memory to the device)
      warm_load_ms: 1500     # a wake: weights from host memory (vLLM sleep mode level 1)
      capacity: {prompt_tokens: 1000, output_tokens: 200}   # placement's capacity estimate
      engine: {max_num_seqs: 128}
      workloads:             # each: workload.llm.LlmWorkloadSpec (model filled in)
        - {rate_rps: 10, phases: [...], prompt_tokens: {...}, output_tokens: {...},
           ttft_ms: 1000, tpot_ms: 50}
    classic:                 # Poisson streams; several may share a model (a class each)
      - {model: resnet50, rate_rps: 2000, phases: [...], slo_ms: 50, max_batch_size: 32}
      - {model: bert-base, name: bert-batch, rate_rps: 3000, phases: [...], slo_ms: 5000,
         priority: offline}
    arms:
      static-3:
        devices: [{name: s0, models: [llama-3.1-8b, resnet50]}, ...]
      cost-aware:
        placement: {policy: cost-aware, hold_s: 30}
        autoscaling: {policy: demand}
        min_switch_s: 30
        devices: [{name: g0, models: [...]}, {name: g1, active: false}, ...]

Every error names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import Phase
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.core.wire import ONLINE, PRIORITY_CLASSES
from evenserve.policy.placement.engine import CapacityMix, EnginePlacement
from evenserve.sim.llm_scenario import EngineSpec, find_profile_set
from evenserve.workload.llm import LlmWorkloadSpec


class LlmModel(Strict):
    model: str = Field(min_length=1)
    kv_tokens: int = Field(ge=1)
    cold_load_ms: float = Field(gt=0)
    warm_load_ms: float = Field(gt=0)
    capacity: CapacityMix
    engine: EngineSpec = Field(default_factory=EngineSpec)
    priority: int = ONLINE
    workloads: list[dict[str, Any]] = Field(min_length=1)

    @model_validator(mode="after")
    def _wake_before_load(self) -> LlmModel:
        if self.warm_load_ms > self.cold_load_ms:
            raise ValueError("warm_load_ms: a wake cannot take longer than cold_load_ms")
        return self

    @property
    def placement(self) -> EnginePlacement:
        """The fields placement reads, as a live ``kind: llm`` folder's ``placement:``
        section gives them (``policy.placement.engine``)."""
        return EnginePlacement(
            kv_tokens=self.kv_tokens,
            cold_load_ms=self.cold_load_ms,
            warm_load_ms=self.warm_load_ms,
            capacity=self.capacity,
        )


def _priority(v: int | str) -> int:
    if isinstance(v, str):
        if v not in PRIORITY_CLASSES:
            raise ValueError(f"unknown class {v!r} ({sorted(PRIORITY_CLASSES)})")
        return PRIORITY_CLASSES[v]
    return v


class ClassicStream(Strict):
    """A Poisson stream of one classic model (its ``name``: the model's, unless given)."""

    model: str = Field(min_length=1)
    name: str | None = None
    rate_rps: float = Field(gt=0)
    phases: list[Phase] = Field(default_factory=list)
    slo_ms: float = Field(gt=0)
    priority: int = ONLINE
    #: The model's serving settings (the first stream of a model gives them).
    batching: dict[str, Any] = Field(
        default_factory=lambda: {"policy": "fixed-window", "max_batch_delay_ms": 2}
    )
    max_batch_size: int = Field(default=32, ge=1)
    #: Load times (None: the defaults from its weights, ``core.scenario.default_load_times_s``).
    cold_load_ms: float | None = Field(default=None, gt=0)
    warm_load_ms: float | None = Field(default=None, gt=0)

    @field_validator("priority", mode="before")
    @classmethod
    def _class(cls, v: int | str) -> int:
        return _priority(v)

    @property
    def stream(self) -> str:
        return self.name or self.model


class DeviceEntry(Strict):
    name: str = Field(min_length=1)
    #: Device memory, GiB (None: the LLM step profile's device memory).
    memory_gib: float | None = Field(default=None, gt=0)
    #: Its residents at the start (READY).
    models: list[str] = Field(default_factory=list)
    active: bool = True
    #: Seconds from a ScaleUp to taking work.
    start_ms: float = Field(default=2000.0, ge=0)


class ArmEntry(Strict):
    placement: str | dict[str, Any] = "static"
    autoscaling: str | dict[str, Any] | None = None
    devices: list[DeviceEntry] = Field(min_length=1)
    host_memory_gib: float = Field(default=64.0, ge=0)
    placement_interval_ms: float = Field(default=1000.0, gt=0)
    #: The anti-thrash window (policy.placement.base; 0: off).
    min_switch_s: float = Field(default=0.0, ge=0)
    unload_ms: float = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _unique(self) -> ArmEntry:
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError("devices: names must be unique")
        return self


class LlmPlacementFile(Strict):
    kind: Literal["llm-placement"]
    name: str
    seed: int = 1
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    drain_s: float = Field(default=300.0, ge=0)
    profiles: str
    llm: LlmModel
    classic: list[ClassicStream] = Field(default_factory=list)
    arms: dict[str, ArmEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> LlmPlacementFile:
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        streams = [c.stream for c in self.classic]
        if len(set(streams)) != len(streams):
            raise ValueError("classic: stream names must be unique (give each a name)")
        known = {self.llm.model, *(c.model for c in self.classic)}
        for arm, a in self.arms.items():
            for i, d in enumerate(a.devices):
                for m in d.models:
                    if m not in known:
                        raise ValueError(f"arms.{arm}.devices.{i}.models: unknown model {m!r}")
        return self


class LlmPlacementScenario:
    """A validated scenario with its LLM workloads parsed and its profile set found."""

    def __init__(self, doc: LlmPlacementFile, source: str, base_dir: Path) -> None:
        self.doc = doc
        self.source = source
        self.base_dir = base_dir
        self.workloads: list[LlmWorkloadSpec] = []
        for i, raw in enumerate(doc.llm.workloads):
            where = f"{source}: llm.workloads.{i}"
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: expected a mapping")
            self.workloads.append(
                validate_document(LlmWorkloadSpec, {"model": doc.llm.model, **raw}, where)
            )

    def profile_dir(self) -> Path:
        return find_profile_set(self.doc.profiles, self.base_dir, self.source, "profiles")

    def with_arms(self, arms: dict[str, ArmEntry]) -> LlmPlacementScenario:
        """The same scenario with other arms (a static search builds its layouts)."""
        doc = self.doc.model_copy(update={"arms": arms})
        return LlmPlacementScenario(doc, self.source, self.base_dir)


def load_llm_placement_scenario(path: Path) -> LlmPlacementScenario:
    raw = read_yaml(path, f"scenario file not found: {path}")
    doc = validate_document(LlmPlacementFile, raw, str(path))
    return LlmPlacementScenario(doc, str(path), path.parent)
