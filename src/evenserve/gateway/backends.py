"""The gateway's backend registry: what each backend is, whether it is routable, and why not.

Routing state (signal windows, in-flight counts, the healthy flag the policy sees) lives in
the shared Router; this registry adds what only the live system has: URLs, signal sources,
ejection reasons and a short event log (who was ejected or readmitted when, for the admin
API and for measuring how fast a failure is noticed).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.clock import Clock
from evenserve.core.profile import LatencyProfile
from evenserve.gateway.config import BackendSpec
from evenserve.policy.routing import ROUTING, Router, RoutingPolicy


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


@dataclass(frozen=True)
class HealthEvent:
    t_s: float
    backend: str
    event: str  # "ejected" | "admitted"
    reason: str


EjectHook = Callable[[str, str], None]


@dataclass
class BackendRegistry:
    router: Router
    clock: Clock
    states: dict[str, BackendState] = field(default_factory=dict)
    events: deque[HealthEvent] = field(default_factory=lambda: deque(maxlen=256))
    on_eject: EjectHook | None = None
    _hosted: frozenset[str] | None = None

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
    ) -> BackendRegistry:
        router = Router(policy, window=window, stale_after_s=stale_after_s)
        reg = cls(router=router, clock=clock)
        now = clock.now()
        for spec in specs:
            profs = profiles(spec) if profiles is not None else {}
            router.add_backend(
                spec.name,
                spec.models,
                profiles={m: p for m, p in profs.items() if m in spec.models},
                max_batch_size=spec.max_batch_size,
                weight=spec.weight,
            )
            # Not routable until the first successful probe says it is ready.
            router.set_healthy(spec.name, False)
            reg.states[spec.name] = BackendState(spec=spec, changed_at_s=now)
        return reg

    # -- membership -------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.states)

    def models(self) -> list[str]:
        return sorted({m for st in self.states.values() for m in st.spec.models})

    def hosted(self) -> frozenset[str]:
        """Every model a configured backend hosts (the backends are fixed once built)."""
        hosted = self._hosted
        if hosted is None:
            hosted = self._hosted = frozenset(
                m for st in self.states.values() for m in st.spec.models
            )
        return hosted

    def repository_index(self) -> list[dict[str, str]]:
        """The gateway's repository index (HTTP and gRPC): each served model, READY while
        some backend can take it."""
        router = self.router
        return [
            {"name": m, "state": "READY" if router.candidates(m) else "UNAVAILABLE"}
            for m in self.models()
        ]

    def model_control_refusal(self, model: str, action: str) -> str:
        """Why the gateway refuses to ``action`` (load, unload) ``model``: it names the
        workers that host it (HTTP answers 501, gRPC UNIMPLEMENTED)."""
        hosts = [
            f"{st.spec.name} ({st.spec.url})"
            for st in self.states.values()
            if model in st.spec.models
        ]
        where = (
            f"model {model!r} is hosted by {', '.join(hosts)}"
            if hosts
            else f"no backend hosts model {model!r}"
        )
        return (
            f"the gateway does not {action} models: model control goes to a worker ({where}); "
            "an evenserve worker loads its repository when it starts"
        )

    def hosts_model(self, model: str) -> bool:
        return model in self.hosted()

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
        first = st.reason == "starting"
        st.healthy = True
        st.reason = "ready"
        st.changed_at_s = now
        self.router.set_healthy(name, True)
        self.events.append(HealthEvent(now, name, "ready" if first else "admitted", "ready"))
        return True

    def is_healthy(self, name: str) -> bool:
        return self.states[name].healthy

    # -- policy -----------------------------------------------------------------------------
    def replace_policy(self, spec: Any, seed: int) -> None:
        """Build and install a policy from a spec; PolicySpecError names the bad field."""
        self.router.set_policy(ROUTING.build(spec, random.Random(seed), where="routing"))
