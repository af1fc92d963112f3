"""A client of the versioned parameter API (``/admin/params`` on a gateway or a worker).

The tuner pushes with it and the watch loop rolls back with it::

    got = get_params(url, token)                       # {version, params, history, ...}
    reply = push_params(url, token, {"batching_per_model": {...}},
                        expected_version=got["version"], note="tuned")
    rollback_params(url, token, to_version=got["version"], expected_version=reply["version"])

Each call answers the server's JSON reply, or raises :class:`ParamsAPIError` with the
status and the reply (409: another change came first, ``current_version`` says which; 400:
the message names the field; 502: a backend failed, ``body["backends"]`` says how; 401:
the token; 404: an unknown version, or a worker without an admin token). ``status`` 0: no
answer (connection refused, time limit), or not sent (a number that is not finite, which
JSON cannot carry: the message names its field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from evenserve.core.errors import EvenserveError
from evenserve.core.validation import non_finite_field

PARAMS_PATH = "/admin/params"
ROLLBACK_PATH = "/admin/params/rollback"
TIMEOUT_S = 30.0


class ParamsAPIError(EvenserveError):
    """A refused or failed call: ``status`` (0: no answer) and the reply's JSON ``body``."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.body: dict[str, Any] = dict(body or {})

    @property
    def current_version(self) -> int | None:
        """The server's current version (a 409 or a 502 names it)."""
        v = self.body.get("version")
        return v if isinstance(v, int) else None


def _call(
    method: str,
    url: str,
    token: str,
    path: str,
    body: Mapping[str, Any] | None,
    timeout_s: float,
    transport: httpx.BaseTransport | None,
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"}
    bad = None if body is None else non_finite_field(body, "body")
    if bad is not None:  # JSON cannot carry it (and the server would refuse it)
        field = bad[0].removeprefix("body.")
        raise ParamsAPIError(0, f"not sent: {field}: {bad[1]} is not a finite number")
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, transport=transport) as client:
            r = client.request(method, url.rstrip("/") + path, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise ParamsAPIError(0, f"{url}: no answer ({type(exc).__name__}: {exc})") from None
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {"error": r.text[:500]}
    if r.status_code != 200:
        raise ParamsAPIError(r.status_code, str(data.get("error", r.reason_phrase)), data)
    return data


def get_params(
    url: str,
    token: str,
    *,
    timeout_s: float = TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """``GET /admin/params``: ``{version, params, history, ...}``."""
    return _call("GET", url, token, PARAMS_PATH, None, timeout_s, transport)


def push_params(
    url: str,
    token: str,
    params: Mapping[str, Any],
    expected_version: int | None = None,
    note: str = "",
    *,
    timeout_s: float = TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """``PUT /admin/params`` (a partial set: keys absent keep their value); the reply is
    ``{version, previous_version, params, backends?}``."""
    body: dict[str, Any] = {"params": dict(params), "note": note}
    if expected_version is not None:
        body["expected_version"] = expected_version
    return _call("PUT", url, token, PARAMS_PATH, body, timeout_s, transport)


def rollback_params(
    url: str,
    token: str,
    to_version: int,
    expected_version: int | None = None,
    note: str = "",
    *,
    timeout_s: float = TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """``POST /admin/params/rollback``: version ``to_version``'s params as a new version."""
    body: dict[str, Any] = {"to_version": to_version}
    if expected_version is not None:
        body["expected_version"] = expected_version
    if note:
        body["note"] = note
    return _call("POST", url, token, ROLLBACK_PATH, body, timeout_s, transport)
