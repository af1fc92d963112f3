"""The gateway's backend registry: what each backend is, whether it is routable, and why not.

Routing state (signal windows, in-flight counts, the healthy flag the policy sees) lives in
the shared Router; this registry adds what only the live system has: URLs, signal sources,
ejection reasons and a short event log (who was ejected or readmitted when, for the admin
API and for measuring how fast a failure is noticed).

Membership. Each backend's models are what its repository index says (``Poller.probe_index``,
on the health period; ``set_index``): a model it lists READY is routable there; one it lists
LOADING, UNLOADING or UNAVAILABLE is known there but not routable (a request for it is
answered 503 with Retry-After, not 404); a model no backend lists is unknown (404). Until a
backend's index first answers (and for good, when it has no index: 404/405), its configured
``models`` stand for its index, all READY. Every change is made here, on the poller's
schedule, never per request: ``hosted()`` and ``hosts_of()`` are rebuilt caches the request
path reads.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from evenserve.cluster.backend_spec import BackendSpec
from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.profile import LatencyProfile
from evenserve.policy.routing import ROUTING, Router, RoutingPolicy
from evenserve.policy.routing.router import PEER_WEIGHT

log = logging.getLogger("evenserve.gateway")

#: A model's state in a repository index (Triton's names), best first: a model several
#: versions or backends list takes the best.
STATES = ("READY", "LOADING", "UNLOADING", "UNAVAILABLE")
READY = "READY"
_RANK = {s: i for i, s in enumerate(STATES)}


def best_state(states: Iterable[str]) -> str:
    return min(states, key=lambda s: _RANK.get(s, len(STATES)), default="UNAVAILABLE")


@dataclass
class BackendState:
    spec: BackendSpec
    healthy: bool = False
    reason: str = "starting"
    changed_at_s: float = 0.0
    ejections: int = 0
    last_error: str | None = None
    #: Probes in a row that got no answer in time (reset by an answer).
    misses: int = 0
    #: When (the gateway's clock) the backend last answered a forwarded request, whatever
    #: the status: a backend answering requests is alive, whatever its probes say.
    answered_s: float = -math.inf
    #: The backend's models by state, as its index last said (the configured models, READY,
    #: until then); the READY ones are what the router routes there.
    index: dict[str, str] = field(default_factory=dict)
    #: Whether ``index`` came from the backend (False: the configured models).
    learned: bool = False
    #: The device its load report names: string, kind, slice (None until one came).
    device: str | None = None
    device_kind: str | None = None
    device_slice: str | None = None
    #: The models version of its newest load report (None: not reported), the version its
    #: index was last read at, and when (the poller skips reads while nothing moved).
    models_version: int | None = None
    index_version: int | None = None
    index_read_s: float = -math.inf
    #: Index reads started and the latest one applied, by start order (an older read's
    #: answer that comes in after a newer one's is dropped: ``Poller.probe_index``).
    index_started: int = 0
    index_applied: int = 0
    #: When its load was last probed (``Poller.load_due``).
    load_sent_s: float = -math.inf
    #: Its newest load report's ``engine_utilization`` (a worker with LLMs: the load
    #: placement reads, design 0022; None: the router's utilization is read).
    engine_utilization: float | None = None

    @property
    def device_name(self) -> str:
        """The backend's name, with its slice when it is part of a GPU (``gpu0/mig-3g.20gb``)."""
        return f"{self.spec.name}/{self.device_slice}" if self.device_slice else self.spec.name


@dataclass(frozen=True)
class HealthEvent:
    t_s: float
    backend: str
    event: str  # "ready" | "ejected" | "admitted" | "models"
    reason: str  # for "models": the new set and the change, "now [a, b] (+b)"


EjectHook = Callable[[str, str], None]
AdmitHook = Callable[[str], None]
#: Adjusts an index a backend reported (placement: its loads and unloads under way win).
IndexOverride = Callable[[str, dict[str, str]], dict[str, str]]
#: Called with a backend's name once an index read from it was applied (placement
#: reconciles its view with ``states[name].index``).
IndexReadHook = Callable[[str], None]


