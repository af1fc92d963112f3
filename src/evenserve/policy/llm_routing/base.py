"""LLM routing: the request, the router's view of one engine, the decision, the policy
protocol and its registry (pure: no I/O, no clock of its own).

An LLM request's cost on an engine is its *uncached* prompt tokens (what the engine's prefix
cache does not hold) plus the tokens it will generate; an engine's state is its running
sequences, its waiting prompts and its KV cache. A policy sees each candidate engine as an
:class:`EngineView`, which the router (``llm_routing.router``) keeps from two sources:

- the engine's own signals (``EngineSample``: a scrape of its load report or its
  Prometheus ``/metrics``), each with the time it was read, so a policy can tell its age;
- the router's synchronous accounting of what it sent there itself (``own_*``): requests
  sent whose first token has not come (their uncached prompt tokens are still to prefill),
  sequences running (first token seen, not finished), the KV tokens they hold and will hold.
  This is exact and current. What the engine reports beyond it (traffic other routers or
  clients sent) is kept as a correction (``extra_*``), computed against the router's own
  counts *at the time the sample was read*, so a stale sample corrects, it does not lie.

``prefix_blocks`` (what the router's prefix index says the engine holds of this request's
prompt, in whole blocks) comes with each decision; see ``llm_routing.prefix_index``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from evenserve.core.llm import StepProfile
from evenserve.policy.registry import Registry


@dataclass(slots=True)
class LlmRequestInfo:
    """What a policy may know of one generation request."""

    request_id: int
    model: str
    arrival_s: float
    prompt_tokens: int
    #: The most tokens it may generate (the router's estimate of its output).
    max_tokens: int
    #: The names of the prompt's whole blocks (each ``block_tokens`` tokens, or their text),
    #: block i naming the prefix up to its end; empty: no prefix lookup.
    prefix_hashes: Sequence[int] = ()
    #: Its class: higher is served first (online 10, offline 0).
    priority: int = 10
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One reading of an engine's own signals (None: the engine does not report it)."""

    #: When the engine's state was read, on the router's clock.
    taken_s: float
    running: int
    waiting: int
    #: Fraction of KV blocks held by sequences (vLLM's ``kv_cache_usage_perc``).
    kv_usage: float | None = None
    #: Prompt tokens of the waiting sequences still to prefill.
    queued_prompt_tokens: int | None = None
    preemptions: int | None = None
    #: Prefix-cache hits over queries so far, in tokens.
    prefix_hit_rate: float | None = None
    kv_blocks: int | None = None
    block_tokens: int | None = None
    #: The KV cache's capacity in tokens, from an engine that reports no block count
    #: (SGLang's ``max_total_num_tokens``): the router counts it in its own blocks.
    kv_tokens: int | None = None


