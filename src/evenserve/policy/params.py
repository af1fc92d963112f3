"""The parameter set a tuner pushes live, its versioned store, and the same set on a simulator arm.

A parameter set ("params") is one JSON object::

    {"routing": {"policy": "queue-aware", ...} | null,      # a routing spec (gateway only)
     "batching_per_model": {"MODEL": {"policy": ..., ...}},  # one batching spec per model
     "class_headroom": null | 0 < x <= 1,                    # QueueOptions.class_headroom
     "learn_profiles": null | true | false}                  # profiles that learn

``learn_profiles`` null means "as the workers were started" (``--learn-profiles``); true or
false turns learning on or off live on every worker (``DeviceScheduler.set_learn_profiles``).

Specs are validated with the registries (``ROUTING.parse``, ``BATCHING.parse``), so an error
names the field (``params.batching_per_model.resnet50.max_batch_size: ...``). A routing spec
is kept normalized (``{policy, ...every param}``, as ``GET /admin/routing`` shows it); a
batching spec is kept as given (``{policy, ...given params}``): a worker fills a missing
``max_batch_size`` from the model's own config, as it does for ``model.yaml``.

Numbers must be finite: a value JSON reads as infinite or not a number (``1e400``, ``NaN``,
``Infinity``) is refused naming its field, so no version holds one and none is served as
the bare ``Infinity`` JSON does not allow.

An update (``parse_update``) is partial: keys absent keep their value; ``batching_per_model``
merges per model (a model named replaces that model's spec whole; models not named keep
theirs). :class:`ParamStore` numbers the sets applied (version 1: the startup config), keeps
a bounded history and refuses a change made against a version that is not the current one.
It is pure (the caller gives the wall-clock time), so the gateway and the worker share it.
:func:`apply_to_arm` puts the same set on a scenario arm, so the simulator and the live
system take the same object.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evenserve.core.errors import ConfigError
from evenserve.core.options import QueueOptions
from evenserve.core.scenario import ArmSpec
from evenserve.core.validation import format_validation_error, non_finite_field
from evenserve.policy.batching import BATCHING
from evenserve.policy.registry import split_spec
from evenserve.policy.routing import ROUTING

#: The keys of a parameter set.
PARAM_KEYS = ("routing", "batching_per_model", "class_headroom", "learn_profiles")
#: The fields of a ``PUT /admin/params`` body and of a ``POST /admin/params/rollback`` body.
PUT_FIELDS = ("params", "expected_version", "note")
ROLLBACK_FIELDS = ("to_version", "expected_version", "note")
#: Versions kept in a store's history by default.
HISTORY_LIMIT = 100


class ParamsError(ConfigError):
    """A parameter set (or update) is malformed; the message names the field."""


class VersionConflictError(ConfigError):
    """A change was made against a version that is not the current one (HTTP 409)."""

    def __init__(self, expected: int, current: int) -> None:
        super().__init__(
            f"expected_version: {expected} is not the current version ({current}); "
            "GET the params and retry against the current version"
        )
        self.expected = expected
        self.current = current


class UnknownVersionError(ConfigError):
    """A rollback names a version the store does not have (HTTP 404)."""


class Params(BaseModel):
    """A full parameter set (every key has a value; ``routing`` None: not this side's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    routing: Any = None
    batching_per_model: dict[str, Any] = Field(default_factory=dict)
    class_headroom: float | None = None
    #: Profiles that learn, on or off (None: as the workers were started).
    learn_profiles: bool | None = None

    def to_json(self, include_routing: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "batching_per_model": {m: dict(s) for m, s in sorted(self.batching_per_model.items())},
            "class_headroom": self.class_headroom,
            "learn_profiles": self.learn_profiles,
        }
        return {"routing": self.routing, **out} if include_routing else out

    def merged(self, update: Mapping[str, Any]) -> Params:
        """This set with a validated partial update (``parse_update``) applied."""
        values: dict[str, Any] = {
            "routing": self.routing,
            "batching_per_model": dict(self.batching_per_model),
            "class_headroom": self.class_headroom,
            "learn_profiles": self.learn_profiles,
        }
        if "routing" in update:
            values["routing"] = update["routing"]
        if "batching_per_model" in update:
            values["batching_per_model"].update(update["batching_per_model"])
        if "class_headroom" in update:
            values["class_headroom"] = update["class_headroom"]
        if "learn_profiles" in update:
            values["learn_profiles"] = update["learn_profiles"]
        return Params(**values)


def normalized_routing(spec: Any, where: str = "routing") -> dict[str, Any]:
    """A routing spec as ``{policy: name, ...every param}`` (PolicySpecError naming the field)."""
    name, params = ROUTING.parse(spec, where)
    return {"policy": name, **params.model_dump()}


def checked_batching(spec: Any, where: str) -> dict[str, Any]:
    """A batching spec validated, as ``{policy: name, ...the params given}``."""
    BATCHING.parse(spec, where)
    name, raw = split_spec(spec, where)
    return {"policy": name, **raw}


def checked_headroom(value: Any, where: str = "class_headroom") -> float | None:
    try:
        return QueueOptions.model_validate({"class_headroom": value}).class_headroom
    except ValidationError as exc:
        msg = format_validation_error(exc)
        raise ParamsError(f"{where}{msg.removeprefix('class_headroom')}") from None


def checked_learn_profiles(value: Any, where: str = "learn_profiles") -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ParamsError(f"{where}: expected true, false or null (got {value!r})")
    return value


def check_finite(raw: Any, where: str) -> None:
    """ParamsError naming the field of the first number in ``raw`` (JSON read: objects,
    arrays, numbers...) that is infinite or not a number."""
    found = non_finite_field(raw, where)
    if found is not None:
        raise ParamsError(f"{found[0]}: {found[1]} is not a finite number")


def parse_update(raw: Any, where: str = "params") -> dict[str, Any]:
    """A partial parameter set validated: only the keys given, each normalized.

    ParamsError (or PolicySpecError, also a ConfigError) naming the field."""
    if not isinstance(raw, Mapping):
        raise ParamsError(f"{where}: expected a JSON object with some of {', '.join(PARAM_KEYS)}")
    check_finite(raw, where)
    unknown = sorted(set(raw) - set(PARAM_KEYS))
    if unknown:
        raise ParamsError(
            f"{where}.{unknown[0]}: unknown parameter (known: {', '.join(PARAM_KEYS)})"
        )
    out: dict[str, Any] = {}
    if "routing" in raw:
        r = raw["routing"]
        out["routing"] = None if r is None else normalized_routing(r, f"{where}.routing")
    if "batching_per_model" in raw:
        per = raw["batching_per_model"]
        if not isinstance(per, Mapping):
            raise ParamsError(f"{where}.batching_per_model: expected an object model -> spec")
        out["batching_per_model"] = {
            str(m): checked_batching(s, f"{where}.batching_per_model.{m}") for m, s in per.items()
        }
    if "class_headroom" in raw:
        out["class_headroom"] = checked_headroom(raw["class_headroom"], f"{where}.class_headroom")
    if "learn_profiles" in raw:
        out["learn_profiles"] = checked_learn_profiles(
            raw["learn_profiles"], f"{where}.learn_profiles"
        )
    return out


def parse_params(raw: Any, where: str = "params") -> Params:
    """A full parameter set validated (keys absent take their empty values)."""
    return Params().merged(parse_update(raw, where))


@dataclass(frozen=True)
class ParamVersion:
    version: int
    params: Params
    applied_unix_s: float
    note: str
    #: What made it: ``startup``, ``put``, ``rollback``, ``routing`` (``PUT /admin/routing``).
    source: str

    def to_json(self, include_routing: bool = True) -> dict[str, Any]:
        return {
            "version": self.version,
            "params": self.params.to_json(include_routing),
            "applied_unix_s": self.applied_unix_s,
            "note": self.note,
            "source": self.source,
        }


class ParamStore:
    """The versions of a parameter set: version 1 is the startup config; each change applied
    is the next number; the last ``history_limit`` are kept (older ones can no longer be
    rolled back to)."""

    def __init__(
        self,
        initial: Params,
        now_unix_s: float,
        *,
        history_limit: int = HISTORY_LIMIT,
        note: str = "startup config",
    ) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be >= 1")
        first = ParamVersion(1, initial, now_unix_s, note, "startup")
        self.history: deque[ParamVersion] = deque([first], maxlen=history_limit)

    @property
    def current(self) -> ParamVersion:
        return self.history[-1]

    @property
    def version(self) -> int:
        return self.current.version

    def check(self, expected_version: int | None) -> None:
        """VersionConflictError unless ``expected_version`` is None or the current one."""
        if expected_version is not None and expected_version != self.version:
            raise VersionConflictError(expected_version, self.version)

    def get(self, version: int) -> ParamVersion:
        """Version ``version`` (UnknownVersionError: never made, or out of the history)."""
        for v in self.history:
            if v.version == version:
                return v
        oldest = self.history[0].version
        raise UnknownVersionError(
            f"to_version: no version {version} (kept: {oldest}..{self.version})"
        )

    def commit(self, params: Params, now_unix_s: float, note: str, source: str) -> ParamVersion:
        """Record ``params`` as applied: the next version."""
        v = ParamVersion(self.version + 1, params, now_unix_s, note, source)
        self.history.append(v)
        return v

    def to_json(self, include_routing: bool = True) -> dict[str, Any]:
        """``{version, params, history: [...]}``, oldest first (``GET /admin/params``)."""
        return {
            "version": self.version,
            "params": self.current.params.to_json(include_routing),
            "history": [v.to_json(include_routing) for v in self.history],
        }


def parse_expected_version(raw: Any, where: str = "expected_version") -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ParamsError(f"{where}: expected a version number (an integer >= 1)")
    return raw


def parse_note(raw: Any, where: str = "note") -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > 1000:
        raise ParamsError(f"{where}: expected a string of at most 1000 characters")
    return raw


def apply_to_arm(arm: ArmSpec, params: Params) -> ArmSpec:
    """``arm`` with ``params`` applied: its routing (unless ``params.routing`` is None), each
    model's batching (merged into the arm's ``batching_per_model``), class headroom and
    (unless ``params.learn_profiles`` is None) profiles that learn."""
    update: dict[str, Any] = {
        "batching_per_model": {**arm.batching_per_model, **params.batching_per_model},
        "class_headroom": params.class_headroom,
    }
    if params.routing is not None:
        update["routing"] = params.routing
    if params.learn_profiles is not None:
        update["learn_profiles"] = params.learn_profiles
    return arm.model_copy(update=update)


def _known_fields(body: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
    unknown = sorted(str(k) for k in body if k not in known)
    if unknown:
        raise ParamsError(f"{unknown[0]}: unknown field (a {what} body has {', '.join(known)})")


def parse_put_body(body: Mapping[str, Any]) -> tuple[dict[str, Any], int | None, str]:
    """A ``PUT /admin/params`` body: (the update, the expected version, the note).
    ParamsError naming the field for an unknown field, no ``params`` or an empty one (a
    change that changes nothing is not a version)."""
    _known_fields(body, PUT_FIELDS, "PUT /admin/params")
    if "params" not in body:
        raise ParamsError(f"params: required (an object with some of {', '.join(PARAM_KEYS)})")
    expected = parse_expected_version(body.get("expected_version"))
    note = parse_note(body.get("note"))
    update = parse_update(body["params"], "params")
    if not update:
        raise ParamsError(
            f"params: empty, nothing to change (give some of {', '.join(PARAM_KEYS)})"
        )
    return update, expected, note


def parse_rollback_body(body: Mapping[str, Any]) -> tuple[int, int | None, str]:
    """A ``POST /admin/params/rollback`` body: (the version to go back to, the expected
    version, the note: given, else ``rollback to version K``)."""
    _known_fields(body, ROLLBACK_FIELDS, "POST /admin/params/rollback")
    to = parse_expected_version(body.get("to_version"), "to_version")
    if to is None:
        raise ConfigError("to_version: required (the version to go back to)")
    expected = parse_expected_version(body.get("expected_version"))
    return to, expected, parse_note(body.get("note")) or f"rollback to version {to}"
