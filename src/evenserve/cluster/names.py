"""The names a cluster file gives: backends and devices, models."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from evenserve.core import wire

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError("letters, digits, '_', '.', '-' only")
    return v


#: A backend or device name: it becomes a metric label, a header value and a log file name.
Name = Annotated[str, Field(min_length=1), AfterValidator(_check_name)]


def _check_model(v: str) -> str:
    if not wire.is_safe_name(v):
        raise ValueError(
            f"{v!r}: a model name is a path segment: {wire.NAME_CHARS}, at most "
            f"{wire.MAX_NAME_LENGTH}, not '.' or '..'"
        )
    return v


#: A model name, as the gateway routes it (``core.wire.split_model_path``).
ModelName = Annotated[str, AfterValidator(_check_model)]
