"""A simulated device: a thin driver that carries out its DeviceScheduler's actions on the
simulation's event heap (a batch start is recorded, a wake-up or a batch end becomes an
event, a dropped request is logged) and hands the events back (``wake``, ``finished``)."""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass
from heapq import heappush
from typing import Protocol

from evenserve.core.profile import LatencyProfile
from evenserve.core.results import DeviceTrace
from evenserve.core.scenario import ArmSpec, Scenario
from evenserve.sched import Batch, Batching, DeviceScheduler, ModelSetup, QueuedRequest
from evenserve.sim.engine import EventLoop
from evenserve.sim.loader import LoadedScenario

NAN = math.nan


class SimHost(Protocol):
    """What devices and the central queue need of the simulation that holds them."""

    loop: EventLoop
    sc: Scenario
    arm: ArmSpec
    arm_name: str
    loaded: LoadedScenario
    policy_rng: random.Random
    warmup_s: float
    utilization_window_s: float
    starvation_s: float | None
    hosts: dict[str, list[SimDevice]]

    def drop(self, r: SimRequest, reason: str, device: str | None) -> None: ...

    def completed(self, batch: Batch[SimRequest], now: float, device: str) -> None: ...

    def batching(self, model: str, rng: random.Random | None = None) -> Batching: ...

    def model_setup(self, model: str, profile: LatencyProfile | None) -> ModelSetup: ...

    def add_device(self, name: str, profiles: dict[str, LatencyProfile]) -> SimDevice: ...


@dataclass(slots=True, eq=False)
class SimRequest(QueuedRequest):
    idx: int = -1
    user: int = -1


class SimDevice:
    """Carries out one device scheduler's actions on the simulation's event heap."""

    __slots__ = (
        "_end_cb",
        "_room",
        "idle_since_s",
        "loop",
        "models",
        "name",
        "profiles",
        "sched",
        "sim",
        "trace",
    )

    def __init__(self, sim: SimHost, name: str, profiles: dict[str, LatencyProfile]) -> None:
        self.sim = sim
        self.loop = sim.loop
        self.name = name
        self.profiles = profiles
        self.models = tuple(sorted(profiles))
        # The per-batch time columns as doubles (no float object kept per entry), with room
        # for ``_room`` batches (``_grow_trace``; ``trim_trace`` cuts them to the batches).
        self._room = 0
        self.trace = DeviceTrace(
            name=name,
            busy_start_s=array("d"),
            busy_end_s=array("d"),
            batch_held_s=array("d"),
            batch_expected_s=array("d"),
            batch_staging_s=array("d"),
            batch_memory_fraction=array("d"),
        )
        self.idle_since_s = 0.0
        self._end_cb = self._end  # one bound method for every event
        self.sched: DeviceScheduler[SimRequest]

    # -- SchedulerActions ---------------------------------------------------------------
    def start_batch(self, batch: Batch[SimRequest]) -> None:
        tr = self.trace
        i = len(tr.batch_sizes)
        if i >= self._room:
            self._grow_trace()
        tr.busy_start_s[i] = batch.started_s
        tr.busy_end_s[i] = batch.started_s + batch.solo_s  # set again when it ends
        tr.batch_sizes.append(batch.items)
        tr.batch_models.append(batch.model)
        tr.batch_held_s[i] = batch.held_s
        tr.batch_cap.append(batch.cap)
        tr.batch_expected_s[i] = batch.solo_s
        slots = self.sched.slots
        tr.batch_staging_s[i] = slots.staging_s_per_item * batch.items
        used, total = self.sched.memory.used_total()
        tr.batch_memory_fraction[i] = used / total if used is not None and total else NAN

    def _grow_trace(self) -> None:
        """Room in the per-batch time columns for as many batches again (64 at first):
        a growth that copies a column copies each entry about once."""
        k = self._room if self._room > 64 else 64
        tr = self.trace
        for col in (
            tr.busy_start_s,
            tr.busy_end_s,
            tr.batch_held_s,
            tr.batch_expected_s,
            tr.batch_staging_s,
            tr.batch_memory_fraction,
        ):
            col.extend(array("d", [NAN]) * k)
        self._room += k

    def trim_trace(self) -> None:
        """Cut the per-batch time columns to the batches started (the run's end)."""
        tr = self.trace
        n = len(tr.batch_sizes)
        del tr.busy_start_s[n:], tr.busy_end_s[n:], tr.batch_held_s[n:]
        del tr.batch_expected_s[n:], tr.batch_staging_s[n:], tr.batch_memory_fraction[n:]
        self._room = n

    def drop(self, request: SimRequest, reason: str) -> None:
        self.sim.drop(request, reason, self.name)

    def wake_at(self, t_s: float) -> None:
        self.loop.at(t_s, self._wake, t_s)

    def end_at(self, t_s: float, token: int) -> None:
        loop = self.loop  # loop.at, inlined (once per batch)
        now = loop.now
        heappush(loop.heap, (now if t_s < now else t_s, next(loop.count), self._end_cb, token))

    # -- events back to the scheduler ---------------------------------------------------
    def _wake(self, at_s: float) -> None:
        self.sched.wake(at_s, self.loop.now)

    def _end(self, token: int) -> None:
        now = self.loop.now
        batch = self.sched.announced(token)
        if batch is None:
            return  # superseded: a batch started or ended since
        # What the batch really took (a slow device's included): a scheduler that learns
        # its profiles hears it, as the worker's hears its executor's measured time.
        self.sched.finished(batch, now, now - batch.started_s)
        self.idle_since_s = now
        self.trace.busy_end_s[batch.index] = now
        self.sim.completed(batch, now, self.name)
