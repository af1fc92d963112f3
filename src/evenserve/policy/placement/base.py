"""Placement: which models are resident on which device, and how many replicas they get.

A placement policy is pure, like routing and batching policies: it reads a ``ClusterView``
(per-model demand, sizes and load costs; per-device memory, residents and their recent use)
and returns actions (``Load``, ``Unload``) that its driver carries out: the simulator's
cluster on its event heap, the live controller through the workers' model-control API. The
driver reports back through the next view (a load in progress is ``LOADING`` until the
driver says it is done), so a policy never assumes an action has taken effect.

Pools (the articles' hot / warm / cold):
- *hot*: resident on a device (``READY``, or ``LOADING`` there);
- *warm*: in host memory (``ClusterView.warm``): swapping it in costs ``warm_load_s``;
- *cold*: on disk: ``cold_load_s`` (disk -> host -> device).

An LLM engine is a model like the others (``ModelInfo.for_engine``): on a device it holds
its weights and the KV cache it serves from (``kv_bytes``: at least one ``max_model_len``
sequence), ``device_bytes`` in all; in host memory its weights only (asleep: vLLM's sleep
mode level 1 keeps the weights in host memory and drops the KV cache), so its warm load is
a wake (``warm_load_s``) and its cold one a load from disk. Every memory sum a policy, the
controller or ``check_actions`` makes on a device is of ``device_bytes``; the warm pool's is
of ``weights_bytes`` (design note 0022).

The anti-thrash rule (``ClusterView.min_switch_s``, 0: off): a model's residency on one
device (loaded there, or not) changes at most once per ``min_switch_s``. The controller
marks each (model, device) changed within it as ``DeviceView.pinned``: no Load or Unload of a
pinned pair (``check_actions`` refuses one; ``common.evictable`` and ``common.targets`` leave
them out), and no ScaleDown of a device with a pinned resident. A miss that only a switch
inside the window could place is refused (503, Retry-After), never placed by a thrash.

The two questions a policy answers:
- ``on_miss(model, view)``: a request came for a model no active device has hot. Return the
  actions that make it resident on one device: a ``Load``, preceded by the ``Unload``s that
  free the memory it needs (never a model with outstanding requests there). ``[]``: it cannot
  be placed now (the request is refused with 503 and Retry-After, never dropped silently).
- ``rebalance(view)``: asked every ``interval_s`` by the driver: replicas for hot models,
  evictions of idle ones, pre-loads. Hysteresis (so that nothing flaps) is the policy's.

Every action list must keep each device within its memory (``check_actions``: the drivers
and the property tests apply it), and never both load and unload one model on one device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evenserve.core.llm import StepProfile
from evenserve.core.profile import LatencyProfile
from evenserve.policy.registry import Registry

READY = "READY"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
#: The states a model has on a device it is resident on (memory held in each of them).
RESIDENT_STATES = (READY, LOADING, UNLOADING)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What placement needs to know of one model (from its profile and model.yaml)."""

    name: str
    #: Device memory it holds while resident (its weights).
    weights_bytes: float
    #: Seconds to make it resident from disk (disk -> host -> device), and from host memory.
    cold_load_s: float
    warm_load_s: float
    #: Seconds of one batch at its usual size, and that size: a request's device cost is
    #: about ``batch_s / max_batch_size`` (what a replica can serve: ``max_batch_size /
    #: batch_s`` requests per second).
    batch_s: float
    max_batch_size: int = 1
    slo_s: float | None = None
    #: Device memory it holds besides its weights while resident: an LLM engine's KV cache
    #: (0 for a classic model: its batches' working memory comes and goes).
    kv_bytes: float = 0.0

    @property
    def device_bytes(self) -> float:
        """What it holds on a device while resident: its weights and its KV cache."""
        return self.weights_bytes + self.kv_bytes

    @classmethod
    def from_profile(
        cls,
        name: str,
        profile: LatencyProfile,
        max_batch_size: int,
        cold_load_s: float,
        warm_load_s: float,
        slo_s: float | None = None,
    ) -> ModelInfo:
        """A model as its latency profile describes it: its weights, and the batch time at
        ``max_batch_size`` (what the simulator's and the gateway's catalogues both use)."""
        return cls(
            name,
            profile.weights_bytes,
            cold_load_s,
            warm_load_s,
            profile.latency_s(max_batch_size),
            max_batch_size,
            slo_s,
        )

    @classmethod
    def for_engine(
        cls,
        name: str,
        profile: StepProfile,
        *,
        kv_tokens: int,
        cold_load_s: float,
        warm_load_s: float,
        max_num_seqs: int,
        prompt_tokens: float,
        output_tokens: float,
        slo_s: float | None = None,
    ) -> ModelInfo:
        """An LLM engine as placement sees it: its weights, a KV cache of ``kv_tokens``
        (whole blocks; at least one ``max_model_len`` sequence: ValueError naming
        ``kv_tokens`` otherwise), and its request capacity: ``max_num_seqs`` requests of a
        mean ``prompt_tokens`` / ``output_tokens`` run as one batch, whose time is their
        prefill plus ``output_tokens`` decode steps of all of them (the step profile at a
        full decode batch, context at half the mean length): the capacity of a busy
        engine, as ``max_batch_size / batch_s`` is a classic model's."""
        if kv_tokens < profile.max_model_len:
            raise ValueError(
                f"kv_tokens: {kv_tokens} is fewer than one sequence of max_model_len "
                f"({profile.max_model_len})"
            )
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if prompt_tokens < 0 or output_tokens < 1:
            raise ValueError("prompt_tokens must be >= 0 and output_tokens >= 1")
        blocks = -(-kv_tokens // profile.block_tokens)
        context = max_num_seqs * (prompt_tokens + output_tokens / 2)
        decode = profile.step_s(0, max_num_seqs, round(context))
        batch_s = profile.prefill_s_per_token * prompt_tokens * max_num_seqs
        batch_s += output_tokens * decode
        return cls(
            name,
            profile.weights_bytes,
            cold_load_s,
            warm_load_s,
            batch_s,
            max_num_seqs,
            slo_s,
            blocks * profile.block_bytes,
        )

    @property
    def capacity_rps(self) -> float:
        """Requests per second one replica serves when busy all the time."""
        return self.max_batch_size / self.batch_s if self.batch_s > 0 else float("inf")


@dataclass(slots=True)
class DeviceView:
    """One device as placement sees it. ``models``: resident model -> state (READY,
    LOADING, UNLOADING: each holds its weights); ``last_used_s``: when a request for a
    model was last sent here; ``outstanding``: its requests queued or running here now;
    ``active``: powered on and taking work (autoscaling turns devices on and off)."""

    name: str
    memory_total_bytes: float
    models: dict[str, str] = field(default_factory=dict)
    last_used_s: dict[str, float] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)
    utilization: float = 0.0
    active: bool = True
    #: Models whose residency here changed (a load or an unload started, the device
    #: stopped) within ``ClusterView.min_switch_s``: none may be loaded or unloaded here now.
    pinned: frozenset[str] = frozenset()

    def used_bytes(self, models: Mapping[str, ModelInfo]) -> float:
        return sum(models[m].device_bytes for m in self.models)

    def free_bytes(self, models: Mapping[str, ModelInfo]) -> float:
        return max(0.0, self.memory_total_bytes - self.used_bytes(models))

    def ready(self, model: str) -> bool:
        return self.models.get(model) == READY


