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
        "_busy_end",
        "_busy_start",
        "_end_cb",
        "_expected",
        "_held",
        "_memory",
        "_staging",
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
        self.trace = DeviceTrace(name=name)
        # The trace's per-batch seconds and fractions, as doubles until ``close_trace``
        # (no float object kept per batch while the run goes on).
        self._busy_start = array("d")
        self._busy_end = array("d")
        self._held = array("d")
        self._expected = array("d")
        self._staging = array("d")
        self._memory = array("d")
        self.idle_since_s = 0.0
        self._end_cb = self._end  # one bound method for every event
        self.sched: DeviceScheduler[SimRequest]

    # -- SchedulerActions ---------------------------------------------------------------
    def start_batch(self, batch: Batch[SimRequest]) -> None:
        tr = self.trace
        started, solo, items = batch.started_s, batch.solo_s, batch.items
        self._busy_start.append(started)
        self._busy_end.append(started + solo)  # set again when it ends
        tr.batch_sizes.append(items)
        tr.batch_models.append(batch.model)
        self._held.append(batch.held_s)
        tr.batch_cap.append(batch.cap)
        self._expected.append(solo)
        sched = self.sched
        self._staging.append(sched.slots.staging_s_per_item * items)
        used, total = sched.memory.used_total()
        self._memory.append(used / total if used is not None and total else NAN)

    def close_trace(self) -> None:
        """The run is over: the trace's per-batch columns get their figures (``start_batch``
        keeps them as doubles while it runs)."""
        tr = self.trace
        tr.busy_start_s = self._busy_start.tolist()
        tr.busy_end_s = self._busy_end.tolist()
        tr.batch_held_s = self._held.tolist()
        tr.batch_expected_s = self._expected.tolist()
        tr.batch_staging_s = self._staging.tolist()
        tr.batch_memory_fraction = self._memory.tolist()

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
        self._busy_end[batch.index] = now
        self.sim.completed(batch, now, self.name)
