"""Admin API, behind a bearer token: backends with signals, health and scores; routing policy.

- ``GET  /admin/backends``: every backend, its health (and why not), the models routed
  there (``models``: READY in its index), its index (``index``: model -> state) and whether
  that came from the backend (``models_learned``; False: the configured models), its
  current signals as the router sees them, signal age, and per hosted model the policy's
  score (queue-aware: the weighted score; least-expected-work: predicted finish seconds),
  per model the learned profile scale (``profile_scale``: profiles that learn; empty if not)
  and soft-overload flag (queue-aware: it steers away from that host; it never refuses).
- ``GET  /admin/routing``: the policy in force, as a spec (``{policy: name, ...params}``).
- ``PUT  /admin/routing``: replace it with a spec; validated like the config file (400 naming
  the field on error, a number that is not finite such as ``1e400`` too); the very next
  routing decision uses it. This is how tuned parameters are pushed to a running gateway.
  Each change is also a new version of ``/admin/params`` (``gateway.params_api``: versioned
  routing, batching and class headroom, with rollback).
- ``GET  /admin/events``: recent ejections and readmissions, and changes of a backend's
  models (event ``models``, reason ``now [a, b] (+b)``), with gateway-clock times.
A missing or wrong token is refused with 401 (``WWW-Authenticate: Bearer``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.types import BackendView, RequestInfo
from evenserve.core.validation import non_finite_field
from evenserve.gateway.backends import BackendRegistry
from evenserve.httpio.server import Request, Response, json_bytes, json_response
from evenserve.policy.registry import PolicySpecError, split_spec
from evenserve.policy.routing import ROUTING

Endpoint = Callable[[Request], Awaitable[Response]]


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return json_response(json_bytes(obj), status, headers)


def _num(x: float | None) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return round(x, 6)


def parse_routing_body(body: bytes) -> Any:
    """The JSON of a ``PUT /admin/routing`` body (empty: null), read as untrusted input
    (``core.wire.parse_json``: bounded nesting); ValueError ``body: ...`` for a 400."""
    return wire.parse_json(body or b"null", "body")


class AdminAPI:
    def __init__(
        self, registry: BackendRegistry, clock: Clock, token: str, seed: int, routing_spec: Any
    ) -> None:
        self.registry = registry
        self.clock = clock
        self._token = token.encode()
        self.seed = seed
        self.routing_spec = self.normalized_spec(routing_spec)
        self.policy_changes = 0
        #: Set by the versioned params API: ``PUT /admin/routing`` becomes a params version
        #: through it (None when it succeeded, else the error response).
        self.versioned_routing: Callable[[Any], Awaitable[Response | None]] | None = None

    @staticmethod
    def normalized_spec(spec: Any) -> dict[str, Any]:
        name, params = ROUTING.parse(spec, "routing")
        return {"policy": name, **params.model_dump()}

    def _authorized(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value:
            return False
        return secrets.compare_digest(value.strip().encode(), self._token)

    def guard(self, endpoint: Endpoint) -> Endpoint:
        async def wrapped(request: Request) -> Response:
            if not self._authorized(request):
                return _json(
                    {"error": "admin API: missing or invalid bearer token"},
                    401,
                    {"www-authenticate": 'Bearer realm="evenserve-admin"'},
                )
            return await endpoint(request)

        return wrapped

    # -- views ------------------------------------------------------------------------------
    def _scores(self, model: str) -> dict[str, dict[str, Any]]:
        """Per healthy host of ``model``: the policy's score and overload flag, if it has them."""
        router = self.registry.router
        policy = router.policy
        cands: list[BackendView] = list(router.candidates(model))
        out: dict[str, dict[str, Any]] = {b.name: {} for b in cands}
        if not cands:
            return out
        scores = getattr(policy, "scores", None)
        finish = getattr(policy, "finish_s", None)
        overloaded = getattr(policy, "overloaded", None)
        now = self.clock.now()
        probe = RequestInfo(request_id=0, model=model, arrival_s=now)
        if callable(scores):
            for b, s in zip(cands, scores(probe, cands, now), strict=True):
                out[b.name]["score"] = _num(float(s))
        elif callable(finish):
            for b in cands:
                out[b.name]["predicted_finish_s"] = _num(float(finish(probe, b, now)))
        if callable(overloaded):
            for b in cands:
                out[b.name]["overloaded"] = bool(overloaded(probe, b, now))
        return out

    def backends_view(self) -> dict[str, Any]:
        router = self.registry.router
        now = self.clock.now()
        scores = {m: self._scores(m) for m in self.registry.models()}
        items = []
        for name, st in self.registry.states.items():
            v = router.view(name)
            items.append(
                {
                    "name": name,
                    "url": st.spec.url,
                    "device": {
                        "name": st.device_name,
                        "device": st.device,
                        "kind": st.device_kind,
                        "slice": st.device_slice,
                    },
                    "models": sorted(router.models_of(name)),
                    "index": dict(sorted(st.index.items())),
                    "models_learned": st.learned,
                    # Profiles that learn: per model, how much slower (> 1) or faster than
                    # its profile the backend runs (empty: it does not learn).
                    "profile_scale": {
                        m: _num(x) for m, x in sorted(router.learned_scales(name).items())
                    },
                    "signal_source": st.spec.signals.source,
                    "healthy": st.healthy,
                    "state": st.reason,
                    "since_s": _num(now - st.changed_at_s),
                    "ejections": st.ejections,
                    "last_error": st.last_error,
                    "signals": {
                        "fresh": v.signals_fresh,
                        "age_s": _num(router.signal_age_s(name, now)),
                        "queue_depth": _num(v.queue_depth),
                        "in_flight": v.in_flight,
                        "utilization": _num(v.utilization),
                        "memory_free_bytes": _num(v.memory_free_bytes),
                        "memory_total_bytes": _num(v.memory_total_bytes),
                        "queued_by_model": {k: _num(q) for k, q in v.queued_by_model.items()},
                    },
                    "scores": {m: s[name] for m, s in scores.items() if name in s},
                }
            )
        return {"policy": self.routing_spec, "backends": items}

    # -- endpoints --------------------------------------------------------------------------
    async def get_backends(self, request: Request) -> Response:
        return _json(self.backends_view())

    async def get_routing(self, request: Request) -> Response:
        return _json({**self.routing_spec, "changes": self.policy_changes})

    def set_routing(self, spec: Any) -> None:
        """Install a routing spec (PolicySpecError naming the field); the very next routing
        decision uses it."""
        split_spec(spec, "routing")
        self.registry.replace_policy(spec, self.seed)
        self.routing_spec = self.normalized_spec(spec)
        self.policy_changes += 1

    async def put_routing(self, request: Request) -> Response:
        try:
            spec = parse_routing_body(request.body)
            bad = non_finite_field(spec, "routing")
            if bad is not None:  # 1e400 reads as inf: no policy weighs with it
                raise ValueError(f"{bad[0]}: {bad[1]} is not a finite number")
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        if self.versioned_routing is not None:  # a new params version (gateway.params_api)
            failed = await self.versioned_routing(spec)
            if failed is not None:
                return failed
        else:
            try:
                self.set_routing(spec)
            except PolicySpecError as exc:
                return _json({"error": str(exc)}, 400)
        return _json({**self.routing_spec, "changes": self.policy_changes})

    async def get_events(self, request: Request) -> Response:
        now = self.clock.now()
        return _json(
            {
                "now_s": now,
                "events": [
                    {
                        "t_s": e.t_s,
                        "ago_s": _num(now - e.t_s),
                        "backend": e.backend,
                        "event": e.event,
                        "reason": e.reason,
                    }
                    for e in self.registry.events
                ],
            }
        )

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        return {
            ("GET", "/admin/backends"): self.guard(self.get_backends),
            ("GET", "/admin/routing"): self.guard(self.get_routing),
            ("PUT", "/admin/routing"): self.guard(self.put_routing),
            ("GET", "/admin/events"): self.guard(self.get_events),
        }
