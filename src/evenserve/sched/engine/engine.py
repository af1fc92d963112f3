"""One LLM model's engine on a device: sequences, KV blocks and the step it runs next (sans I/O).

The device scheduler asks ``plan(now)`` for the next step when it gives the engine the device,
runs it (the simulator's clock, an emulated sleep, or a real model through ``StepExecutor``)
and reports ``done(step, now, sampled)``, which answers the tokens each sequence produced.

Theory of operation (vLLM's V1 scheduler, one token budget for prefill and decode).
- Sequences wait in class order, first come first served within a class (a higher
  ``priority`` first, as everywhere: online 10 before offline 0; then the order they
  arrived). A preempted sequence keeps its place. One
  that brought a deadline and has not started by then is taken out (``expire``: the driver
  answers it ``deadline-expired``); once started it finishes.
- A step first keeps every running sequence going: a decode needs one token, a prompt being
  prefilled in chunks needs its next chunk (``chunk_tokens``). Each takes tokens from the
  step's budget (``max_num_batched_tokens``) and the KV blocks its context grows into. When
  blocks run out, a running sequence is preempted by recompute: the lowest class, then the
  newest, of all running ones first (possibly the one asking; one already given its part of
  this step gives it back, as vLLM's priority policy does); its blocks are freed, it goes
  back to waiting and later prefills its prompt and what it had generated again.
  Preemptions are counted.
- Then, if nothing was preempted in this step, waiting sequences are admitted in order while
  the budget, the sequence cap (``max_num_seqs``) and free blocks allow: a prompt's leading
  whole blocks found in the prefix cache are not computed again (at least its last token is,
  to sample from). Without chunked prefill a prompt is admitted whole or not at all (head of
  line: nothing behind it jumps ahead); with it, the first chunk that fits.
- ``request-level`` mode is the classic batcher with a generation as one job: when nothing
  runs, up to ``max_num_seqs`` waiting prompts start together, each reserving the blocks of
  its prompt and all its ``max_tokens``, and nothing joins until every one has finished;
  a finished sequence's row keeps being computed as padding until then (as a static batch
  under ``generate`` does), so decode steps cost the batch's full size.
- A sequence finishes at ``max_tokens`` (``length``), at the model's EOS unless
  ``ignore_eos`` (``stop``), or at the context limit (``length``); its blocks are freed at once
  (named prompt blocks stay cached for later prompts with the same prefix).
- ``cancel`` takes a sequence out wherever it is (its caller went away) and frees its blocks.
- Seq ids whose executor cache must be dropped (finished, cancelled, preempted) collect in
  ``to_free`` for a real executor's driver to hand to ``StepExecutor.free``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from evenserve.core.llm import StepEntry, StepProfile
from evenserve.core.wire import QUEUE_FULL
from evenserve.sched.engine.blocks import KvBlocks, prompt_hashes
from evenserve.sched.queues import QueuedRequest

R = TypeVar("R", bound=QueuedRequest)

Mode = Literal["request-level", "continuous", "continuous-chunked"]
MODES: tuple[Mode, ...] = ("request-level", "continuous", "continuous-chunked")

#: A sequence's states.
WAITING, RUNNING, FINISHED = 0, 1, 2
#: Refusal of a prompt whose context cannot fit the model (or the device's KV blocks).
TOO_LONG = "context-too-long"


@dataclass(frozen=True, slots=True)
class GenSpec:
    """What one generation asks for."""

    prompt: Sequence[int]
    max_tokens: int
    ignore_eos: bool = False
    #: Sampling, for a real model (None: its default; an emulated model's tokens are made up).
    temperature: float | None = None
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """One LLM model's engine on a device."""

    profile: StepProfile
    mode: Mode = "continuous"
    max_num_seqs: int = 256
    #: The step's token budget (prefill and decode tokens together).
    max_num_batched_tokens: int = 8192
    #: Longest prompt chunk in one step (chunked mode; None: the budget).
    chunk_tokens: int | None = None
    prefix_caching: bool = True
    #: Waiting sequences before refusals (None: unbounded).
    max_waiting: int | None = None
    eos_token_id: int | None = None
    #: Targets (seconds): time to first token and per output token after it.
    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.chunk_tokens is not None and self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        if self.mode != "continuous-chunked" and self.max_num_batched_tokens < (
            self.profile.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens must be >= the model's max_model_len "
                f"({self.profile.max_model_len}) without chunked prefill"
            )


