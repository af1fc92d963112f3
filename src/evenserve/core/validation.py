"""Typed config documents: read YAML, validate a parsed mapping, one clear error naming fields."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from evenserve.core.errors import ConfigError


class Strict(BaseModel):
    """A config document's models: an unknown field is an error."""

    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path, missing: str, error: type[ConfigError] = ConfigError) -> Any:
    """The parsed YAML of ``path``; ``missing`` is the message when the file does not exist."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise error(missing) from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming the field by its dotted path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p != "__root__")
        where = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        lines.append(f"{where}: {e['msg']}" if where else str(e["msg"]))
    return "; ".join(lines)


def validate_document(
    model: type[M], raw: Any, source: str, error: type[ConfigError] = ConfigError
) -> M:
    """``model`` validated from the top-level mapping ``raw`` read from ``source``."""
    if not isinstance(raw, dict):
        raise error(f"{source}: expected a mapping at the top level")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{source}: {format_validation_error(exc)}") from exc


def non_finite_field(doc: Any, where: str) -> tuple[str, float] | None:
    """The path (``where.a.0.b``) and the value of the first number in ``doc`` (parsed JSON
    or YAML: mappings, lists, numbers...) that is infinite or not a number, else None. JSON
    has no such numbers: a document holding one can be neither sent nor served as JSON."""
    if isinstance(doc, float):
        return None if math.isfinite(doc) else (where, doc)
    if isinstance(doc, Mapping):
        items: Any = doc.items()
    elif isinstance(doc, list | tuple):
        items = enumerate(doc)
    else:
        return None
    for k, v in items:
        found = non_finite_field(v, f"{where}.{k}")
        if found is not None:
            return found
    return None