@dataclass(slots=True)
class ClusterView:
    """The whole cluster at ``now_s``: models, devices, demand (requests per second per
    model, the driver's smoothed estimate) and the warm pool (models held in host memory).

    ``burst_rps``: a demand estimate that rises fast and falls slow (the controller's: the
    larger of a short-time-constant and the ``rate_rps`` estimate), for the autoscaler's
    compute demand; None: ``rate_rps``. Placement policies read ``rate_rps`` only."""

    now_s: float
    models: Mapping[str, ModelInfo]
    devices: Sequence[DeviceView]
    rate_rps: Mapping[str, float] = field(default_factory=dict)
    warm: frozenset[str] = frozenset()
    burst_rps: Mapping[str, float] | None = None
    #: The anti-thrash window (module docstring; 0: off).
    min_switch_s: float = 0.0
    #: How long the demand estimates have been observing (the controller's: since its
    #: first tick or event). A rate of 0 read over a shorter time is not evidence that a
    #: model has no demand; infinite: as long as it takes (a view built by hand).
    observed_s: float = math.inf

    def device(self, name: str) -> DeviceView:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def hosts(self, model: str) -> list[DeviceView]:
        """Active devices where ``model`` is READY or LOADING."""
        return [d for d in self.devices if d.active and d.models.get(model) in (READY, LOADING)]

    def load_s(self, model: str) -> float:
        """Seconds to make ``model`` resident now (warm or cold)."""
        info = self.models[model]
        return info.warm_load_s if model in self.warm else info.cold_load_s


