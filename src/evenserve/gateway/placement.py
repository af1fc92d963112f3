"""The gateway's placement driver: the live side of ``policy.placement.controller``.

When the cluster file has ``gateway.placement``, the gateway owns one PlacementController
(the same object the simulator drives, ``sim/placement.py``) and this driver feeds it and
carries out what it decides, through the workers' model-control API. Without placement none
of this exists and the request path does not change (the dispatcher tests one attribute for
None).

Events in (the same sequence as the simulator's):
- ``arrival``: every inference request for a catalogue model (one RateEstimator update);
- ``sent`` / ``done``: from the dispatcher's own try bookkeeping (``_pick`` / ``_done``);
- ``utilization``: every tick, from each device's newest load report: its
  ``engine_utilization`` where it has LLMs (the load the simulator's device reports with an
  engine on it, ``policy.placement.engine``), else the router's view of its busy fraction;
- ``load_done`` / ``unload_done``: the HTTP answers of the load/unload POSTs this driver makes;
- ``device_ready``: the registry admits a device the autoscaler turned on (its worker is up);
- ``device_stopped``: the launcher says the drained worker it stopped has exited;
- ``device_lost``: the registry ejects an active device (refused connects, probes without
  an answer, a not-ready answer, a forward timeout) that the autoscaler did not turn off.
  Its residents leave the controller's view, the requests waiting for a load there are
  placed again (``wait``), its backend index is emptied and read afresh, and it stops
  counting device-seconds; its next admission is ``device_ready`` (it counts again);
- ``reconcile``: every index the poller reads from a backend (``on_index_read``), with this
  driver's loads and unloads under way written over it (``ModelOperations.override``):
  models READY there are adopted, models the controller counts READY that the index no
  longer has leave.

Decisions out:
- **miss** (``miss``): an inference request for a catalogue model no healthy backend has
  READY. ``route_miss`` gives the device (where it is LOADING, else where the policy loads
  it, after unloads) and the actions to start now; this driver starts them as tasks and the
  request waits *in the gateway* for that load's answer (at most ``load_wait_ms``), then goes
  through the normal tries (the model is READY there by then). Waiting here rather than on
  the worker avoids a race: a request sent just after the load POST could reach the worker
  before the load has begun and be answered "not loaded". ``None``: 503 with Retry-After,
  naming the model and why (no device can hold it now).
- **tick** (every ``interval_ms``): rebalance actions are carried out the same way; a
  ScaleUp is published on ``GET /admin/scale`` (``start``) for the launcher, a ScaleDown
  holds the device out of routing at once and is published as ``stop`` once nothing is
  outstanding there (``device_scaling``, which also keeps the device-seconds).

An Unload is started only when the controller says (its check: nothing outstanding there);
the model leaves the router's set at once (the backend's index shows it UNLOADING), so no
new request is sent for it meanwhile. A Load that waits for unloads comes out of their
``unload_done``. A load the worker refuses (or a lost connection) takes the model off the
device in the controller's view and answers the requests waiting for it with 503. The loads
and unloads under way are ``model_operations``; the catalogue and devices come from the
cluster file (``placement_catalogue``); the counters, metrics and admin view are
``placement_report``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.registry import Collector

from evenserve.cluster.gateway_section import PlacementSettings
from evenserve.core.clock import Clock
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.device_scaling import DeviceBook, DeviceScaling
from evenserve.gateway.model_operations import Lost, ModelOperations, Post
from evenserve.gateway.placement_catalogue import GIB, DeviceSetup
from evenserve.gateway.placement_counters import PlacementCounters, bump
from evenserve.gateway.placement_report import PlacementCollector, placement_view
from evenserve.policy.placement import (
    AUTOSCALING,
    LOADING,
    PLACEMENT,
    READY,
    UNLOADING,
    Action,
    DeviceView,
    Load,
    ModelInfo,
    ScaleAction,
    ScaleUp,
    Unload,
)
from evenserve.policy.placement.controller import PlacementController, next_due

log = logging.getLogger("evenserve.gateway.placement")


@dataclass
class PlacementDriver:
    registry: BackendRegistry
    clock: Clock
    controller: PlacementController
    settings: PlacementSettings
    post: Post
    counters: PlacementCounters = field(default_factory=PlacementCounters)
    ops: ModelOperations = field(init=False)
    scaling: DeviceScaling = field(init=False)
    _loop_task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.ops = ModelOperations(self.registry, self.post, self.counters)
        self.scaling = DeviceScaling(self.counters)

    @classmethod
    def build(
        cls,
        registry: BackendRegistry,
        clock: Clock,
        settings: PlacementSettings,
        autoscaling: Any,
        models: Mapping[str, ModelInfo],
        devices: Sequence[DeviceSetup],
        post: Post,
    ) -> PlacementDriver:
        views = [
            DeviceView(d.name, d.memory_bytes, dict.fromkeys(d.models, READY), active=d.active)
            for d in devices
        ]
        ctl = PlacementController(
            models,
            views,
            PLACEMENT.build(settings.policy, where="gateway.placement"),
            None
            if autoscaling is None
            else AUTOSCALING.build(autoscaling, where="gateway.autoscaling"),
            host_memory_bytes=settings.host_memory_gb * GIB,
            interval_s=settings.interval_ms / 1000.0,
            min_switch_s=settings.min_switch_s,
        )
        drv = cls(registry, clock, ctl, settings, post)
        now = clock.now()
        drv.scaling.books = {
            d.name: DeviceBook(d.active, now if d.active else None) for d in devices
        }
        registry.catalogue = frozenset(models)
        registry.on_admit = drv._admitted
        registry.index_override = drv.ops.override
        registry.on_index_read = drv._index_read
        before = registry.on_eject

        def ejected(name: str, reason: str) -> None:
            if before is not None:
                before(name, reason)
            drv._ejected(name, reason)

        registry.on_eject = ejected
        for d in devices:
            if not d.active:
                registry.hold(d.name, "off (a spare: the autoscaler turns it on)")
        return drv

    @property
    def load_wait_s(self) -> float:
        return self.settings.load_wait_ms / 1000.0

    # -- the request path (O(1) each) ------------------------------------------------------
    def arrival(self, model: str) -> None:
        ctl = self.controller
        if model in ctl.models:
            now = self.clock.now()
            ctl.arrival(model, now)
            self.scaling.burst.arrival(now)

    def sent(self, model: str, backend: str) -> None:
        ctl = self.controller
        if backend in ctl.devices and model in ctl.models:
            ctl.sent(model, backend, self.clock.now())

    def done(self, model: str, backend: str) -> None:
        ctl = self.controller
        if backend in ctl.devices and model in ctl.models:
            ctl.done(model, backend, 1, self.clock.now())

    def handles(self, model: str) -> bool:
        return model in self.controller.models

    def miss(self, model: str) -> tuple[str | None, asyncio.Future[str | None] | None, str]:
        """A request for ``model`` found no READY healthy host: (device, what to wait for,
        "") or (None, None, why it cannot be placed now)."""
        now = self.clock.now()
        dev, actions = self.controller.route_miss(model, now)
        self.carry_out(actions)
        if dev is None:
            return (
                None,
                None,
                (
                    f"model {model!r} is not resident on any device and no device can hold it now "
                    f"(placement {self.policy_name}: not enough free or evictable memory)"
                ),
            )
        state = self.controller.devices[dev].models.get(model)
        if state == READY:  # READY in the controller's view: nothing to wait for
            fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return dev, fut, ""
        return dev, self.ops.waiter(model, dev), ""

    async def wait(self, model: str, dev: str, fut: asyncio.Future[str | None]) -> str | None:
        """Wait for the load of ``model`` on ``dev``; None when READY, else why not. If
        ``dev`` is lost meanwhile the model is placed again (``miss``) and the wait goes on
        for that load, within the same ``load_wait_ms``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.load_wait_s
        while True:
            try:
                err = await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return (
                    f"model {model!r} is still loading on {dev} after "
                    f"{self.settings.load_wait_ms:g} ms"
                )
            if not isinstance(err, Lost):
                return err
            again, nxt, why = self.miss(model)
            if again is None or nxt is None:
                return f"{err}; {why}"
            dev, fut = again, nxt

    @property
    def policy_name(self) -> str:
        p = self.settings.policy
        return p if isinstance(p, str) else str(p.get("policy"))

    # -- carrying out ----------------------------------------------------------------------
    def carry_out(self, actions: Sequence[Action | ScaleAction]) -> None:
        for a in actions:
            if isinstance(a, Unload):
                self.ops.begin(a, self.ops.unload(a, self._unloaded))
            elif isinstance(a, Load):
                self.ops.begin(a, self.ops.load(a, self._loaded))
            elif isinstance(a, ScaleUp):
                self.scaling.scale_up(a.device, self.clock.now())
                self.registry.release(a.device)
            else:
                self.scaling.scale_down(a.device)
                self.registry.hold(a.device, "scaling down (draining)")
                self._check_drained(a.device)

    def _loaded(self, a: Load, err: str | None) -> None:
        """The worker's answer to a load (``err``: why it did not load)."""
        ctl = self.controller
        d = ctl.devices[a.device]
        if err is None:
            ctl.load_done(a.model, a.device, self.clock.now())
            if d.models.get(a.model) == READY:
                self.ops.set_state(a.device, a.model, READY)
            log.info("placement: loaded %s on %s", a.model, a.device)
        else:
            log.warning("placement: load of %s on %s failed: %s", a.model, a.device, err)
            if d.models.get(a.model) == LOADING:
                del d.models[a.model]  # it is not there: the controller must not count it
            self.ops.set_state(a.device, a.model, None)
        why = None if err is None else f"the load of model {a.model!r} on {a.device} failed ({err})"
        self.ops.answer(a.model, a.device, why)

    def _unloaded(self, a: Unload) -> None:
        ctl = self.controller
        if ctl.devices[a.device].models.get(a.model) == UNLOADING:
            self.ops.set_state(a.device, a.model, None)
            self.carry_out(ctl.unload_done(a.model, a.device, self.clock.now()))

    # -- scaling ---------------------------------------------------------------------------
    def _busy(self, dev: str) -> bool:
        """Something outstanding on ``dev``, or a load or unload under way there (a draining
        device stops once it answered)."""
        return any(self.controller.devices[dev].outstanding.values()) or self.ops.busy(dev)

    def _check_drained(self, dev: str) -> None:
        self.scaling.check_drained(dev, self._busy(dev))

    def _admitted(self, dev: str) -> None:
        """The registry admitted ``dev``: a device turned on is ready (device_ready); a lost
        one is back (device_ready, then what its index says now: reconcile)."""
        ctl = self.controller
        if dev in ctl.starting:
            ctl.device_ready(dev, self.clock.now())
            self.scaling.books[dev].scale = None
            log.warning("placement: %s is ready", dev)
        elif dev in ctl.lost:
            now = self.clock.now()
            ctl.device_ready(dev, now)
            self.scaling.books[dev].turn_on(now)
            log.warning("placement: %s is back", dev)
            self._index_read(dev)

    def stopped(self, dev: str) -> None:
        """The launcher stopped ``dev``'s worker (drained): device_stopped."""
        now = self.clock.now()
        self.scaling.stopped(dev, now)
        self.controller.device_stopped(dev, now)
        self.ops.forget_index(dev, read_again=False)
        log.warning("placement: %s is off", dev)

    def scale_requests(self) -> list[dict[str, str]]:
        """What the launcher is asked to do now: ``start`` or ``stop`` a device."""
        return self.scaling.requests(self._busy)

    def active_seconds(self) -> dict[str, float]:
        return self.scaling.active_seconds(self.clock.now())

    # -- a lost device, and reconciliation ------------------------------------------------
    def _ejected(self, dev: str, reason: str) -> None:
        """The registry ejected ``dev``: if it was on (not turned off by the autoscaler),
        it is lost (``device_lost``)."""
        ctl = self.controller
        if dev not in ctl.devices or dev in ctl.lost:
            return
        now = self.clock.now()
        loading = ctl.device_lost(dev, now)
        if dev not in ctl.lost:
            return  # off, starting or stopping: not lost
        bump(self.counters.lost, dev)
        self.scaling.books[dev].turn_off(now)
        self.ops.lose(dev, reason)
        # What it hosts is unknown now: read its index afresh when back.
        self.ops.forget_index(dev, read_again=True)
        log.warning(
            "placement: %s lost (%s): its models leave it%s",
            dev,
            reason,
            f"; loads of {', '.join(loading)} there are placed again" if loading else "",
        )

    def _index_read(self, dev: str) -> None:
        """An index of ``dev`` was read (or ``dev`` is back): reconcile the controller's
        view of it with that index (this driver's operations under way written over it)."""
        ctl = self.controller
        st = self.registry.states.get(dev)
        if dev not in ctl.devices or st is None:
            return
        d = ctl.devices[dev]
        before = dict(d.models)
        started = ctl.reconcile(dev, st.index, self.clock.now())
        after = d.models
        for m, s in after.items():
            if s == READY and before.get(m) in (None, LOADING):
                bump(self.counters.adopted, (dev, m))
                self.ops.answer(m, dev, None)  # its load was waiting for room
                over = d.used_bytes(ctl.models) > d.memory_total_bytes
                log.warning(
                    "placement: %s READY on %s (not loaded by placement): adopted%s",
                    m,
                    dev,
                    "; the device is over its memory: no loads there until room" if over else "",
                )
        for m, s in before.items():
            if s == READY and m not in after:
                bump(self.counters.dropped, (dev, m))
                log.warning("placement: %s is no longer on %s (its index): dropped", m, dev)
        self.carry_out(started)

    # -- the tick --------------------------------------------------------------------------
    def tick(self) -> None:
        """One placement interval: utilization in, then rebalance and scale out."""
        ctl = self.controller
        now = self.clock.now()
        router = self.registry.router
        states = self.registry.states
        for name, d in ctl.devices.items():
            if d.active:
                st = states.get(name)
                eu = None if st is None else st.engine_utilization
                u = eu if eu is not None else router.view(name).utilization
                if u is not None and math.isfinite(u):
                    ctl.utilization(name, u)
        self.scaling.burst.tick(ctl, now)
        self.carry_out(ctl.tick(now))
        for name in self.scaling.books:
            self._check_drained(name)

    async def run(self) -> None:
        """Call ``tick`` every ``tick_s`` on a fixed schedule (a late wake-up does not push
        the next: the ticks stay where the simulator's are, ``tick_s`` apart; a call a whole
        period late starts the schedule again from then)."""
        every = self.controller.tick_s
        due = self.clock.now() + every
        while True:
            await asyncio.sleep(max(0.0, due - self.clock.now()))
            try:
                self.tick()
            except Exception:  # a bug in a policy must not stop placement for good
                log.exception("placement tick failed")
            due = next_due(due, every, self.clock.now())

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self.ops.tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def collector(self) -> Collector:
        return PlacementCollector(self.counters, self.active_seconds)

    def view(self) -> dict[str, Any]:
        """``GET /admin/placement`` (``placement_report.placement_view``)."""
        now = self.clock.now()
        ctl, ops = self.controller, self.ops
        return placement_view(
            ctl,
            self.settings,
            self.counters,
            self.scaling,
            ops,
            now,
            self.scale_requests,
            wall_offset_s=self.scaling.wall() - now,
        )
