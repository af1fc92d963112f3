"""emulated: a profile-driven device. No compute: a batch takes the profile's time for its size.

Theory of operation. ``run`` sleeps for ``profile.latency_s(batch)`` and returns zeros of the
declared output shapes (a variable output dimension takes the size of the same dimension of
the first input, else 1). The sleep must be accurate at the P50, because the simulator and
the router trust these figures; ``time.sleep`` overshoots by tens of microseconds to a
millisecond depending on the host (and on getting the GIL back), so the runtime learns its
own overshoot (an exponentially weighted mean, capped at 2 ms), sleeps that much less, and
covers the last stretch with a tight spin. The spin is the learned overshoot plus 50 us per
batch, so a laptop hosting many emulated devices is not burnt by busy-waiting. The worker
also shortens CPython's GIL switch interval while it serves emulated models (see
``worker.device``), which bounds how late a device thread can wake up behind a busy HTTP
thread.

Several instances. When the worker runs more than one batch at once (``--instances``), its
emulated models share one ``EmulatedDevice``: concurrent batches slow each other down as
``core.contention`` says (the simulator's model), so an emulated device with two instances
is not two devices. Each batch's thread waits on the device's condition until its end, which
moves whenever another batch starts or ends, then sleeps the last stretch precisely.

Memory: the profile's resident weights while loaded and its working memory per batch; the
worker adds them up against the emulated device's configured total. Needs no torch.

Loading takes time. ``load`` sleeps the model's load time (in the calling thread: the worker
loads from a thread, so the event loop goes on serving): ``emulated.load_ms`` when model.yaml
gives it, else the simulator's own default cold load (``core.scenario.default_load_times_s``:
the profile's weights at 2 GB/s plus 50 ms of set-up), so live and simulated loads agree. A
model of 440 MB loads in 0.05 + 0.44e9 * 1.048576 / 2e9 = 0.28 s.

The warm pool (``runtime.host_pool``, the worker's ``--host-pool``): a load that finds the
model's entry in the host's pool is warm, ``load_warm`` sleeps the warm load time instead
(``emulated.warm_load_ms``, else the simulator's default warm load: the weights at 12 GB/s
plus 5 ms; 0.043 s for the model above). The entry ``write_pool_entry`` makes after a cold
load is a file of the profile's weights bytes, allocated with ``posix_fallocate`` (on tmpfs
that reserves the host memory without writing it): the pool holds what a real one would.

A slower device (the worker's ``--slowdown`` and ``--slowdown-phases``, which mirror a
scenario's ``devices[].slowdown`` and ``slowdown_phases``): every batch takes its profile's
time times the slowdown when it starts (``EmulatedSlowdown``: a ``core.slowdown`` schedule in
seconds from an origin, by default the worker's first batch, so phases line up with a load
that starts then), while the worker's profile still says the profile's time.

Slow input staging (the worker's ``--staging-ms-per-item``, which mirrors a scenario's
``devices[].staging_ms_per_item``): before it computes, a batch spends that many ms per item
staging its inputs (``stage``, which the executor times as the batch's compute_input phase),
on top of its profile's time, as a host-to-device copy that stalls would.

Failures on purpose: with ``fail_value`` set, a batch whose first input holds that value
raises instead of running (EmulatedFailure), as a real runtime failing would, so the worker
answers 500 ``inference failed`` to every request of that batch (tests of what a client, a
gateway and its connection pool do after a backend's 500).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from evenserve.core.contention import DEFAULT_INTERFERENCE, SharedDevice, occupancy
from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile, bundled_profile_set, load_profile
from evenserve.core.scenario import default_load_times_s
from evenserve.core.slowdown import SlowdownSchedule
from evenserve.core.validation import Strict
from evenserve.runtime.base import Array, RuntimeContext
from evenserve.runtime.host_pool import allocate_file

#: Wake this long before the deadline (on top of the learned overshoot), then spin (seconds).
SPIN_MARGIN_S = 0.00005
#: The learned overshoot is capped: it bounds how long a sleep may end in a spin (seconds).
MAX_OVERSHOOT_S = 0.002


class EmulatedParams(Strict):
    """The ``emulated:`` section of model.yaml (all optional)."""

    profile: str | None = Field(
        default=None,
        description="profile YAML, relative to the model folder; needed unless the device is "
        "emulated:PROFILE_SET (then the set's profile named like the model is used)",
    )
    profile_name: str | None = Field(
        default=None, description="name of the profile in the device's profile set"
    )
    fail_value: float | None = Field(
        default=None,
        description="a batch whose first input holds this value fails (the worker answers 500)",
    )
    load_ms: float | None = Field(
        default=None,
        ge=0,
        description="how long loading the model takes, ms (default: 50 ms plus the profile's "
        "weights at 2 GB/s)",
    )
    warm_load_ms: float | None = Field(
        default=None,
        ge=0,
        description="how long a warm load (from the worker's host pool) takes, ms (default: "
        "5 ms plus the profile's weights at 12 GB/s)",
    )


class EmulatedFailure(RuntimeError):
    """The failure ``fail_value`` asks for."""


class PreciseSleeper:
    """Sleeps until a deadline: a learned-short ``time.sleep``, then a tight spin."""

    def __init__(self) -> None:
        self._overshoot_s = 0.0001

    def sleep_until(self, end: float) -> None:
        """Return as soon after ``end`` (a perf_counter time) as the host allows."""
        before = time.perf_counter()
        coarse = end - before - self._overshoot_s - SPIN_MARGIN_S
        if coarse > 0:
            time.sleep(coarse)
            # The overshoot includes getting the GIL back; learn it slowly, so one late
            # wake-up (a busy host) does not make every later sleep short.
            overshoot = time.perf_counter() - before - coarse
            self._overshoot_s += 0.1 * (min(overshoot, MAX_OVERSHOOT_S) - self._overshoot_s)
        # Spin without releasing the GIL: releasing it here could cost a whole switch
        # interval to get it back. CPython still hands the GIL to a waiting thread after
        # one switch interval, so the HTTP thread is never starved for longer than that.
        while time.perf_counter() < end:
            pass


def load_time_s(profile: LatencyProfile, load_ms: float | None = None) -> float:
    """How long loading a model takes: ``load_ms`` when given, else the default cold load of
    its weights (``core.scenario.default_load_times_s``, as the simulator's)."""
    if load_ms is not None:
        return load_ms / 1000.0
    return default_load_times_s(profile.weights_bytes)[0]


def warm_load_time_s(profile: LatencyProfile, warm_load_ms: float | None = None) -> float:
    """How long a warm load (from host memory) takes: ``warm_load_ms`` when given, else the
    default warm load of its weights (``core.scenario.default_load_times_s``)."""
    if warm_load_ms is not None:
        return warm_load_ms / 1000.0
    return default_load_times_s(profile.weights_bytes)[1]


def load_sleep(seconds: float) -> None:
    """The wait of an emulated load (a function of its own, so tests can hold a load)."""
    time.sleep(seconds)


#: Hand a batch to the precise sleeper once its end is this close (seconds).
HANDOVER_S = 0.002


class EmulatedSlowdown:
    """How much slower than its profile an emulated device runs now: ``schedule`` at the
    seconds since the origin (``origin_unix_s``, wall-clock; None: the first batch asked)."""

    def __init__(self, schedule: SlowdownSchedule, origin_unix_s: float | None = None) -> None:
        self.schedule = schedule
        self._origin: float | None = None
        if origin_unix_s is not None:
            self._origin = time.perf_counter() - (time.time() - origin_unix_s)

    def factor(self) -> float:
        now = time.perf_counter()
        if self._origin is None:
            self._origin = now
        return self.schedule.at(now - self._origin)


class EmulatedDevice:
    """One emulated device shared by the batches of every model on it (``core.contention``)."""

    def __init__(self, interference: float = DEFAULT_INTERFERENCE) -> None:
        self._shared = SharedDevice(interference)  # on the perf_counter clock
        self._cond = threading.Condition()

    def run(self, solo_s: float, occupancy: float, sleeper: PreciseSleeper) -> None:
        """Block for as long as a batch of ``solo_s`` alone takes while sharing the device."""
        key = object()
        with self._cond:
            self._shared.start(key, time.perf_counter(), solo_s, occupancy)
            self._cond.notify_all()
            while True:
                end = self._shared.end_of(key)
                left = end - time.perf_counter()
                if left <= HANDOVER_S:
                    break
                self._cond.wait(left - HANDOVER_S)
        # Outside the lock: a start in the last 2 ms is not felt by this batch (it is by
        # the new one, which counts this one until it ends).
        sleeper.sleep_until(end)
        with self._cond:
            self._shared.finish(key, time.perf_counter())
            self._cond.notify_all()


class EmulatedRuntime:
    """A model that costs exactly what its profile says."""

    def __init__(
        self,
        ctx: RuntimeContext,
        profile: LatencyProfile,
        device: EmulatedDevice | None = None,
        fail_value: float | None = None,
        load_ms: float | None = None,
        warm_load_ms: float | None = None,
    ) -> None:
        self.ctx = ctx
        self.profile = profile
        self.device = device
        self.fail_value = fail_value
        #: How long ``load`` takes (seconds).
        self.load_s = load_time_s(profile, load_ms)
        #: How long ``load_warm`` takes (seconds).
        self.warm_load_s = warm_load_time_s(profile, warm_load_ms)
        self._sleeper = PreciseSleeper()
        self._loaded = False
        #: A device slower than the profile (the worker's --slowdown); None: as the profile.
        self.slowdown: EmulatedSlowdown | None = None
        #: Input staging per item before a batch computes (the worker's
        #: --staging-ms-per-item, in seconds); 0: none.
        self.staging_s_per_item = 0.0

    def load(self) -> None:
        """Sleep the load time (blocking: call it from a thread); resident afterwards."""
        load_sleep(self.load_s)
        self._loaded = True

    def load_warm(self, entry: Path) -> None:
        """A load from the host pool (``entry``: the model's file there): sleep the warm
        load time; resident afterwards."""
        load_sleep(self.warm_load_s)
        self._loaded = True

    #: The host-pool entry may be written while the load runs (it needs nothing loaded).
    pool_entry_first = True

    def pool_bytes(self) -> float:
        """The bytes of the model's host-pool entry: its weights."""
        return self.profile.weights_bytes

    def pool_tag(self) -> str:
        """What besides model.yaml decides the entry (the profile a profile set gives)."""
        p = self.profile
        return f"{p.model}|{p.weights_bytes:.0f}"

    def write_pool_entry(self, path: Path) -> None:
        """The host-pool entry: a file of the weights' bytes, reserved (``posix_fallocate``)."""
        allocate_file(path, int(self.profile.weights_bytes))

    def stage(self, inputs: Mapping[str, Array]) -> None:
        """Stage one batch's inputs: ``staging_s_per_item`` per item (the executor calls it
        while it assembles the batch, so the time counts as compute_input)."""
        if self.staging_s_per_item <= 0:
            return
        items = int(inputs[self.ctx.inputs[0].name].shape[0])
        self._sleeper.sleep_until(time.perf_counter() + self.staging_s_per_item * items)

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        start = time.perf_counter()
        first = inputs[self.ctx.inputs[0].name]
        batch = int(first.shape[0])
        if self.fail_value is not None and bool(np.any(first == self.fail_value)):
            raise EmulatedFailure(f"the batch holds fail_value {self.fail_value:g}")
        out: dict[str, Array] = {}
        for spec in self.ctx.outputs:
            dims = [
                (first.shape[i + 1] if i + 1 < first.ndim else 1) if d == -1 else d
                for i, d in enumerate(spec.shape)
            ]
            out[spec.name] = np.zeros([batch, *dims], dtype=spec.dtype)
        took = self.profile.latency_s(batch)
        if self.slowdown is not None:
            took *= self.slowdown.factor()
        if self.device is not None:
            solo = took - (time.perf_counter() - start)
            self.device.run(max(0.0, solo), occupancy(self.profile, batch), self._sleeper)
            return out
        # The batch's time counts from entry: making the outputs is part of it.
        self._sleeper.sleep_until(start + took)
        return out

    def resident_bytes(self) -> float:
        return self.profile.weights_bytes if self._loaded else 0.0

    def batch_memory_bytes(self, batch: int) -> float | None:
        return self.profile.batch_memory_bytes(batch)

    def describe(self) -> dict[str, Any]:
        p = self.profile
        return {
            "runtime": "emulated",
            "profile_model": p.model,
            "profile_device": p.device,
            "profile_runtime": p.runtime,
            "precision": p.precision,
            "profile_source": p.source,
            "load_ms": round(self.load_s * 1000.0, 3),
            "warm_load_ms": round(self.warm_load_s * 1000.0, 3),
        }

    def close(self) -> None:
        self._loaded = False


def resolve_profile(
    ctx: RuntimeContext, params: EmulatedParams | None, profile_sets_dir: Path | None
) -> LatencyProfile:
    """The profile an emulated model runs on.

    On an ``emulated:SET`` device: the set's profile for ``profile_name`` (default: the model
    name). Elsewhere: the ``profile`` file of the model's ``emulated:`` section.
    """
    p = params or EmulatedParams()
    dev = ctx.device
    if dev.kind == "emulated":
        assert dev.profile_set is not None
        set_dir = Path(dev.profile_set)
        if not set_dir.is_dir() and profile_sets_dir is not None:
            set_dir = profile_sets_dir / dev.profile_set
        if not set_dir.is_dir():
            set_dir = bundled_profile_set(dev.profile_set) or set_dir
        if not set_dir.is_dir():
            raise ConfigError(
                f"--device {dev.name}: profile set not found (looked for {dev.profile_set!r} "
                f"and {set_dir})"
            )
        name = p.profile_name or ctx.model
        path = set_dir / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(q.stem for q in set_dir.glob("*.yaml"))) or "none"
            raise ConfigError(
                f"model {ctx.model!r}: emulated.profile_name: no profile {name!r} in profile "
                f"set {set_dir} (profiles: {known})"
            )
        # A MIG slice of the emulated device runs at its compute fraction (core.slices).
        return load_profile(path).at_speed(dev.compute_fraction)
    if p.profile is None:
        raise ConfigError(
            f"model {ctx.model!r}: emulated.profile: required on device {dev.name} "
            "(a profile YAML relative to the model folder)"
        )
    return load_profile(ctx.model_dir / p.profile)  # an absolute path stays as it is
