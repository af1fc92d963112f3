"""The worker's admin API: its versioned parameters (batching per model, class headroom,
profiles that learn).

Behind a bearer token (``--admin-token-file`` or ``$EVENSERVE_ADMIN_TOKEN``); without one
every ``/admin/*`` path answers 404 saying the admin API is off; a missing or wrong token is
401. The bodies and semantics are the gateway's (``policy.params``), without ``routing``:

- ``GET  /admin/params``: ``{version, params, history: [{version, params, applied_unix_s,
  note, source}], live}`` (version 1: the startup config; the last 100 kept; ``live``: what
  runs now, ``learn_profiles`` as a boolean: a version's null means as the worker was
  started).
- ``PUT  /admin/params`` ``{"expected_version": N?, "params": {...partial}, "note": "..."}``:
  keys absent keep their value (``batching_per_model`` merges per model; ``routing`` is
  ignored); 409 when ``expected_version`` is not the current one; 400 naming the field (a
  model not served here, an empty body or ``params``, an unknown field, a number that is not
  finite such as ``1e400``: no version is made); else the next version, applied to the
  scheduler for its next decision (queued requests are kept and answered once). The reply
  is ``{version, previous_version, params}``.
- ``POST /admin/params/rollback`` ``{"to_version": K, "expected_version": N?}``: version
  K's params applied as a new version (404: K unknown).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.httpio.bearer import (
    BEARER_CHALLENGE,
    admin_error,
    admin_json,
    bearer_ok,
    object_body,
)
from evenserve.httpio.server import Request, Response
from evenserve.policy.params import (
    Params,
    ParamStore,
    ParamVersion,
    UnknownVersionError,
    VersionConflictError,
    parse_put_body,
    parse_rollback_body,
)
from evenserve.sched import batching_setup
from evenserve.worker.device import Device
from evenserve.worker.models.registry import ModelRegistry

Endpoint = Callable[[Request], Awaitable[Response]]
#: The admin paths (each answers 404 "off" without a token).
PARAMS_PATH = "/admin/params"
ROLLBACK_PATH = "/admin/params/rollback"


class LiveParams:
    """The parameters the worker runs with now, and how they change."""

    def __init__(self, models: ModelRegistry, device: Device) -> None:
        self.models = models
        self.device = device
        self.options = device.options
        #: ``--learn-profiles`` as started (a params set's ``learn_profiles`` null goes back
        #: to it); ``options.learn_profiles`` is what runs now.
        self.startup_learn_profiles = device.options.learn_profiles

    def params(self) -> Params:
        return Params(
            batching_per_model=self.models.batching_params(),
            class_headroom=self.options.queue.class_headroom,
            learn_profiles=self.options.learn_profiles,
        )

    def apply(
        self,
        batching_per_model: Mapping[str, Any] | None = None,
        class_headroom: float | None = None,
        *,
        set_headroom: bool = False,
        learn_profiles: bool | None = None,
        set_learning: bool = False,
        where: str = "params",
    ) -> None:
        """Batch each model named with its new spec, (``set_headroom``) use the class
        headroom given and (``set_learning``) turn profiles that learn on or off
        (``learn_profiles`` None: as the worker was started), from the scheduler's next
        decision on: queued requests stay queued and are each answered once; running
        batches run on. Every spec is checked before anything changes (ConfigError naming
        the field: a model not served here, a policy's batch size over the model's
        ``max_batch_size``). Call it on the worker's loop."""
        built: dict[str, tuple[Any, Any]] = {}
        for m, spec in (batching_per_model or {}).items():
            hosted = self.models.get(m)
            at = f"{where}.batching_per_model.{m}"
            if hosted is None:
                served = ", ".join(sorted(self.models)) or "none"
                raise ConfigError(f"{at}: model {m!r} is not served here (models: {served})")
            e = hosted.entry
            built[m] = batching_setup(spec, e.config.max_batch_size, at)
        driver = self.device.driver
        now = driver.clock.now() if driver is not None else 0.0
        for m, (full, policy) in built.items():
            self.models[m].policy = policy
            self.models[m].batching_spec = full
            if driver is not None:
                with driver.lock:
                    driver.sched.set_policy(m, policy, now)
        if set_headroom:
            self.options.queue = self.options.queue.model_copy(
                update={"class_headroom": class_headroom}
            )
            if driver is not None:
                with driver.lock:
                    driver.sched.set_class_headroom(class_headroom, now)
        if set_learning:
            on = self.startup_learn_profiles if learn_profiles is None else learn_profiles
            self.options.learn_profiles = on
            if driver is not None:
                with driver.lock:
                    driver.sched.set_learn_profiles(on, now)


