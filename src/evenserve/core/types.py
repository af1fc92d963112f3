"""The small value types every layer speaks: requests, backend signals, queue views, decisions.

Times are seconds on the driver's clock (a real monotonic clock live, a virtual one in the
simulator). Memory is in bytes. Utilization is a busy-time fraction in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evenserve.core.profile import LatencyProfile


@dataclass(slots=True)
class RequestInfo:
    """What a policy may know about one request."""

    request_id: int
    model: str
    arrival_s: float
    priority: int = 10
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One reading of a backend's load signals (the worker's load endpoint, or the simulator).

    ``queue_depth`` counts requests waiting (not yet in a running batch); ``in_flight`` counts
    requests inside running batches; ``utilization`` is busy time over a recent window.
    Unknown figures are ``None`` (a backend whose metrics lack them): policies must treat
    unknown as unknown, never as idle.
    """

    timestamp_s: float
    queue_depth: float
    in_flight: float = 0.0
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    queued_by_model: Mapping[str, float] = field(default_factory=dict)
    busy_remaining_s: float = 0.0
    #: The most requests one batch of each model takes on this backend, as its scheduler
    #: batches it (empty: unknown); the router passes it to policies that predict work.
    max_batch_size: Mapping[str, int] = field(default_factory=dict)
    #: Each model's latency SLO here, seconds (a model without one is absent).
    slo_s: Mapping[str, float] = field(default_factory=dict)
    #: Each model's queue bound here: requests waiting before refusals (absent: unbounded).
    max_queue: Mapping[str, int] = field(default_factory=dict)
    #: Profiles that learn (a backend that learns; empty otherwise): per model the learned
    #: scale of its profile and its smoothed observed batch times, ms by batch size, from
    #: which the router rebuilds the learned profile (``core.profile_learning``).
    profile_scale: Mapping[str, float] = field(default_factory=dict)
    observed_ms: Mapping[str, Mapping[int, float]] = field(default_factory=dict)

    @property
    def memory_free_bytes(self) -> float | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(0.0, self.memory_total_bytes - self.memory_used_bytes)


@dataclass(slots=True)
class BackendView:
    """A routing policy's snapshot of one backend that hosts the request's model.

    ``queue_depth`` is the framework's estimate: the mean of the last few sampled queue depths
    plus the requests this router sent since the newest sample (so bursts between two polls
    spread out). ``signals_fresh`` is False when the newest sample is older than the staleness
    bound: then utilization and memory are None and queue depth is only the router's own count.
    ``in_flight`` and ``in_flight_by_model`` are this router's own count of requests sent and
    not yet answered (exact and current, whatever the signals); ``latency_per_request_s`` is
    what the router learned from its own answers: per model, seconds of latency per request
    in flight here at the send (an EWMA of latency / (in flight + 1)), a speed figure that
    needs no profile. ``slo_s`` and ``max_queue`` are what the backend reports per model;
    ``sampled_at_s`` is when the newest sample was taken (None: never), so a policy can age
    what it says (``busy_remaining_s`` was true then).
    The defaults are a backend nothing is known of yet.
    """

    name: str
    queue_depth: float = 0.0
    in_flight: int = 0
    utilization: float | None = None
    memory_free_bytes: float | None = None
    memory_total_bytes: float | None = None
    signals_fresh: bool = False
    queued_by_model: Mapping[str, float] = field(default_factory=dict)
    busy_remaining_s: float = 0.0
    profiles: Mapping[str, LatencyProfile] = field(default_factory=dict)
    max_batch_size: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0
    in_flight_by_model: Mapping[str, int] = field(default_factory=dict)
    latency_per_request_s: Mapping[str, float] = field(default_factory=dict)
    slo_s: Mapping[str, float] = field(default_factory=dict)
    max_queue: Mapping[str, int] = field(default_factory=dict)
    sampled_at_s: float | None = None


@dataclass(slots=True)
class QueueView:
    """A batching policy's view of one model's queue on a device that could start a batch
    now, in service order; ``memory_free_bytes`` is the device's free memory (None: unknown)."""

    model: str
    requests: Sequence[RequestInfo]
    profile: LatencyProfile | None
    memory_free_bytes: float | None = None
    #: The model's latency SLO in seconds (requests without a deadline default to
    #: arrival + SLO for deadline-aware policies); None when unknown.
    slo_s: float | None = None
    #: Smoothed arrival rate of this queue (req/s) and the class of its model's requests by
    #: default; the device choice uses them to keep lower classes out of capacity that higher
    #: classes are about to need.
    arrival_rate_rps: float | None = None
    default_priority: int | None = None

    def __len__(self) -> int:
        return len(self.requests)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run a batch of the ``n`` requests at the head of the queue now."""

    n: int


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Do nothing until ``t_s`` (or until the queue changes, whichever comes first)."""

    t_s: float = math.inf


BatchDecision = Dispatch | WaitUntil

#: Dispatch decisions by size, made once (they are immutable: policies answer with these on
#: every decision instead of a new object each time).
_DISPATCH: dict[int, Dispatch] = {}
#: WaitUntil() (no wake-up wanted).
NO_WAKE = WaitUntil()


def dispatch(n: int) -> Dispatch:
    """``Dispatch(n)``, the same object for the same ``n``."""
    d = _DISPATCH.get(n)
    if d is None:
        d = _DISPATCH[n] = Dispatch(n)
    return d
