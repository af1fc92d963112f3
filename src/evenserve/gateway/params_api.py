"""The gateway's versioned parameters: routing here; batching, class headroom and profiles that
learn on the workers.

Behind the admin bearer token (401 otherwise). Bodies are ``policy.params``'s:

- ``GET  /admin/params``: ``{version, params: {routing, batching_per_model, class_headroom,
  learn_profiles}, history: [{version, params, applied_unix_s, note, source}], backends:
  {name: version}}`` (version 1: the startup config; its ``batching_per_model`` is empty and
  its ``class_headroom`` and ``learn_profiles`` null: the workers run their own configs until
  a change names them; the last 100 versions kept; ``backends``: each backend's params
  version at this one).
- ``PUT  /admin/params`` ``{"expected_version": N?, "params": {...partial}, "note": "..."}``:
  keys absent keep their value (``batching_per_model`` merges per model); 409 (with
  ``version``) when ``expected_version`` is not the current one; 400 naming the field (an
  empty body or ``params``, an unknown field, a number that is not finite such as
  ``1e400``, a model no backend hosts: no version is made); else a new version:
  ``{version, previous_version, params, backends: {name: result}}``.
- ``POST /admin/params/rollback`` ``{"to_version": K, "expected_version": N?, "note"?}``:
  version K's params applied as a new version (404: K unknown).

Theory of operation. A change is validated whole first. Its batching (only the models each
backend hosts: its index, any state), class headroom and ``learn_profiles`` go to every
backend's own ``/admin/params`` (same token, all at once, each with a time limit); a backend
with nothing to change is skipped. If any backend fails (an error status, no answer in
time), the ones already changed are rolled back to their previous version (best effort:
each result says whether its revert worked), the gateway's version stays as it was and the
answer is 502 naming the failed backends. Only when every backend took it is routing
installed (the very next decision uses it) and the version committed, with each backend's
new version, so a rollback to K rolls each backend back to its own version at K (a backend
restarted since, which no longer has it, is sent K's params instead). Changes are
serialized (one lock), and ``PUT /admin/routing`` is one more version (routing only)
through the same path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from evenserve.core.errors import ConfigError
from evenserve.gateway.admin import AdminAPI, Endpoint
from evenserve.gateway.backends import BackendRegistry
from evenserve.httpio.bearer import admin_error, admin_json, object_body
from evenserve.httpio.server import Request, Response
from evenserve.policy.params import (
    Params,
    ParamStore,
    UnknownVersionError,
    VersionConflictError,
    normalized_routing,
    parse_put_body,
    parse_rollback_body,
)

PARAMS_PATH = "/admin/params"
ROLLBACK_PATH = "/admin/params/rollback"
#: How long one backend may take to answer a change.
BACKEND_TIMEOUT_S = 10.0


@dataclass
class BackendChange:
    """What one backend was asked and what it said."""

    sent: dict[str, Any]
    ok: bool = False
    error: str | None = None
    version: int | None = None
    previous_version: int | None = None
    reverted: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "sent": self.sent}
        for k in ("error", "version", "previous_version", "reverted"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return {**out, **self.extra}


class ChangeFailed(Exception):
    def __init__(self, results: dict[str, BackendChange]) -> None:
        self.results = results
        self.failed = sorted(n for n, r in results.items() if not r.ok)
        super().__init__(", ".join(f"{n}: {results[n].error}" for n in self.failed))


class GatewayParams:
    """``/admin/params`` on the gateway (see the module docstring)."""

    def __init__(
        self,
        registry: BackendRegistry,
        admin: AdminAPI,
        token: str,
        *,
        wall_clock: Callable[[], float] = time.time,
        timeout_s: float = BACKEND_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.registry = registry
        self.admin = admin
        self._token = token
        self.wall_clock = wall_clock
        self.timeout_s = timeout_s
        self._transport = transport
        self.store = ParamStore(Params(routing=admin.routing_spec), wall_clock())
        #: Each gateway version's backend versions (a backend absent: its startup version 1).
        self.backend_versions: dict[int, dict[str, int]] = {1: {}}
        self._lock: asyncio.Lock | None = None
        admin.versioned_routing = self._put_routing

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        guard = self.admin.guard
        return {
            ("GET", PARAMS_PATH): guard(self.get_params),
            ("PUT", PARAMS_PATH): guard(self.put_params),
            ("POST", ROLLBACK_PATH): guard(self.rollback),
        }

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def view(self) -> dict[str, Any]:
        return {**self.store.to_json(), "backends": self.backend_versions[self.store.version]}

    # -- the backends --------------------------------------------------------------------------
    def hosted(self, name: str) -> set[str]:
        st = self.registry.states[name]
        return set(st.index) | set(self.registry.router.models_of(name))

    def _for_backend(self, name: str, update: Mapping[str, Any]) -> dict[str, Any]:
        """The part of ``update`` backend ``name`` takes (empty: nothing for it)."""
        out: dict[str, Any] = {}
        hosted = self.hosted(name)
        per = {m: s for m, s in update.get("batching_per_model", {}).items() if m in hosted}
        if per:
            out["batching_per_model"] = per
        for key in ("class_headroom", "learn_profiles"):
            if key in update:
                out[key] = update[key]
        return out

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=self.timeout_s,
            trust_env=False,
            transport=self._transport,
            headers={"authorization": f"Bearer {self._token}"},
        )

    async def _send(
        self, client: httpx.AsyncClient, name: str, method: str, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        url = self.registry.url(name).rstrip("/") + path
        try:
            r = await client.request(method, url, json=body)
        except httpx.HTTPError as exc:
            return 0, {"error": f"{type(exc).__name__}: {exc}"[:300]}
        try:
            data = r.json()
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        return r.status_code, data

    async def _change_one(
        self, client: httpx.AsyncClient, name: str, change: BackendChange, rollback_to: int | None
    ) -> None:
        if rollback_to is None:
            status, data = await self._send(
                client, name, "PUT", PARAMS_PATH, {"params": change.sent, "note": "via gateway"}
            )
        else:
            status, data = await self._send(
                client, name, "POST", ROLLBACK_PATH, {"to_version": rollback_to}
            )
            if status == 404 and "error" in data and "to_version" in str(data["error"]):
                # Restarted since: it no longer has that version; send its params instead.
                change.extra["resent_params"] = True
                status, data = await self._send(
                    client, name, "PUT", PARAMS_PATH, {"params": change.sent, "note": "via gateway"}
                )
        if status == 200 and isinstance(data.get("version"), int):
            change.ok = True
            change.version = data["version"]
            pv = data.get("previous_version")
            change.previous_version = pv if isinstance(pv, int) else None
            return
        what = "no answer" if status == 0 else f"HTTP {status}"
        change.error = f"{what}: {data.get('error', '')}".rstrip(": ")[:300]

    async def _revert(self, client: httpx.AsyncClient, name: str, change: BackendChange) -> None:
        if change.previous_version is None or change.version is None:
            change.reverted = False
            return
        status, _ = await self._send(
            client,
            name,
            "POST",
            ROLLBACK_PATH,
            {"to_version": change.previous_version, "expected_version": change.version},
        )
        change.reverted = status == 200

    async def _fan_out(
        self, plan: dict[str, tuple[dict[str, Any], int | None]]
    ) -> dict[str, BackendChange]:
        """Send each backend its part (a PUT, or a rollback to a version of its own); on any
        failure revert those changed and raise ChangeFailed."""
        results = {n: BackendChange(sent) for n, (sent, _) in plan.items()}
        if not plan:
            return results
        async with self._client() as client:
            await asyncio.gather(
                *(self._change_one(client, n, results[n], to) for n, (_, to) in plan.items())
            )
            if all(r.ok for r in results.values()):
                return results
            await asyncio.gather(*(self._revert(client, n, r) for n, r in results.items() if r.ok))
        raise ChangeFailed(results)

    # -- a change -----------------------------------------------------------------------------
    async def _apply(
        self,
        update: dict[str, Any],
        note: str,
        source: str,
        rollback_of: int | None = None,
    ) -> Response:
        """Apply a validated update (or roll back to ``rollback_of``) as the next version."""
        current = self.store.current
        known = self.backend_versions[current.version]
        target_versions = None if rollback_of is None else self.backend_versions[rollback_of]
        plan: dict[str, tuple[dict[str, Any], int | None]] = {}
        for name in self.registry.states:
            part = self._for_backend(name, update)
            if target_versions is not None:
                to = target_versions.get(name, 1)
                if to != known.get(name, 1):
                    plan[name] = (part, to)
            elif part:
                plan[name] = (part, None)
        try:
            results = await self._fan_out(plan)
        except ChangeFailed as exc:
            return admin_error(
                f"backend(s) {', '.join(exc.failed)} failed: {exc}; the backends changed were "
                f"reverted and the gateway stays at version {current.version}",
                502,
                version=current.version,
                failed=exc.failed,
                backends={n: r.to_json() for n, r in exc.results.items()},
            )
        routing = update.get("routing")
        if routing is not None and (routing != self.admin.routing_spec or source == "routing"):
            self.admin.set_routing(routing)
        versions = dict(known)
        versions.update({n: r.version for n, r in results.items() if r.version is not None})
        # A rollback is exactly version K's set (the backends went back to their own K).
        merged = (
            current.params.merged(update)
            if rollback_of is None
            else self.store.get(rollback_of).params
        )
        v = self.store.commit(merged, self.wall_clock(), note, source)
        self.backend_versions[v.version] = versions
        for old in [k for k in self.backend_versions if k < self.store.history[0].version]:
            del self.backend_versions[old]
        skipped = {n: {"ok": True, "skipped": "nothing to change"} for n in self.registry.states}
        return admin_json(
            {
                "version": v.version,
                "previous_version": current.version,
                "params": v.params.to_json(),
                "backends": {**skipped, **{n: r.to_json() for n, r in results.items()}},
                **({} if rollback_of is None else {"rolled_back_to": rollback_of}),
            }
        )

    # -- endpoints ----------------------------------------------------------------------------
    async def get_params(self, request: Request) -> Response:
        return admin_json(self.view())

    def known_models(self) -> set[str]:
        """Every model some backend hosts (in its index, any state, or routed there)."""
        return set().union(*(self.hosted(n) for n in self.registry.states))

    async def put_params(self, request: Request) -> Response:
        try:
            update, expected, note = parse_put_body(object_body(request))
            if "routing" in update and update["routing"] is None:
                raise ConfigError("params.routing: the gateway needs a routing policy")
            known = self.known_models()
            for m in update.get("batching_per_model", {}):
                if m not in known:
                    raise ConfigError(
                        f"params.batching_per_model.{m}: no backend hosts model {m!r} "
                        f"(models: {', '.join(sorted(known)) or 'none'})"
                    )
        except (ConfigError, ValueError) as exc:
            return admin_error(str(exc), 400)
        async with self.lock:
            try:
                self.store.check(expected)
            except VersionConflictError as exc:
                return admin_error(str(exc), 409, version=exc.current)
            return await self._apply(update, note, "put")

    async def rollback(self, request: Request) -> Response:
        try:
            to, expected, note = parse_rollback_body(object_body(request))
        except (ConfigError, ValueError) as exc:
            return admin_error(str(exc), 400)
        async with self.lock:
            try:
                self.store.check(expected)
                target = self.store.get(to)
            except VersionConflictError as exc:
                return admin_error(str(exc), 409, version=exc.current)
            except UnknownVersionError as exc:
                return admin_error(str(exc), 404)
            update = {
                "routing": target.params.routing,
                "batching_per_model": dict(target.params.batching_per_model),
                "class_headroom": target.params.class_headroom,
                "learn_profiles": target.params.learn_profiles,
            }
            return await self._apply(update, note, "rollback", rollback_of=to)

    async def _put_routing(self, spec: Any) -> Response | None:
        """``PUT /admin/routing``: one more version, routing only (None: done)."""
        try:
            update = {"routing": normalized_routing(spec, "routing")}
        except ConfigError as exc:
            return admin_error(str(exc), 400)
        async with self.lock:
            reply = await self._apply(update, "PUT /admin/routing", "routing")
        return None if reply.status == 200 else reply