class WorkerAdmin:
    """The worker's ``/admin/params`` endpoints over its :class:`LiveParams`."""

    def __init__(
        self,
        live: LiveParams,
        token: str | None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.live = live
        self._token = None if token is None else token.encode()
        self.wall_clock = wall_clock
        self.store = ParamStore(self.live_params(), wall_clock())

    def live_params(self) -> Params:
        return self.live.params()

    def guard(self, endpoint: Endpoint) -> Endpoint:
        async def wrapped(request: Request) -> Response:
            if self._token is None:
                return admin_error(
                    "the admin API is off (start the worker with --admin-token-file or "
                    "EVENSERVE_ADMIN_TOKEN set)",
                    404,
                )
            if not bearer_ok(request.headers.get("authorization"), self._token):
                return admin_json(
                    {"error": "admin API: missing or invalid bearer token"}, 401, BEARER_CHALLENGE
                )
            return await endpoint(request)

        return wrapped

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        return {
            ("GET", PARAMS_PATH): self.guard(self.get_params),
            ("PUT", PARAMS_PATH): self.guard(self.put_params),
            ("POST", ROLLBACK_PATH): self.guard(self.rollback),
        }

    # -- endpoints ----------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        out = self.store.to_json(include_routing=False)
        # What runs now (a model loaded since the last change runs its model.yaml's spec).
        out["live"] = self.live_params().to_json(include_routing=False)
        return out

    async def get_params(self, request: Request) -> Response:
        return admin_json(self.view())

    def _apply(self, update: Mapping[str, Any], note: str, source: str) -> ParamVersion:
        """Apply a validated update on top of the current version and record it."""
        self.live.apply(
            update.get("batching_per_model"),
            update.get("class_headroom"),
            set_headroom="class_headroom" in update,
            learn_profiles=update.get("learn_profiles"),
            set_learning="learn_profiles" in update,
        )
        previous = self.store.current.params
        merged = previous.merged({k: v for k, v in update.items() if k != "routing"})
        if source == "rollback":  # exactly the version rolled back to
            merged = Params(
                batching_per_model=update["batching_per_model"],
                class_headroom=update["class_headroom"],
                learn_profiles=update["learn_profiles"],
            )
        return self.store.commit(merged, self.wall_clock(), note, source)

    def _reply(self, previous: int, v: ParamVersion, **more: Any) -> Response:
        return admin_json(
            {
                "version": v.version,
                "previous_version": previous,
                "params": v.params.to_json(include_routing=False),
                **more,
            }
        )

    async def put_params(self, request: Request) -> Response:
        try:
            update, expected, note = parse_put_body(object_body(request))
            self.store.check(expected)
            previous = self.store.version
            v = self._apply(update, note, "put")
        except VersionConflictError as exc:
            return admin_error(str(exc), 409, version=exc.current)
        except (ConfigError, ValueError) as exc:
            return admin_error(str(exc), 400)
        ignored = ["routing"] if "routing" in update else []
        return self._reply(previous, v, **({"ignored": ignored} if ignored else {}))

    async def rollback(self, request: Request) -> Response:
        try:
            to, expected, note = parse_rollback_body(object_body(request))
            self.store.check(expected)
            target = self.store.get(to)
            previous = self.store.version
            update = target.params.to_json(include_routing=False)
            v = self._apply(update, note, "rollback")
        except VersionConflictError as exc:
            return admin_error(str(exc), 409, version=exc.current)
        except UnknownVersionError as exc:
            return admin_error(str(exc), 404)
        except (ConfigError, ValueError) as exc:
            return admin_error(str(exc), 400)
        return self._reply(previous, v, rolled_back_to=to)
