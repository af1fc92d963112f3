"""The target: loopback check, a preflight that turns a bad target into one clear message,
and the classification of failed requests.

Preflight, before any load: the server must answer (``GET /v2/health/live``), and every model
of the mix must exist (``GET /v2/models/{model}``: its metadata, which the payloads are built
from). A refused connection, a timeout or an unknown model stops the run with a
:class:`TargetError` that says what was tried and what the server offers; answers that go wrong
during the run (500s, 429s, timeouts) are counted by kind and summarized, never raised.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from evenserve.core.errors import EvenserveError
from evenserve.core.wire import HEALTH_LIVE_PATH, REPOSITORY_INDEX_PATH
from evenserve.httpio.client import BadResponse, ConnectFailed, ConnectionLost


class TargetError(EvenserveError):
    """The target cannot be load-tested (unreachable, not KServe v2, unknown model)."""


#: The send path's errors (``httpio.client``): the connection closed before the answer was
#: complete; the answer could not be parsed as HTTP/1.1.
ConnectionLostError = ConnectionLost
BadResponseError = BadResponse


def check_url(url: str, allow_remote: bool, what: str = "target") -> str:
    """Normalize ``url``; refuse anything but a loopback host unless ``allow_remote``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"{what} {url!r}: expected http://HOST:PORT")
    host = parts.hostname
    if not allow_remote and not is_loopback(host):
        raise TargetError(
            f"{what} {url!r}: {host} is not a loopback address; load tests go to 127.0.0.1 / "
            "localhost unless --allow-remote is given"
        )
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


#: A failed request's kind by the class of the client's exception (ours or aiohttp's), first
#: match first; aiohttp's timeouts are TimeoutErrors, its connect errors ClientOSErrors.
EXCEPTION_KINDS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (ConnectionRefusedError, "connection-refused"),
    (TimeoutError, "timeout"),
    ((ConnectionLostError, ConnectionResetError, BrokenPipeError), "connection-lost"),
    ((BadResponseError, aiohttp.ClientPayloadError), "bad-response"),
    (aiohttp.ClientConnectorError, "connect-error"),
    ((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError), "connection-lost"),
    (OSError, "connect-error"),
)


def classify_exception(exc: BaseException) -> str:
    """A failed request's kind (EXCEPTION_KINDS; a connect error that was a refusal is one)."""
    if isinstance(exc, ConnectFailed):
        return {"connect-refused": "connection-refused", "timeout": "timeout"}.get(
            str(exc), "connect-error"
        )
    if isinstance(exc, aiohttp.ClientConnectorError) and (
        isinstance(exc.os_error, ConnectionRefusedError) or "refused" in str(exc).lower()
    ):
        return "connection-refused"
    return next((kind for types, kind in EXCEPTION_KINDS if isinstance(exc, types)), "client-error")


def classify_status(status: int) -> str:
    if status == 429:
        return "overloaded"
    if status == 404:
        return "not-found"
    return f"http-{status}"


HINTS = {
    "connection-refused": "nothing listens there: is the server running, and on that port?",
    "connect-error": "the connection could not be made (address, firewall, DNS)",
    "timeout": "the server took longer than --timeout to answer",
    "connection-lost": "the server closed the connection before answering (crashed?)",
    "overloaded": "the server refused work (429: queue full or every host overloaded)",
    "not-found": "the server does not know this model (or the URL path is wrong)",
    "bad-response": "the answer was cut short or malformed",
}


def hint(kind: str) -> str:
    if kind in HINTS:
        return HINTS[kind]
    if kind.startswith("http-5"):
        return "the server failed on the request (see its log)"
    if kind.startswith("http-4"):
        return "the server rejected the request (see the example message)"
    return "unexpected client error"


@dataclass
class ErrorTally:
    """Failed requests by kind, with the first message of each kind."""

    counts: Counter[str] = field(default_factory=Counter)
    by_model: Counter[tuple[str, str]] = field(default_factory=Counter)
    example: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, model: str, message: str) -> None:
        self.counts[kind] += 1
        self.by_model[(kind, model)] += 1
        self.example.setdefault(kind, message[:300])

    def to_json(self) -> dict[str, Any]:
        return {
            kind: {
                "count": n,
                "models": {m: c for (k, m), c in sorted(self.by_model.items()) if k == kind},
                "example": self.example.get(kind, ""),
                "hint": hint(kind),
            }
            for kind, n in self.counts.most_common()
        }


def error_lines(errors: dict[str, Any], total: int) -> list[str]:
    """The human summary of a run's errors (one line per kind)."""
    out = []
    for kind, e in errors.items():
        models = ", ".join(f"{m} {c}" for m, c in e["models"].items())
        pct = 100.0 * e["count"] / total if total else 0.0
        out.append(
            f"{kind}: {e['count']} of {total} requests ({pct:.1f} %; {models}) - {e['hint']}"
            + (f"; e.g. {e['example']!r}" if e["example"] else "")
        )
    return out


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        body = await resp.read()
        try:
            return resp.status, json.loads(body) if body else None
        except ValueError:
            return resp.status, body.decode(errors="replace")[:300]


async def preflight(
    session: aiohttp.ClientSession, base_url: str, models: list[str], need_metadata: set[str]
) -> dict[str, dict[str, Any]]:
    """Check the target and return metadata of the models in ``need_metadata``."""
    try:
        status, _ = await _get(session, base_url + HEALTH_LIVE_PATH)
    except (TimeoutError, aiohttp.ClientError) as exc:
        kind = classify_exception(exc)
        why = f": {exc.strerror}" if isinstance(exc, aiohttp.ClientConnectorError) else ""
        raise TargetError(f"target {base_url}: {kind} ({hint(kind)}){why}") from None
    if status >= 500 or status == 404:
        raise TargetError(
            f"target {base_url}: GET {HEALTH_LIVE_PATH} answered {status}; is this a KServe v2 "
            "server (an evenserve gateway or worker, Triton, MLServer)?"
        )
    meta: dict[str, dict[str, Any]] = {}
    missing = []
    for m in models:
        try:
            status, body = await _get(session, f"{base_url}/v2/models/{m}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            kind = classify_exception(exc)
            raise TargetError(f"target {base_url}: model {m!r}: {kind} ({hint(kind)})") from None
        if status == 404:
            missing.append(m)
            continue
        if status == 503 and m not in need_metadata:
            # Known but not loaded (a placement gateway loads it on the first request); its
            # request body is given, so its metadata is not needed.
            continue
        if status != 200 or not isinstance(body, dict):
            raise TargetError(
                f"target {base_url}: GET /v2/models/{m} answered {status}: {str(body)[:200]}"
            )
        if m in need_metadata:
            meta[m] = body
    if missing:
        known = await known_models(session, base_url)
        raise TargetError(
            f"target {base_url}: no model named {', '.join(repr(m) for m in missing)} "
            f"(the target serves: {', '.join(known) if known else 'unknown'}); check --mix"
        )
    return meta


async def known_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    try:
        async with session.post(base_url + REPOSITORY_INDEX_PATH, json={}) as resp:
            if resp.status != 200:
                return []
            body = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return []
    if not isinstance(body, list):
        return []
    return sorted({str(x.get("name")) for x in body if isinstance(x, dict) and x.get("name")})
