"""LLM workloads: what each generation request asks for, and when it arrives.

A workload (:class:`LlmWorkloadSpec`, the YAML form a scenario holds) is one model's stream
of :class:`LlmRequest`: a prompt of token ids, an output length (``max_tokens``, with
``ignore_eos`` so the engine runs to it), a class and TTFT/TPOT targets. Arrivals are open
loop (Poisson at ``rate_rps``, optionally with rate phases) or closed loop (``users`` each
thinking an exponential ``think_ms`` between an answer and the next request).

Lengths. A prompt's and an output's token count is drawn from a distribution (``fixed``,
``uniform`` over [min, max], ``lognormal`` with the *mean* of the distribution in tokens and
``sigma`` of the underlying normal, or ``empirical``: one of a list of values, equally
likely), rounded and clipped to [min, max].

Shared prefixes. With ``prefix_groups`` a fraction ``share`` of requests belongs to one of
``groups`` groups (equally likely); each group has one prefix of ``tokens`` random ids, and a
grouped prompt starts with its group's prefix (the whole prompt is the prefix's start when
the drawn length is shorter). The drawn prompt length is the total, so changing ``share``
changes only what a prefix cache can reuse, not the work offered. The rest of every prompt
is uniform random ids in ``[0, vocab)``.

Seeding. Arrivals follow the package's convention (``random.Random`` seeded
``{seed}:arrivals:llm:{model}``, a :class:`PoissonProcess` as the classic streams use).
Each request's shape (class, lengths, group) and its token ids come from two numpy
generators seeded from ``{seed}:llm-shape:{model}`` and ``{seed}:llm-ids:{model}`` (closed
loop: ``...:user:{u}`` appended, one pair per user, so a user's requests do not depend on
when the others' answers come); the group prefixes from ``{seed}:llm-prefix:{model}``.
Shapes and ids on separate streams keep the shapes of two runs that differ only in
``share`` or ``vocab`` identical request by request (common random numbers), and every
draw happens for every request whether or not it is used, for the same reason.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from evenserve.core.errors import ConfigError
from evenserve.core.llm import GenerationRecord
from evenserve.core.scenario import Phase
from evenserve.core.validation import Strict, validate_document
from evenserve.core.wire import PRIORITY_CLASSES
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng

#: The default class of a request without one (``online``, as classic requests).
DEFAULT_PRIORITY = PRIORITY_CLASSES["online"]


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """One generation request: when it is due (seconds from the start) and what it asks."""

    request_id: int
    model: str
    arrival_s: float
    prompt_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool = True
    priority: int = DEFAULT_PRIORITY
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def record(self, scheduled_s: float | None = None) -> GenerationRecord:
        """An empty record of this request (no tokens yet), due at ``scheduled_s``
        (default: its arrival time), carrying its class and targets."""
        return GenerationRecord(
            request_id=self.request_id,
            model=self.model,
            scheduled_s=self.arrival_s if scheduled_s is None else scheduled_s,
            prompt_tokens=len(self.prompt_ids),
            ttft_target_s=self.ttft_target_s,
            tpot_target_s=self.tpot_target_s,
            priority=self.priority,
        )


# -- the YAML form ---------------------------------------------------------------------------


class _Clipped(Strict):
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered_bounds(self) -> _Clipped:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max: must be >= min ({self.min}), got {self.max}")
        return self

    def clip(self, n: float) -> int:
        v = max(self.min, round(n))
        return v if self.max is None else min(self.max, v)


class FixedLength(_Clipped):
    dist: Literal["fixed"]
    value: int = Field(ge=1)

    def draw(self, rng: np.random.Generator) -> int:
        return self.clip(self.value)


class UniformLength(_Clipped):
    """Every length in [min, max] equally likely (``max`` is required)."""

    dist: Literal["uniform"]
    max: int = Field(ge=1)

    def draw(self, rng: np.random.Generator) -> int:
        return self.min + math.floor(rng.random() * (self.max - self.min + 1))


class LognormalLength(_Clipped):
    """Lognormal with ``mean`` tokens (the distribution's mean before clipping) and ``sigma``
    (of the underlying normal): ``mu = ln(mean) - sigma^2 / 2``."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)

    def draw(self, rng: np.random.Generator) -> int:
        mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
        return self.clip(math.exp(mu + self.sigma * float(rng.standard_normal())))


class EmpiricalLength(_Clipped):
    """One of ``values``, each equally likely (repeat a value to weigh it)."""

    dist: Literal["empirical"]
    values: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)

    def draw(self, rng: np.random.Generator) -> int:
        return self.clip(self.values[math.floor(rng.random() * len(self.values))])


