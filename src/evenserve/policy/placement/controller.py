"""The placement controller: the pure state machine between a placement policy and its driver.

One object for the simulator's cluster and (later) the live ``evenserve up``: it keeps the
ClusterView a policy reads, asks the policy and the autoscaler, checks what they answer, and
sequences the actions for the driver to carry out. It never reads a clock: every event comes
with its time, and every decision goes out as a return value.

Events in: ``arrival`` (a request of a model reached the front door: the demand estimate),
``sent`` / ``done`` (requests outstanding on a device, its last use), ``load_done``,
``unload_done``, ``utilization``, ``device_ready``, ``device_stopped``, ``device_lost`` (a
worker stopped answering: its residents leave, it is out of the view until ``device_ready``),
``reconcile`` (what a device's own index says: models READY there are adopted, models it no
longer has leave).

Decisions out: ``route_miss(model, now)`` (no device has the model READY: the device where it
is LOADING, else the policy's ``on_miss``) and ``tick(now)`` (every ``interval_s`` the
policy's ``rebalance``; every ``scale_interval_s``, ``interval_s / SCALE_CHECKS_PER_INTERVAL``,
the autoscaler's ``decide``: a driver calls ``tick`` every ``tick_s``). Both return the
actions the driver starts *now*:

- an ``Unload`` is reported ``UNLOADING`` (its weights still held) until ``unload_done``; it
  counts as an eviction (every unload the policy asks for makes room or rebalances);
- a ``Load`` is reported ``LOADING`` at once (so the policy does not place the model twice
  and requests for it go there), but it is handed to the driver only when the device's
  memory holds it next to everything still resident there, UNLOADING models included. A Load
  that must wait for unloads comes out of the ``unload_done`` that frees its room (in the
  order the policy asked). ``load_seconds`` says how long a started load takes (warm or cold
  as the model was when it started);
- ``ScaleUp``: the device is *starting* (not active) until ``device_ready``; ``ScaleDown``:
  it is inactive at once (nothing new is placed or routed there), the driver drains it and
  reports ``device_stopped``; its residents leave with it (into the warm pool). Scale actions
  for a device already starting, or already stopping or off, are dropped.

The anti-thrash rule (``min_switch_s``, 0: off; design note 0022): every change of a model's
residency on a device (a Load or an Unload applied, the device stopped or lost with it) is
logged (``counts.switch_log``) and pins that (model, device) for ``min_switch_s``: the view
marks it ``DeviceView.pinned``, ``check_actions`` refuses a Load or Unload of it, and a
ScaleDown of a device with a pinned resident is dropped.

The warm pool: host memory of ``host_memory_bytes``. A model that leaves a device (an unload
done, a device stopped) and a model loaded from disk (it passed through host memory) are
warm; beyond the capacity the least recently used warm models go cold. A warm load touches
the model's place in the LRU order.

The autoscaler's demand: its view (``scale_view``) carries ``burst_rps``, per model the
larger of the ``rate_tau_s`` estimate and one over ``SCALE_RATE_TAU_S`` (0.5 s), corrected
for their start alike: it rises within about a second of a step in the offered load and
falls as slowly as the long one, so scale-up is quick and scale-down (which needs both low,
then the autoscaler's ``quiet_s``) is as conservative as before. Why the checks run more
often than rebalance: ``decide`` is a few sums over models and devices, and at a 1 s tick
a ScaleUp needs two ticks, 1-2 s after the signal crosses; at 0.25 s it comes
``up_after_s`` to ``up_after_s`` + 0.25 s after (the bound in the design note 0009).

A policy answer ``check_actions`` refuses is a bug in that policy: PlacementError is raised,
never passed on to a driver.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from evenserve.policy.batching.rate import RateEstimator
from evenserve.policy.placement.base import (
    LOADING,
    READY,
    UNLOADING,
    Action,
    Autoscaler,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    PlacementPolicy,
    ScaleAction,
    ScaleUp,
    Unload,
    check_actions,
)

#: Time constant of the per-model demand estimate placement reads (seconds): long enough
#: that a second's quiet does not look like no demand, short enough to follow a day/night
#: swing within a minute.
PLACEMENT_RATE_TAU_S = 10.0
#: Time constant of the autoscaler's fast-rising demand (seconds): a 3x step in a model's
#: rate reads as 2x after ``0.5 * ln 2`` = 0.35 s; the noise of a Poisson rate r over it is
#: about ``1 / sqrt(r)`` (10 % at 100 req/s), filtered by the autoscaler's ``up_after_s``.
SCALE_RATE_TAU_S = 0.5
#: The autoscaler decides this many times per placement interval.
SCALE_CHECKS_PER_INTERVAL = 4
#: Slack on tick times (a sum of quarter intervals may fall a hair short of the interval).
_TICK_EPS_S = 1e-9
#: The logs in ``PlacementCounts`` keep this many entries, the newest (a gateway runs for
#: weeks; a simulated run or a bench never comes near it).
LOG_MAX = 100_000


def next_due(due_s: float, every_s: float, now: float) -> float:
    """The next due time after a check due at ``due_s`` ran at ``now``: ``due_s + every_s``,
    so a driver's call a little late does not push the schedule (a tick at 2.003 s keeps the
    next at 3.0 s, not 3.003 s, where a call at 2.999 s would then find it not due and the
    rebalance would wait a whole tick); the first check, or one a whole period late, starts
    the schedule again from ``now``."""
    nxt = due_s + every_s
    return nxt if nxt > now + _TICK_EPS_S else now + every_s


class Decision(NamedTuple):
    """One decision of the controller, as it was taken (``PlacementCounts.decisions``): a
    trace to lay a live run's decisions beside the simulator's, decision by decision."""

    t_s: float
    #: What asked: ``miss`` (``route_miss``: the policy's on_miss), ``rebalance``, or
    #: ``autoscale``.
    source: str
    #: ``load`` / ``unload`` (a model on a device), ``up`` / ``down`` (a device).
    kind: str
    #: The model ("" for ``up`` / ``down``).
    model: str
    device: str
    #: The model's demand estimate then (``rate_rps``); for ``up`` / ``down`` the sum over
    #: every model of the autoscaler's (``burst_rate_rps``).
    rate_rps: float
    #: The device's utilization as the controller last heard it; for ``up`` / ``down`` the
    #: sum over the active devices (the autoscaler's other demand estimate).
    utilization: float


@dataclass(slots=True)
class PlacementCounts:
    """What the controller did, for a run's records."""

    loads: int = 0
    cold_loads: int = 0
    warm_loads: int = 0
    #: Unloads the policy asked for (to make room, or by rebalance).
    evictions: int = 0
    scale_ups: int = 0
    scale_downs: int = 0
    #: Misses the policy could not place (the request is refused with 503).
    unplaced: int = 0
    #: (time, model, device) of every load started, for tests and traces.
    load_log: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=LOG_MAX))
    #: Devices declared lost (``device_lost``: their worker stopped answering).
    lost: int = 0
    #: Models ``reconcile`` found READY on a device the controller did not count them on
    #: (loaded by hand, a worker restarted with its models), and models it counted READY
    #: that the device's index no longer lists READY (unloaded by hand, restarted empty).
    adopted: int = 0
    dropped: int = 0
    #: (time, model, device, kind) of every change of a model's residency on a device:
    #: ``load`` / ``unload`` decided, ``stopped`` / ``lost`` (it left with its device). The
    #: anti-thrash rule is about these.
    switch_log: deque[tuple[float, str, str, str]] = field(
        default_factory=lambda: deque(maxlen=LOG_MAX)
    )
    #: Every decision taken (a Load or Unload the policy asked, a scale action carried
    #: out), with what asked and the demand estimate then.
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=LOG_MAX))


