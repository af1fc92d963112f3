"""The front door's rules: admit, choose the backend, judge a try, retry or eject, exhausted.

Theory of operation. Pure code over a Router: outcomes in (a status and a reason, or how a
try failed), decisions out; no clock reads (the driver passes its time), no I/O, no HTTP or
gRPC object. The gateway's three drivers (the awaited HTTP path, the callback fast path,
gRPC: ``gateway.dispatcher``) and the simulator's front (``sim.front``) run these rules, so
what the simulator predicts of refusals and retries is what the gateway does.

For one request of model m (a ``Tries``, which the driver keeps):
1. ``admit``: a model no backend has, in any state, is unknown (404, naming the known
   models). With refusals on (the gateway's ``overload.enabled``, the simulator arm's
   ``overload_refusals``), ``Router.refusal`` says whether every healthy host of m is full
   or predicted late past its SLO on the hosts' own evidence: then 429 ``overloaded`` with
   Retry-After, at once.
2. ``choose``: the router's pick among the healthy hosts of m, never one tried (or excluded
   from the start: a gRPC request's backends without a gRPC endpoint), for at most
   ``1 + retries`` tries. The driver counts the pick as sent (``Router.sent``) and, when the
   try is over, done (``Router.done``, with its time when the backend served it).
3. ``judge`` an answer: a backend's 503 (not ready, draining) or 429 other than ``shed``
   (its queue was full when the request came) means it did not take the work: the request
   goes to the next backend, and that answer is kept to relay should no try be left. Every
   other answer, a 429 ``shed`` and a 504 among them (the device is overloaded and this is
   its lowest class; the deadline has not grown), is the answer. ``failed`` judges a try
   that got no answer (``FAILURES``): connection refused or connect timeout (the request
   never left) and a connection lost before any answer (inference is side-effect free) go
   to the next backend; a refused connection also ejects the backend at once (its own
   evidence; a connect timeout may be the gateway's own lag, a lost connection a stale
   keep-alive: the poller decides). A response timeout means the backend has the request
   and is stuck: eject it and answer 504, no retry (the work may still finish there).
4. ``exhausted``: no try left or no host left: the last backend's kept refusal (relayed as
   it came), or the front door's own 503 with what each try met.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from evenserve.core.types import RequestInfo
from evenserve.core.wire import OVERLOADED, SHED, shown_name
from evenserve.policy.routing.router import Router

#: Outcome labels of the front door's own answers (the gateway's metrics).
UNKNOWN_MODEL = "unknown_model"
UNAVAILABLE = "unavailable"

#: The statuses by which a backend may say it did not take the work (``judge`` reads the
#: reason of these only).
REFUSING_STATUSES = (429, 503)

#: How a try got no answer (the driver sorts its transport's failure into one).
CONNECT_REFUSED = "connect-refused"
CONNECT_TIMEOUT = "connect-timeout"
CONNECTION_LOST = "connection-lost"
RESPONSE_TIMEOUT = "response-timeout"


@dataclass(frozen=True, slots=True)
class Refusal:
    """The front door's own answer: its status, outcome label and message; ``reason`` goes
    as ``x-evenserve-reason`` and ``retry_after`` says whether Retry-After goes with it."""

    status: int
    outcome: str
    message: str
    reason: str | None = None
    retry_after: bool = False


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a try without an answer comes to: the next backend (``retry``) or a 504; the
    backend ejected now for ``eject`` (the reason), or not (None)."""

    retry: bool
    eject: str | None


#: Each failure's judgement (module docstring, step 3).
FAILURES = {
    CONNECT_REFUSED: Judgement(True, "connect-refused"),
    CONNECT_TIMEOUT: Judgement(True, None),
    CONNECTION_LOST: Judgement(True, None),
    RESPONSE_TIMEOUT: Judgement(False, "timeout"),
}


@dataclass(slots=True)
class Tries:
    """One request at the front door: how many tries it had, the backends tried (and those
    excluded from the start), what each failed try met, and the backend whose refusal is
    kept to relay (the last one's)."""

    req: RequestInfo
    attempt: int = 0
    tried: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    refused_by: str | None = None


class FrontDoor:
    """The rules over one router: ``retries`` more backends after the first; ``refusals``:
    whether the overload rule may refuse; ``hosts_model`` and ``models``: the catalogue
    (whether a model is known at all, and every known model for the 404's message)."""

    __slots__ = ("hosts_model", "models", "refusals", "retries", "router")

    def __init__(
        self,
        router: Router,
        *,
        retries: int,
        refusals: bool,
        hosts_model: Callable[[str], bool],
        models: Callable[[], Iterable[str]],
    ) -> None:
        self.router = router
        self.retries = retries
        self.refusals = refusals
        self.hosts_model = hosts_model
        self.models = models

    def admit(self, model: str, now_s: float) -> Refusal | None:
        """None: take the request; else the answer at once (404 unknown, 429 overloaded)."""
        if not self.hosts_model(model):
            return Refusal(
                404,
                UNKNOWN_MODEL,
                f"unknown model {shown_name(model)} (served: {', '.join(self.models())})",
            )
        if self.refusals:
            why = self.router.refusal(model, now_s)
            if why is not None:
                return Refusal(429, OVERLOADED, f"{why}; retry later", OVERLOADED, True)
        return None

    def choose(self, t: Tries, now_s: float) -> str | None:
        """The backend for the next try (recorded as tried), or None: no try or host left."""
        if t.attempt > self.retries:
            return None
        view = self.router.choose(t.req, now_s, exclude=t.tried)
        if view is None:
            return None
        name = view.name
        t.tried.append(name)
        t.attempt += 1
        return name

    @staticmethod
    def judge(t: Tries, name: str, status: int, reason: str | None) -> bool:
        """Whether backend ``name``'s answer (``status``, its ``x-evenserve-reason``; a
        driver may leave the reason None unless the status is in ``REFUSING_STATUSES``) is
        the one to give; False: the request goes to the next backend, and this answer is
        the one kept to relay."""
        if status in REFUSING_STATUSES and reason != SHED:
            t.refused_by = name
            t.failures.append(f"{name}: answered {status}")
            return False
        return True

    @staticmethod
    def failed(t: Tries, name: str, kind: str, note: str) -> Judgement:
        """A try on ``name`` that got no answer (``kind``, one of ``FAILURES``; ``note``: the
        words for the 503 should no try be left)."""
        j = FAILURES[kind]
        if j.retry:
            t.failures.append(f"{name}: {note}")
        return j

    @staticmethod
    def exhausted(t: Tries, none_ready: Callable[[], str]) -> Refusal | None:
        """No try left: None to relay the kept refusal (``refused_by``'s answer), else the
        front door's 503 naming what the tries met (``none_ready``'s words when none was
        made)."""
        if t.refused_by is not None:
            return None
        what = "; ".join(t.failures) if t.failures else none_ready()
        return Refusal(
            503,
            UNAVAILABLE,
            f"no backend available for model {t.req.model!r} ({what})",
            None,
            True,
        )


def first_try(door: FrontDoor, req: RequestInfo, now_s: float) -> str | None:
    """``door.choose`` for a request's first try, without a ``Tries`` (the simulator's hot
    path: most requests need no second): the router's pick among every healthy host."""
    view = door.router.choose(req, now_s)
    return None if view is None else view.name