LengthSpec = Annotated[
    FixedLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="dist")
]


class PrefixGroups(Strict):
    """``share`` of the requests start with one of ``groups`` prefixes of ``tokens`` ids."""

    groups: int = Field(ge=1)
    tokens: int = Field(ge=1)
    share: float = Field(ge=0, le=1)


def _priority_value(p: int | str, where: str) -> int:
    if isinstance(p, int):
        return p
    if p not in PRIORITY_CLASSES:
        raise ValueError(f"{where}: unknown class {p!r} ({sorted(PRIORITY_CLASSES)})")
    return PRIORITY_CLASSES[p]


class LlmClass(Strict):
    """One request class: its weight in the mix, priority and targets (None: the workload's)."""

    weight: float = Field(gt=0)
    priority: int | str | None = None
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)


class LlmWorkloadSpec(Strict):
    """One model's LLM workload (module docstring): open loop with ``rate_rps`` or closed loop
    with ``users`` (exactly one of them)."""

    model: str = Field(min_length=1)
    rate_rps: float | None = Field(default=None, gt=0)
    phases: list[Phase] = Field(default_factory=list)
    users: int | None = Field(default=None, ge=1)
    think_ms: float = Field(default=0.0, ge=0)
    prompt_tokens: LengthSpec
    output_tokens: LengthSpec
    prefix_groups: PrefixGroups | None = None
    vocab: int = Field(default=32000, ge=2)
    ignore_eos: bool = True
    priority: int | str = DEFAULT_PRIORITY
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    classes: list[LlmClass] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> LlmWorkloadSpec:
        if (self.rate_rps is None) == (self.users is None):
            raise ValueError("rate_rps or users: give exactly one (open or closed loop)")
        if self.phases and self.rate_rps is None:
            raise ValueError("phases: rate phases apply to an open loop (rate_rps) only")
        _priority_value(self.priority, "priority")
        for i, c in enumerate(self.classes):
            if c.priority is not None:
                _priority_value(c.priority, f"classes.{i}.priority")
        return self

    @property
    def closed_loop(self) -> bool:
        return self.users is not None


def parse_llm_workload(raw: Mapping[str, Any] | Any, source: str) -> LlmWorkloadSpec:
    """The workload in the parsed mapping ``raw``; ConfigError naming ``source`` and the field."""
    return validate_document(LlmWorkloadSpec, raw, source, ConfigError)


# -- drawing requests ------------------------------------------------------------------------


