"""The admin APIs' bearer-token check (the gateway's and the worker's)."""

from __future__ import annotations

import secrets

#: The ``WWW-Authenticate`` header of a 401 from an admin API.
BEARER_CHALLENGE = {"www-authenticate": 'Bearer realm="evenserve-admin"'}


def bearer_ok(authorization: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time)."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return False
    return secrets.compare_digest(value.strip().encode(), token)
