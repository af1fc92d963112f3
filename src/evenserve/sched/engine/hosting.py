"""One LLM engine as a device scheduler hosts it: the engine, its class, whether a step of it
runs, and what the interleaving rule reads of it (sans I/O)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Generic, TypeVar

from evenserve.core.wire import ONLINE
from evenserve.sched.engine.engine import Engine, EngineSetup, Step, TokenEvent
from evenserve.sched.engine.interleave import Side
from evenserve.sched.queues import QueuedRequest

R = TypeVar("R", bound=QueuedRequest)


class EngineHost(Generic[R]):
    """An engine on a device (see ``DeviceScheduler.add_engine``)."""

    __slots__ = ("blocked", "engine", "idle_since_s", "in_flight", "name", "priority")

    def __init__(
        self, name: str, setup: EngineSetup, num_blocks: int, now: float, priority: int = ONLINE
    ) -> None:
        self.name = name
        self.engine: Engine[R] = Engine(setup, num_blocks)
        #: The class of its requests that bring none (the interleaving rule's side).
        self.priority = priority
        #: A step of it is running (an engine runs one step at a time).
        self.in_flight = False
        #: ``plan`` found nothing to run although work waits (cleared by the next change).
        self.blocked = False
        #: When its last step ended (or it was added).
        self.idle_since_s = now

    @property
    def reserved_bytes(self) -> float:
        """Device memory the engine holds: its weights and its KV blocks."""
        e = self.engine
        return e.profile.weights_bytes + e.kv.num_blocks * e.profile.block_bytes

    @property
    def ready(self) -> bool:
        """A step may start now."""
        return not self.in_flight and not self.blocked and self.engine.has_work

    def side(self, now: float) -> Side:
        e = self.engine
        head = max(s.req.priority for s in e.running) if e.running else self.priority
        if not e.running and e.waiting:
            head = max(s.req.priority for s in e.waiting if s.state == 0)
        tpot = e.setup.tpot_s
        waited = now - self.idle_since_s if e.running else 0.0
        return Side(head, e.next_step_s(), waited, math.inf if tpot is None else tpot)

    def done(
        self, step: Step[R], now: float, sampled: Mapping[int, int] | None
    ) -> list[TokenEvent[R]]:
        self.in_flight = False
        self.blocked = False
        self.idle_since_s = now
        return self.engine.done(step, now, sampled)