class Seq(Generic[R]):
    """One generation in the engine."""

    __slots__ = (
        "blocks",
        "cached",
        "computed",
        "hashes",
        "order",
        "output",
        "output_ids",
        "preemptions",
        "published",
        "req",
        "seq_id",
        "spec",
        "state",
        "total",
    )

    def __init__(self, req: R, spec: GenSpec, seq_id: int, hashes: list[int]) -> None:
        self.req = req
        self.spec = spec
        self.seq_id = seq_id
        self.order = seq_id
        self.hashes = hashes
        #: Tokens of the context (prompt + generated) and how many have their KV computed.
        self.total = len(spec.prompt)
        self.computed = 0
        #: Output tokens so far, and their ids (None where an emulated engine made them).
        self.output = 0
        self.output_ids: list[int | None] = []
        self.blocks: list[int] = []
        #: Prompt blocks named in the prefix cache so far.
        self.published = 0
        self.state = WAITING
        self.preemptions = 0
        #: Prompt tokens the prefix cache gave it when first admitted.
        self.cached = 0

    def key(self) -> tuple[int, int]:
        """Waiting order: the higher class, then arrival."""
        return (-self.req.priority, self.order)

    def __lt__(self, other: Seq[R]) -> bool:
        return self.key() < other.key()

    def context_ids(self) -> list[int]:
        """The context's token ids (for a real executor; generated ids must be known)."""
        return [*self.spec.prompt, *(t if t is not None else 0 for t in self.output_ids)]


@dataclass(slots=True)
class Part(Generic[R]):
    """One sequence's part in a step: ``tokens`` computed from position ``start``."""

    seq: Seq[R]
    start: int
    tokens: int
    #: The step ends its known context: it samples the next token.
    sample: bool
    #: A decode (one new token after the prompt), not a prompt (re)fill.
    decode: bool


