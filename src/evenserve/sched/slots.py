"""A device's instance slots: which are free, the batch on each, when each ends, busy time.

A batch alone takes its solo time. With several instances, batches running at once share
the device (``core.contention``): every start or end moves the others' ends, so after a
change the earliest end is announced again (``end_at`` with a new token); ``announced``
answers with the batch a token stands for, or None once a later announcement superseded it.
One instance keeps a direct path: a batch ends at its start plus its solo time, announced
when it starts.

``slowdown`` is how much slower the device really runs than its profiles say (1.0: as they
say; a scenario's ``slowdown``, a throttled card). It stretches when a batch really ends (what
is announced with ``end_at``) but not the scheduler's own estimates (``solo_s``, ``end_s`` on
the direct path, ``busy_remaining_s``): like a live worker, the scheduler only learns that a
device is slower from the batch times it observes (with profiles that learn, its estimates
follow them; a batch's real time still comes from the profile as given, times the slowdown).
"""

from __future__ import annotations

import bisect
from typing import Generic, TypeVar

from evenserve.core.contention import SharedDevice
from evenserve.core.options import DeviceOptions
from evenserve.sched.actions import Batch, SchedulerActions
from evenserve.sched.busy import BusyClock
from evenserve.sched.queues import QueuedRequest

R = TypeVar("R", bound=QueuedRequest)


class Slots(Generic[R]):
    __slots__ = (
        "_actions",
        "_moved",
        "_shared",
        "_token",
        "busy",
        "free",
        "free_since",
        "instances",
        "running",
        "slowdown",
        "staging_s_per_item",
    )

    def __init__(
        self,
        device: DeviceOptions,
        actions: SchedulerActions[R],
        utilization_window_s: float,
        origin_s: float,
    ) -> None:
        self.instances = device.instances
        self._actions = actions
        self.free = list(range(device.instances))
        #: When each instance last became free (its last batch's end; the origin at first).
        self.free_since = [origin_s] * device.instances
        self.running: dict[int, Batch[R]] = {}
        self._shared = SharedDevice(device.interference) if device.instances > 1 else None
        self._token = 0
        self._moved = False
        self.busy = BusyClock(device.instances, utilization_window_s, origin_s)
        self.slowdown = 1.0
        #: Input staging per item (host to device) a batch spends before it computes; the
        #: profile does not include it (a simulated transfer stall; 0 live, where the worker
        #: times its staging itself).
        self.staging_s_per_item = 0.0

    def start(
        self, batch: Batch[R], occupancy: float, now: float, true_s: float | None = None
    ) -> None:
        """``batch`` starts on ``batch.instance`` (taken from ``free``). ``true_s``: what it
        takes alone on a device as fast as its profile (default ``batch.solo_s``; a learned
        profile's estimate may differ), before the slowdown."""
        self.running[batch.instance] = batch
        self.busy.change(now, 1)
        real_s = (batch.solo_s if true_s is None else true_s) * self.slowdown
        if self.staging_s_per_item:
            real_s += self.staging_s_per_item * batch.items
        if self._shared is None:
            batch.end_s = now + batch.solo_s
            self._token += 1
            self._actions.end_at(
                batch.end_s if real_s == batch.solo_s else now + real_s, self._token
            )
        else:
            self._shared.start(batch.instance, now, real_s, occupancy)
            self._moved = True

    def finish(self, batch: Batch[R], now: float) -> None:
        inst = batch.instance
        if self.running.pop(inst, None) is not batch:
            raise ValueError(f"batch {batch.index} is not running")
        self.busy.change(now, -1)  # it ran: BusyClock.stop without the check
        self.free_since[inst] = now
        if self._shared is None:
            self.free.append(inst)
        else:
            self._shared.finish(inst, now)
            bisect.insort(self.free, inst)
            self._moved = True
        batch.end_s = now

    def announce(self) -> None:
        """After a change: announce the earliest end if starts or ends moved it."""
        if not self._moved or self._shared is None:
            return
        self._moved = False
        nxt = self._shared.next_end()
        if nxt is not None:
            self.running[nxt[0]].end_s = nxt[1]  # type: ignore[index]
            self._token += 1
            self._actions.end_at(nxt[1], self._token)

    def announced(self, token: int) -> Batch[R] | None:
        """The batch whose end was announced with ``token``; None when superseded."""
        if token != self._token or not self.running:
            return None
        if self._shared is None:
            return next(iter(self.running.values()))
        nxt = self._shared.next_end()
        assert nxt is not None
        return self.running[nxt[0]]  # type: ignore[index]

    def busy_remaining_s(self, now: float) -> float:
        """Seconds until an instance is free (0 when one is free now), from estimates."""
        if self.free:
            return 0.0
        if self._shared is None:
            end = next(iter(self.running.values())).end_s
        else:
            nxt = self._shared.next_end()
            if nxt is None:
                return 0.0
            end = nxt[1]
        return end - now if end > now else 0.0