@dataclass(slots=True, eq=False)
class EngineView:
    """The router's view of one engine (module docstring). Change it through the router."""

    name: str
    index: int
    models: frozenset[str]
    #: Its step profile (None: unknown; the router learns a speed from its answers).
    profile: StepProfile | None
    #: Its KV cache in blocks of ``block_tokens``: the router's block, the length of the
    #: prompt blocks its requests name (a sample in the engine's own blocks is converted).
    kv_blocks: int
    block_tokens: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    #: Blocks the router's prefix index keeps for it: its KV blocks at first, learned down
    #: from the cached tokens the engine reports (``LlmRouter.first_token``).
    prefix_capacity: int = 0
    #: Block names the index holds for it now.
    prefix_held: int = 0
    #: The engine's newest sample as the router holds it, and when it arrived.
    sample: EngineSample | None = None
    received_s: float | None = None
    #: The router's own accounting (exact): sent, first token not yet seen ...
    own_waiting: int = 0
    #: ... their uncached prompt tokens, in all and by class ...
    own_waiting_tokens: int = 0
    own_waiting_tokens_by_class: dict[int, int] = field(default_factory=dict)
    #: ... sequences running (first token seen, not finished) ...
    own_running: int = 0
    #: ... the context tokens they hold now (uncached prompt + half their output: the mean
    #: over a generation) and the most they will hold (uncached prompt + max_tokens), all in
    #: flight. Uncached: a prefix the engine's cache holds is shared, counted once, by the
    #: request that brought it.
    own_context_tokens: int = 0
    #: Tokens of the cached prefix blocks the router's own requests in flight share here
    #: (each distinct block once: what the engine holds for them beyond their own).
    own_shared_tokens: int = 0
    own_committed_tokens: int = 0
    #: The uncached prompt tokens the router sent here per second lately, by class (an
    #: exponentially decaying count, time constant ``rate_tau_s``), as of ``rate_at_s``.
    sent_tokens_per_s: dict[int, float] = field(default_factory=dict)
    rate_at_s: float = 0.0
    #: Tokens of ``max_tokens`` over the router's own requests in flight here.
    own_out_tokens: int = 0
    #: The router's own waiting requests by class, in the order sent: request id -> (when
    #: it was sent, its TTFT target, its uncached prompt tokens); one without a target is
    #: absent.
    own_deadlines: dict[int, OrderedDict[int, tuple[float, float, int]]] = field(
        default_factory=dict
    )
    rate_tau_s: float = 5.0
    #: What the engine's sample says beyond the router's own count at the sample's time
    #: (another router's or client's work), never negative.
    extra_waiting: int = 0
    extra_waiting_tokens: int = 0
    extra_running: int = 0
    extra_kv_tokens: int = 0
    #: Learned from the router's own answers: seconds to a first token per prompt token
    #: ahead and the fixed part, and seconds per output token (EWMAs; None: none yet).
    learned_s_per_token: float | None = None
    learned_base_s: float | None = None
    learned_tpot_s: float | None = None
    #: What a policy computed from this view's fields alone (no request, no clock), by a
    #: key of the policy's; the router drops it (None) at every change it makes to the view.
    #: One who changes a field by hand (a new profile, new batch limits) drops it too.
    memo: dict[Any, Any] | None = None

    def age_s(self, now: float) -> float | None:
        """How old the newest sample is (None: never sampled)."""
        return None if self.sample is None else now - self.sample.taken_s

    def token_rate(self, now: float, above: int | None = None) -> float:
        """Uncached prompt tokens per second the router sent here lately, decayed to now:
        all, or only those of classes higher than ``above``."""
        total = sum(r for c, r in self.sent_tokens_per_s.items() if above is None or c > above)
        dt = now - self.rate_at_s
        return total if dt <= 0 else total * math.exp(-dt / self.rate_tau_s)

    def add_sent_tokens(self, now: float, priority: int, tokens: int) -> None:
        """Count ``tokens`` sent now in the decaying rates."""
        dt = now - self.rate_at_s
        rates = self.sent_tokens_per_s
        if dt > 0:
            k = math.exp(-dt / self.rate_tau_s)
            for c in rates:
                rates[c] *= k
            self.rate_at_s = now
        rates[priority] = rates.get(priority, 0.0) + tokens / self.rate_tau_s

    @property
    def kv_tokens(self) -> int:
        """KV capacity in tokens."""
        return self.kv_blocks * self.block_tokens

    @property
    def held_tokens(self) -> int:
        """KV tokens the engine's sequences hold, by the router's count and the correction."""
        return self.own_context_tokens + self.own_shared_tokens + self.extra_kv_tokens

    @property
    def waiting(self) -> int:
        return self.own_waiting + self.extra_waiting

    @property
    def running(self) -> int:
        return self.own_running + self.extra_running

    def waiting_tokens_at_or_above(self, priority: int) -> int:
        """Prompt tokens waiting that the engine serves before a request of ``priority``
        (its own class and higher: first come first served within a class)."""
        own = sum(t for c, t in self.own_waiting_tokens_by_class.items() if c >= priority)
        return own + self.extra_waiting_tokens


@dataclass(frozen=True, slots=True)
class LlmDecision:
    """A policy's answer: an engine, or a refusal (``engine`` None) with when to retry."""

    engine: EngineView | None
    #: Predicted time to first token and per output token there (None: the policy does not
    #: predict).
    ttft_s: float | None = None
    tpot_s: float | None = None
    #: A refusal's reason and the seconds after which a retry may succeed.
    reason: str | None = None
    retry_after_s: float | None = None


@runtime_checkable
class LlmRoutingPolicy(Protocol):
    def choose(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> LlmDecision:
        """Pick one of ``engines`` (never empty) or refuse. ``prefix_blocks``: by engine
        index, the leading prompt blocks the router's prefix index says it holds."""
        ...


LLM_ROUTING: Registry[LlmRoutingPolicy] = Registry("llm-routing")
