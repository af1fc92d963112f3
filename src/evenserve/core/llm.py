"""LLM generation: the step profile of an engine on a device, and what runs one engine step.

An LLM engine's unit of work is a *step* (iteration-level scheduling): every running sequence
gets its next token, waiting prompts are prefilled (whole, or a chunk of a long one). What a
step costs on a device is the step profile: ``c0 + c_p x prefill tokens + c_d x decode
sequences + c_kv x KV tokens read``, plus CPU time per output token off the device's clock
(detokenizing, sampling bookkeeping), as the BLIS simulator fits vLLM (design note 0018). KV
memory is counted in blocks of ``block_tokens`` tokens.

A profile file (``profiles/<set>/<model>.yaml`` with ``kind: llm-step``) states its source, as
the classic latency profiles do; figures without a published or measured source say
``synthetic`` in their source.

``StepEntry`` and ``StepExecutor`` are what an engine hands a real model: the tokens each
sequence feeds this step (a prefill chunk, or the last sampled token of a decode) from the
position its cache holds, and whether to sample the next token (not for a prompt chunk that
is not its last). An executor keeps one KV cache per sequence until ``free``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import orjson
from pydantic import Field

from evenserve.core.errors import ProfileError
from evenserve.core.validation import Strict, read_yaml, validate_document

GIB = 1024.0**3

#: Tokens per KV block (vLLM's default block size; the prefix cache hashes whole blocks).
BLOCK_TOKENS = 16


class StepProfileFile(Strict):
    """The YAML schema of one LLM step profile."""

    kind: Literal["llm-step"]
    model: str
    device: str
    runtime: str
    precision: str
    source: str
    notes: str | None = None
    #: Fixed cost of one step, ms.
    c0_ms: float = Field(gt=0)
    #: Per prefill token in the step, microseconds.
    prefill_us_per_token: float = Field(ge=0)
    #: Per decode sequence in the step, microseconds.
    decode_us_per_seq: float = Field(ge=0)
    #: Per KV-cache token read by the step's decodes (attention over the context), us.
    kv_us_per_token: float = Field(default=0.0, ge=0)
    #: CPU per output token off the device's clock (it delays the token, not the device), ms.
    cpu_ms_per_output_token: float = Field(default=0.0, ge=0)
    #: Resident weights, GiB.
    weights_gib: float = Field(ge=0)
    #: KV-cache bytes per token (all layers, K and V).
    kv_bytes_per_token: int = Field(gt=0)
    #: The device's memory, GiB, and the fraction of it the engine may use (vLLM's
    #: ``gpu_memory_utilization``): KV blocks = (memory x utilization - weights) / block bytes.
    device_memory_gib: float = Field(gt=0)
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_tokens: int = Field(default=BLOCK_TOKENS, ge=1)
    #: The longest context (prompt + output) the model takes.
    max_model_len: int = Field(default=8192, ge=1)


@dataclass(frozen=True, slots=True)
class StepProfile:
    """A step profile (see the module docstring); times in seconds, memory in bytes."""

    model: str
    device: str
    runtime: str
    precision: str
    source: str
    c0_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    kv_s_per_token: float
    cpu_s_per_output_token: float
    weights_bytes: float
    kv_bytes_per_token: int
    device_memory_bytes: float
    memory_utilization: float = 0.9
    block_tokens: int = BLOCK_TOKENS
    max_model_len: int = 8192

    @classmethod
    def from_file_model(cls, f: StepProfileFile) -> StepProfile:
        return cls(
            model=f.model,
            device=f.device,
            runtime=f.runtime,
            precision=f.precision,
            source=f.source,
            c0_s=f.c0_ms / 1e3,
            prefill_s_per_token=f.prefill_us_per_token / 1e6,
            decode_s_per_seq=f.decode_us_per_seq / 1e6,
            kv_s_per_token=f.kv_us_per_token / 1e6,
            cpu_s_per_output_token=f.cpu_ms_per_output_token / 1e3,
            weights_bytes=f.weights_gib * GIB,
            kv_bytes_per_token=f.kv_bytes_per_token,
            device_memory_bytes=f.device_memory_gib * GIB,
            memory_utilization=f.memory_utilization,
            block_tokens=f.block_tokens,
            max_model_len=f.max_model_len,
        )

    def to_file_model(self) -> StepProfileFile:
        return StepProfileFile(
            kind="llm-step",
            model=self.model,
            device=self.device,
            runtime=self.runtime,
            precision=self.precision,
            source=self.source,
            c0_ms=self.c0_s * 1e3,
            prefill_us_per_token=self.prefill_s_per_token * 1e6,
            decode_us_per_seq=self.decode_s_per_seq * 1e6,
            kv_us_per_token=self.kv_s_per_token * 1e6,
            cpu_ms_per_output_token=self.cpu_s_per_output_token * 1e3,
            weights_gib=self.weights_bytes / GIB,
            kv_bytes_per_token=self.kv_bytes_per_token,
            device_memory_gib=self.device_memory_bytes / GIB,
            memory_utilization=self.memory_utilization,
            block_tokens=self.block_tokens,
            max_model_len=self.max_model_len,
        )

    def step_s(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int) -> float:
        """Seconds one step takes on the device."""
        return (
            self.c0_s
            + self.prefill_s_per_token * prefill_tokens
            + self.decode_s_per_seq * decode_seqs
            + self.kv_s_per_token * kv_tokens
        )

    @property
    def block_bytes(self) -> float:
        return float(self.block_tokens * self.kv_bytes_per_token)

    def kv_blocks(self, other_bytes: float = 0.0) -> int:
        """KV blocks that fit in ``device memory x utilization - weights - other_bytes``
        (``other_bytes``: what co-located models hold: their weights and batch memory)."""
        free = self.device_memory_bytes * self.memory_utilization - self.weights_bytes
        free -= other_bytes
        return max(0, math.floor(free / self.block_bytes))


def is_step_profile(raw: object) -> bool:
    """Whether a parsed profile document is an LLM step profile (``kind: llm-step``)."""
    return isinstance(raw, Mapping) and raw.get("kind") == "llm-step"


def load_step_profile(path: Path) -> StepProfile:
    """Read one step profile YAML; ProfileError naming the file and the field on a problem."""
    raw = read_yaml(path, f"step profile file not found: {path}", ProfileError)
    return StepProfile.from_file_model(
        validate_document(StepProfileFile, raw, str(path), ProfileError)
    )


def load_step_profiles(directory: Path) -> dict[str, StepProfile]:
    """The step profiles of one profile set (its ``kind: llm-step`` files), by model."""
    if not directory.is_dir():
        raise ProfileError(f"profile set not found: {directory}")
    out: dict[str, StepProfile] = {}
    for path in sorted(directory.glob("*.yaml")):
        raw = read_yaml(path, f"profile file not found: {path}", ProfileError)
        if is_step_profile(raw):
            prof = StepProfile.from_file_model(
                validate_document(StepProfileFile, raw, str(path), ProfileError)
            )
            out[prof.model] = prof
    return out


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One sequence's part in a step, as a real model runs it."""

    seq_id: int
    #: Token ids fed this step: a prompt chunk, or the last sampled token (a decode).
    tokens: Sequence[int]
    #: Position of ``tokens[0]``: how many tokens of this sequence its cache already holds.
    start: int
    #: Sample the next token after this step (False for a prompt chunk before the last).
    sample: bool
    #: How (None: the executor's own default): softmax temperature (0: greedy), nucleus
    #: ``top_p``, and a seed that makes the sequence's draws repeatable.
    temperature: float | None = None
    top_p: float = 1.0
    seed: int | None = None


