"""A transformers causal LM run one engine step at a time: the real ``StepExecutor``.

Theory of operation. The engine (not this module) decides each step's sequences; ``step``
runs them in ONE forward pass of the model. All the step's tokens are packed into one row
(``input_ids`` of shape ``[1, T]``, T = decode tokens + prefill-chunk tokens) with each
token's own position in ``position_ids``, so every linear layer (the bulk of the work) runs
once over the whole step. Attention is the only part that must keep the sequences apart: it
goes through an attention function registered with transformers' ``AttentionInterface``
(every model that routes attention through that interface takes it: Llama, Mistral, Qwen2...;
rotary embeddings come from ``position_ids``, so they are right per token). The step's plan
reaches that function as a forward keyword argument, which the model passes down to it.

The KV cache is a slot cache: per layer, one tensor ``[slots, kv_heads, length, head_dim]``
for K and one for V; a sequence holds one slot from its first chunk until ``free``. In each
layer the attention function writes the step's new K/V into their slots and positions, then:

- the decodes (entries of one token) attend together: their queries ``[B, heads, 1, d]``
  regrouped as ``[B, kv_heads, heads/kv_heads, d]`` (grouped-query attention without copying
  K/V per query head) against their slots' K/V up to the longest context, the positions past
  each sequence's own context masked;
- each prefill chunk attends alone to its slot up to its end, causally (a chunk after the
  first sees the whole cached prefix: ``start`` tokens, then its own causal triangle).

Only the positions that sample reach the LM head (``logits_to_keep``). Sampling is greedy
(argmax) unless ``temperature`` > 0 (then softmax sampling from a seeded generator). Slots
and lengths grow by doubling as needed (a copy); ``free`` returns a slot. A preempted
sequence is recomputed by prefilling it again from position 0 (or any ``start`` up to what
its slot holds: the rest is overwritten). Entries are checked before anything changes; a step
whose forward pass fails (out of memory) leaves its sequences' caches undefined: free them.

Why this shape and not transformers' own continuous batching, or padded DynamicCaches:
design note 0019 (measured).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from evenserve.core.errors import ConfigError
from evenserve.core.llm import StepEntry, StepExecutor, Tokenizer
from evenserve.core.validation import Strict
from evenserve.runtime.base import require

#: The name the packed-step attention is registered under in transformers.
ATTENTION_NAME = "evenserve_step"
#: The forward keyword argument that carries the step's plan to the attention function.
PLAN_KWARG = "evenserve_step_plan"

#: A tiny Llama for the byte tokenizer (259 ids): tests, the CPU bench, emulated models.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 259,
    "max_position_embeddings": 2048,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
}

DTYPES = ("float32", "bfloat16", "float16")


class LlmTorchParams(Strict):
    """The ``llm_torch:`` section of model.yaml: a transformers causal LM on one device."""

    config: dict[str, Any] | str | None = Field(
        default=None,
        description="inline config (model_type defaults to llama) or a local config.json "
        "(or its folder), relative to the model folder: random weights",
    )
    weights: str | None = Field(
        default=None,
        description="local save_pretrained folder (config.json and weights), relative to "
        "the model folder; nothing is downloaded",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads")
    temperature: float = Field(default=0.0, ge=0, description="0: greedy (argmax)")
    max_seqs: int = Field(default=16, ge=1, description="KV slots to start with (it grows)")
    max_model_len: int | None = Field(
        default=None, ge=1, description="longest context (None: the config's positions)"
    )
    tokenizer: str | None = Field(
        default=None, description="'byte' (None) or a local tokenizer.json, relative"
    )
    eos_token: str | None = Field(default=None, description="the EOS token of a tokenizer.json")


@dataclass(slots=True)
class _Prefill:
    slot: int
    start: int
    length: int
    offset: int


@dataclass(slots=True)
class _Plan:
    """One step's layout in the packed row: decodes first (``decodes`` of them), then the
    prefill chunks; what the attention function needs, built once per step."""

    cache: _SlotCache
    decodes: int
    #: Decodes' slots and the position each writes (device tensors), their longest context.
    decode_slots: Any = None
    decode_pos: Any = None
    decode_first_slot: int | None = None
    decode_len: int = 0
    #: ``[B, 1, 1, decode_len]``: True where a decode may attend.
    decode_mask: Any = None
    prefills: list[_Prefill] = field(default_factory=list)


class _SlotCache:
    """Per layer one K and one V tensor ``[slots, kv_heads, length, head_dim]``."""

    def __init__(
        self, torch: Any, layers: int, kv_heads: int, head_dim: int, dtype: Any, device: Any
    ) -> None:
        self._torch = torch
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.k: list[Any] = []
        self.v: list[Any] = []
        self.slots = 0
        self.length = 0

    def ensure(self, slots: int, length: int) -> None:
        """At least ``slots`` slots of ``length`` positions (doubling; the content kept)."""
        if slots <= self.slots and length <= self.length:
            return
        new_slots = max(slots, self.slots * 2 if slots > self.slots else self.slots)
        new_len = max(length, self.length * 2 if length > self.length else self.length)
        shape = (new_slots, self.kv_heads, new_len, self.head_dim)
        torch = self._torch
        grown_k, grown_v = [], []
        for i in range(self.layers):
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if self.slots:
                k[: self.slots, :, : self.length] = self.k[i]
                v[: self.slots, :, : self.length] = self.v[i]
            grown_k.append(k)
            grown_v.append(v)
        self.k, self.v = grown_k, grown_v
        self.slots, self.length = new_slots, new_len

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def _step_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature: query ``[1, H, T, d]``, key and value
    ``[1, KVH, T, d]`` (this step's tokens only); returns ``[1, T, H, d]``."""
    plan: _Plan | None = kwargs.get(PLAN_KWARG)
    if plan is None:
        raise RuntimeError(
            f"attention {ATTENTION_NAME!r} runs only inside TorchStepExecutor.step (no plan)"
        )
    cache = plan.cache
    torch = cache._torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    layer = module.layer_idx
    kc, vc = cache.k[layer], cache.v[layer]
    heads, kv_heads, d = query.shape[1], key.shape[1], query.shape[3]
    parts = []
    b = plan.decodes
    if b:
        kc[plan.decode_slots, :, plan.decode_pos] = key[0, :, :b].transpose(0, 1)
        vc[plan.decode_slots, :, plan.decode_pos] = value[0, :, :b].transpose(0, 1)
        n = plan.decode_len
        if plan.decode_first_slot is not None:  # consecutive slots: a view, no gather
            s0 = plan.decode_first_slot
            kd, vd = kc[s0 : s0 + b, :, :n], vc[s0 : s0 + b, :, :n]
        else:
            kd, vd = kc[plan.decode_slots, :, :n], vc[plan.decode_slots, :, :n]
        # [1, H, B, d] -> [B, KVH, H/KVH, d]: a KV head's query heads as its query rows
        qd = query[0, :, :b].transpose(0, 1).reshape(b, kv_heads, heads // kv_heads, d)
        od = sdpa(qd, kd, vd, attn_mask=plan.decode_mask, scale=scaling)
        parts.append(od.reshape(b, heads, d))
    for p in plan.prefills:
        end = p.start + p.length
        kc[p.slot, :, p.start : end] = key[0, :, p.offset : p.offset + p.length]
        vc[p.slot, :, p.start : end] = value[0, :, p.offset : p.offset + p.length]
        qp = query[:, :, p.offset : p.offset + p.length]
        kp, vp = kc[p.slot : p.slot + 1, :, :end], vc[p.slot : p.slot + 1, :, :end]
        if p.start == 0:
            op = sdpa(qp, kp, vp, is_causal=True, scale=scaling, enable_gqa=heads != kv_heads)
        else:
            rows = torch.arange(p.start, end, device=query.device)[:, None]
            mask = torch.arange(end, device=query.device)[None, :] <= rows
            op = sdpa(qp, kp, vp, attn_mask=mask, scale=scaling, enable_gqa=heads != kv_heads)
        parts.append(op[0].transpose(0, 1))
    return torch.cat(parts, dim=0).unsqueeze(0), None


_REGISTERED = False


def _register_attention(transformers: Any) -> None:
    global _REGISTERED
    if not _REGISTERED:
        transformers.AttentionInterface.register(ATTENTION_NAME, _step_attention)
        _REGISTERED = True


class TorchStepExecutor:
    """A transformers causal LM on one device, run a step at a time (module docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        max_model_len: int | None = None,
        max_seqs: int = 16,
        temperature: float = 0.0,
        seed: int = 0,
        eos_token_id: int | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        self._torch = require("torch", "transformers")
        transformers = require("transformers", "transformers")
        _register_attention(transformers)
        cfg = model.config
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            raise ConfigError(
                "llm_torch: models with sliding-window attention are not supported "
                f"(config sliding_window={cfg.sliding_window})"
            )
        model.set_attn_implementation(ATTENTION_NAME)
        self.model = model.eval()
        self.config = cfg
        self.eos_token_id = eos_token_id
        self.vocab_size = int(cfg.vocab_size)
        self.max_model_len = int(max_model_len or cfg.max_position_embeddings)
        self.temperature = temperature
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        self._cache = _SlotCache(
            self._torch, int(cfg.num_hidden_layers), kv_heads, head_dim, self.dtype, self.device
        )
        self._cache.ensure(max_seqs, min(256, self.max_model_len))
        self._generator = self._torch.Generator(device=self.device).manual_seed(seed)
        #: Per-sequence generators of requests that brought a seed.
        self._seeded: dict[int, Any] = {}
        #: seq_id -> (slot, tokens its slot holds)
        self._seqs: dict[int, tuple[int, int]] = {}
        self._free_slots = list(range(self._cache.slots))
        self._provenance = dict(provenance or {})
        self._weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    # -- the StepExecutor protocol -------------------------------------------------------

    def step(self, entries: Sequence[StepEntry]) -> Mapping[int, int]:
        if not entries:
            return {}
        plan, input_ids, positions, keep, sample_ids = self._plan(entries)
        torch = self._torch
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=keep,
                **{PLAN_KWARG: plan},
            )
            if not sample_ids:
                return {}
            logits = out.logits[0].float()
            chosen = torch.argmax(logits, dim=-1)
            by_id = {e.seq_id: e for e in entries if e.sample}
            for row, sid in enumerate(sample_ids):
                e = by_id[sid]
                temp = self.temperature if e.temperature is None else e.temperature
                if temp > 0:
                    chosen[row] = self._draw(logits[row], temp, e.top_p, sid, e.seed)
        return dict(zip(sample_ids, chosen.tolist(), strict=True))

    def _draw(
        self, logits: Any, temperature: float, top_p: float, sid: int, seed: int | None
    ) -> Any:
        """One token drawn from ``softmax(logits / temperature)`` cut to its nucleus of mass
        ``top_p``; a sequence with a seed draws from a generator of its own (repeatable)."""
        torch = self._torch
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p  # the first always kept
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        gen = self._generator
        if seed is not None:
            gen = self._seeded.get(sid)
            if gen is None:
                gen = self._seeded[sid] = torch.Generator(device=self.device).manual_seed(
                    seed % (2**63)
                )
        return torch.multinomial(probs, 1, generator=gen)[0]

    def free(self, seq_id: int) -> None:
        self._seeded.pop(seq_id, None)
        held = self._seqs.pop(seq_id, None)
        if held is not None:
            self._free_slots.append(held[0])

    # -- what the worker reports -----------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: all layers, K and V."""
        c = self._cache
        element_bytes = int(self._torch.finfo(self.dtype).bits) // 8
        return 2 * c.layers * c.kv_heads * c.head_dim * element_bytes

    def resident_bytes(self) -> float:
        """Weights plus the KV slots allocated so far."""
        return float(self._weights_bytes + self._cache.bytes)

    def describe(self) -> dict[str, Any]:
        transformers = require("transformers", "transformers")
        return {
            "runtime": "torch-llm",
            "architecture": type(self.model).__name__,
            **self._provenance,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "attention": "packed step, slot KV cache",
            "sampling": f"temperature {self.temperature}" if self.temperature else "greedy",
            "torch_version": str(self._torch.__version__),
            "transformers_version": str(transformers.__version__),
            "torch_threads": int(self._torch.get_num_threads()),
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
            "weights_bytes": self._weights_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_slots": self._cache.slots,
            "max_model_len": self.max_model_len,
        }

    @property
    def active_seqs(self) -> int:
        return len(self._seqs)

    # -- one step's layout ------------------------------------------------------------------

    def _plan(self, entries: Sequence[StepEntry]) -> tuple[_Plan, Any, Any, Any, list[int]]:
        seen: set[int] = set()
        for e in entries:
            if e.seq_id in seen:
                raise ValueError(f"seq {e.seq_id}: twice in one step")
            seen.add(e.seq_id)
            self._check(e)
        ordered = sorted(entries, key=lambda e: len(e.tokens) != 1)  # decodes first, stable
        longest = max(e.start + len(e.tokens) for e in ordered)
        new = sum(1 for e in ordered if e.seq_id not in self._seqs)
        if new > len(self._free_slots) or longest > self._cache.length:
            grown = self._cache.slots + max(0, new - len(self._free_slots))
            before = self._cache.slots
            self._cache.ensure(grown, longest)
            self._free_slots.extend(range(before, self._cache.slots))
        self._free_slots.sort(reverse=True)  # pop() gives the lowest: slots stay together
        ids: list[int] = []
        pos: list[int] = []
        keep: list[int] = []
        sample_ids: list[int] = []
        plan = _Plan(cache=self._cache, decodes=0)
        d_slots: list[int] = []
        d_pos: list[int] = []
        for e in ordered:
            slot = self._seqs[e.seq_id][0] if e.seq_id in self._seqs else self._free_slots.pop()
            n = len(e.tokens)
            self._seqs[e.seq_id] = (slot, e.start + n)
            offset = len(ids)
            ids.extend(e.tokens)
            pos.extend(range(e.start, e.start + n))
            if e.sample:
                keep.append(offset + n - 1)
                sample_ids.append(e.seq_id)
            if n == 1:
                d_slots.append(slot)
                d_pos.append(e.start)
            else:
                plan.prefills.append(_Prefill(slot, e.start, n, offset))
        torch, dev = self._torch, self.device
        if d_slots:
            b = len(d_slots)
            plan.decodes = b
            plan.decode_len = max(d_pos) + 1
            plan.decode_slots = torch.tensor(d_slots, device=dev)
            plan.decode_pos = torch.tensor(d_pos, device=dev)
            if d_slots == list(range(d_slots[0], d_slots[0] + b)):
                plan.decode_first_slot = d_slots[0]
            lengths = plan.decode_pos + 1
            mask = torch.arange(plan.decode_len, device=dev)[None, :] < lengths[:, None]
            plan.decode_mask = mask[:, None, None, :]
        return (
            plan,
            torch.tensor([ids], device=dev),
            torch.tensor([pos], device=dev),
            torch.tensor(keep, dtype=torch.long, device=dev),
            sample_ids,
        )

    def _check(self, e: StepEntry) -> None:
        if not e.tokens:
            raise ValueError(f"seq {e.seq_id}: a step entry needs at least one token")
        held = self._seqs.get(e.seq_id)
        if held is None and e.start != 0:
            raise ValueError(
                f"seq {e.seq_id}: start {e.start} but the executor holds no cache for it "
                "(a new or freed sequence starts at 0)"
            )
        if held is not None and e.start > held[1]:
            raise ValueError(
                f"seq {e.seq_id}: start {e.start} is past the {held[1]} tokens its cache holds"
            )
        end = e.start + len(e.tokens)
        if end > self.max_model_len:
            raise ValueError(
                f"seq {e.seq_id}: {end} tokens exceed max_model_len {self.max_model_len}"
            )
        bad = next((t for t in e.tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"seq {e.seq_id}: token id {bad} is outside the vocabulary")


def _local(model_dir: Path, value: str, field_name: str) -> Path:
    path = model_dir / value  # an absolute path stays as it is
    if not path.exists():
        raise ConfigError(
            f"llm_torch.{field_name}: {value!r} is not a local file or folder ({path}); "
            "evenserve never downloads models: give a local path"
        )
    return path


def _config_dict(model_dir: Path, config: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    path = _local(model_dir, config, "config")
    if path.is_dir():
        path = path / "config.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"llm_torch.config: {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"llm_torch.config: {path}: not a JSON object")
    return doc


def build_model(model_dir: Path, params: LlmTorchParams) -> tuple[Any, dict[str, Any]]:
    """The causal LM ``params`` describe, on its device at its dtype, and its provenance."""
    torch = require("torch", "transformers")
    transformers = require("transformers", "transformers")
    dtype = getattr(torch, params.dtype)
    if params.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"llm_torch.device: {params.device}: torch sees no CUDA device")
    if params.threads:
        torch.set_num_threads(params.threads)
    weights = _local(model_dir, params.weights, "weights") if params.weights else None
    has_weights = weights is not None and any(
        any(weights.glob(pattern)) for pattern in ("*.safetensors", "*.bin")
    )
    if weights is not None and has_weights:
        if params.config is not None:
            raise ConfigError("llm_torch.config: give config or weights with weights, not both")
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(weights), local_files_only=True, dtype=dtype
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(f"llm_torch.weights: {weights}: {exc}") from None
        provenance = {"weights": f"pretrained: {params.weights}"}
    else:
        source = params.config if params.config is not None else params.weights
        if source is None:
            raise ConfigError("llm_torch.config: required (or weights: a local folder)")
        raw = _config_dict(model_dir, source)
        model_type = str(raw.pop("model_type", "llama"))
        for key in ("architectures", "transformers_version", "torch_dtype", "dtype"):
            raw.pop(key, None)
        try:
            config = transformers.AutoConfig.for_model(model_type, **raw)
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"llm_torch.config: {exc}") from None
        torch.manual_seed(params.seed)
        # a GPU model is built where it runs: initialising a billion parameters on the host
        # first takes longer than the measurement it is built for
        where = torch.device(params.device) if params.device != "cpu" else contextlib.nullcontext()
        try:
            with where:
                model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except (TypeError, ValueError, AssertionError, RuntimeError) as exc:
            raise ConfigError(f"llm_torch.config: cannot build a causal LM: {exc}") from None
        provenance = {"weights": f"random (seed {params.seed}), {model_type} config"}
    model = model.to(device=params.device, dtype=dtype)
    return model, provenance


def build_executor(
    model_dir: Path, params: LlmTorchParams, tokenizer: Tokenizer | None = None
) -> TorchStepExecutor:
    """The worker's factory: the model, checked against ``tokenizer`` (its ids must fit the
    model's vocabulary; its EOS becomes the executor's), ready to step."""
    model, provenance = build_model(model_dir, params)
    vocab = int(model.config.vocab_size)
    eos = None
    if tokenizer is not None:
        if tokenizer.vocab_size > vocab:
            raise ConfigError(
                f"llm_torch: the tokenizer has {tokenizer.vocab_size} ids, the model's "
                f"vocabulary {vocab}"
            )
        eos = tokenizer.eos_token_id
    executor = TorchStepExecutor(
        model,
        max_model_len=params.max_model_len,
        max_seqs=params.max_seqs,
        temperature=params.temperature,
        seed=params.seed,
        eos_token_id=eos,
        provenance=provenance,
    )
    if params.max_model_len and params.max_model_len > executor.config.max_position_embeddings:
        raise ConfigError(
            f"llm_torch.max_model_len: {params.max_model_len} is more than the model's "
            f"{executor.config.max_position_embeddings} positions"
        )
    return executor


def parameter_count(config: Mapping[str, Any]) -> int:
    """Parameters of a Llama-architecture config (embeddings untied from the LM head)."""
    h, i = int(config["hidden_size"]), int(config["intermediate_size"])
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kvh = int(config.get("num_key_value_heads", heads))
    d = int(config.get("head_dim", h // heads))
    attn = h * heads * d * 2 + h * kvh * d * 2
    per_layer = attn + 3 * h * i + 2 * h
    tied = bool(config.get("tie_word_embeddings", False))
    return layers * per_layer + vocab * h * (1 if tied else 2) + h


if TYPE_CHECKING:  # it implements core.llm.StepExecutor (checked statically, never run)

    def _executor(e: TorchStepExecutor) -> StepExecutor:
        return e


__all__ = [
    "ATTENTION_NAME",
    "DTYPES",
    "TINY_LLAMA",
    "LlmTorchParams",
    "TorchStepExecutor",
    "build_executor",
    "build_model",
    "parameter_count",
]
