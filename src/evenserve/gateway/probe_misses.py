"""When a probe without an answer ejects its backend: the gateway's evidence rule.

Ejection needs the backend's own evidence. A refused connection ejects at once (with the
reason; so do a not-ready answer and a bad load report, judged by the poller); the next
successful probe readmits it. So a dead worker leaves routing within one period plus the
connect failure (refused connections fail in well under a millisecond on loopback), and a
restarted one is back within one period of becoming ready. A probe without an answer in time
(a timeout, a lost connection) is a *miss*: ``health.misses`` (2) in a row eject. A probe's
time limit runs from when it was sent, and an answer that came in time but that a busy
gateway read late still counts (``httpio.client``), so the gateway's own lag cannot eject a
healthy backend. Nor is a backend ejected for a miss while it is answering requests: one
that answered a forwarded request (any status) after the missed probe was sent is alive, only
slow to probe (a worker busy decoding large bodies; counted in ``answering``). A backend that
hangs answers nothing, and its next miss ejects it. And never all at once without evidence: a
miss does not eject while every other healthy backend has missed too (that is the gateway
starving, not every backend failing at once, counted in ``held``; a hung backend then still
leaves routing through the data plane's request timeout).
"""

from __future__ import annotations

import logging

from evenserve.gateway.backends import BackendRegistry, BackendState
from evenserve.httpio.client import ConnectFailed, HttpClientError

#: The poller's logger: these are its lines (their logger name unchanged by the split).
log = logging.getLogger("evenserve.gateway.poller")


class MissJudge:
    """Judges the probes of a registry's backends that got no answer (module docstring)."""

    def __init__(self, registry: BackendRegistry, misses_to_eject: int) -> None:
        self.registry = registry
        #: ``health.misses``: misses in a row that eject.
        self.misses_to_eject = misses_to_eject
        #: Misses not acted on because every other backend missed too (the gateway's lag).
        self.held = 0
        #: Misses not acted on because the backend answered a request after the probe went.
        self.answering = 0

    def failed(self, st: BackendState, exc: HttpClientError, sent_s: float) -> None:
        """A probe sent at ``sent_s`` got no answer: a refused connection ejects at once,
        anything else is a miss."""
        if isinstance(exc, ConnectFailed):
            if str(exc) == "connect-refused":
                self.registry.eject(st.spec.name, "connect-refused")
            else:
                self.missed(st, f"connect {exc}", sent_s)
            return
        self.missed(st, "timeout" if isinstance(exc, TimeoutError) else "connection-lost", sent_s)

    def missed(self, st: BackendState, reason: str, sent_s: float) -> None:
        """A probe sent at ``sent_s`` got no answer in time: a miss (module docstring)."""
        st.misses += 1
        st.last_error = reason
        if st.misses < self.misses_to_eject or not st.healthy:
            return
        if st.answered_s >= sent_s:  # it answered a request since: alive, slow to probe
            self.answering += 1
            if self.answering == 1 or self.answering % 100 == 0:
                log.warning(
                    "backend %s missed %d probes in a row but is answering requests: not "
                    "ejected (%d times)",
                    st.spec.name,
                    st.misses,
                    self.answering,
                )
            return
        others = [o for o in self.registry.states.values() if o is not st and o.healthy]
        if others and all(o.misses > 0 for o in others):
            self.held += 1
            if self.held == 1 or self.held % 100 == 0:
                log.warning(
                    "every backend missed its probe at once (%d times): the gateway is "
                    "starved, not every backend down; none ejected",
                    self.held,
                )
            return
        self.registry.eject(st.spec.name, f"{reason} ({st.misses} probes in a row)")
