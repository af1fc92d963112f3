"""Policy registry: kebab-case names -> (typed params, factory).

A policy spec in a config is either a bare name (``round-robin``) or a mapping with a
``policy`` key and the policy's parameters (``{policy: fixed-window, max_batch_size: 8}``).
Parameters are validated by the policy's pydantic model; unknown names and unknown or
out-of-range parameters raise PolicySpecError naming the field.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from evenserve.core.errors import ConfigError
from evenserve.core.validation import format_validation_error

P = TypeVar("P")
F = TypeVar("F", bound=Callable[..., Any])


class PolicySpecError(ConfigError):
    """A policy spec names an unknown policy or carries bad parameters."""


class PolicyParams(BaseModel):
    """Base of every policy's parameter model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class RegistryEntry(Generic[P]):
    name: str
    params_model: type[PolicyParams]
    factory: Callable[..., P]
    summary: str
    seeded: bool


class Registry(Generic[P]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, RegistryEntry[P]] = {}

    def register(
        self, name: str, params_model: type[PolicyParams], summary: str, *, seeded: bool = False
    ) -> Callable[[F], F]:
        """Register a policy class, built as ``cls(params)``, or ``cls(params, rng)`` with
        ``seeded`` (a randomized policy gets the seeded generator)."""

        def deco(factory: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} policy {name!r} registered twice")
            self._entries[name] = RegistryEntry(name, params_model, factory, summary, seeded)
            return factory

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str, where: str = "policy") -> RegistryEntry[P]:
        try:
            return self._entries[name]
        except KeyError:
            raise PolicySpecError(
                f"{where}: unknown {self.kind} policy {name!r} (known: {', '.join(self.names())})"
            ) from None

    def parse(self, spec: Any, where: str = "policy") -> tuple[str, PolicyParams]:
        """Validate a spec; return (name, params)."""
        name, raw = split_spec(spec, where)
        entry = self.entry(name, f"{where}.policy" if isinstance(spec, Mapping) else where)
        try:
            params = entry.params_model.model_validate(raw)
        except ValidationError as exc:
            raise PolicySpecError(format_validation_error(exc, where)) from exc
        return name, params

    def resolved(self, spec: Any, where: str = "policy") -> dict[str, Any]:
        """A spec with every parameter spelled out: ``{"policy": name, **params}``."""
        name, params = self.parse(spec, where)
        return {"policy": name, **params.model_dump()}

    def build(self, spec: Any, rng: random.Random | None = None, where: str = "policy") -> P:
        name, params = self.parse(spec, where)
        entry = self._entries[name]
        if entry.seeded:
            return entry.factory(params, rng or random.Random(0))
        return entry.factory(params)


def split_spec(spec: Any, where: str) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        raw = dict(spec)
        name = raw.pop("policy", None)
        if not isinstance(name, str):
            raise PolicySpecError(f"{where}.policy: required (a policy name)")
        return name, raw
    raise PolicySpecError(f"{where}: expected a policy name or a mapping with 'policy'")


def spec_label(spec: Any) -> str:
    """Short human label of a spec, e.g. ``fixed-window(max_batch_size=8)``."""
    name, raw = split_spec(spec, "policy")
    if not raw:
        return name
    inner = ",".join(f"{k}={v}" for k, v in sorted(raw.items()))
    return f"{name}({inner})"


def batching_label(batching: Any, per_model: Mapping[str, Any]) -> str:
    """An arm's batching as one label: its spec, then each model's own (``m: spec``)."""
    own = "; ".join(f"{m}: {spec_label(s)}" for m, s in sorted(per_model.items()))
    return spec_label(batching) + (f"; {own}" if own else "")