@dataclass(slots=True)
class Step(Generic[R]):
    """One engine step: its parts and what the step profile says it costs."""

    parts: list[Part[R]]
    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    seconds: float
    #: Padding rows (request-level mode: finished sequences of the batch still computed).
    padding: int = 0

    def entries(self) -> list[StepEntry]:
        """What a real executor runs for this step."""
        out = []
        for p in self.parts:
            ids = p.seq.context_ids()
            spec = p.seq.spec
            out.append(
                StepEntry(
                    p.seq.seq_id,
                    ids[p.start : p.start + p.tokens],
                    p.start,
                    p.sample,
                    spec.temperature,
                    spec.top_p,
                    spec.seed,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class TokenEvent(Generic[R]):
    """A sequence produced its ``index``-th output token (1-based), maybe its last."""

    req: R
    token: int | None
    index: int
    #: ``stop`` or ``length`` on its last token, else None.
    finish: str | None = None
    #: On the first token: the prompt tokens the prefix cache gave it (else None).
    cached: int | None = None


@dataclass(slots=True)
class EngineCounters:
    """What the engine has done (vLLM's counters)."""

    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    finished: int = 0
    cancelled: int = 0
    by_finish: dict[str, int] = field(default_factory=dict)


class Engine(Generic[R]):
    """One LLM model's engine (see the module docstring)."""

    def __init__(self, setup: EngineSetup, num_blocks: int) -> None:
        self.setup = setup
        self.profile = setup.profile
        self.kv = KvBlocks(num_blocks, setup.profile.block_tokens)
        self.waiting: list[Seq[R]] = []
        self.running: list[Seq[R]] = []
        self.by_req: dict[int, Seq[R]] = {}
        self.counters = EngineCounters()
        self.to_free: list[int] = []
        self._ids = itertools.count()
        self._waiting_n = 0
        #: Sequences that came with a deadline (``expire`` looks only when there are some).
        self._deadlines = 0
        #: Prompt tokens the waiting sequences still have to compute.
        self.queued_prompt_tokens = 0
        self._chunked = setup.mode == "continuous-chunked"
        self._static = setup.mode == "request-level"
        self._chunk = setup.chunk_tokens or setup.max_num_batched_tokens
        #: request-level: the batch's size while it runs (decode steps cost all of it).
        self._batch_rows = 0

    # -- requests in -------------------------------------------------------------------------
    def check(self, spec: GenSpec) -> str | None:
        """Why ``spec`` can never run here (None: it can): its context over the model's
        length, or over every KV block of the device."""
        ctx = len(spec.prompt) + spec.max_tokens
        if not spec.prompt or spec.max_tokens < 1 or ctx > self.profile.max_model_len:
            return TOO_LONG
        if self.kv.blocks_for(ctx) > self.kv.num_blocks:
            return TOO_LONG
        return None

    def add(self, req: R, spec: GenSpec) -> str | None:
        """Queue a generation (None) or refuse it: ``context-too-long``, ``queue-full``."""
        why = self.check(spec)
        if why is not None:
            return why
        bound = self.setup.max_waiting
        if bound is not None and self._waiting_n >= bound:
            return QUEUE_FULL
        sid = next(self._ids)
        hashes = (
            prompt_hashes(spec.prompt, self.kv.block_tokens) if self.setup.prefix_caching else []
        )
        seq = Seq(req, spec, sid, hashes)
        self.by_req[req.request_id] = seq
        if req.deadline_s is not None:
            self._deadlines += 1
        self._push(seq)
        return None

    def _push(self, seq: Seq[R]) -> None:
        seq.state = WAITING
        heapq.heappush(self.waiting, seq)
        self._waiting_n += 1
        self.queued_prompt_tokens += seq.total - seq.computed

    def _head(self) -> Seq[R] | None:
        w = self.waiting
        while w and w[0].state != WAITING:
            heapq.heappop(w)  # cancelled while waiting
        return w[0] if w else None

    def _pop(self) -> Seq[R]:
        seq = heapq.heappop(self.waiting)
        self._waiting_n -= 1
        self.queued_prompt_tokens -= seq.total - seq.computed
        return seq

    def cancel(self, req: R) -> bool:
        """Take ``req``'s sequence out (its caller went away); False if it is not here."""
        seq = self.by_req.pop(req.request_id, None)
        if seq is None or seq.req is not req:
            if seq is not None:
                self.by_req[req.request_id] = seq
            return False
        if seq.state == WAITING:
            self._waiting_n -= 1
            self.queued_prompt_tokens -= seq.total - seq.computed
        elif seq.state == RUNNING:
            self.running.remove(seq)
        seq.state = FINISHED
        self.kv.release(seq.blocks)
        self.to_free.append(seq.seq_id)
        self.counters.cancelled += 1
        return True

    def expire(self, now: float) -> list[R]:
        """Take out the waiting sequences whose deadline has passed (not yet started: a
        running one finishes); their requests, for the driver to answer ``deadline-expired``."""
        if not self._deadlines:
            return []
        out = []
        for seq in self.waiting:
            d = seq.req.deadline_s
            if seq.state == WAITING and seq.output == 0 and d is not None and d <= now:
                seq.state = FINISHED
                self._waiting_n -= 1
                self.queued_prompt_tokens -= seq.total - seq.computed
                self.by_req.pop(seq.req.request_id, None)
                self._deadlines -= 1
                out.append(seq.req)
        return out

    def abandon(self) -> list[R]:
        """Take every sequence out, waiting or running (shutdown, unload); their requests."""
        out = []
        for seq in list(self.by_req.values()):
            if seq.state == RUNNING:
                self.running.remove(seq)
            seq.state = FINISHED
            self.kv.release(seq.blocks)
            self.to_free.append(seq.seq_id)
            out.append(seq.req)
        self.by_req.clear()
        self.waiting.clear()
        self._waiting_n = 0
        self.queued_prompt_tokens = 0
        return out

    # -- readings ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.running) or self._waiting_n > 0

    @property
    def num_waiting(self) -> int:
        return self._waiting_n

    @property
    def num_running(self) -> int:
        return len(self.running)

    def next_step_s(self) -> float:
        """A cheap estimate of the next step's time: every running sequence decoding."""
        p = self.profile
        kv = sum(s.computed for s in self.running)
        return p.step_s(0, len(self.running), kv)

    # -- the step ----------------------------------------------------------------------------
    def plan(self, now: float) -> Step[R] | None:
        """The next step (None: nothing can run now)."""
        parts = self._plan_static() if self._static else self._plan_continuous()
        if not parts:
            return None
        prefill = decode = kv = 0
        for p in parts:
            if p.decode:
                decode += 1
                kv += p.start
            else:
                prefill += p.tokens
        padding = 0
        if self._static and decode:
            padding = self._batch_rows - len(parts)
            ctx = max(p.start for p in parts)
            decode += padding
            kv += padding * ctx
        self.counters.steps += 1
        return Step(parts, prefill, decode, kv, self.profile.step_s(prefill, decode, kv), padding)

    def _grow(self, seq: Seq[R], upto: int) -> bool:
        kv = self.kv
        return kv.grow(seq.blocks, kv.blocks_for(upto) - len(seq.blocks))

    def _preempt(self, seq: Seq[R]) -> None:
        self.running.remove(seq)
        self.kv.release(seq.blocks)
        seq.computed = 0
        seq.published = 0
        seq.preemptions += 1
        self.counters.preemptions += 1
        self.to_free.append(seq.seq_id)
        self._push(seq)

    def _plan_continuous(self) -> list[Part[R]]:
        budget = self.setup.max_num_batched_tokens
        chunked, chunk = self._chunked, self._chunk
        parts: list[Part[R]] = []
        preempted = False
        for seq in list(self.running):
            if seq.state != RUNNING or budget <= 0:
                continue
            need = seq.total - seq.computed
            n = min(need, budget, chunk) if chunked else need
            if n > budget:
                continue  # an unchunked refill that no longer fits: next step
            while not self._grow(seq, seq.computed + n):
                # The lowest class, then the newest, of every running sequence; one already
                # given its part of this step loses it (vLLM's priority policy does the same).
                victim = max(self.running, key=lambda s: (-s.req.priority, s.order))
                for i, q in enumerate(parts):
                    if q.seq is victim:
                        budget += q.tokens
                        del parts[i]
                        break
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.state != RUNNING:
                continue
            decode = need == 1 and seq.output > 0
            parts.append(Part(seq, seq.computed, n, seq.computed + n == seq.total, decode))
            budget -= n
        if preempted:
            return parts
        kv = self.kv
        cap = self.setup.max_num_seqs
        while budget > 0 and len(self.running) < cap:
            head = self._head()
            if head is None:
                break
            seq = head
            hit: list[int] = []
            if seq.hashes and seq.computed == 0:
                hit = kv.lookup(seq.hashes, (seq.total - 1) // kv.block_tokens)
                kv.acquire(hit)
                seq.blocks.extend(hit)
            start = len(hit) * kv.block_tokens
            need = seq.total - start
            n = min(need, budget, chunk) if chunked else need
            if n > budget or not self._grow(seq, start + n):
                kv.release(seq.blocks)
                break
            self._pop()
            if seq.hashes:
                kv.count_query(((seq.total - 1) // kv.block_tokens) * kv.block_tokens, start)
            if seq.output == 0:
                self.counters.prompt_tokens += len(seq.spec.prompt)
            seq.computed = start
            if seq.output == 0 and seq.preemptions == 0:
                seq.cached = start
            seq.published = len(hit)
            seq.state = RUNNING
            self.running.append(seq)
            parts.append(Part(seq, start, n, start + n == seq.total, False))
            budget -= n
        return parts

    def _plan_static(self) -> list[Part[R]]:
        if self.running:
            return [Part(s, s.computed, 1, True, True) for s in self.running]
        kv = self.kv
        parts: list[Part[R]] = []
        while len(parts) < self.setup.max_num_seqs:
            seq = self._head()
            if seq is None:
                break
            if not kv.grow(seq.blocks, kv.blocks_for(seq.total + seq.spec.max_tokens - seq.output)):
                break
            self._pop()
            if seq.output == 0:
                self.counters.prompt_tokens += len(seq.spec.prompt)
            seq.state = RUNNING
            self.running.append(seq)
            parts.append(Part(seq, 0, seq.total, True, False))
        self._batch_rows = len(parts)
        return parts

    def done(
        self, step: Step[R], now: float, sampled: Mapping[int, int] | None = None
    ) -> list[TokenEvent[R]]:
        """``step`` ended: advance its sequences; the tokens they produced, in step order.
        ``sampled``: a real executor's next token per seq id (None: an emulated engine)."""
        events: list[TokenEvent[R]] = []
        kv = self.kv
        bt = kv.block_tokens
        eos = self.setup.eos_token_id
        max_len = self.profile.max_model_len
        for p in step.parts:
            seq = p.seq
            if seq.state != RUNNING or seq.computed != p.start:
                continue  # cancelled or preempted while the step ran
            seq.computed += p.tokens
            if seq.hashes and seq.published < len(seq.hashes):
                whole = min(seq.computed, len(seq.spec.prompt)) // bt
                if whole > seq.published:
                    kv.publish(seq.blocks, seq.hashes, seq.published, whole)
                    seq.published = whole
            if not p.sample:
                continue
            token = None if sampled is None else sampled.get(seq.seq_id)
            seq.output += 1
            seq.output_ids.append(token)
            seq.total += 1
            self.counters.generation_tokens += 1
            finish = None
            if seq.output >= seq.spec.max_tokens or seq.total >= max_len:
                finish = "length"
            elif token is not None and token == eos and not seq.spec.ignore_eos:
                finish = "stop"
            cached = seq.cached if seq.output == 1 else None
            events.append(TokenEvent(seq.req, token, seq.output, finish, cached))
            if finish is not None:
                self._finish(seq, finish)
        return events

    def _finish(self, seq: Seq[R], finish: str) -> None:
        self.running.remove(seq)
        seq.state = FINISHED
        self.by_req.pop(seq.req.request_id, None)
        self.kv.release(seq.blocks)
        self.to_free.append(seq.seq_id)
        c = self.counters
        c.finished += 1
        c.by_finish[finish] = c.by_finish.get(finish, 0) + 1
        if not self.running:
            self._batch_rows = 0