class StepExecutor(Protocol):
    """A real LLM on a device: runs engine steps, one KV cache per sequence."""

    #: The token that ends a generation (None: the model has none; it runs to max_tokens).
    eos_token_id: int | None

    def step(self, entries: Sequence[StepEntry]) -> Mapping[int, int]:
        """Run one step; for each entry with ``sample``, the next token id, by ``seq_id``."""
        ...

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``'s cache (it finished, was cancelled or preempted)."""
        ...


class Tokenizer(Protocol):
    """Text to token ids and back (a local tokenizer file, or the built-in byte-level one)."""

    #: The end-of-sequence token (None: none).
    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(slots=True)
class GenerationRecord:
    """One LLM request as a client or the simulator saw it: the figures TTFT, TPOT, ITL,
    end-to-end and goodput are computed from (times in seconds on one clock)."""

    request_id: int
    model: str
    #: When it was due to be sent (open loop: its scheduled time; TTFT counts from here).
    scheduled_s: float
    prompt_tokens: int
    #: ``completed``, a refusal or failure reason (``queue-full``, ``failed``...).
    outcome: str = "completed"
    #: Arrival time of each output token (a chunk of k tokens adds k equal times).
    token_times_s: list[float] | None = None
    finished_s: float | None = None
    #: Targets the request was judged against (None: none).
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    #: The request's class (higher is served first, as elsewhere: online 10, offline 0).
    priority: int = 10

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s) if self.token_times_s else 0

    @property
    def ttft_s(self) -> float | None:
        t = self.token_times_s
        return t[0] - self.scheduled_s if t else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two)."""
        t = self.token_times_s
        if not t or len(t) < 2:
            return None
        return (t[-1] - t[0]) / (len(t) - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.scheduled_s

    def met_targets(self) -> bool:
        """Completed within both targets (a missing target is met; one token: TPOT met)."""
        if self.outcome != "completed" or not self.token_times_s:
            return False
        ttft, tpot = self.ttft_s, self.tpot_s
        if self.ttft_target_s is not None and ttft is not None and ttft > self.ttft_target_s:
            return False
        return not (
            self.tpot_target_s is not None and tpot is not None and tpot > self.tpot_target_s
        )


#: The outcome of a request the run ended before it was answered: the simulator's drain
#: reached its end (``drain_s``), or the live run's horizon (its duration plus drain) came
#: first. Not completed: its TTFT and TPOT are in no figure, and it met no target.
UNFINISHED = "unfinished"


def mark_unfinished(records: Iterable[GenerationRecord]) -> None:
    """The records still open when a run ends (``completed``, the default, with no finish
    time) become ``unfinished``."""
    for rec in records:
        if rec.outcome == "completed" and rec.finished_s is None:
            rec.outcome = UNFINISHED


def openai_error_body(
    message: str, type_: str, param: str | None = None, code: str | int | None = None
) -> bytes:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``: what the
    worker's OpenAI front and the gateway's answer with."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}})  # fmt: skip
