"""The simulator's placement driver: an arm with ``placement`` loads and unloads models and
turns devices on and off, as a PlacementController (policy.placement.controller) decides.

Theory of operation (all on the simulation's event heap):
- At the start each active device holds its configured models READY (the initial
  placement); devices with ``active: false`` are off. The Router's candidates are the models
  READY on active devices that are not stopping (``Router.set_models`` at every change).
- A request the Router has no host for goes to ``route_miss``: to the device loading the
  model (it waits in that device's scheduler, ``begin_load`` ... ``loaded``, at most
  ``load_wait_ms``, then ``load-timeout``), or where the policy loads it; ``None``: dropped
  as ``no-backend`` (the gateway's 503).
- A load takes the model's cold or warm load time (``ModelSpec.load_times_s``); its weights
  are held from its start. A load the controller holds back until unloads free its room
  starts when they are done; requests sent for it meanwhile are parked here and offered to
  the scheduler when it starts (their load-wait bound counts from then; an unload takes
  ``unload_ms``, 10 ms by default). An unload takes ``unload_ms``; the weights are held until
  it is done. An unload asked while the model is still loading happens once it is loaded.
- Every ``tick_s`` (the controller's: a quarter of ``placement_interval_ms`` with an
  autoscaler): each device's busy fraction to the controller, then its ``tick`` (rebalance
  every ``placement_interval_ms``, autoscaling every ``tick_s``); the first at one interval,
  or where a ``PlacementClock`` (a live run's) says. ScaleUp: the device costs
  from then, and takes work after ``start_ms`` (its scheduler, empty, ends its drain).
  ScaleDown: nothing new is sent; it drains (its queued requests run at once, loads and
  unloads under way finish), then it is off and its residents leave it.
- Memory: a device's resident weights (loading, ready, unloading) never exceed
  its memory (``memory_gb``, or its slice's): asserted at every load start (a controller
  or policy bug otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from evenserve.core.results import RequestLog
from evenserve.core.scenario import DeviceSpec
from evenserve.core.wire import NO_BACKEND, OVERLOADED
from evenserve.policy.placement import (
    AUTOSCALING,
    PLACEMENT,
    READY,
    Action,
    DeviceView,
    Load,
    ModelInfo,
    ScaleAction,
    ScaleDown,
    ScaleUp,
    Unload,
)
from evenserve.policy.placement.burst import BurstClock
from evenserve.policy.placement.controller import PlacementController
from evenserve.policy.routing import Router
from evenserve.sim.device import SimDevice, SimHost, SimRequest
from evenserve.sim.front import SimFront

GIB = 1024.0**3


@dataclass(frozen=True, slots=True)
class PlacementClock:
    """Where a live gateway's controller stood when its load began (seconds from the load's
    t = 0): its demand estimates started at ``start_s`` (before the load: negative; None:
    at its first event, as the simulator's do), its next rebalance was due at
    ``rebalance_s`` and its autoscaler's next check at ``scale_s``. A simulation given one
    replays that schedule (``SimPlacement.first_tick_s``) instead of its own (estimates
    from the first event, the first tick one interval in)."""

    start_s: float | None
    rebalance_s: float
    scale_s: float

    def apply(self, ctl: PlacementController) -> float:
        """Set ``ctl``'s estimates' start and schedule to this clock's; returns when its
        first tick is due (the next rebalance, or the autoscaler's next check if sooner)."""
        if self.start_s is not None:
            ctl.start(self.start_s)
        ctl.schedule(self.rebalance_s, self.scale_s)
        return self.rebalance_s if ctl.autoscaler is None else min(self.rebalance_s, self.scale_s)


class PlacementHost(SimHost, Protocol):
    """What the placement driver needs of the simulation that holds it."""

    router: Router | None
    front: SimFront | None
    log: RequestLog
    refusals: bool
    end_s: float


@dataclass(eq=False)
class _Device:
    """What the driver keeps of one device beyond its SimDevice."""

    sim_device: SimDevice
    spec: DeviceSpec
    on: bool
    #: When it was last turned on (None: off).
    on_since_s: float | None
    active_s: float = 0.0
    starting: bool = False
    stopping: bool = False
    #: Loads and unloads under way here.
    ops: int = 0
    #: Models whose load started in the scheduler and is not done yet.
    loading: set[str] = field(default_factory=set)
    #: Unloads asked while the model was loading: carried out once it is loaded.
    unload_after_load: set[str] = field(default_factory=set)
    #: Requests for a load that waits for room (not started yet), by model.
    parked: dict[str, list[SimRequest]] = field(default_factory=dict)
    peak_weights_bytes: float = 0.0

    @property
    def memory_bytes(self) -> float:
        return self.spec.memory_total_bytes


class SimPlacement:
    def __init__(
        self,
        sim: PlacementHost,
        devices: list[tuple[SimDevice, DeviceSpec]],
        clock: PlacementClock | None = None,
    ) -> None:
        self.sim = sim
        arm, sc = sim.arm, sim.sc
        self.load_wait_s = arm.load_wait_ms / 1000.0
        #: When each ScaleUp was decided (RunRecords.scale_ups_s).
        self.scale_ups_s: list[float] = []
        #: Each ScaleUp's burst-clock time (policy.placement.burst, as the gateway's gauge).
        self.burst = BurstClock()
        self.scale_up_decisions_s: list[float] = []
        self.unload_s = arm.unload_ms / 1000.0
        self.devices = {
            d.name: _Device(d, s, s.active, 0.0 if s.active else None) for d, s in devices
        }
        first = devices[0][0]
        infos: dict[str, ModelInfo] = {}
        for m, ms in sc.models.items():
            prof = first.profiles[m]
            cap = sim.batching(m).policy.max_batch_size
            cold, warm = ms.load_times_s(prof.weights_bytes)
            infos[m] = ModelInfo.from_profile(m, prof, cap, cold, warm, ms.slo_s)
        views = [
            DeviceView(
                d.name,
                s.memory_total_bytes,
                {m: READY for m in d.models},
                active=s.active,
            )
            for d, s in devices
        ]
        self.controller = PlacementController(
            infos,
            views,
            PLACEMENT.build(arm.placement, sim.policy_rng),
            None if arm.autoscaling is None else AUTOSCALING.build(arm.autoscaling, sim.policy_rng),
            host_memory_bytes=arm.host_memory_gb * GIB,
            interval_s=arm.placement_interval_ms / 1000.0,
            min_switch_s=arm.min_switch_s,
        )
        for pd in self.devices.values():
            self._note_memory(pd)
        #: When the first tick runs.
        self.first_tick_s = (
            self.controller.interval_s if clock is None else clock.apply(self.controller)
        )

    # -- requests -------------------------------------------------------------------------
    def arrive(self, r: SimRequest) -> None:
        sim = self.sim
        router = sim.router
        assert router is not None
        now = sim.loop.now
        ctl = self.controller
        ctl.arrival(r.model, now)
        self.burst.arrival(now)
        if sim.refusals and router.refusal(r.model, now) is not None:
            sim.drop(r, OVERLOADED, None)
            return
        view = router.choose(r, now)
        if view is not None:
            name = view.name
        else:
            dev, actions = ctl.route_miss(r.model, now)
            self.carry_out(actions, now)
            if dev is None:
                sim.drop(r, NO_BACKEND, None)
                return
            name = dev
        router.sent(name, r.model, now)
        reason = self.offer(name, r, now)
        if reason is not None:  # the next device, as the gateway's rules say (sim.front)
            front = sim.front
            assert front is not None
            front.refused(r, 0, name, reason, now)

    def offer(self, name: str, r: SimRequest, now: float) -> str | None:
        """A try of ``r`` on device ``name`` (the front's, with placement): the controller
        counts it sent; parked while its model's load waits for room (taken), else offered
        to the device's scheduler (None, or the reason it refused)."""
        self.controller.sent(r.model, name, now)
        pd = self.devices[name]
        sched = pd.sim_device.sched
        if r.model not in sched.models:  # its load waits for room: park it until it starts
            pd.parked.setdefault(r.model, []).append(r)
            return None
        return sched.offer(r, now)

    def done_one(self, model: str, device: str) -> None:
        """A try on ``device`` refused at the door is over (the front tries the next)."""
        self.done(model, device, 1)

    def done(self, model: str, device: str, n: int) -> None:
        """``n`` requests sent to ``device`` were answered or dropped."""
        now = self.sim.loop.now
        self.controller.done(model, device, n, now)
        pd = self.devices[device]
        if pd.stopping:
            self.sim.loop.at(now, self._check_stop, device)

    # -- actions --------------------------------------------------------------------------
    def carry_out(self, actions: list[Action] | list[Action | ScaleAction], now: float) -> None:
        for a in actions:
            if isinstance(a, Load):
                self._start_load(a, now)
            elif isinstance(a, Unload):
                self._start_unload(a, now)
            elif isinstance(a, ScaleUp):
                self._scale_up(a.device, now)
            elif isinstance(a, ScaleDown):
                self._scale_down(a.device, now)

    def _start_load(self, a: Load, now: float) -> None:
        pd = self.devices[a.device]
        d = pd.sim_device
        prof = d.profiles[a.model]
        d.sched.begin_load(self.sim.model_setup(a.model, prof), now, prof, self.load_wait_s)
        self._note_memory(pd)
        pd.ops += 1
        pd.loading.add(a.model)
        self.sim.loop.at(now + self.controller.load_seconds(a), self._load_done, a)
        for r in pd.parked.pop(a.model, []):
            reason = d.sched.offer(r, now)
            if reason is not None:
                self.sim.drop(r, reason, a.device)

    def _load_done(self, a: Load) -> None:
        now = self.sim.loop.now
        pd = self.devices[a.device]
        pd.loading.discard(a.model)
        pd.ops -= 1
        waits = self.sim.log.load_wait_s
        for r in pd.sim_device.sched.loaded(a.model, now):
            waits[r.idx] = now - r.arrival_s
        self.controller.load_done(a.model, a.device, now)
        if a.model in pd.unload_after_load:
            pd.unload_after_load.discard(a.model)
            self._start_unload(Unload(a.model, a.device), now)
        self._sync_router(pd)
        self._check_stop(a.device)

    def _start_unload(self, a: Unload, now: float) -> None:
        pd = self.devices[a.device]
        if a.model in pd.loading:
            pd.unload_after_load.add(a.model)
            return
        self._sync_router(pd)  # no new requests for it
        pd.ops += 1
        self.sim.loop.at(now + self.unload_s, self._unload_done, a)

    def _unload_done(self, a: Unload) -> None:
        now = self.sim.loop.now
        pd = self.devices[a.device]
        pd.ops -= 1
        pd.sim_device.sched.remove_model(a.model, now)  # it has no requests (check_actions)
        self.carry_out(self.controller.unload_done(a.model, a.device, now), now)
        self._check_stop(a.device)

    def _scale_up(self, name: str, now: float) -> None:
        pd = self.devices[name]
        self.scale_ups_s.append(now)
        took = self.burst.scale_up(now)
        if took is not None:
            self.scale_up_decisions_s.append(took)
        pd.starting = True
        pd.on = True
        pd.on_since_s = now
        self.sim.loop.at(now + pd.spec.start_ms / 1000.0, self._ready, name)

    def _ready(self, name: str) -> None:
        now = self.sim.loop.now
        pd = self.devices[name]
        pd.starting = False
        pd.sim_device.sched.end_drain(now)  # empty: its models left when it stopped
        self.controller.device_ready(name, now)
        self._sync_router(pd)

    def _scale_down(self, name: str, now: float) -> None:
        pd = self.devices[name]
        pd.stopping = True
        self._sync_router(pd)
        pd.sim_device.sched.begin_drain(now)
        self.sim.loop.at(now, self._check_stop, name)

    def _check_stop(self, name: str) -> None:
        pd = self.devices[name]
        d = pd.sim_device
        if not pd.stopping or pd.ops or pd.parked or not d.sched.idle:
            return
        now = self.sim.loop.now
        for m in d.sched.models:
            d.sched.remove_model(m, now)
        self.controller.device_stopped(name, now)
        pd.stopping = False
        pd.on = False
        assert pd.on_since_s is not None
        pd.active_s += now - pd.on_since_s
        pd.on_since_s = None

    # -- upkeep ---------------------------------------------------------------------------
    def tick(self, _: object) -> None:
        sim = self.sim
        now = sim.loop.now
        ctl = self.controller
        for name, pd in self.devices.items():
            if pd.on and not pd.starting:
                ctl.utilization(name, pd.sim_device.sched.busy.fraction(now))
        self.burst.tick(ctl, now)
        self.carry_out(ctl.tick(now), now)
        nxt = now + ctl.tick_s
        if nxt <= sim.end_s:
            sim.loop.at(nxt, self.tick, None)

    def _sync_router(self, pd: _Device) -> None:
        router = self.sim.router
        assert router is not None
        d = pd.sim_device
        name = d.name
        view = self.controller.devices[name]
        ready = [] if pd.stopping or not view.active else self.controller.ready_models(name)
        router.set_models(name, ready, profiles={m: d.profiles[m] for m in ready})
        router.update_max_batch_size(name, {m: d.sched.max_batch_size[m] for m in ready})

    def _note_memory(self, pd: _Device) -> None:
        used = pd.sim_device.sched.memory.weights_bytes
        assert used <= pd.memory_bytes * (1 + 1e-12), (
            f"{pd.sim_device.name}: {used / GIB:.3f} GiB of weights over "
            f"{pd.memory_bytes / GIB:.3f} GiB"
        )
        pd.peak_weights_bytes = max(pd.peak_weights_bytes, used)

    # -- results --------------------------------------------------------------------------
    def active_s(self, name: str, end_s: float) -> float:
        pd = self.devices[name]
        return pd.active_s + (0.0 if pd.on_since_s is None else end_s - pd.on_since_s)


__all__ = ["SimPlacement"]
