"""The LLM models a worker hosts: each one's tokenizer, chat template, step profile, engine
settings and step runner, built from its ``kind: llm`` folder and the device.

The step profile: the folder's ``step_profile`` file, else (an emulated device) the profile of
the model's name in the device's profile set (``--device emulated:SET``); a real model without
one gets a nominal profile (``UNPROFILED``: its steps take what they take; the profile only
orders its steps against classic batches and estimates waits). Its KV blocks: ``engine.
num_blocks``, else what the profile's device memory holds after the weights and the classic
models (the device scheduler's ``add_engine``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.llm import StepProfile, Tokenizer, load_step_profile, load_step_profiles
from evenserve.policy.placement.engine import engine_blocks, engine_info
from evenserve.sched.engine import EngineSetup
from evenserve.worker.llm.config import LlmEntry
from evenserve.worker.llm.steps import EmulatedSteps, StepRunner, TorchSteps
from evenserve.worker.openai import ChatTemplate

#: A real model's nominal step profile when its folder gives none.
UNPROFILED = StepProfile(
    model="unprofiled", device="unknown", runtime="llm_torch", precision="unknown",
    source="nominal: the model's folder gives no step profile", c0_s=0.001,
    prefill_s_per_token=1e-5, decode_s_per_seq=1e-5, kv_s_per_token=0.0,
    cpu_s_per_output_token=0.0, weights_bytes=0.0, kv_bytes_per_token=1024,
    device_memory_bytes=2 * 1024**3, memory_utilization=0.9,
)  # fmt: skip


@dataclass
class LlmModel:
    """One LLM served here."""

    entry: LlmEntry
    tokenizer: Tokenizer
    template: ChatTemplate
    profile: StepProfile
    setup: EngineSetup
    runner: StepRunner
    max_model_len: int
    kv_blocks: int = 0
    #: The KV blocks its engine is hosted with (None: what the device's memory holds):
    #: ``engine.num_blocks``, or under placement ``placement.kv_tokens`` in whole blocks.
    num_blocks: int | None = None

    @property
    def name(self) -> str:
        return self.entry.name

    def describe(self) -> dict[str, Any]:
        c = self.entry.config
        p = self.profile
        return {
            "kind": "llm",
            "runtime": c.runtime,
            "engine": self.setup.mode,
            "max_num_seqs": self.setup.max_num_seqs,
            "max_num_batched_tokens": self.setup.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "kv_blocks": self.kv_blocks,
            "block_tokens": p.block_tokens,
            "step_profile": {
                "device": p.device,
                "source": p.source,
                "c0_ms": p.c0_s * 1e3,
                "prefill_us_per_token": p.prefill_s_per_token * 1e6,
                "decode_us_per_seq": p.decode_s_per_seq * 1e6,
                "kv_us_per_token": p.kv_s_per_token * 1e6,
            },
            **self.runner.describe(),
        }


def _step_profile(entry: LlmEntry, profiles_dir: Path | None) -> StepProfile | None:
    c = entry.config
    if c.step_profile is not None:
        return load_step_profile(entry.relative(c.step_profile, "step_profile"))
    if profiles_dir is not None and profiles_dir.is_dir():
        found = load_step_profiles(profiles_dir).get(entry.name)
        if found is not None:
            return found
    return None


def profile_set_dir(profile_set: str | None, profiles_dir: Path | None) -> Path | None:
    """An ``emulated:SET`` device's profile set folder, found as the emulated runtime finds
    it: SET as a folder, else under ``--profiles-dir``, else bundled (None: not found)."""
    if not profile_set:
        return None
    from evenserve.core.profile import bundled_profile_set

    for d in (Path(profile_set), None if profiles_dir is None else profiles_dir / profile_set):
        if d is not None and d.is_dir():
            return d
    return bundled_profile_set(profile_set)


def build_llm(entry: LlmEntry, profiles_dir: Path | None, emulated: bool) -> LlmModel:
    """``entry``'s model built (a real one's weights made or read: blocking). ConfigError
    naming the file and the field."""
    c = entry.config
    where = entry.source
    if c.runtime == "emulated" and not emulated:
        raise ConfigError(f"{where}: runtime: emulated needs an emulated device (--device)")
    profile = _step_profile(entry, profiles_dir)
    from evenserve.runtime.llm.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(entry.directory, c.tokenizer, c.eos_token)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    template = ChatTemplate(
        None
        if c.chat_template is None
        else entry.relative(c.chat_template, "chat_template").read_text()
    )
    runner: StepRunner
    if c.runtime == "emulated":
        if profile is None:
            raise ConfigError(
                f"{where}: step_profile: an emulated LLM needs a step profile (a file, or "
                f"a kind: llm-step profile named {entry.name!r} in the device's profile set)"
            )
        runner = EmulatedSteps()
        max_len = c.max_model_len or profile.max_model_len
        eos = None
    else:
        from evenserve.core.validation import validate_document
        from evenserve.runtime.llm.torch_executor import LlmTorchParams, build_executor

        params = validate_document(LlmTorchParams, c.llm_torch or {}, f"{where}: llm_torch")
        try:
            ex = build_executor(entry.directory, params, tok)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        runner = TorchSteps(ex, ex.describe())
        positions = int(ex.config.max_position_embeddings)
        max_len = c.max_model_len or params.max_model_len or positions
        eos = ex.eos_token_id
        if profile is None:
            profile = UNPROFILED
    profile = _with_len(profile, max_len)
    e = c.engine
    budget = e.max_num_batched_tokens
    if budget is None:
        budget = 512 if e.mode == "continuous-chunked" else max_len
    try:
        setup = EngineSetup(
            profile,
            mode=e.mode,
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=budget,
            chunk_tokens=e.chunk_tokens,
            prefix_caching=e.prefix_caching,
            max_waiting=e.max_waiting,
            eos_token_id=eos,
            ttft_s=None if c.ttft_ms is None else c.ttft_ms / 1e3,
            tpot_s=None if c.tpot_ms is None else c.tpot_ms / 1e3,
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: engine: {exc}") from exc
    num_blocks = e.num_blocks
    if c.placement is not None:
        try:
            info = engine_info(entry.name, profile, c.placement, e.max_num_seqs)
        except ValueError as exc:
            raise ConfigError(f"{where}: placement.{exc}") from exc
        num_blocks = engine_blocks(info, profile)
    return LlmModel(entry, tok, template, profile, setup, runner, max_len, 0, num_blocks)


def _with_len(profile: StepProfile, max_len: int) -> StepProfile:
    from dataclasses import replace

    return profile if profile.max_model_len == max_len else replace(profile, max_model_len=max_len)


def llm_readings(driver: Any) -> dict[str, dict[str, float]]:
    """Each engine's figures now (the metrics' scrape, the load report), under the lock."""
    out: dict[str, dict[str, float]] = {}
    with driver.lock:
        for name, host in driver.sched.engines.items():
            e = host.engine
            c, kv = e.counters, e.kv
            out[name] = {
                "running": float(e.num_running),
                "waiting": float(e.num_waiting),
                "kv_usage": kv.usage(),
                "queued_prompt_tokens": float(e.queued_prompt_tokens),
                "block_size": float(kv.block_tokens),
                "num_blocks": float(kv.num_blocks),
                "prefix_caching": float(e.setup.prefix_caching),
                "preemptions": float(c.preemptions),
                "prompt_tokens": float(c.prompt_tokens),
                "generation_tokens": float(c.generation_tokens),
                "prefix_queries": float(kv.query_tokens),
                "prefix_hits": float(kv.hit_tokens),
            }
    return out
