"""An LLM pool scenario (``kind: llm-pool``): several devices, each hosting an engine of one
LLM next to classic models, and a router in front of the engines.

    kind: llm-pool
    name: llm-pool
    seed: 1
    duration_s: 300          # arrivals stop here; what arrived is answered (drain_s more)
    warmup_s: 30             # figures count requests scheduled in [warmup_s, duration_s)
    signals: {scrape_s: 1.0, stale_s: 0.0}   # each engine sampled every scrape_s; a sample
                                             # reaches the router stale_s after it was read
    llm:
      model: llama-3.1-8b
      engine: {mode: continuous-chunked, max_num_batched_tokens: 512}
      workloads:             # each: a name, then workload.llm.LlmWorkloadSpec (model filled in)
        - {name: chat, rate_rps: 6, prompt_tokens: {...}, output_tokens: {...}, ...}
    devices:                 # each: a name, a profile set (the LLM's step profile and the
                             # classic models'), engine overrides, which classic models it hosts
      - {name: h100-0, profiles: h100-llm, classic: [resnet50, bert-base]}
    classic:                 # rate_rps is the model's total, split evenly over its devices
      - {model: resnet50, rate_rps: 400, slo_ms: 25, max_batch_size: 32}
    arms:                    # each: the routing policy (llm_routing registry), and overrides
      round-robin: {routing: round-robin}
      ours-stale: {routing: predicted-ttft, signals: {stale_s: 5}, rate_scale: 1.0}

Every error names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.policy.llm_routing import LLM_ROUTING
from evenserve.sim.llm_scenario import ClassicSection, EngineSpec, LlmSection, find_profile_set
from evenserve.workload.llm import LlmWorkloadSpec


class SignalsSection(Strict):
    #: Each engine's signals are read every ``scrape_s`` ...
    scrape_s: float = Field(default=1.0, gt=0)
    #: ... and reach the router ``stale_s`` after they were read.
    stale_s: float = Field(default=0.0, ge=0)


class SignalsOverride(Strict):
    scrape_s: float | None = Field(default=None, gt=0)
    stale_s: float | None = Field(default=None, ge=0)


class PoolDevice(Strict):
    name: str = Field(min_length=1)
    #: A profile set: bundled (``h100-llm``) or a folder relative to the scenario file.
    profiles: str = Field(min_length=1)
    engine: EngineSpec | None = None
    #: The classic models it hosts (each in the scenario's ``classic``).
    classic: list[str] = Field(default_factory=list)


class PoolArm(Strict):
    routing: Any = "predicted-ttft"
    signals: SignalsOverride | None = None
    #: Every LLM workload's rate (open loop) multiplied by this.
    rate_scale: float = Field(default=1.0, gt=0)


class LlmPoolFile(Strict):
    kind: str = Field(pattern="^llm-pool$")
    name: str
    seed: int = 1
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    drain_s: float = Field(default=600.0, ge=0)
    signals: SignalsSection = Field(default_factory=SignalsSection)
    llm: LlmSection
    devices: list[PoolDevice] = Field(min_length=1)
    classic: list[ClassicSection] = Field(default_factory=list)
    arms: dict[str, PoolArm] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> LlmPoolFile:
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError("devices: two devices share a name")
        known = {c.model for c in self.classic}
        for i, d in enumerate(self.devices):
            for m in d.classic:
                if m not in known:
                    raise ValueError(f"devices.{i}.classic: {m!r} is not in classic")
        hosted = {m for d in self.devices for m in d.classic}
        for i, c in enumerate(self.classic):
            if c.model not in hosted:
                raise ValueError(f"classic.{i}: no device hosts {c.model!r}")
        for name, a in self.arms.items():
            LLM_ROUTING.parse(a.routing, where=f"arms.{name}.routing")
        return self


class LlmPoolScenario:
    """A validated pool scenario with its named workloads parsed."""

    def __init__(self, doc: LlmPoolFile, source: str, base_dir: Path) -> None:
        self.doc = doc
        self.source = source
        self.base_dir = base_dir
        self.workloads: list[tuple[str, LlmWorkloadSpec]] = []
        for i, raw in enumerate(doc.llm.workloads):
            where = f"{source}: llm.workloads.{i}"
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: expected a mapping")
            body = dict(raw)
            name = body.pop("name", f"workload-{i}")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{where}.name: expected a non-empty string")
            spec = validate_document(LlmWorkloadSpec, {"model": doc.llm.model, **body}, where)
            self.workloads.append((name, spec))
        names = [n for n, _ in self.workloads]
        if len(set(names)) != len(names):
            raise ConfigError(f"{source}: llm.workloads: two workloads share a name")

    def profile_dir(self, name: str) -> Path:
        return find_profile_set(name, self.base_dir, self.source, "devices")


def is_llm_pool_scenario(path: Path) -> bool:
    """Whether ``path`` holds an LLM pool scenario (``kind: llm-pool``)."""
    try:
        raw = read_yaml(path, f"scenario file not found: {path}")
    except ConfigError:
        return False
    return isinstance(raw, dict) and raw.get("kind") == "llm-pool"


def load_llm_pool_scenario(path: Path) -> LlmPoolScenario:
    raw = read_yaml(path, f"scenario file not found: {path}")
    doc = validate_document(LlmPoolFile, raw, str(path))
    return LlmPoolScenario(doc, str(path), path.parent)
