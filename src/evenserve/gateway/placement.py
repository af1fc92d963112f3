"""The gateway's placement driver: the live side of ``policy.placement.controller``.

When the cluster file has ``gateway.placement``, the gateway owns one PlacementController
(the same object the simulator drives, ``sim/placement.py``) and this driver feeds it and
carries out what it decides, through the workers' model-control API. Without placement none
of this exists and the request path does not change (the dispatcher tests one attribute for
None).

Events in (the same sequence as the simulator's):
- ``arrival``: every inference request for a catalogue model (one RateEstimator update);
- ``sent`` / ``done``: from the dispatcher's own try bookkeeping (``_pick`` / ``_done``);
- ``utilization``: every tick, from each device's newest load report (the router's view);
- ``load_done`` / ``unload_done``: the HTTP answers of the load/unload POSTs this driver makes;
- ``device_ready``: the registry admits a device the autoscaler turned on (its worker is up);
- ``device_stopped``: the launcher says the drained worker it stopped has exited;
- ``device_lost``: the registry ejects an active device (refused connects, probes without
  an answer, a not-ready answer, a forward timeout) that the autoscaler did not turn off.
  Its residents leave the controller's view, the requests waiting for a load there are
  placed again (``wait``), its backend index is emptied and read afresh, and it stops
  counting device-seconds; its next admission is ``device_ready`` (it counts again);
- ``reconcile``: every index the poller reads from a backend (``on_index_read``), with this
  driver's loads and unloads under way written over it (``_override``): models READY there
  are adopted, models the controller counts READY that the index no longer has leave.

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
  holds the device out of routing at once, and once nothing is outstanding there it is
  published as ``stop`` (the launcher sends SIGTERM, the worker drains again and exits, and
  the launcher POSTs ``stopped``).

An Unload is started only when the controller says (its check: nothing outstanding there);
the model leaves the router's set at once (the backend's index shows it UNLOADING), so no
new request is sent for it meanwhile. A Load that waits for unloads comes out of their
``unload_done``. A load the worker refuses (or a lost connection) takes the model off the
device in the controller's view and answers the requests waiting for it with 503.

Device-seconds (the cost): a device counts from its ScaleUp decision (or from the start for
an active one) until it is stopped or lost, as in the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from evenserve.cluster.file import LoadedCluster
from evenserve.cluster.gateway_section import PlacementSettings
from evenserve.core.clock import Clock
from evenserve.core.profile import LatencyProfile
from evenserve.core.scenario import default_load_times_s
from evenserve.gateway.backends import BackendRegistry
from evenserve.metrics import names
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
from evenserve.policy.placement.autoscale import demand_devices
from evenserve.policy.placement.burst import BurstClock
from evenserve.policy.placement.controller import PlacementController

log = logging.getLogger("evenserve.gateway.placement")

GIB = 1024.0**3
#: Memory of a device whose size the cluster file does not give (DeviceOptions' default).
DEFAULT_MEMORY_GB = 24.0

#: POST ``path`` on backend ``name``: (status, body); raises on a lost connection.
Post = Callable[[str, str], Awaitable[tuple[int, bytes]]]


def model_info(
    name: str,
    profile: LatencyProfile | None,
    max_batch_size: int | None = None,
    load_s: float | None = None,
    warm_load_s: float | None = None,
) -> ModelInfo:
    """A catalogue entry: weights from the profile (0 without one), cold and warm load times
    with the scenario's defaults (``core.scenario.default_load_times_s``; ``load_s`` and
    ``warm_load_s``, the model's own, replace them), batch time and size from the profile at
    the batching cap (default: the profile's largest batch)."""
    weights = profile.weights_bytes if profile is not None else 0.0
    cold, warm = default_load_times_s(weights)
    if load_s is not None:
        cold = load_s
    if warm_load_s is not None:
        warm = warm_load_s
    if profile is None:
        return ModelInfo(name, weights, cold, warm, 0.0, max_batch_size or 1)
    cap = max_batch_size or max(profile.batches, default=1)
    return ModelInfo.from_profile(name, profile, cap, cold, warm)


@dataclass(frozen=True)
class DeviceSetup:
    """One device the controller manages (a worker device or an evenserve backend)."""

    name: str
    memory_bytes: float
    models: tuple[str, ...]
    active: bool = True


def cluster_setup(
    cluster: LoadedCluster, profile_sets: Mapping[str, Mapping[str, LatencyProfile]]
) -> tuple[dict[str, ModelInfo], list[DeviceSetup]]:
    """The catalogue and devices of a cluster file: every worker device (its ``memory_gb``,
    its configured models, active or a spare) and every listed evenserve backend (24 GiB);
    the catalogue is the repository's models and every configured one, each described by
    the first profile set that has it."""
    devices: list[DeviceSetup] = []
    names_: set[str] = set()
    w = cluster.config.workers
    if w is not None:
        repo = cluster.repo_models()
        names_.update(repo)
        for d in w.devices:
            models = tuple(d.models if d.models is not None else repo)
            names_.update(models)
            devices.append(
                DeviceSetup(d.name, d.memory_gb * GIB, models if d.active else (), d.active)
            )
    for b in cluster.config.backends:
        if b.signals.source != "evenserve":
            continue
        models = tuple(b.models or ())
        names_.update(models)
        devices.append(DeviceSetup(b.name, DEFAULT_MEMORY_GB * GIB, models))
    infos: dict[str, ModelInfo] = {}
    for m in sorted(names_):
        em = emulated_section(cluster, m)
        pname = em.get("profile_name")
        key = pname if isinstance(pname, str) else m
        prof = next((ps[key] for ps in profile_sets.values() if key in ps), None)
        load_s, warm_s = (_seconds(em.get(k)) for k in ("load_ms", "warm_load_ms"))
        infos[m] = model_info(m, prof, load_s=load_s, warm_load_s=warm_s)
    return infos, devices


def _seconds(ms: Any) -> float | None:
    return None if isinstance(ms, bool) or not isinstance(ms, int | float) else ms / 1e3


def emulated_section(cluster: LoadedCluster, model: str) -> dict[str, Any]:
    """The ``emulated:`` section of a repository model's model.yaml ({} if none): its
    ``profile_name`` (the profile in the device's set, default the model's name) and its
    ``load_ms`` and ``warm_load_ms`` (what the emulated worker sleeps for a cold and a warm
    load), so the controller plans with the weights and the load times the worker has."""
    w = cluster.config.workers
    if w is None:
        return {}
    path = cluster.resolve(w.repo) / model / "model.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    em = raw.get("emulated") if isinstance(raw, dict) else None
    return em if isinstance(em, dict) else {}


class _Lost(str):
    """A load's answer when its device was lost meanwhile: the request places it again."""


class _Collector(Collector):
    def __init__(self, driver: PlacementDriver) -> None:
        self.driver = driver

    def collect(self) -> Iterator[Metric]:
        d = self.driver
        for name, text, counts in (
            (names.GATEWAY_MODEL_LOADS, "model loads the gateway started", d.loads),
            (names.GATEWAY_EVICTIONS, "model unloads the gateway started", d.evictions),
            (
                names.GATEWAY_PLACEMENT_ADOPTED,
                "models placement adopted from a backend's index (loaded by hand, a restart)",
                d.adopted,
            ),
            (
                names.GATEWAY_PLACEMENT_DROPPED,
                "models placement counted READY that a backend's index no longer had",
                d.dropped,
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["backend", "model"])
            for (b, m), n in sorted(counts.items()):
                family.add_metric([b, m], n)
            yield family
        act = CounterMetricFamily(
            names.GATEWAY_DEVICE_ACTIVE_SECONDS,
            "seconds each device was on (device-seconds: the cost)",
            labels=["backend"],
        )
        for b, s in sorted(d.active_seconds().items()):
            act.add_metric([b], s)
        yield act
        lost = CounterMetricFamily(
            names.GATEWAY_DEVICES_LOST,
            "times a device on was lost (ejected, not turned off by the autoscaler)",
            labels=["backend"],
        )
        for b, n in sorted(d.lost.items()):
            lost.add_metric([b], n)
        yield lost
        sc = CounterMetricFamily(
            names.GATEWAY_SCALE_DECISIONS, "autoscaler decisions", labels=["direction"]
        )
        for direction, n in sorted(d.scale_decisions.items()):
            sc.add_metric([direction], n)
        yield sc
        up = GaugeMetricFamily(
            names.GATEWAY_SCALE_UP_DECISION_SECONDS,
            "seconds from the first request of the interval whose demand estimate first "
            "exceeded the devices to the ScaleUp decision (the last one)",
        )
        up.add_metric([], math.nan if d.last_scale_up_s is None else d.last_scale_up_s)
        yield up

    def describe(self) -> Iterator[Metric]:
        return iter(())


@dataclass
class _DeviceBook:
    on: bool
    on_since_s: float | None
    active_s: float = 0.0
    #: What the launcher is asked to do: "start", "drain" (waiting for outstanding), "stop".
    scale: str | None = None


@dataclass
class PlacementDriver:
    registry: BackendRegistry
    clock: Clock
    controller: PlacementController
    settings: PlacementSettings
    post: Post
    loads: dict[tuple[str, str], int] = field(default_factory=dict)
    evictions: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Loads done as the workers' replies say they came: from the host pool or from disk.
    live_sources: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    scale_decisions: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    #: Seconds from the first request of the last burst to its ScaleUp (None: none yet).
    last_scale_up_s: float | None = None
    scale_up_log: list[float] = field(default_factory=list)
    #: Per device, how many times it was lost; per (device, model), adoptions and drops.
    lost: dict[str, int] = field(default_factory=dict)
    adopted: dict[tuple[str, str], int] = field(default_factory=dict)
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Per device, bumped when it is lost: a load or unload begun before answers nothing.
    _gen: dict[str, int] = field(default_factory=dict)
    #: The wall time (Unix seconds) of every ScaleUp decision, for a bench to measure the
    #: decision time from its own burst's start (``/admin/placement`` ``scale_ups_unix_s``).
    scale_up_unix_s: list[float] = field(default_factory=list)
    wall: Callable[[], float] = time.time
    _books: dict[str, _DeviceBook] = field(default_factory=dict)
    #: A future per load decided (model, device): None when READY, else the error.
    _waiters: dict[tuple[str, str], asyncio.Future[str | None]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    #: Loads and unloads under way, (device, model) -> LOADING | UNLOADING: they override
    #: what the backend's index says until their answer (an index read just before the
    #: worker began must not make an unloading model routable again).
    _ops: dict[tuple[str, str], str] = field(default_factory=dict)
    _loop_task: asyncio.Task[None] | None = None
    #: The first arrival since the last tick, and the start of the burst in progress.
    _burst: BurstClock = field(default_factory=BurstClock)

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
        )
        drv = cls(registry, clock, ctl, settings, post)
        now = clock.now()
        drv._books = {d.name: _DeviceBook(d.active, now if d.active else None) for d in devices}
        registry.catalogue = frozenset(models)
        registry.on_admit = drv._admitted
        registry.index_override = drv._override
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
            self._burst.arrival(now)

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
        return dev, self._waiter(model, dev), ""

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
            if not isinstance(err, _Lost):
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
    def _waiter(self, model: str, dev: str) -> asyncio.Future[str | None]:
        key = (model, dev)
        fut = self._waiters.get(key)
        if fut is None or fut.done():
            fut = self._waiters[key] = asyncio.get_running_loop().create_future()
        return fut

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _override(self, dev: str, index: dict[str, str]) -> dict[str, str]:
        ops = [(m, s) for (d, m), s in self._ops.items() if d == dev]
        if not ops:
            return index
        out = dict(index)
        for m, s in ops:
            out[m] = s
        return out

    def _set_state(self, dev: str, model: str, state: str | None) -> None:
        st = self.registry.states.get(dev)
        if st is None:
            return
        epochs = self.registry.index_epochs
        epochs[dev] = epochs.get(dev, 0) + 1
        index = dict(st.index)
        if state is None:
            index.pop(model, None)
        else:
            index[model] = state
        self.registry.set_index(dev, index)

    def carry_out(self, actions: Sequence[Action | ScaleAction]) -> None:
        for a in actions:
            if isinstance(a, Unload):
                self.evictions[(a.device, a.model)] = self.evictions.get((a.device, a.model), 0) + 1
                self._ops[(a.device, a.model)] = UNLOADING
                self._set_state(a.device, a.model, UNLOADING)
                self._spawn(self._unload(a))
            elif isinstance(a, Load):
                self.loads[(a.device, a.model)] = self.loads.get((a.device, a.model), 0) + 1
                self._waiter(a.model, a.device)
                self._ops[(a.device, a.model)] = LOADING
                self._set_state(a.device, a.model, LOADING)
                self._spawn(self._load(a))
            elif isinstance(a, ScaleUp):
                self._scale_up(a.device)
            else:
                self._scale_down(a.device)

    async def _load(self, a: Load) -> None:
        path = f"/v2/repository/models/{a.model}/load"
        gen = self._gen.get(a.device, 0)
        try:
            status, body = await self.post(a.device, path)
            err = (
                None
                if status < 300
                else f"answered {status}: {body[:300].decode(errors='replace')}"
            )
        except Exception as exc:  # a lost connection: the load did not happen
            err = f"{type(exc).__name__} {exc}"
        if self._gen.get(a.device, 0) != gen:
            return  # the device was lost meanwhile: its waiters were answered then
        now = self.clock.now()
        ctl = self.controller
        d = ctl.devices[a.device]
        self._ops.pop((a.device, a.model), None)
        if err is None:
            self._count_source(body)
            ctl.load_done(a.model, a.device, now)
            if d.models.get(a.model) == READY:
                self._set_state(a.device, a.model, READY)
            log.info("placement: loaded %s on %s", a.model, a.device)
        else:
            log.warning("placement: load of %s on %s failed: %s", a.model, a.device, err)
            if d.models.get(a.model) == LOADING:
                del d.models[a.model]  # it is not there: the controller must not count it
            self._set_state(a.device, a.model, None)
        fut = self._waiters.pop((a.model, a.device), None)
        if fut is not None and not fut.done():
            fut.set_result(
                None
                if err is None
                else f"the load of model {a.model!r} on {a.device} failed ({err})"
            )

    def _count_source(self, body: bytes) -> None:
        """The worker's load reply says where the load came from (host: its warm pool)."""
        with contextlib.suppress(ValueError, AttributeError):
            source = json.loads(body or b"{}").get("load_source")
            if source in self.live_sources:
                self.live_sources[source] += 1

    async def _unload(self, a: Unload) -> None:
        path = f"/v2/repository/models/{a.model}/unload"
        gen = self._gen.get(a.device, 0)
        try:
            status, _ = await self.post(a.device, path)
            if status >= 300:
                log.warning("placement: unload of %s on %s answered %d", a.model, a.device, status)
        except Exception as exc:  # the worker is gone: so is the model
            log.warning("placement: unload of %s on %s: %s", a.model, a.device, exc)
        if self._gen.get(a.device, 0) != gen:
            return  # the device was lost meanwhile: the controller forgot its residents
        now = self.clock.now()
        self._ops.pop((a.device, a.model), None)
        if self.controller.devices[a.device].models.get(a.model) == UNLOADING:
            self._set_state(a.device, a.model, None)
            self.carry_out(self.controller.unload_done(a.model, a.device, now))

    # -- scaling ---------------------------------------------------------------------------
    def _scale_up(self, dev: str) -> None:
        now = self.clock.now()
        self.scale_decisions["up"] += 1
        book = self._books[dev]
        book.scale = "start"
        if not book.on:
            book.on, book.on_since_s = True, now
        self.scale_up_unix_s.append(self.wall())
        took = self._burst.scale_up(now)
        if took is not None:
            self.last_scale_up_s = took
            self.scale_up_log.append(took)
            log.warning(
                "placement: ScaleUp %s %.3f s after the first request of the over-demand", dev, took
            )
        else:
            log.warning("placement: ScaleUp %s", dev)
        self.registry.release(dev)

    def _scale_down(self, dev: str) -> None:
        self.scale_decisions["down"] += 1
        self._books[dev].scale = "drain"
        self.registry.hold(dev, "scaling down (draining)")
        log.warning("placement: ScaleDown %s: draining", dev)
        self._check_drained(dev)

    def _check_drained(self, dev: str) -> None:
        book = self._books[dev]
        if book.scale != "drain" or any(self.controller.devices[dev].outstanding.values()):
            return
        if any(d == dev for d, _ in self._ops):
            return  # a load or unload is under way there: stop once it answered
        book.scale = "stop"

    def _admitted(self, dev: str) -> None:
        """The registry admitted ``dev``: a device turned on is ready (device_ready); a lost
        one is back (device_ready, then what its index says now: reconcile)."""
        ctl = self.controller
        if dev in ctl.starting:
            ctl.device_ready(dev, self.clock.now())
            self._books[dev].scale = None
            log.warning("placement: %s is ready", dev)
        elif dev in ctl.lost:
            now = self.clock.now()
            ctl.device_ready(dev, now)
            book = self._books[dev]
            book.on, book.on_since_s = True, now
            log.warning("placement: %s is back", dev)
            self._index_read(dev)

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
        self.lost[dev] = self.lost.get(dev, 0) + 1
        self._gen[dev] = self._gen.get(dev, 0) + 1
        book = self._books[dev]
        if book.on and book.on_since_s is not None:
            book.active_s += now - book.on_since_s
        book.on, book.on_since_s = False, None
        for key in [k for k in self._ops if k[0] == dev]:
            del self._ops[key]
        for key in [k for k in self._waiters if k[1] == dev]:
            fut = self._waiters.pop(key)
            if not fut.done():
                fut.set_result(_Lost(f"{dev} was lost while loading model {key[0]!r} ({reason})"))
        st = self.registry.states.get(dev)
        if st is not None:  # what it hosts is unknown now: read its index afresh when back
            epochs = self.registry.index_epochs
            epochs[dev] = epochs.get(dev, 0) + 1
            self.registry.set_index(dev, {})
            st.index_version, st.index_read_s = None, -math.inf
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
                self.adopted[(dev, m)] = self.adopted.get((dev, m), 0) + 1
                fut = self._waiters.pop((m, dev), None)
                if fut is not None and not fut.done():  # its load was waiting for room
                    fut.set_result(None)
                over = d.used_bytes(ctl.models) > d.memory_total_bytes
                log.warning(
                    "placement: %s READY on %s (not loaded by placement): adopted%s",
                    m,
                    dev,
                    "; the device is over its memory: no loads there until room" if over else "",
                )
        for m, s in before.items():
            if s == READY and m not in after:
                self.dropped[(dev, m)] = self.dropped.get((dev, m), 0) + 1
                log.warning("placement: %s is no longer on %s (its index): dropped", m, dev)
        self.carry_out(started)

    def stopped(self, dev: str) -> None:
        """The launcher stopped ``dev``'s worker (drained): device_stopped."""
        book = self._books[dev]
        if book.scale != "stop":
            raise ValueError(f"{dev} was not asked to stop (state: {book.scale})")
        now = self.clock.now()
        self.controller.device_stopped(dev, now)
        book.scale = None
        if book.on and book.on_since_s is not None:
            book.active_s += now - book.on_since_s
        book.on, book.on_since_s = False, None
        if dev in self.registry.states:
            epochs = self.registry.index_epochs
            epochs[dev] = epochs.get(dev, 0) + 1
            self.registry.set_index(dev, {})
        log.warning("placement: %s is off", dev)

    def scale_requests(self) -> list[dict[str, str]]:
        """What the launcher is asked to do now: ``start`` or ``stop`` a device."""
        out = []
        for name, book in self._books.items():
            if book.scale == "drain":
                self._check_drained(name)
            if book.scale in ("start", "stop"):
                out.append({"device": name, "action": book.scale})
        return out

    def active_seconds(self) -> dict[str, float]:
        now = self.clock.now()
        return {
            n: b.active_s + (now - b.on_since_s if b.on_since_s is not None else 0.0)
            for n, b in self._books.items()
        }

    # -- the tick --------------------------------------------------------------------------
    def tick(self) -> None:
        """One placement interval: utilization in, then rebalance and scale out."""
        ctl = self.controller
        now = self.clock.now()
        router = self.registry.router
        for name, d in ctl.devices.items():
            if d.active:
                u = router.view(name).utilization
                if u is not None and math.isfinite(u):
                    ctl.utilization(name, u)
        self._burst.tick(ctl, now)
        self.carry_out(ctl.tick(now))
        for name in self._books:
            self._check_drained(name)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.controller.tick_s)
            try:
                self.tick()
            except Exception:  # a bug in a policy must not stop placement for good
                log.exception("placement tick failed")

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def collector(self) -> Collector:
        return _Collector(self)

    # -- the admin view --------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        ctl = self.controller
        now = self.clock.now()
        active_s = self.active_seconds()
        c = ctl.counts
        return {
            "policy": self.settings.policy,
            "autoscaling": None if ctl.autoscaler is None else type(ctl.autoscaler).__name__,
            "interval_ms": self.settings.interval_ms,
            "load_wait_ms": self.settings.load_wait_ms,
            "devices": {
                name: {
                    "active": d.active,
                    "starting": name in ctl.starting,
                    "lost": name in ctl.lost,
                    "scale": self._books[name].scale,
                    "residents": dict(sorted(d.models.items())),
                    "outstanding": dict(sorted(d.outstanding.items())),
                    "utilization": d.utilization,
                    "memory_total_bytes": d.memory_total_bytes,
                    "memory_used_bytes": d.used_bytes(ctl.models),
                    "active_seconds": round(active_s[name], 6),
                }
                for name, d in ctl.devices.items()
            },
            "lost": sorted(ctl.lost),
            "counts": {
                "loads": c.loads,
                "cold_loads": c.cold_loads,
                "warm_loads": c.warm_loads,
                # What the workers' load replies said (the controller plans, they measure).
                "live_warm_loads": self.live_sources["host"],
                "live_cold_loads": self.live_sources["disk"],
                "evictions": c.evictions,
                "scale_ups": c.scale_ups,
                "scale_downs": c.scale_downs,
                "unplaced": c.unplaced,
                "lost": c.lost,
                "adopted": c.adopted,
                "dropped": c.dropped,
            },
            "pending": {
                "loads_waiting": sorted(f"{m}@{d}" for (m, d) in self._waiters),
                "operations": len(self._tasks),
                "scale": self.scale_requests(),
            },
            "demand_rps": {m: round(ctl.rate_rps(m, now), 6) for m in sorted(ctl.models)},
            "demand_devices": round(demand_devices(ctl.view(now)), 6),
            "warm": ctl.warm,
            "scale_up_decision_s": self.last_scale_up_s,
            "scale_up_decisions_s": list(self.scale_up_log),
            "scale_ups_unix_s": list(self.scale_up_unix_s),
        }


def parse_scale_report(body: bytes) -> tuple[str, str]:
    """``POST /admin/scale`` body ``{"device": D, "event": "started" | "stopped"}``."""
    try:
        doc = json.loads(body or b"null")
    except ValueError:
        raise ValueError("body: not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError('body: expected {"device": NAME, "event": "started" | "stopped"}')
    dev, event = doc.get("device"), doc.get("event")
    if not isinstance(dev, str) or event not in ("started", "stopped"):
        raise ValueError('body: expected {"device": NAME, "event": "started" | "stopped"}')
    return dev, event


__all__ = [
    "DeviceSetup",
    "PlacementDriver",
    "cluster_setup",
    "model_info",
    "parse_scale_report",
]