def llm_rng(name: str) -> np.random.Generator:
    """A numpy generator seeded from a stream name (stable across runs and platforms)."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


@dataclass(frozen=True, slots=True)
class _Class:
    cum_weight: float
    priority: int
    ttft_target_s: float | None
    tpot_target_s: float | None


def _classes(spec: LlmWorkloadSpec) -> list[_Class]:
    ttft = None if spec.ttft_ms is None else spec.ttft_ms / 1e3
    tpot = None if spec.tpot_ms is None else spec.tpot_ms / 1e3
    prio = _priority_value(spec.priority, "priority")
    if not spec.classes:
        return [_Class(1.0, prio, ttft, tpot)]
    total = sum(c.weight for c in spec.classes)
    out: list[_Class] = []
    acc = 0.0
    for c in spec.classes:
        acc += c.weight / total
        out.append(
            _Class(
                acc,
                prio if c.priority is None else _priority_value(c.priority, "priority"),
                ttft if c.ttft_ms is None else c.ttft_ms / 1e3,
                tpot if c.tpot_ms is None else c.tpot_ms / 1e3,
            )
        )
    last = out[-1]
    out[-1] = _Class(1.0, last.priority, last.ttft_target_s, last.tpot_target_s)
    return out


class LlmRequestSampler:
    """Draws request after request of one workload (module docstring: what, and its seeds).

    ``stream`` names this sampler's generators beyond the model (a closed-loop user:
    ``user:3``); the group prefixes are the model's, shared by every sampler of one seed.
    """

    __slots__ = ("_classes", "_ids", "_prefixes", "_shape", "spec")

    def __init__(self, spec: LlmWorkloadSpec, seed: int, stream: str = "") -> None:
        self.spec = spec
        tail = f":{stream}" if stream else ""
        self._shape = llm_rng(f"{seed}:llm-shape:{spec.model}{tail}")
        self._ids = llm_rng(f"{seed}:llm-ids:{spec.model}{tail}")
        self._classes = _classes(spec)
        pg = spec.prefix_groups
        if pg is None:
            self._prefixes: list[tuple[int, ...]] = []
        else:
            prng = llm_rng(f"{seed}:llm-prefix:{spec.model}")
            self._prefixes = [
                tuple(prng.integers(0, spec.vocab, size=pg.tokens).tolist())
                for _ in range(pg.groups)
            ]

    def draw(self, request_id: int, arrival_s: float) -> LlmRequest:
        spec, shape = self.spec, self._shape
        u_class = shape.random()
        cls = next(c for c in self._classes if u_class <= c.cum_weight)
        n_prompt = spec.prompt_tokens.draw(shape)
        n_out = spec.output_tokens.draw(shape)
        u_group, u_which = shape.random(), shape.random()
        prefix: tuple[int, ...] = ()
        pg = spec.prefix_groups
        if pg is not None and u_group < pg.share:
            prefix = self._prefixes[math.floor(u_which * pg.groups)][:n_prompt]
        tail = self._ids.integers(0, spec.vocab, size=n_prompt - len(prefix)).tolist()
        return LlmRequest(
            request_id=request_id,
            model=spec.model,
            arrival_s=arrival_s,
            prompt_ids=prefix + tuple(tail),
            max_tokens=n_out,
            ignore_eos=spec.ignore_eos,
            priority=cls.priority,
            ttft_target_s=cls.ttft_target_s,
            tpot_target_s=cls.tpot_target_s,
        )


def _open_rate(spec: LlmWorkloadSpec) -> float:
    if spec.rate_rps is None:
        raise ConfigError(f"workload {spec.model}: an open loop needs rate_rps (it has users)")
    return spec.rate_rps


def iter_llm_open_loop(spec: LlmWorkloadSpec, seed: int, end_s: float) -> Iterator[LlmRequest]:
    """The open-loop requests arriving in ``[0, end_s)``, in time order, one at a time
    (request ids 0, 1, ...)."""
    proc = PoissonProcess(_open_rate(spec), spec.phases, arrivals_rng(seed, f"llm:{spec.model}"))
    sampler = LlmRequestSampler(spec, seed)
    t = proc.next_after(0.0)
    i = 0
    while t < end_s:
        yield sampler.draw(i, t)
        i += 1
        t = proc.next_after(t)


def llm_open_loop(
    spec: LlmWorkloadSpec, seed: int, duration_s: float, max_requests: int | None = None
) -> list[LlmRequest]:
    """The open-loop requests of ``[0, duration_s)``, at most ``max_requests`` (the earliest)."""
    out: list[LlmRequest] = []
    for r in iter_llm_open_loop(spec, seed, duration_s):
        if max_requests is not None and len(out) >= max_requests:
            break
        out.append(r)
    return out


class LlmUser:
    """One closed-loop user: its think times and its requests, on generators of its own.

    The ``k``-th request of user ``u`` out of ``n`` has id ``k * n + u``: unique over the
    users, and fixed whatever order their answers come back in.
    """

    __slots__ = ("_mean_think_s", "_sampler", "_sent", "_think", "n_users", "user")

    def __init__(self, spec: LlmWorkloadSpec, seed: int, user: int) -> None:
        if spec.users is None:
            raise ConfigError(f"workload {spec.model}: a closed loop needs users (it has a rate)")
        if not 0 <= user < spec.users:
            raise ConfigError(f"user: must be in [0, {spec.users}), got {user}")
        self.user = user
        self.n_users = spec.users
        self._sampler = LlmRequestSampler(spec, seed, f"user:{user}")
        self._think = llm_rng(f"{seed}:llm-think:{spec.model}:user:{user}")
        self._mean_think_s = spec.think_ms / 1e3
        self._sent = 0

    def think_s(self) -> float:
        """An exponential think time with the workload's mean (0 when the mean is 0)."""
        mean = self._mean_think_s
        return float(self._think.exponential(mean)) if mean > 0 else 0.0

    def next_request(self, arrival_s: float) -> LlmRequest:
        """This user's next request, sent at ``arrival_s``."""
        rid = self._sent * self.n_users + self.user
        self._sent += 1
        return self._sampler.draw(rid, arrival_s)


def llm_users(spec: LlmWorkloadSpec, seed: int) -> list[LlmUser]:
    """The workload's closed-loop users, 0 to ``users - 1``."""
    if spec.users is None:
        raise ConfigError(f"workload {spec.model}: a closed loop needs users (it has a rate)")
    return [LlmUser(spec, seed, u) for u in range(spec.users)]
