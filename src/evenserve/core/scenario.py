"""The typed scenario file: devices and placement, models and SLOs, workload, arms.

Only the shape is checked here (core knows no policies); ``evenserve.sim.loader`` also checks
policy names and profiles. Every error names the field by its dotted path.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from evenserve.core.options import DeviceOptions, ModelOptions, QueueOptions
from evenserve.core.slices import DeviceSlice, parse_slice
from evenserve.core.validation import Strict
from evenserve.core.wire import PRIORITY_CLASSES

CENTRAL_QUEUE = "central-queue"


class Phase(Strict):
    """A stretch of the run where open-loop rates are multiplied (e.g. a burst)."""

    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)
    multiplier: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Phase:
        if self.end_s <= self.start_s:
            raise ValueError("end_s must be greater than start_s")
        return self


class DeviceSpec(DeviceOptions):
    """A simulated device: its name, the models placed on it, its profile set, and how it
    runs batches (``DeviceOptions``: instances, interference, memory). Under an arm with
    ``placement`` its models are the initial placement (an active device may start empty,
    and one that is not ``active`` starts off: autoscaling turns it on); without placement a
    device hosts its models the whole run, always on."""

    name: str = Field(min_length=1)
    models: list[str] = Field(default_factory=list)
    profile_set: str | None = None
    count: int = Field(default=1, ge=1, description="expand into NAME0..NAME{count-1}")
    slice: str | None = Field(
        default=None,
        description="part of a GPU (core.slices): mig=<G>g.<M>gb (its own M GiB, latency x "
        "7/G) or share=K/M (memory_gb x K/M, full speed, no contention between shares)",
    )
    active: bool = Field(
        default=True, description="on at the start (placement arms: off until scaled up)"
    )
    start_ms: float = Field(
        default=2000.0, ge=0, description="scale-up time: turned on -> taking work"
    )
    slowdown: float = Field(
        default=1.0,
        gt=0,
        description="how much slower the device runs than its profiles say (2: batches take "
        "twice the profile's time; routing and batching still read the profile)",
    )
    slowdown_phases: list[Phase] = Field(
        default_factory=list,
        description="stretches of the run where the slowdown is multiplied (a card that "
        "throttles mid-run); phases must not overlap",
    )
    staging_ms_per_item: float = Field(
        default=0.0,
        ge=0,
        description="host-to-device input staging per item, before each batch computes "
        "(a transfer stall: pageable memory, large inputs); the profile does not include it",
    )

    @field_validator("slice")
    @classmethod
    def _slice_ok(cls, v: str | None) -> str | None:
        if v is not None:
            parse_slice(v)  # ValueError naming the bad part, under devices[i].slice
        return v

    @property
    def device_slice(self) -> DeviceSlice | None:
        return None if self.slice is None else parse_slice(self.slice)

    @property
    def memory_total_bytes(self) -> float:
        """The device's memory cap: ``memory_gb``, a share's part or a MIG profile's own."""
        total = self.memory_gb * 1024.0**3
        sl = self.device_slice
        return total if sl is None else sl.memory_bytes(total)

    @property
    def compute_fraction(self) -> float:
        """Its speed as a fraction of its profiles' device (a MIG slice: G/7)."""
        sl = self.device_slice
        return 1.0 if sl is None else sl.compute_fraction

    def slowdown_at(self, t_s: float) -> float:
        """The device's slowdown at ``t_s`` (its ``slowdown`` times the phase's multiplier)."""
        for ph in self.slowdown_phases:
            if ph.start_s <= t_s < ph.end_s:
                return self.slowdown * ph.multiplier
        return self.slowdown

    @model_validator(mode="after")
    def _phases_apart(self) -> DeviceSpec:
        ps = sorted(self.slowdown_phases, key=lambda p: p.start_s)
        for a, b in itertools.pairwise(ps):
            if b.start_s < a.end_s:
                raise ValueError("slowdown_phases: phases overlap")
        if any(p.multiplier <= 0 for p in ps):
            raise ValueError("slowdown_phases: multiplier must be > 0")
        return self

    @model_validator(mode="after")
    def _inactive_starts_empty(self) -> DeviceSpec:
        if not self.active and self.models:
            raise ValueError("models: a device that is not active starts with none")
        return self