@dataclass(frozen=True, slots=True)
class Load:
    model: str
    device: str


@dataclass(frozen=True, slots=True)
class Unload:
    model: str
    device: str


Action = Load | Unload


class PlacementError(ValueError):
    """An action list a policy must not return (over memory, a conflict, an unknown name)."""


def check_actions(view: ClusterView, actions: Iterable[Action]) -> None:
    """Raise PlacementError unless ``actions``, applied in order to ``view``, keep every
    device within its memory (``device_bytes``), load only models not resident there onto
    active devices, unload only resident models without outstanding requests, never both
    load and unload one model on one device, and never load or unload a pinned one there.
    (An unload frees its memory at once for this check: the driver starts a load only once
    the unloads before it are done.)"""
    models = view.models
    resident = {d.name: dict(d.models) for d in view.devices}
    by_name = {d.name: d for d in view.devices}
    touched: dict[tuple[str, str], str] = {}
    for a in actions:
        d = by_name.get(a.device)
        if d is None:
            raise PlacementError(f"{a}: no device {a.device!r}")
        if a.model not in models:
            raise PlacementError(f"{a}: no model {a.model!r}")
        key = (a.model, a.device)
        kind = "load" if isinstance(a, Load) else "unload"
        if touched.get(key, kind) != kind:
            raise PlacementError(f"{a}: {a.model!r} both loaded and unloaded on {a.device!r}")
        touched[key] = kind
        if a.model in d.pinned:
            raise PlacementError(
                f"{a}: {a.model!r} changed on {a.device!r} within the last "
                f"{view.min_switch_s:g} s (the anti-thrash rule)"
            )
        here = resident[a.device]
        if isinstance(a, Load):
            if not d.active:
                raise PlacementError(f"{a}: device {a.device!r} is not active")
            if a.model in here:
                raise PlacementError(f"{a}: {a.model!r} is already resident on {a.device!r}")
            here[a.model] = LOADING
            used = sum(models[m].device_bytes for m in here)
            if used > d.memory_total_bytes:
                raise PlacementError(
                    f"{a}: {used / 2**30:.2f} GiB over {a.device!r}'s "
                    f"{d.memory_total_bytes / 2**30:.2f} GiB"
                )
        else:
            if here.get(a.model) not in (READY, LOADING):
                raise PlacementError(f"{a}: {a.model!r} is not resident on {a.device!r}")
            if d.outstanding.get(a.model, 0) > 0:
                raise PlacementError(f"{a}: {a.model!r} has requests outstanding on {a.device!r}")
            del here[a.model]


@runtime_checkable
class PlacementPolicy(Protocol):
    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        """Make ``model`` resident on one active device (unloads first, then one Load), or
        ``[]`` when it cannot be placed now."""
        ...

    def rebalance(self, view: ClusterView) -> list[Action]:
        """Periodic changes: replicas, evictions, pre-loads (``[]``: none)."""
        ...


PLACEMENT: Registry[PlacementPolicy] = Registry("placement")


@dataclass(frozen=True, slots=True)
class ScaleUp:
    """Turn on an inactive device (start its worker); it takes work once it is ready."""

    device: str


@dataclass(frozen=True, slots=True)
class ScaleDown:
    """Drain an active device (its queued and running requests finish, nothing new is sent
    to it), then turn it off (stop its worker): its residents leave with it."""

    device: str


ScaleAction = ScaleUp | ScaleDown


@runtime_checkable
class Autoscaler(Protocol):
    def decide(self, view: ClusterView) -> list[ScaleAction]:
        """Devices to turn on or off now (``[]``: none). Asked every ``interval_s`` by the
        driver; the hysteresis (how long a burst or a quiet spell must last) is the
        autoscaler's, and it reads devices being turned on as not active yet."""
        ...


AUTOSCALING: Registry[Autoscaler] = Registry("autoscaling")
