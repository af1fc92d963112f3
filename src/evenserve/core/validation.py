"""Typed config documents: validate a parsed YAML/JSON mapping, one clear error naming fields."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from evenserve.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


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