#: Load-time assumptions when a model gives none (placement arms): bandwidth from disk to
#: device (through host memory), and from host memory to device, plus a fixed set-up cost.
#: Round figures for an NVMe SSD (2 GB/s) and PCIe 4.0 x16 in practice (12 GB/s); a
#: scenario that knows better sets ``load_ms`` / ``warm_load_ms``.
COLD_LOAD_BYTES_PER_S = 2e9
COLD_LOAD_FIXED_S = 0.050
WARM_LOAD_BYTES_PER_S = 12e9
WARM_LOAD_FIXED_S = 0.005


def default_load_times_s(weights_bytes: float) -> tuple[float, float]:
    """(cold, warm) load seconds of a model of ``weights_bytes`` that gives none: the one
    default the simulator, the gateway's placement catalogue and the emulated runtime share."""
    return (
        weights_bytes / COLD_LOAD_BYTES_PER_S + COLD_LOAD_FIXED_S,
        weights_bytes / WARM_LOAD_BYTES_PER_S + WARM_LOAD_FIXED_S,
    )


class ModelSpec(ModelOptions):
    """A model: its SLO (required here), class, deadline and latency profile."""

    slo_ms: float = Field(gt=0)
    profile: str | None = Field(default=None, description="profile name; default: model name")
    max_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="largest batch the model takes (model.yaml's): a policy that sets no "
        "max_batch_size gets it, a larger one is refused; default: none, the policy's own",
    )
    load_ms: float | None = Field(
        default=None,
        ge=0,
        description="cold load, disk -> host -> device (default: weights / 2 GB/s + 50 ms)",
    )
    warm_load_ms: float | None = Field(
        default=None,
        ge=0,
        description="warm load, host -> device (default: weights / 12 GB/s + 5 ms)",
    )

    def load_times_s(self, weights_bytes: float) -> tuple[float, float]:
        """(cold, warm) load seconds: the given ones, else ``default_load_times_s``."""
        cold, warm = default_load_times_s(weights_bytes)
        if self.load_ms is not None:
            cold = self.load_ms / 1000.0
        if self.warm_load_ms is not None:
            warm = self.warm_load_ms / 1000.0
        return cold, warm


class Stream(Strict):
    """One open-loop Poisson stream: a model, a rate, a priority class and a deadline."""

    model: str
    rate_rps: float = Field(ge=0)
    priority: int | str | None = Field(
        default=None, description="integer or online/offline; default: the model's priority"
    )
    deadline_ms: float | None = Field(default=None, gt=0)
    phases: list[Phase] | None = Field(
        default=None, description="rate phases of this stream; default: the workload's"
    )

    @model_validator(mode="after")
    def _known_class(self) -> Stream:
        if isinstance(self.priority, str) and self.priority not in PRIORITY_CLASSES:
            raise ValueError(
                f"priority: unknown class {self.priority!r} ({sorted(PRIORITY_CLASSES)})"
            )
        return self

    def priority_value(self) -> int | None:
        if isinstance(self.priority, str):
            return PRIORITY_CLASSES[self.priority]
        return self.priority


class OpenLoop(Strict):
    type: Literal["open-loop"]
    rates_rps: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    phases: list[Phase] = Field(default_factory=list)
    streams: list[Stream] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_traffic(self) -> OpenLoop:
        if not self.rates_rps and not self.streams:
            raise ValueError("rates_rps or streams: at least one is required")
        return self


