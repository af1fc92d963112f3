"""What the gateway answers: exactly one ``Answer`` per request, a backend's relayed as the
bytes it came in where it can go so, the front door's own refusals written anew.

A backend's answer that came in one read with an exact ``Content-Length`` and no hop-by-hop
header (the HTTP client keeps such an answer whole: ``httpio.client.Reply.raw``) goes to the
client as it is, with ``x-evenserve-backend`` added at the end of its head
(``Dispatcher.settle``), every other header as the backend sent it, as nginx relays them; any
other is written anew from its status, body and the relayed headers
(``RELAY_RESPONSE_HEADERS``). A gRPC try's answer (``GrpcReply``) carries the HTTP status the
front door's rules judge it by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evenserve.core import wire
from evenserve.httpio.client import parse_headers
from evenserve.httpio.server.messages import Response
from evenserve.policy.routing.dispatch import Refusal

#: Response headers relayed to the client.
RELAY_RESPONSE_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.RETRY_AFTER_HEADER,
    wire.REASON_HEADER,
    wire.QUEUE_MS_HEADER,
    wire.COMPUTE_MS_HEADER,
)


@dataclass(slots=True)
class GrpcReply:
    """A backend's answer to a gRPC call: its status code, message, trailing metadata and
    response (OK only: the serialized message, relayed as it is); ``status`` is the HTTP
    counterpart the shared rules judge, ``reason`` the backend's ``x-evenserve-reason``."""

    status: int
    reason: str | None
    code: Any
    message: str = ""
    trailing: tuple[tuple[str, str], ...] = ()
    response: Any = None


class Answer(Response):
    """What the gateway sends back: exactly one per request. It is the HTTP server's
    ``Response`` as well (status, body, headers, ``raw``, ``raw_head``), so the fast path
    hands it to the server as it is."""

    __slots__ = ("backend", "grpc", "head", "outcome")
    headers: dict[str, str]

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str],
        backend: str | None,
        outcome: str,
        grpc: GrpcReply | None = None,
        raw: bytes | None = None,
        raw_head: int = 0,
        head: bytes = b"",
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.backend = backend
        self.outcome = outcome
        #: A backend's gRPC answer, relayed as it is (gRPC requests only).
        self.grpc = grpc
        #: A backend's HTTP answer relayed as the bytes it came in, ``x-evenserve-backend``
        #: added (``Dispatcher.settle``); ``headers`` is then empty and ``head`` (the backend's
        #: head) has them. ``raw_head``: where the head of ``raw`` ends.
        self.raw = raw
        self.raw_head = raw_head
        self.head = head

    def __repr__(self) -> str:
        return f"Answer({self.status}, backend={self.backend!r}, outcome={self.outcome!r})"

    def header(self, name: str) -> str | None:
        """A response header (lower-case name) whichever way the answer goes out."""
        if self.raw is not None:
            return parse_headers(self.head).get(name)
        return self.headers.get(name)


_new = object.__new__


def relayed_answer(
    status: int, body: bytes, backend: str, outcome: str, raw: bytes, raw_head: int, head: bytes
) -> Answer:
    """``Answer(status, body, {}, backend, outcome, None, raw, raw_head, head)``: a backend's
    answer relayed as its bytes (per request, so without a class call's ``__init__``)."""
    a: Answer = _new(Answer)
    a.status = status
    a.body = body
    a.headers = {}
    a.backend = backend
    a.outcome = outcome
    a.grpc = None
    a.raw = raw
    a.raw_head = raw_head
    a.head = head
    return a


def error_answer(
    status: int, message: str, outcome: str, extra: Mapping[str, str] | None = None
) -> Answer:
    headers = {"content-type": "application/json"}
    if extra:
        headers.update(extra)
    return Answer(status, json.dumps({"error": message}).encode(), headers, None, outcome)


def refusal_answer(ref: Refusal, retry_after_s: int) -> Answer:
    """The front door's own answer (``policy.routing.dispatch.Refusal``) as the gateway sends
    it: Retry-After ``retry_after_s`` where the rules ask for it, and the reason."""
    extra: dict[str, str] = {}
    if ref.retry_after:
        extra["retry-after"] = str(retry_after_s)
    if ref.reason is not None:
        extra[wire.REASON_HEADER] = ref.reason
    return error_answer(ref.status, ref.message, ref.outcome, extra)


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    if status == 429:
        return "backend_overloaded"
    if status < 500:
        return "client_error"
    return "backend_error"
