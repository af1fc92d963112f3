"""An LLM model folder's ``model.yaml`` (``kind: llm``), typed and validated.

    kind: llm
    runtime: emulated          # emulated (a step profile's times) | llm_torch (a real model)
    step_profile: null         # a step profile YAML (relative); emulated default: the device's
                               # profile set's profile of this model's name
    tokenizer: byte            # built-in byte-level, or a local tokenizer.json (relative)
    eos_token: null            # a tokenizer.json's EOS token (default: its usual one)
    chat_template: null        # a Jinja chat template file (relative); default: built-in
    max_model_len: null        # default: the step profile's (emulated) or the model's positions
    priority: online           # the class of its requests that bring none
    ttft_ms: 1000              # targets: time to first token, time per output token after it
    tpot_ms: 50
    engine: {mode: continuous-chunked, max_num_seqs: 64, max_num_batched_tokens: 512,
             chunk_tokens: null, prefix_caching: true, max_waiting: 1024, num_blocks: null}
    placement:                 # optional: the engine under the gateway's placement (design
      kv_tokens: 131072        # 0022): the KV cache it holds awake (its KV blocks; not with
      cold_load_ms: 20000      # engine.num_blocks), its load from disk and its wake from
      warm_load_ms: 1500       # host memory (vLLM sleep mode level 1; emulated: slept), and
      capacity: {prompt_tokens: 1000, output_tokens: 200}   # the mean request placement
                               # sizes its capacity by (policy.placement.engine)
    llm_torch: {...}           # runtime llm_torch's section (runtime.llm.LlmTorchParams)

Every error names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.policy.placement.engine import EnginePlacement

MODEL_FILE = "model.yaml"


class LlmEngineConfig(Strict):
    mode: Literal["request-level", "continuous", "continuous-chunked"] = "continuous-chunked"
    max_num_seqs: int = Field(default=64, ge=1)
    #: The step's token budget (default: 512 chunked, else the model's context length).
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    chunk_tokens: int | None = Field(default=None, ge=1)
    prefix_caching: bool = True
    max_waiting: int | None = Field(default=1024, ge=1)
    #: KV blocks (default: what the device memory holds after weights and classic models).
    num_blocks: int | None = Field(default=None, ge=1)


class LlmModelFile(Strict):
    kind: Literal["llm"]
    name: str = Field(min_length=1)
    version: str = "1"
    description: str | None = None
    runtime: Literal["emulated", "llm_torch"]
    step_profile: str | None = None
    tokenizer: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    priority: int | Literal["online", "offline"] = "online"
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    engine: LlmEngineConfig = Field(default_factory=LlmEngineConfig)
    llm_torch: dict[str, Any] | None = None
    #: The engine as placement reads it (None: not placed; it cannot be put to sleep).
    placement: EnginePlacement | None = None

    @field_validator("name", "version")
    @classmethod
    def _routable(cls, v: str) -> str:
        if not wire.is_safe_name(v):
            raise ValueError(f"{v!r}: use {wire.NAME_CHARS}, at most {wire.MAX_NAME_LENGTH}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> LlmModelFile:
        if self.llm_torch is not None and self.runtime != "llm_torch":
            raise ValueError(f"llm_torch: section given but runtime is {self.runtime!r}")
        if self.placement is not None and self.engine.num_blocks is not None:
            raise ValueError(
                "engine.num_blocks: an engine under placement holds placement.kv_tokens "
                "(give one of them)"
            )
        return self

    @property
    def priority_value(self) -> int:
        p = self.priority
        return wire.PRIORITY_CLASSES[p] if isinstance(p, str) else p


class LlmEntry:
    """One validated LLM model folder."""

    def __init__(self, config: LlmModelFile, directory: Path, source: Path) -> None:
        self.config = config
        self.directory = directory
        self.source = source

    @property
    def name(self) -> str:
        return self.config.name

    def relative(self, value: str, field_name: str) -> Path:
        p = (self.directory / value).resolve()
        if not p.is_file():
            raise ConfigError(f"{self.source}: {field_name}: no such file {value!r}")
        return p


def is_llm_folder(directory: Path) -> bool:
    """Whether ``directory/model.yaml`` declares an LLM (``kind: llm``)."""
    path = directory / MODEL_FILE
    if not path.is_file():
        return False
    try:
        raw = read_yaml(path, "")
    except ConfigError:
        return False
    return isinstance(raw, dict) and raw.get("kind") == "llm"


def load_llm_model(directory: Path) -> LlmEntry:
    source = directory / MODEL_FILE
    raw = read_yaml(source, f"{directory}: no {MODEL_FILE} in this model folder")
    if isinstance(raw, dict):
        raw.setdefault("name", directory.name)
    cfg = validate_document(LlmModelFile, raw, str(source))
    if cfg.name != directory.name:
        raise ConfigError(f"{source}: name: {cfg.name!r} differs from its folder")
    return LlmEntry(cfg, directory, source)