@dataclass
class BackendRegistry:
    router: Router
    clock: Clock
    states: dict[str, BackendState] = field(default_factory=dict)
    events: deque[HealthEvent] = field(default_factory=lambda: deque(maxlen=256))
    on_eject: EjectHook | None = None
    #: Each backend's whole profile set (a newly learned model's profile is looked up here).
    profile_sets: dict[str, dict[str, LatencyProfile]] = field(default_factory=dict)
    #: Models the gateway's placement can load (known, never 404, though no backend has them).
    catalogue: frozenset[str] = frozenset()
    on_admit: AdmitHook | None = None
    index_override: IndexOverride | None = None
    on_index_read: IndexReadHook | None = None
    #: Per backend, how many times the gateway itself changed its index (placement's loads
    #: and unloads): an index read that began before such a change is stale (``Poller``).
    index_epochs: dict[str, int] = field(default_factory=dict)
    #: Backends held out of routing whatever their probes say (placement: a spare that is
    #: off, a device scaling down), with why.
    held: dict[str, str] = field(default_factory=dict)
    _hosted: frozenset[str] | None = None
    _hosts: dict[str, tuple[str, ...]] | None = None

    @classmethod
    def build(
        cls,
        specs: Iterable[BackendSpec],
        policy: RoutingPolicy,
        clock: Clock,
        *,
        window: int,
        stale_after_s: float,
        profiles: Callable[[BackendSpec], dict[str, LatencyProfile]] | None = None,
        replicas: int = 1,
        peer_weight: float = PEER_WEIGHT,
    ) -> BackendRegistry:
        router = Router(
            policy,
            window=window,
            stale_after_s=stale_after_s,
            replicas=replicas,
            peer_weight=peer_weight,
        )
        reg = cls(router=router, clock=clock)
        now = clock.now()
        for spec in specs:
            profs = profiles(spec) if profiles is not None else {}
            models = spec.models or []
            router.add_backend(
                spec.name,
                models,
                profiles={m: p for m, p in profs.items() if m in models},
                max_batch_size=spec.max_batch_size,
                weight=spec.weight,
            )
            # Not routable until the first successful probe says it is ready.
            router.set_healthy(spec.name, False)
            reg.profile_sets[spec.name] = profs
            reg.states[spec.name] = BackendState(
                spec=spec, changed_at_s=now, index=dict.fromkeys(models, READY)
            )
        return reg

    # -- membership -------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.states)

    def models(self) -> list[str]:
        """Every model some backend has, in any state (sorted)."""
        return sorted(self.hosted())

    def ready_models(self) -> list[str]:
        """Every model some backend lists READY (routable once that backend is healthy)."""
        return sorted({m for st in self.states.values() for m, s in st.index.items() if s == READY})

    def hosted(self) -> frozenset[str]:
        """Every model some backend has, in any state: a request for any other is 404.
        Cached; rebuilt after a backend's index changes."""
        hosted = self._hosted
        if hosted is None:
            hosted = self._hosted = self.catalogue | frozenset(
                m for st in self.states.values() for m in st.index
            )
        return hosted

    def repository_index(self) -> list[dict[str, Any]]:
        """The gateway's repository index (HTTP and gRPC): every model some backend has,
        READY when some backend can take it now, else the best state its backends report
        (an ejected backend's READY counts as UNAVAILABLE), with each backend's state
        (``backends``). Triton's shape plus ``backends``."""
        out: list[dict[str, Any]] = []
        for m in self.models():
            states = self.states_of(m)
            state = READY if self.router.candidates(m) else best_state(states.values())
            out.append({"name": m, "state": state, "backends": states})
        return out

    def model_control_refusal(self, model: str, action: str) -> str:
        """Why the gateway refuses to ``action`` (load, unload) ``model``: it names the
        workers that host it (HTTP answers 501, gRPC UNIMPLEMENTED)."""
        hosts = [f"{n} ({self.states[n].spec.url})" for n in self.hosts_of(model)]
        where = (
            f"model {model!r} is hosted by {', '.join(hosts)}"
            if hosts
            else f"no backend hosts model {wire.shown_name(model)}"
        )
        return (
            f"the gateway does not {action} models: model control goes to a worker ({where}); "
            "an evenserve worker loads its repository when it starts"
        )

    def hosts_model(self, model: str) -> bool:
        hosted = self._hosted  # ``hosted``'s cache read here: once per request
        return model in (hosted if hosted is not None else self.hosted())

    def hosts_of(self, model: str) -> tuple[str, ...]:
        """The backends that have ``model`` in any state (cached like ``hosted``)."""
        hosts = self._hosts
        if hosts is None:
            by: dict[str, list[str]] = {}
            for name, st in self.states.items():
                for m in st.index:
                    by.setdefault(m, []).append(name)
            hosts = self._hosts = {m: tuple(n) for m, n in by.items()}
        return hosts.get(model, ())

    def states_of(self, model: str) -> dict[str, str]:
        """Per backend that has ``model``: its state there (an ejected backend's READY
        counts as UNAVAILABLE: it is not routable)."""
        out: dict[str, str] = {}
        for name in self.hosts_of(model):
            st = self.states[name]
            s = st.index[model]
            out[name] = "UNAVAILABLE" if s == READY and not st.healthy else s
        return out

    def set_index(self, name: str, index: dict[str, str]) -> bool:
        """Backend ``name``'s repository index answered ``index`` (model -> state): the
        router routes its READY models there from now on. True when that set changed (then
        one log line and a ``models`` event say how)."""
        st = self.states[name]
        if self.index_override is not None:
            index = self.index_override(name, index)
        before = st.index
        st.learned = True
        if index == before:
            return False
        st.index = dict(index)
        if set(index) != set(before):
            self._hosted = None
            self._hosts = None
        old = self.router.models_of(name)
        new = frozenset(m for m, s in index.items() if s == READY)
        if new == old:
            return False
        profs = self.profile_sets.get(name, {})
        self.router.set_models(name, new, profiles={m: p for m, p in profs.items() if m in new})
        change = [f"+{m}" for m in sorted(new - old)] + [f"-{m}" for m in sorted(old - new)]
        reason = f"now [{', '.join(sorted(new))}] ({', '.join(change)})"
        log.warning("backend %s: models %s", name, reason)  # rare, and worth seeing
        self.events.append(HealthEvent(self.clock.now(), name, "models", reason))
        return True

    def url(self, name: str) -> str:
        return self.states[name].spec.url

    # -- health -----------------------------------------------------------------------------
    def eject(self, name: str, reason: str) -> bool:
        """Take ``name`` out of routing; True if it was routable."""
        st = self.states[name]
        st.last_error = reason
        if not st.healthy:
            st.reason = reason
            return False
        now = self.clock.now()
        st.healthy = False
        st.reason = reason
        st.changed_at_s = now
        st.ejections += 1
        self.router.set_healthy(name, False)
        self.events.append(HealthEvent(now, name, "ejected", reason))
        if self.on_eject is not None:
            self.on_eject(name, reason)
        return True

    def admit(self, name: str) -> bool:
        """Put ``name`` (back) into routing; True if it was not routable."""
        st = self.states[name]
        now = self.clock.now()
        if st.healthy:
            return False
        if name in self.held:
            st.reason = self.held[name]
            return False
        first = st.reason == "starting"
        st.healthy = True
        st.reason = "ready"
        st.changed_at_s = now
        self.router.set_healthy(name, True)
        self.events.append(HealthEvent(now, name, "ready" if first else "admitted", "ready"))
        if self.on_admit is not None:
            self.on_admit(name)
        return True

    def hold(self, name: str, reason: str) -> None:
        """Take ``name`` out of routing until ``release`` (probes do not readmit it)."""
        self.held[name] = reason
        st = self.states.get(name)
        if st is not None and st.healthy:
            st.healthy = False
            st.changed_at_s = self.clock.now()
            self.router.set_healthy(name, False)
            self.events.append(HealthEvent(st.changed_at_s, name, "ejected", reason))
        if st is not None:
            st.reason = reason

    def release(self, name: str) -> None:
        """Let probes admit ``name`` again."""
        self.held.pop(name, None)

    def is_healthy(self, name: str) -> bool:
        return self.states[name].healthy

    # -- policy -----------------------------------------------------------------------------
    def replace_policy(self, spec: Any, seed: int) -> None:
        """Build and install a policy from a spec; PolicySpecError names the bad field."""
        self.router.set_policy(ROUTING.build(spec, random.Random(seed), where="routing"))
