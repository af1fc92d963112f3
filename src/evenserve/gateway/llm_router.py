"""The gateway's LLM router: ``policy.llm_routing.LlmRouter`` fed with live signals, and
what one OpenAI request of an LLM model is to it (design note 0021).

Engines. An LLM engine is one model on one backend (``backend/model``):
- an evenserve worker's load report lists its engines (``llm_by_model``: ``core.load.
  LlmLoad``); each report adds the engines it names (their step profile when the report
  carries a whole one, KV blocks, limits), drops those it no longer names and is fed to the
  router as an ``EngineSample`` read when the gateway received it (``observe_report``);
- an OpenAI-compatible server (``kind: openai``) has one engine per model its
  ``GET /v1/models`` lists (``set_openai_models``), without a step profile (the router learns
  its speed from its answers), and its ``/metrics`` samples (``gateway.prometheus_signals.
  llm_samples_from_text``) are fed as they are read (``observe``).
Staleness: every sample keeps the time it was read (``EngineView.age_s``; the gauge
``evenserve_gateway_llm_engine_signal_age_seconds``); once it is older than
``gateway.llm.stale_after_ms`` (``expire``, on the poller's signal tick) its corrections are
dropped and the engine is routed on the router's own accounting alone. An experiment can hold
every sample back ``gateway.llm.signal_delay_ms`` before the router sees it, with the time it
was read (``feed``): a lagging metrics pipeline, as the simulator's ``signals.stale_s``.

A request. The gateway has the request's text, not its tokens (``request_info``): the
prompt (a completion's ``prompt``; a chat's messages' content, joined) is cut into blocks
of ``prefix_block_tokens x chars_per_token`` characters, each named by a hash chained over
the blocks before it (block i names the prompt up to its end), and its tokens estimated as
its characters / ``chars_per_token`` (a prompt of token ids: the ids themselves, blocks of
``prefix_block_tokens`` ids). Its output is its ``max_tokens`` (``max_completion_tokens``;
absent: 16 for a completion, ``gateway.llm.default_max_tokens`` for a chat); its targets
the ``x-evenserve-ttft-ms`` / ``x-evenserve-tpot-ms`` headers, else ``gateway.llm``'s.

Accounting (``LlmTry``): ``LlmRouter.sent`` when a try is sent, ``first_token`` when the
first SSE event carrying text comes back (or the whole answer of a request not streamed),
``done`` once when the try ends, whatever way (answered, failed, refused by the backend and
retried elsewhere, the client gone), with the output tokens its usage gives (else the text
events counted). The prompt tokens the engine's prefix cache gave (``usage.
prompt_tokens_details.cached_tokens``, as vLLM and evenserve's workers report them) go to
``first_token`` when the event with the first text carries them (vLLM's
``continuous_usage_stats``; a whole answer), else to ``done`` (a stream's final usage chunk):
the router corrects its prefix index's size for the engine from them either way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from evenserve.cluster.gateway_section import GatewaySection
from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.llm import StepProfile, StepProfileFile
from evenserve.core.load import LlmLoad
from evenserve.metrics import names
from evenserve.policy.llm_routing import (
    EngineSample,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
    LlmRouter,
)

#: OpenAI's default ``max_tokens`` of a completion.
COMPLETION_DEFAULT_MAX_TOKENS = 16
#: A chained block name's seed (any constant: names are compared within one gateway).
_SEED = 0x5EED


def _chain(prev: int, block: object) -> int:
    return hash((prev, block))


def text_block_hashes(text: str, block_chars: int) -> list[int]:
    """The names of ``text``'s whole blocks of ``block_chars`` characters, chained: block i's
    name depends on every character up to its end (a partial last block is not named)."""
    out: list[int] = []
    h = _SEED
    for i in range(0, len(text) - block_chars + 1, block_chars):
        h = _chain(h, text[i : i + block_chars])
        out.append(h)
    return out


def id_block_hashes(ids: list[int], block_tokens: int) -> list[int]:
    """``text_block_hashes`` for a prompt of token ids (blocks of ``block_tokens`` ids)."""
    out: list[int] = []
    h = _SEED
    for i in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = _chain(h, tuple(ids[i : i + block_tokens]))
        out.append(h)
    return out


def chat_text(messages: Any) -> str:
    """A chat's messages' content joined (a part list's text parts), in order."""
    parts: list[str] = []
    if not isinstance(messages, list):
        return ""
    for m in messages:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(
                p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts)


def _positive_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _header_ms(headers: Mapping[str, str], name: str) -> float | None:
    try:
        ms = wire.parse_deadline_ms(headers.get(name), name)
    except ValueError:
        return None  # not a number: the request goes on without that target
    return None if ms is None else ms / 1000.0


def profile_of_report(step: Mapping[str, float | str]) -> StepProfile | None:
    """The step profile a load report carries, when it carries a whole one (else None:
    the router learns the engine's speed from its answers)."""
    try:
        f = StepProfileFile.model_validate({"kind": "llm-step", **step})
    except ValueError:
        return None
    return StepProfile.from_file_model(f)


def sample_of_report(load: LlmLoad, taken_s: float) -> EngineSample:
    """An evenserve engine's figures as the router's sample, read at ``taken_s``."""
    return EngineSample(
        taken_s=taken_s,
        running=load.running,
        waiting=load.waiting,
        kv_usage=load.kv_usage,
        queued_prompt_tokens=load.queued_prompt_tokens,
        preemptions=load.preemptions,
        kv_blocks=load.kv_blocks or None,
        block_tokens=load.block_tokens,
    )


class LlmGateway:
    """The LLM router of one gateway, its engines and counters (module docstring)."""

    def __init__(self, cfg: GatewaySection, clock: Clock, healthy: Callable[[str], bool]) -> None:
        llm = cfg.llm
        self.cfg = llm
        self.clock = clock
        self.healthy = healthy
        self.router = LlmRouter.build(
            cfg.llm_routing, seed=cfg.seed, prefix_max_blocks=llm.prefix_max_blocks
        )
        self.block_chars = max(1, round(llm.prefix_block_tokens * llm.chars_per_token))
        self.stale_after_s = llm.stale_after_ms / 1000.0
        self.delay_s = llm.signal_delay_ms / 1000.0
        #: Each backend's engines, by model.
        self.by_backend: dict[str, dict[str, EngineView]] = {}
        #: Each engine's backend (by the view's index).
        self.backend_of: dict[int, str] = {}
        #: Refusals answered, by (model, reason).
        self.refusals: dict[tuple[str, str], int] = {}

    # -- engines ----------------------------------------------------------------------------
    def handles(self, model: str) -> bool:
        """Whether ``model`` is an LLM some backend serves (its OpenAI requests are routed
        here)."""
        return bool(self.router.candidates(model))

    def _add(
        self,
        backend: str,
        model: str,
        profile: StepProfile | None,
        kv_blocks: int,
        block_tokens: int,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
    ) -> EngineView:
        v = self.router.add_engine(
            f"{backend}/{model}",
            [model],
            profile,
            kv_blocks,
            block_tokens,
            max_num_seqs,
            max_num_batched_tokens,
        )
        self.by_backend.setdefault(backend, {})[model] = v
        self.backend_of[v.index] = backend
        return v

    def _keep_only(self, backend: str, models: Iterable[str]) -> None:
        mine = self.by_backend.get(backend, {})
        for m in set(mine) - set(models):
            v = mine.pop(m)
            self.router.remove_engine(v.name)
            self.backend_of.pop(v.index, None)

    def observe_report(self, backend: str, llms: Mapping[str, LlmLoad], now: float) -> None:
        """An evenserve worker's load report (its engines), received at ``now``."""
        self._keep_only(backend, llms)
        mine = self.by_backend.get(backend, {})
        for model, load in llms.items():
            v = mine.get(model)
            profile = profile_of_report(load.step_profile) if load.step_profile else None
            if v is None:
                # Its KV cache in the router's blocks: those the gateway names prompts by.
                block = self.cfg.prefix_block_tokens
                v = self._add(
                    backend,
                    model,
                    profile,
                    load.kv_blocks * load.block_tokens // block,
                    block,
                    load.max_num_seqs,
                    load.max_num_batched_tokens,
                )
            else:
                if profile is not None:
                    v.profile = profile
                v.max_num_seqs = load.max_num_seqs
                v.max_num_batched_tokens = load.max_num_batched_tokens
            self.feed(v.name, sample_of_report(load, now), now)

    def forget_backend(self, backend: str) -> None:
        """``backend`` reports no engines any more."""
        self._keep_only(backend, ())

    def set_openai_models(
        self, backend: str, models: Iterable[str], kv_tokens: int | None = None
    ) -> None:
        """An OpenAI server lists ``models``: one engine each (no step profile), with
        ``kv_tokens`` of KV cache when the cluster file gives it (else none known until its
        /metrics say: ``LlmRouter.observe``)."""
        models = list(models)
        self._keep_only(backend, models)
        mine = self.by_backend.get(backend, {})
        block = self.cfg.prefix_block_tokens
        blocks = 0 if kv_tokens is None else kv_tokens // block
        for m in models:
            if m not in mine:
                self._add(backend, m, None, blocks, block)

    def observe(self, backend: str, model: str | None, sample: EngineSample, now: float) -> None:
        """A sample of ``backend``'s engine of ``model`` (None: every engine it has)."""
        mine = self.by_backend.get(backend, {})
        views = list(mine.values()) if model is None else [mine[model]] if model in mine else []
        for v in views:
            self.feed(v.name, sample, now)

    def feed(self, engine: str, sample: EngineSample, now: float) -> None:
        """Hand ``sample`` of ``engine`` to the router: now, or ``signal_delay_ms`` after it
        was read (an experiment's lagging pipeline; the router gets it with its read time)."""
        if self.delay_s <= 0:
            self.router.observe(engine, sample, now)
            return
        wait = max(0.0, sample.taken_s + self.delay_s - now)
        asyncio.get_running_loop().call_later(wait, self._late, engine, sample)

    def _late(self, engine: str, sample: EngineSample) -> None:
        self.router.observe(engine, sample, self.clock.now())

    def expire(self, now: float) -> None:
        """Engines whose newest sample is older than ``stale_after_ms``: on the router's own
        accounting alone (``LlmRouter.forget_corrections``)."""
        for v in self.router.engines.values():
            age = v.age_s(now)
            if age is not None and age > self.stale_after_s:
                self.router.forget_corrections(v.name)

    # -- one request ------------------------------------------------------------------------
    def request_info(
        self, request_id: int, model: str, chat: bool, obj: Mapping[str, Any],
        headers: Mapping[str, str], now: float, priority: int,
    ) -> LlmRequestInfo:  # fmt: skip
        """What the router knows of one request (module docstring)."""
        llm = self.cfg
        hashes: list[int]
        if chat:
            text = chat_text(obj.get("messages"))
            tokens = math.ceil(len(text) / llm.chars_per_token)
            hashes = text_block_hashes(text, self.block_chars)
            default_out = llm.default_max_tokens
        else:
            prompt = obj.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                tokens = len(prompt)
                hashes = id_block_hashes(prompt, llm.prefix_block_tokens)
            else:
                if isinstance(prompt, list):  # a batch of prompts: their text, joined
                    prompt = "\n".join(p for p in prompt if isinstance(p, str))
                text = prompt if isinstance(prompt, str) else ""
                tokens = math.ceil(len(text) / llm.chars_per_token)
                hashes = text_block_hashes(text, self.block_chars)
            default_out = COMPLETION_DEFAULT_MAX_TOKENS
        out = _positive_int(obj.get("max_completion_tokens")) or _positive_int(
            obj.get("max_tokens")
        )
        ttft = _header_ms(headers, wire.TTFT_HEADER)
        tpot = _header_ms(headers, wire.TPOT_HEADER)
        return LlmRequestInfo(
            request_id=request_id,
            model=model,
            arrival_s=now,
            prompt_tokens=max(1, tokens),
            max_tokens=out or default_out,
            prefix_hashes=hashes,
            priority=priority,
            ttft_target_s=ttft if ttft is not None else _ms(llm.ttft_ms),
            tpot_target_s=tpot if tpot is not None else _ms(llm.tpot_ms),
        )

    def choose(
        self, info: LlmRequestInfo, now: float, routable: Iterable[str], exclude: Iterable[str]
    ) -> LlmDecision:
        """The policy's decision among the engines of ``info.model`` on the ``routable``
        backends (healthy, the model READY there) not in ``exclude``, offered in the order of
        ``routable`` (the classic router's: the cluster file's), so a policy that goes by
        position (round robin) cycles the backends as they are listed, not in the order their
        first reports happened to arrive."""
        rank = {name: i for i, name in enumerate(routable)}
        ok = set(rank).difference(exclude)
        engines = [v for v in self.router.candidates(info.model) if self.backend_of[v.index] in ok]
        if not engines:
            return LlmDecision(None, reason="no-engine")
        engines.sort(key=lambda v: rank[self.backend_of[v.index]])
        return self.router.route(info, now, engines)

    def refused(self, model: str, reason: str) -> None:
        key = (model, reason)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def start(self, info: LlmRequestInfo, view: EngineView, now: float) -> LlmTry:
        """A try of ``info`` is sent to ``view``: counted until its ``LlmTry`` ends."""
        self.router.sent(info, view, now)
        return LlmTry(self.router, self.clock, info.request_id)

    # -- metrics ----------------------------------------------------------------------------
    def collector(self) -> Collector:
        return _LlmCollector(self)


def _ms(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def retry_after_header(seconds: float | None) -> str:
    """Retry-After for a refusal: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds or 0.0)))


class LlmTry:
    """One try's accounting (module docstring): ``first_token`` at most once, ``end`` exactly
    once whatever happens (later calls do nothing). ``feed`` reads a streamed answer's
    pieces for its first text and its usage."""

    __slots__ = (
        "_carry",
        "cached",
        "clock",
        "ended",
        "first",
        "request_id",
        "router",
        "text_events",
        "usage",
    )

    def __init__(self, router: LlmRouter, clock: Clock, request_id: int) -> None:
        self.router = router
        self.clock = clock
        self.request_id = request_id
        self.first = False
        self.ended = False
        self.text_events = 0
        self.usage: int | None = None
        #: The engine's cached prompt tokens, once an answer's usage said.
        self.cached: int | None = None
        self._carry = b""

    def first_token(self) -> None:
        if not self.first and not self.ended:
            self.first = True
            self.router.first_token(self.request_id, self.clock.now(), self.cached)

    def end(self, output_tokens: int | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        self.router.done(self.request_id, self.clock.now(), output_tokens, self.cached)

    def end_stream(self) -> None:
        """The stream is over: ended with its usage's output tokens, else its text events."""
        self.end(self.usage if self.usage is not None else self.text_events or None)

    def whole(self, body: bytes) -> None:
        """A whole (not streamed) 2xx answer: its first token and its end at once."""
        obj = _json(body)
        self.cached = _cached_tokens(obj)
        self.first_token()
        self.end(_completion_tokens(obj))

    def feed(self, piece: bytes) -> None:
        """A piece of a streamed answer (server-sent events, possibly cut anywhere)."""
        data = self._carry + piece
        cut = data.rfind(b"\n")
        if cut < 0:
            self._carry = data[-65536:]
            return
        self._carry = data[cut + 1 :]
        for line in data[:cut].split(b"\n"):
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            obj = _json(payload)
            if obj is None:
                continue
            n = _completion_tokens(obj)
            if n is not None:
                self.usage = n
                c = _cached_tokens(obj)
                if c is not None:
                    self.cached = c
            if _has_text(obj):
                self.text_events += 1
                self.first_token()


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _has_text(obj: Mapping[str, Any]) -> bool:
    """Whether a completion or chat chunk carries generated text."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    for c in choices:
        if not isinstance(c, dict):
            continue
        if c.get("text"):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return True
    return False


def _completion_tokens(obj: Mapping[str, Any] | None) -> int | None:
    if obj is None:
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _cached_tokens(obj: Mapping[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (None: absent or not a count)."""
    usage = obj.get("usage") if obj is not None else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


class _LlmCollector(Collector):
    """Per engine: its signal's age and the router's in-flight count; refusals by model and
    reason (read at scrape time)."""

    def __init__(self, llm: LlmGateway) -> None:
        self.llm = llm

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.llm.clock.now()
        age = GaugeMetricFamily(
            names.GATEWAY_LLM_SIGNAL_AGE,
            "seconds since the engine's newest signal sample was read (NaN before the first)",
            labels=["engine"],
        )
        flight = GaugeMetricFamily(
            names.GATEWAY_LLM_IN_FLIGHT,
            "requests the LLM router sent the engine, not ended (first token not seen: waiting)",
            labels=["engine", "state"],
        )
        for v in self.llm.router.engines.values():
            a = v.age_s(now)
            age.add_metric([v.name], math.nan if a is None else a)
            flight.add_metric([v.name, "waiting"], v.own_waiting)
            flight.add_metric([v.name, "running"], v.own_running)
        refused = CounterMetricFamily(
            names.GATEWAY_LLM_REFUSALS,
            "OpenAI requests the LLM router refused (429), by model and reason",
            labels=["model", "reason"],
        )
        for (model, reason), n in self.llm.refusals.items():
            refused.add_metric([model, reason], n)
        yield age
        yield flight
        yield refused

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(())
