"""What the admin APIs (the gateway's and the worker's) share: the bearer-token check, the
JSON object a request body must be, and the error reply."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.httpio.server import Request, Response, json_bytes

JSON = {"content-type": "application/json"}

#: The ``WWW-Authenticate`` header of a 401 from an admin API.
BEARER_CHALLENGE = {"www-authenticate": 'Bearer realm="evenserve-admin"'}


def bearer_ok(authorization: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time)."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return False
    return secrets.compare_digest(value.strip().encode(), token)


def admin_json(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, json_bytes(obj), {**JSON, **(headers or {})})


def admin_error(message: str, status: int, **more: Any) -> Response:
    """``{"error": message, ...more}`` with ``status``."""
    return admin_json({"error": message, **more}, status)


def object_body(request: Request) -> dict[str, Any]:
    """The request's JSON object body, read as untrusted input; ConfigError naming
    ``body`` when it is empty or not a JSON object."""
    if not request.body.strip():
        raise ConfigError("body: empty (expected a JSON object)")
    raw = wire.parse_json(request.body, "body")
    if not isinstance(raw, dict):
        raise ConfigError("body: expected a JSON object")
    return raw
