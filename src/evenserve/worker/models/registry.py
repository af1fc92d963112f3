"""The models a worker hosts: one record per model, their states, and the load/unload hooks.

A :class:`HostedModel` is everything serving one model takes (its entry, runtime, batching
policy and spec, latency profile, signature, statistics, description and load report): one
record, added and removed whole. The :class:`ModelRegistry` holds the records of the models
served (READY or UNLOADING) and every model's state (the repository index). The subsystems
that follow the models join its hooks: ``on_load`` when a model starts being served (the
device threads run it, the driver schedules it, telemetry counts it), ``on_unload`` when it
stops (the hooks run in the reverse order: the driver lets it go before the executor does).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.profile import LatencyProfile
from evenserve.runtime.base import Runtime
from evenserve.sched import ModelSetup
from evenserve.worker.kserve import ModelSignature
from evenserve.worker.repository import ModelEntry
from evenserve.worker.stats import ModelStats

#: The name the worker's model lines have always been logged under (``--log-level``).
log = logging.getLogger("evenserve.worker.service")

#: Model states (Triton's repository index).
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"


@dataclass(frozen=True)
class ModelState:
    state: str
    #: Why it is UNAVAILABLE (``unloaded``, ``not loaded``, ``load failed: ...``).
    reason: str | None = None
    version: str | None = None

    def json(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name}
        if self.version is not None:
            out["version"] = self.version
        out["state"] = self.state
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class ModelStates(dict[str, ModelState]):
    """Each model's state; ``version`` moves at every change (the load report carries it, so a
    gateway reads the repository index only when it moved). It starts at a random number, so
    a restarted worker does not repeat the versions of the one before it."""

    def __init__(self) -> None:
        super().__init__()
        self.version = random.randrange(1 << 40)

    def __setitem__(self, name: str, state: ModelState) -> None:
        super().__setitem__(name, state)
        self.version += 1

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.version += 1

    def pop(self, name: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(name, *default)


@dataclass
class HostedModel:
    """One model served here: what serving it takes, as one record."""

    entry: ModelEntry
    runtime: Runtime
    #: The batching policy it runs now and its spec (``PUT /admin/params`` changes both).
    policy: Any
    batching_spec: Any
    profile: LatencyProfile | None
    signature: ModelSignature = field(init=False)
    stats: ModelStats = field(init=False)
    #: The runtime's description with its load report (``LOAD_INFO_KEYS``), once loaded.
    description: dict[str, Any] = field(default_factory=dict)
    #: Where its load came from, how long it took, its warm-up (``LOAD_INFO_KEYS``).
    load_info: dict[str, Any] | None = None
    #: Its host-pool entry's digest (None: not in the pool).
    pool_digest: str | None = None

    def __post_init__(self) -> None:
        e = self.entry
        self.signature = ModelSignature(
            e.name, e.config.version, e.inputs, e.outputs, e.config.max_batch_size
        )
        self.stats = ModelStats(e.name, e.config.version)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.entry.inputs]

    @property
    def weights_bytes(self) -> float:
        return self.profile.weights_bytes if self.profile is not None else 0.0

    def loaded(self, description: dict[str, Any], load_info: dict[str, Any]) -> None:
        """Its runtime is loaded: the description and load report (statistics show them)."""
        self.description = description
        self.load_info = load_info
        self.stats.load = load_info

    def setup(self, default_max_queue: int | None) -> ModelSetup:
        """What the scheduler needs of it (``default_max_queue``: the worker's bound)."""
        c = self.entry.config
        return ModelSetup(
            name=self.name,
            policy=self.policy,
            profile=self.profile,
            max_batch_size=c.max_batch_size,
            max_queue=c.max_queue_size or default_max_queue,
            priority=c.priority_value,
            deadline_s=c.deadline_s,
            slo_s=c.slo_s,
        )


LoadHook = Callable[[HostedModel], None]
UnloadHook = Callable[[HostedModel], None]


class ModelRegistry(Mapping[str, HostedModel]):
    """The models served (by name) and every model's state, with load/unload hooks."""

    def __init__(self) -> None:
        self._models: dict[str, HostedModel] = {}
        #: Every model's state (the index); folders never loaded are absent.
        self.states = ModelStates()
        self._on_load: list[LoadHook] = []
        self._on_unload: list[UnloadHook] = []
        #: The worker serves inference: ready once started, never again once draining.
        self.ready = False
        self.draining = False

    # -- Mapping -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> HostedModel:
        return self._models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    # -- hooks -------------------------------------------------------------------------------
    def join(self, on_load: LoadHook | None = None, on_unload: UnloadHook | None = None) -> None:
        """Hear of every model that starts (``on_load``) or stops (``on_unload``) being
        served from now on; unload hooks run in the reverse order they joined."""
        if on_load is not None:
            self._on_load.append(on_load)
        if on_unload is not None:
            self._on_unload.insert(0, on_unload)

    def add(self, model: HostedModel) -> None:
        """Hold a model's record without telling the hooks (a starting worker's models: what
        joins the hooks is built from the records)."""
        for note in model.entry.notes:  # what its config sets that evenserve ignores
            log.warning("model %r: %s: %s", model.name, model.entry.source, note)
        self._models[model.name] = model

    def install(self, model: HostedModel) -> None:
        """A loaded model starts being served: its record, then every ``on_load`` hook."""
        self.add(model)
        for hook in self._on_load:
            hook(model)

    def remove(self, name: str) -> HostedModel:
        """A model stops being served: every ``on_unload`` hook, then its record goes."""
        model = self._models[name]
        for hook in self._on_unload:
            hook(model)
        return self._models.pop(name)

    # -- reads -------------------------------------------------------------------------------
    def signature(self, name: str) -> ModelSignature | None:
        model = self._models.get(name)
        return None if model is None else model.signature

    def state(self, name: str) -> ModelState:
        st = self.states.get(name)
        return st if st is not None else ModelState(UNAVAILABLE, "not loaded")

    def model_ready(self, name: str) -> bool:
        return self.ready and self.state(name).state == READY

    def refusal(self, name: str) -> str | None:
        """Why a new inference request for ``name`` is refused now (503), None when it may be
        queued. Checked right before it is submitted (no await between)."""
        if self.draining or not self.ready:
            return "the worker is not ready (loading or shutting down)"
        st = self.state(name)
        if st.state == READY:
            return None
        if st.state == UNLOADING:
            return f"model {name!r} is unloading"
        if st.state == LOADING:
            return f"model {name!r} is loading"
        return f"model {name!r} is not loaded ({st.reason})"

    def weights_bytes(self, name: str) -> float:
        model = self._models.get(name)
        return 0.0 if model is None else model.weights_bytes

    def ready_names(self) -> set[str]:
        return {n for n, st in self.states.items() if st.state == READY}

    def batching_params(self) -> dict[str, Any]:
        """The batching spec each served model runs with now."""
        return {
            n: dict(m.batching_spec) if isinstance(m.batching_spec, Mapping) else m.batching_spec
            for n, m in self._models.items()
        }
