"""One inference request on its way through the gateway: what is forwarded of it, and its
class and deadline as the router sees them (parsed from the forwarded headers at
admission)."""

from __future__ import annotations

from collections.abc import Callable

from evenserve.core import wire
from evenserve.core.types import RequestInfo
from evenserve.gateway.answers import Answer
from evenserve.policy.routing.dispatch import Tries

#: Request headers forwarded to the backend (lower case); others are hop-by-hop or ours.
FORWARD_REQUEST_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.PRIORITY_HEADER,
    wire.DEADLINE_HEADER,
)


class Forward(Tries):
    """One inference request on its way through the gateway: the rules' ``Tries`` and what
    the drivers need to forward it and answer. Made by ``new_forward`` (per request, without
    a class call's ``__init__`` frame)."""

    __slots__ = (
        "_headers",
        "answer",
        "backend",
        "body",
        "head_key",
        "model",
        "path",
        "relayed",
        "t0",
    )

    model: str
    path: str
    body: bytes
    #: When it came (``time.perf_counter``): its latency's start.
    t0: float
    #: The forwarded headers' values (FORWARD_REQUEST_HEADERS' order): a key of its head.
    head_key: tuple[str | None, ...]
    _headers: dict[str, str] | None
    #: The kept refusal (``FrontDoor.judge``), relayed when no try is left.
    relayed: Answer | None
    answer: Callable[[Answer], None] | None
    #: The backend of the try under way (the fast path's; set when it is sent).
    backend: str

    @property
    def headers(self) -> dict[str, str]:
        """The headers to forward (made when first asked for: the fast path's heads are
        made once per kind of request, not per request)."""
        h = self._headers
        if h is None:
            h = self._headers = {"accept-encoding": "identity"}
            for name, v in zip(FORWARD_REQUEST_HEADERS, self.head_key, strict=True):
                if v is not None:
                    h[name] = v
        return h


_new = object.__new__


def new_forward(
    req: RequestInfo, path: str, body: bytes, t0: float, head_key: tuple[str | None, ...]
) -> Forward:
    """A ``Forward`` of ``req`` (no try yet, nothing kept), every field set."""
    fw: Forward = _new(Forward)
    fw.req = req
    fw.attempt = 0
    fw.tried = []
    fw.failures = []
    fw.refused_by = None
    fw.model = req.model
    fw.path = path
    fw.body = body
    fw.t0 = t0
    fw.head_key = head_key
    fw._headers = None
    fw.relayed = None
    fw.answer = None
    fw.backend = ""
    return fw


def classify(req: RequestInfo, priority: str | None, deadline_ms: str | None) -> None:
    """The request's class and deadline from its headers' values, into ``req`` (the router
    sees them); a value that does not parse is left to the worker to refuse."""
    try:
        p = wire.parse_priority(priority, wire.PRIORITY_HEADER)
    except ValueError:
        p = None
    if p is not None:
        req.priority = p
    try:
        ms = wire.parse_deadline_ms(deadline_ms, wire.DEADLINE_HEADER)
    except ValueError:
        ms = None
    if ms is not None:
        req.deadline_s = req.arrival_s + ms / 1000.0