class PlacementController:
    def __init__(
        self,
        models: Mapping[str, ModelInfo],
        devices: Sequence[DeviceView],
        policy: PlacementPolicy,
        autoscaler: Autoscaler | None = None,
        *,
        host_memory_bytes: float = 0.0,
        interval_s: float = 1.0,
        rate_tau_s: float = PLACEMENT_RATE_TAU_S,
        scale_rate_tau_s: float | None = None,
        scale_checks_per_interval: int | None = None,
        min_switch_s: float = 0.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if min_switch_s < 0:
            raise ValueError("min_switch_s must be >= 0")
        self.models = dict(models)
        self.devices = {d.name: d for d in devices}
        for d in devices:
            for m in d.models:
                if m not in self.models:
                    raise ValueError(f"device {d.name!r}: unknown model {m!r}")
            if d.used_bytes(self.models) > d.memory_total_bytes:
                raise ValueError(f"device {d.name!r}: its residents are over its memory")
        self.policy = policy
        self.autoscaler = autoscaler
        self.host_memory_bytes = host_memory_bytes
        self.interval_s = interval_s
        if scale_rate_tau_s is None:
            scale_rate_tau_s = SCALE_RATE_TAU_S
        checks = scale_checks_per_interval or SCALE_CHECKS_PER_INTERVAL
        self.scale_interval_s = interval_s / checks
        self._rates = {m: RateEstimator(rate_tau_s) for m in self.models}
        self._fast = {m: RateEstimator(scale_rate_tau_s) for m in self.models}
        self._fast_tau_s = scale_rate_tau_s
        self._warm: OrderedDict[str, None] = OrderedDict()
        #: Loads decided but waiting for unloads on their device, in order.
        self._pending: dict[str, list[Load]] = {d.name: [] for d in devices}
        self._load_s: dict[tuple[str, str], float] = {}
        self._starting: set[str] = set()
        self._stopping: set[str] = set()
        #: Devices whose worker was lost (``device_lost``) and has not come back yet.
        self._lost: set[str] = set()
        self._next_tick_s = 0.0
        self._next_scale_s = 0.0
        self._rate_tau_s = rate_tau_s
        #: The time of the first event: the demand estimates start there (rate_rps).
        self._start_s: float | None = None
        self.counts = PlacementCounts()
        #: The anti-thrash window, and when each (model, device) last changed (a load or an
        #: unload decided, the device stopped or lost with the model on it).
        self.min_switch_s = min_switch_s
        self._changed: dict[tuple[str, str], float] = {}

    # -- the view ---------------------------------------------------------------------------
    def view(self, now: float) -> ClusterView:
        """The cluster as the policy sees it now (the controller's own objects). A lost
        device is not in it: nothing is placed there and the autoscaler neither counts it
        nor turns it on, until its worker is back (``device_ready``)."""
        lost = self._lost
        devices = [d for d in self.devices.values() if d.name not in lost]
        if self.min_switch_s > 0:
            for d in devices:
                d.pinned = self.pinned(d.name, now)
        return ClusterView(
            now_s=now,
            models=self.models,
            devices=devices,
            rate_rps={m: self.rate_rps(m, now) for m in self._rates},
            warm=frozenset(self._warm),
            min_switch_s=self.min_switch_s,
            observed_s=0.0 if self._start_s is None else max(0.0, now - self._start_s),
        )

    def pinned(self, device: str, now: float) -> frozenset[str]:
        """The models whose residency on ``device`` changed within ``min_switch_s``."""
        w = self.min_switch_s
        return frozenset(
            m for (m, dev), t in self._changed.items() if dev == device and now - t < w
        )

    def scale_view(self, now: float) -> ClusterView:
        """The autoscaler's view: ``view(now)`` with ``burst_rps`` (``burst_rate_rps``)."""
        v = self.view(now)
        v.burst_rps = {m: self.burst_rate_rps(m, now) for m in self._rates}
        return v

    @property
    def tick_s(self) -> float:
        """How often a driver calls ``tick``: the scale interval with an autoscaler, else
        the placement interval."""
        return self.interval_s if self.autoscaler is None else self.scale_interval_s

    @property
    def warm(self) -> list[str]:
        """The warm pool, least recently used first."""
        return list(self._warm)

    def rate_rps(self, model: str, now: float) -> float:
        """The demand estimate of ``model``: the decaying count over ``rate_tau_s``,
        corrected for the estimator's start. ``t`` seconds after the first event the count
        has gathered ``1 - exp(-t / tau)`` of its weight, so it is divided by that (the
        bias correction of an exponential average started at 0): a steady rate reads as
        itself from the start, not as ramping up over several tau (without it a freshly
        started controller would see every model idle, and evict and scale as if)."""
        return self._corrected(self._rates[model].rate_at(now), now, self._rate_tau_s)

    def burst_rate_rps(self, model: str, now: float) -> float:
        """The autoscaler's demand of ``model``: the larger of ``rate_rps`` and the estimate
        over ``scale_rate_tau_s`` (rises fast, falls slow)."""
        fast = self._corrected(self._fast[model].rate_at(now), now, self._fast_tau_s)
        return max(fast, self.rate_rps(model, now))

    def _corrected(self, raw: float, now: float, tau: float) -> float:
        if self._start_s is None or now <= self._start_s:
            return raw
        return raw / -math.expm1(-(now - self._start_s) / tau)

    def _started(self, now: float) -> None:
        if self._start_s is None:
            self._start_s = now

    def start(self, now: float) -> None:
        """The demand estimates start at ``now`` (else at the first event): a driver whose
        controller was running before its first event says so (a simulation replaying a live
        gateway that started before its load)."""
        self._started(now)

    @property
    def started_s(self) -> float | None:
        """When the demand estimates started (None: no event yet)."""
        return self._start_s

    @property
    def next_rebalance_s(self) -> float:
        """When the next rebalance is due (0.0: at the first ``tick``)."""
        return self._next_tick_s

    @property
    def next_scale_s(self) -> float:
        """When the autoscaler's next check is due (0.0: at the first ``tick``)."""
        return self._next_scale_s

    def schedule(self, rebalance_s: float, scale_s: float) -> None:
        """The next rebalance and the autoscaler's next check are due then (a simulation
        replaying a live gateway's schedule; calls before then do nothing)."""
        self._next_tick_s = rebalance_s
        self._next_scale_s = scale_s

    def ready_models(self, device: str) -> list[str]:
        """The models READY on ``device`` (what a router may send there)."""
        return sorted(m for m, s in self.devices[device].models.items() if s == READY)

    def load_seconds(self, load: Load) -> float:
        """How long a started ``load`` takes (warm or cold, as it was when it started)."""
        return self._load_s[(load.model, load.device)]

    @property
    def starting(self) -> frozenset[str]:
        return frozenset(self._starting)

    @property
    def lost(self) -> frozenset[str]:
        """Devices lost (``device_lost``) and not back yet."""
        return frozenset(self._lost)

    # -- events in --------------------------------------------------------------------------
    def arrival(self, model: str, now: float) -> None:
        self._started(now)
        self._rates[model].observe(now)
        self._fast[model].observe(now)

    def sent(self, model: str, device: str, now: float) -> None:
        d = self.devices[device]
        d.outstanding[model] = d.outstanding.get(model, 0) + 1
        d.last_used_s[model] = now

    def done(self, model: str, device: str, n: int, now: float) -> None:
        d = self.devices[device]
        left = d.outstanding.get(model, 0) - n
        if left < 0:
            raise ValueError(f"done: {model!r} on {device!r}: more done than sent")
        if left:
            d.outstanding[model] = left
        else:
            d.outstanding.pop(model, None)

    def utilization(self, device: str, value: float) -> None:
        self.devices[device].utilization = value

    def load_done(self, model: str, device: str, now: float) -> None:
        d = self.devices[device]
        if d.models.get(model) == LOADING:
            d.models[model] = READY
        # (An Unload asked while it loaded left it UNLOADING: its unload_done follows.)

    def unload_done(self, model: str, device: str, now: float) -> list[Action]:
        """``model`` left ``device``; returns the waiting loads that now fit there (start
        them)."""
        d = self.devices[device]
        if d.models.get(model) != UNLOADING:
            raise ValueError(f"unload_done: {model!r} is not unloading on {device!r}")
        del d.models[model]
        self._make_warm(model)
        return list(self._start_pending(device, now))

    def device_ready(self, device: str, now: float) -> None:
        """``device``'s worker is up (turned on, or a lost one back): active, nothing
        resident until its index says otherwise (``reconcile``)."""
        d = self.devices[device]
        self._starting.discard(device)
        self._lost.discard(device)
        d.active = True
        d.models.clear()
        d.utilization = 0.0

    def device_stopped(self, device: str, now: float) -> None:
        """``device`` is off (drained): its residents leave it (into the warm pool)."""
        d = self.devices[device]
        if any(d.outstanding.values()):
            raise ValueError(f"device_stopped: {device!r} still has requests outstanding")
        self._stopping.discard(device)
        d.active = False
        for m in list(d.models):
            self._switch(m, device, now, "stopped")
            self._make_warm(m)
        d.models.clear()
        self._pending[device] = []
        d.utilization = 0.0

    def device_lost(self, device: str, now: float) -> list[str]:
        """``device``'s worker stopped answering (ejected, not on purpose): it is inactive
        and out of the view, its residents leave it (not into the warm pool: nothing says
        its host memory survived), and the loads waiting for room there are forgotten. A
        model without another replica is a miss again. Returns the models that were
        LOADING there (started or waiting): whoever waits for those loads must be answered
        now (their ``load_done`` will change nothing). Only an active device that is not
        stopping can be lost (a device the autoscaler turned off, or one starting, is not:
        ``[]``). Its ``outstanding`` counts stay: each request sent there is still answered
        (as failed) with ``done``. ``device_ready`` brings it back."""
        d = self.devices[device]
        if not d.active or device in self._stopping or device in self._lost:
            return []
        loading = sorted(m for m, s in d.models.items() if s == LOADING)
        for m in list(d.models):
            self._switch(m, device, now, "lost")
        self._lost.add(device)
        d.active = False
        d.models.clear()
        self._pending[device] = []
        d.utilization = 0.0
        self.counts.lost += 1
        return loading

    def reconcile(self, device: str, index: Mapping[str, str], now: float) -> list[Action]:
        """What ``device``'s own repository index says (model -> state), with the driver's
        loads and unloads under way already written over it (those win). A catalogue model
        READY there that the controller does not count (loaded by hand, or the worker
        restarted with it) is adopted READY: its memory counts, a policy may evict it like
        any other. If that puts the device over its memory (the worker accepted the load,
        so its real memory allowed it) it is adopted anyway: ``free_bytes`` reads 0 and no
        load is planned or started there until unloads make room (``check_actions`` and
        the start of a waiting load both check the cap). A model the controller counts READY
        that the index does not list at all, or lists UNAVAILABLE, leaves the view (not
        into the warm pool); LOADING or UNLOADING in the index leaves it as it is (a change
        under way). A model the controller is about to load (waiting for room) found READY
        is adopted and its load forgotten. A device that is not active (off, starting,
        stopping, lost) is not reconciled. Returns the waiting loads that now fit there."""
        d = self.devices[device]
        if not d.active or device in self._lost:
            return []
        changed = False
        for m in sorted(index):
            if index[m] != READY or m not in self.models:
                continue
            state = d.models.get(m)
            if state is None:
                d.models[m] = READY
                self.counts.adopted += 1
            elif state == LOADING and self._is_pending(device, m):
                self._pending[device] = [p for p in self._pending[device] if p.model != m]
                d.models[m] = READY
                self.counts.adopted += 1
                changed = True
        for m, state in list(d.models.items()):
            if state == READY and index.get(m, "UNAVAILABLE") == "UNAVAILABLE":
                del d.models[m]
                self.counts.dropped += 1
                changed = True
        return list(self._start_pending(device, now)) if changed else []

    # -- decisions out ----------------------------------------------------------------------
    def route_miss(self, model: str, now: float) -> tuple[str | None, list[Action]]:
        """Where a request for ``model`` goes when no active device has it READY: the device
        loading it (no actions), else where the policy's ``on_miss`` loads it (and the
        actions to start now); ``(None, [])``: it cannot be placed now (refuse with 503)."""
        view = self.view(now)
        hosts = view.hosts(model)
        if hosts:
            ready = [d for d in hosts if d.models[model] == READY]
            pick = min(ready or hosts, key=lambda d: (d.outstanding.get(model, 0), d.name))
            return pick.name, []
        proposed = self.policy.on_miss(model, view)
        if not proposed:
            self.counts.unplaced += 1
            return None, []
        self._check(view, proposed, "on_miss")
        target = [a for a in proposed if isinstance(a, Load) and a.model == model]
        if not target:
            raise PlacementError(f"on_miss({model!r}): no Load of {model!r} in {proposed}")
        started = self._apply(proposed, now, "miss")
        return target[-1].device, started

    def tick(self, now: float) -> list[Action | ScaleAction]:
        """Every ``interval_s`` the policy's rebalance, then every ``scale_interval_s`` the
        autoscaler's decision (calls in between do nothing); returns what to start now."""
        self._started(now)
        out: list[Action | ScaleAction] = []
        if now >= self._next_tick_s - _TICK_EPS_S:
            self._next_tick_s = next_due(self._next_tick_s, self.interval_s, now)
            view = self.view(now)
            proposed = self.policy.rebalance(view)
            if proposed:
                self._check(view, proposed, "rebalance")
                out.extend(self._apply(proposed, now, "rebalance"))
        if self.autoscaler is not None and now >= self._next_scale_s - _TICK_EPS_S:
            self._next_scale_s = next_due(self._next_scale_s, self.scale_interval_s, now)
            for s in self.autoscaler.decide(self.scale_view(now)):
                if self._scale(s, now):
                    out.append(s)
        return out

    # -- internals --------------------------------------------------------------------------
    def _check(self, view: ClusterView, actions: Iterable[Action], where: str) -> None:
        try:
            check_actions(view, actions)
        except PlacementError as exc:
            raise PlacementError(f"placement policy {where}: {exc}") from exc

    def _apply(self, actions: Sequence[Action], now: float, source: str) -> list[Action]:
        started: list[Action] = []
        touched: set[str] = set()
        for a in actions:
            d = self.devices[a.device]
            kind = "unload" if isinstance(a, Unload) else "load"
            self._switch(a.model, a.device, now, kind)
            self.counts.decisions.append(
                Decision(
                    now, source, kind, a.model, a.device, self.rate_rps(a.model, now),
                    d.utilization,
                )
            )  # fmt: skip
            if isinstance(a, Unload):
                self.counts.evictions += 1
                pend = self._pending[a.device]
                waiting = [p for p in pend if p.model == a.model]
                if waiting:  # its load never started: forget it, nothing to unload
                    pend.remove(waiting[0])
                    del d.models[a.model]
                    touched.add(a.device)
                    continue
                d.models[a.model] = UNLOADING
                started.append(a)
            else:
                d.models[a.model] = LOADING
                self._pending[a.device].append(a)
                touched.add(a.device)
        for name in sorted(touched):
            started.extend(self._start_pending(name, now))
        return started

    def _start_pending(self, device: str, now: float) -> Iterable[Load]:
        """Start the waiting loads of ``device`` that fit, in order (a load that does not fit
        holds back those after it: first come, first served)."""
        d = self.devices[device]
        pend = self._pending[device]
        while pend:
            load = pend[0]
            others = sum(
                self.models[m].device_bytes
                for m, s in d.models.items()
                if m != load.model and not (s == LOADING and self._is_pending(device, m))
            )
            if others + self.models[load.model].device_bytes > d.memory_total_bytes:
                return
            pend.pop(0)
            warm = load.model in self._warm
            info = self.models[load.model]
            self._load_s[(load.model, load.device)] = info.warm_load_s if warm else info.cold_load_s
            self.counts.loads += 1
            if warm:
                self.counts.warm_loads += 1
            else:
                self.counts.cold_loads += 1
            self.counts.load_log.append((now, load.model, load.device))
            self._make_warm(load.model)  # a cold load passes through host memory
            yield load

    def _switch(self, model: str, device: str, now: float, kind: str) -> None:
        self._changed[(model, device)] = now
        self.counts.switch_log.append((now, model, device, kind))

    def _is_pending(self, device: str, model: str) -> bool:
        return any(p.model == model for p in self._pending[device])

    def _make_warm(self, model: str) -> None:
        w = self._warm
        w[model] = None
        w.move_to_end(model)
        cap = self.host_memory_bytes
        while w and sum(self.models[m].weights_bytes for m in w) > cap:
            w.popitem(last=False)

    def _scale(self, s: ScaleAction, now: float | None = None) -> bool:
        d = self.devices.get(s.device)
        if d is None:
            raise PlacementError(f"autoscaler: no device {s.device!r}")
        if s.device in self._lost:
            return False  # its worker is gone: it comes back on its own (device_ready)
        if isinstance(s, ScaleUp):
            if d.active or s.device in self._starting:
                return False
            if s.device in self._stopping:
                return False  # it is still draining: ask again once it is off
            self._starting.add(s.device)
            self.counts.scale_ups += 1
            self._log_scale("up", s.device, now)
            return True
        if not d.active or s.device in self._stopping:
            return False
        if any(st == LOADING and self._is_pending(s.device, m) for m, st in d.models.items()):
            return False  # a load waits for room there: not now
        if (
            now is not None
            and self.min_switch_s > 0
            and self.pinned(s.device, now) & d.models.keys()
        ):
            return False  # a resident changed there within the anti-thrash window
        d.active = False
        self._stopping.add(s.device)
        self.counts.scale_downs += 1
        self._log_scale("down", s.device, now)
        return True

    def _log_scale(self, kind: str, device: str, now: float | None) -> None:
        if now is not None:
            rps = sum(self.burst_rate_rps(m, now) for m in self._rates)
            util = sum(d.utilization for d in self.devices.values() if d.active)
            self.counts.decisions.append(Decision(now, "autoscale", kind, "", device, rps, util))


__all__ = [
    "LOG_MAX",
    "PLACEMENT_RATE_TAU_S",
    "SCALE_CHECKS_PER_INTERVAL",
    "SCALE_RATE_TAU_S",
    "Decision",
    "PlacementController",
    "PlacementCounts",
    "next_due",
]