class ClosedLoop(Strict):
    type: Literal["closed-loop"]
    users: int = Field(ge=1)
    think_ms: float = Field(ge=0)
    mix: dict[str, Annotated[float, Field(ge=0)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _mix_positive(self) -> ClosedLoop:
        if sum(self.mix.values()) <= 0:
            raise ValueError("mix: weights must not all be zero")
        return self


class TraceWorkload(Strict):
    type: Literal["trace"]
    path: str


Workload = Annotated[OpenLoop | ClosedLoop | TraceWorkload, Field(discriminator="type")]


class ArmSpec(QueueOptions):
    """One arm: routing, batching, and the devices' queue options (``QueueOptions``)."""

    routing: Any
    batching: Any
    batching_per_model: dict[str, Any] = Field(default_factory=dict)
    overload_refusals: bool = Field(
        default=False,
        description=(
            "the front door refuses (429) when every host is full or predicted late past "
            "the SLO (live: the gateway's overload.enabled)"
        ),
    )
    retries: int = Field(
        default=1,
        ge=0,
        le=3,
        description="other devices a request is tried on when one refuses it at once (queue "
        "full, draining), as the gateway retries (live: the gateway's forward.retries)",
    )
    description: str | None = None
    devices: list[str] | None = Field(
        default=None, description="the (expanded) devices this arm runs on; default: all"
    )
    placement: Any = Field(
        default=None,
        description="placement policy {policy: NAME, ...}: models are loaded and unloaded",
    )
    autoscaling: Any = Field(
        default=None, description="autoscaler {policy: NAME, ...} (needs placement)"
    )
    placement_interval_ms: float = Field(
        default=1000.0, gt=0, description="how often rebalance and autoscaling are asked"
    )
    load_wait_ms: float = Field(
        default=10000.0, gt=0, description="a request waits this long for a load at most"
    )
    unload_ms: float = Field(default=10.0, ge=0, description="time an unload takes")
    host_memory_gb: float = Field(
        default=0.0, ge=0, description="host memory for warm models (GiB; 0: none)"
    )
    min_switch_s: float = Field(
        default=0.0,
        ge=0,
        description="the anti-thrash window: a model's residency on one device changes at "
        "most once per this many seconds (0: off)",
    )
    learn_profiles: bool = Field(
        default=False,
        description="profiles that learn: each device's profiles follow its observed batch "
        "times (smoothed), and the router's follow the devices' load reports (live: the "
        "workers' --learn-profiles)",
    )

    gateways: int = Field(
        default=1,
        ge=1,
        description="gateways in front of the devices, each its own router with its own sends "
        "and reports; arrivals split across them as an L4 balancer does (a closed-loop user "
        "keeps its gateway, other arrivals go round robin)",
    )
    gateway_replicas: int | None = Field(
        default=None,
        ge=1,
        description="the gateway count each router assumes (live: gateway.replicas); default "
        "`gateways`; 1 with several gateways is the naive router that counts only its own sends",
    )
    gateway_peer_weight: float = Field(
        default=0.75,
        ge=0.0,
        le=1.0,
        description="with several gateways: how much of the others' sends each router counts, "
        "as a share of its own (live: gateway.peer_weight)",
    )
    gateway_offsets_ms: list[float] | None = Field(
        default=None,
        description="per gateway, when its first load report arrives (ms; then one every "
        "signals.interval_ms); default evenly staggered: g * interval / gateways",
    )

    @model_validator(mode="after")
    def _placement_options(self) -> ArmSpec:
        if self.autoscaling is not None and self.placement is None:
            raise ValueError("autoscaling: needs placement")
        return self

    @model_validator(mode="after")
    def _gateway_options(self) -> ArmSpec:
        if self.gateways > 1:
            if self.placement is not None:
                raise ValueError("gateways: several gateways do not run placement")
            if self.routing == CENTRAL_QUEUE:
                raise ValueError("gateways: the central queue has no router")
        offs = self.gateway_offsets_ms
        if offs is not None:
            if len(offs) != self.gateways:
                raise ValueError("gateway_offsets_ms: one offset per gateway")
            if any(o < 0 for o in offs):
                raise ValueError("gateway_offsets_ms: offsets must be >= 0")
        return self


class SignalSpec(Strict):
    interval_ms: float = Field(default=100.0, gt=0)
    window: int = Field(default=3, ge=1)
    utilization_window_ms: float = Field(default=1000.0, gt=0)


class Scenario(Strict):
    name: str
    description: str | None = None
    seed: int = 0
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    timeseries_interval_s: float = Field(default=1.0, gt=0)
    profile_sets: dict[str, str] = Field(min_length=1)
    default_profile_set: str | None = None
    signals: SignalSpec = Field(default_factory=SignalSpec)
    devices: list[DeviceSpec] = Field(min_length=1)
    models: dict[str, ModelSpec] = Field(min_length=1)
    workload: Workload
    arms: dict[str, ArmSpec] = Field(min_length=1)
    levels: dict[str, list[Phase]] = Field(
        default_factory=dict,
        description="named load levels: each replaces an open-loop workload's rate phases",
    )
    #: A fixed cost every answered request pays outside the devices, in the simulator: the
    #: live path's HTTP hops (load generator -> gateway -> worker and back) on the host a
    #: scenario is benched on. Not scaled by a bench's time scale (it is the host's).
    request_overhead_ms: float = Field(
        default=0.0,
        ge=0,
        description="simulator: fixed per-request cost outside the devices (the live HTTP path)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.levels and not isinstance(self.workload, OpenLoop):
            raise ValueError("levels: only an open-loop workload has rate phases to replace")
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be less than duration_s")
        if self.default_profile_set is not None and self.default_profile_set not in (
            self.profile_sets
        ):
            raise ValueError(
                f"default_profile_set: unknown profile set {self.default_profile_set!r}"
            )
        seen: set[str] = set()
        for i, d in enumerate(self.expanded_devices()):
            if d.name in seen:
                raise ValueError(f"devices: device name {d.name!r} used twice")
            seen.add(d.name)
            for m in d.models:
                if m not in self.models:
                    raise ValueError(f"devices[{i}].models: unknown model {m!r}")
            ps = d.profile_set or self.default_profile_set
            if ps is None:
                if len(self.profile_sets) != 1:
                    raise ValueError(
                        f"devices[{i}].profile_set: required when there are several profile sets"
                    )
            elif ps not in self.profile_sets:
                raise ValueError(f"devices[{i}].profile_set: unknown profile set {ps!r}")
        for arm, spec in self.arms.items():
            devs = self.arm_devices(arm)  # unknown names raise here
            if spec.placement is not None:
                continue  # models are loaded where the policy says
            placed = {m for d in devs for m in d.models}
            for m in self.models:
                if m not in placed:
                    where = "" if spec.devices is None else f" of arms.{arm}.devices"
                    raise ValueError(f"models.{m}: not placed on any device{where}")
        wl = self.workload  # a trace names its models in its file, checked when it is read
        field = "rates_rps" if isinstance(wl, OpenLoop) else "mix"
        for m in getattr(wl, field, {}):
            if m not in self.models:
                raise ValueError(f"workload.{field}.{m}: unknown model")
        for i, st in enumerate(getattr(wl, "streams", [])):
            if st.model not in self.models:
                raise ValueError(f"workload.streams[{i}].model: unknown model {st.model!r}")
        for arm, spec in self.arms.items():
            for m in spec.batching_per_model:
                if m not in self.models:
                    raise ValueError(f"arms.{arm}.batching_per_model.{m}: unknown model")
        return self

    def at_level(self, level: str) -> Scenario:
        """This scenario with the open-loop phases of load level ``level``."""
        if level not in self.levels:
            known = ", ".join(self.levels) or "none defined"
            raise ValueError(f"unknown load level {level!r} (levels: {known})")
        assert isinstance(self.workload, OpenLoop)
        wl = self.workload.model_copy(update={"phases": list(self.levels[level])})
        return self.model_copy(update={"workload": wl})

    def arm_devices(self, arm: str) -> list[DeviceSpec]:
        """The expanded devices arm ``arm`` runs on (ValueError: it names an unknown one)."""
        names = self.arms[arm].devices
        devs = self.expanded_devices()
        if names is None:
            return devs
        by_name = {d.name: d for d in devs}
        for i, n in enumerate(names):
            if n not in by_name:
                raise ValueError(f"arms.{arm}.devices[{i}]: unknown device {n!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"arms.{arm}.devices: a device is listed twice")
        return [by_name[n] for n in names]

    def expanded_devices(self) -> list[DeviceSpec]:
        return [
            d if d.count == 1 else d.model_copy(update={"name": f"{d.name}{k}", "count": 1})
            for d in self.devices
            for k in range(d.count)
        ]

    def profile_set_of(self, device: DeviceSpec) -> str:
        ps = device.profile_set or self.default_profile_set
        return ps if ps is not None else next(iter(self.profile_sets))
