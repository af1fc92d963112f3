"""The simulator's front door: N gateways behind an L4 split, each running the gateway's rules.

Theory of operation. Each simulated gateway is a Router under a ``FrontDoor``
(``policy.routing.dispatch``), the rules the live gateway's dispatcher runs, so the
simulator's refusals and retries are the gateway's:
- The L4 split (several gateways, design 0013): a closed-loop user keeps its gateway (its
  connection), other arrivals go round robin; which gateway routed each request in flight
  is kept (``gateway_of``, by log index) so its answer reaches that router.
- Admission: with refusals on (the arm's ``overload_refusals``, live ``overload.enabled``)
  a request is dropped as ``overloaded`` when the refusal rule holds (the gateway's 429).
- The choice and the tries: the router picks a device, the pick is counted as sent and the
  request offered to the device's scheduler. A device that refuses at once as the worker
  answers 503 (``draining``) or 429 other than ``shed`` (``queue-full``) did not take the
  work: the router hears the try is done and the request goes to the next device, for at
  most ``1 + retries`` tries (the arm's ``retries``, live ``forward.retries``), as the
  gateway retries; other refusals (``deadline-infeasible``: a 504) are the answer. No try
  or device left: the last refusal stands (``drop`` with its reason), or ``no-backend``
  when no device was chosen.
The first try needs no per-request record (most requests have no second): a ``Tries`` is
made only when a device refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from evenserve.core.wire import NO_BACKEND, REFUSAL_STATUS
from evenserve.policy.routing import Router
from evenserve.policy.routing.dispatch import FrontDoor, Tries, first_try
from evenserve.sched import DRAINING

if TYPE_CHECKING:
    from evenserve.sim.device import SimRequest

#: The status the worker answers a refusal at the door with (``core.wire.REFUSAL_STATUS``;
#: a draining worker answers 503): what the rules judge a device's refusal by.
OFFER_STATUS = {**REFUSAL_STATUS, DRAINING: 503}

#: Offer ``r`` to device ``name`` at ``now``: None (taken) or the reason it was refused.
Offer = Callable[[str, "SimRequest", float], "str | None"]
#: ``r`` will not run: its reason and the device it was last sent to (None: none).
Drop = Callable[["SimRequest", str, "str | None"], None]


class SimFront:
    """The routers of an arm's gateways (``routers[0]`` alone without several), each under
    the rules: ``retries`` more devices after a refusal at the door, ``refusals`` whether
    the overload rule drops; ``models`` every model of the scenario (none is unknown);
    ``offer`` puts a request on a device's scheduler, ``drop`` logs one that will not run
    (and tells the router of its gateway that a request sent to the device is done);
    ``done`` (placement's) hears each refused try that is over besides the router."""

    def __init__(
        self,
        routers: list[Router],
        *,
        retries: int,
        refusals: bool,
        models: Collection[str],
        offer: Offer,
        drop: Drop,
        done: Callable[[str, str], None] | None = None,
    ) -> None:
        self.routers = routers
        known = frozenset(models)
        listed = sorted(known)
        self.doors = [
            FrontDoor(
                r,
                retries=retries,
                refusals=refusals,
                hosts_model=known.__contains__,
                models=lambda: listed,
            )
            for r in routers
        ]
        self.refusals = refusals
        self.offer = offer
        self.drop = drop
        #: What else hears that a refused try is over (placement: ``done(model, device)``).
        self.done = done
        #: With several gateways: which one routed each request in flight (by log index).
        self.gateway_of: dict[int, int] = {}
        self._next_gateway = 0

    def arrive(self, r: SimRequest, now: float) -> None:
        """A request at the front: through the L4 split (several gateways), then routed."""
        n = len(self.routers)
        if n == 1:
            self.route(r, 0, now)
            return
        if r.user >= 0:
            g = r.user % n
        else:
            g = self._next_gateway
            self._next_gateway = (g + 1) % n
        self.gateway_of[r.idx] = g
        self.route(r, g, now)

    def route(self, r: SimRequest, g: int, now: float) -> None:
        """Gateway ``g``'s rules for ``r``: admitted or refused, then its first try."""
        door = self.doors[g]
        if self.refusals:
            refused = door.admit(r.model, now)
            if refused is not None:  # overloaded (every model of a scenario is known)
                self.drop(r, refused.reason or NO_BACKEND, None)
                return
        name = first_try(door, r, now)
        if name is None:
            self.drop(r, NO_BACKEND, None)
            return
        door.router.sent(name, r.model, now)
        reason = self.offer(name, r, now)
        if reason is not None:
            self.refused(r, g, name, reason, now)

    def refused(self, r: SimRequest, g: int, name: str, reason: str, now: float) -> None:
        """Device ``name`` (``r``'s first try) refused ``r`` at the door: the next device
        while the rules say so, else the refusal stands."""
        door = self.doors[g]
        router = door.router
        model = r.model
        t = Tries(r, 1, [name])
        while not door.judge(t, name, OFFER_STATUS.get(reason, 0), reason):
            # The gateway's order: the try is over, then the next pick.
            router.done(name, model)
            if self.done is not None:
                self.done(model, name)
            nxt = door.choose(t, now)
            if nxt is None:
                self.drop(r, reason, None)  # the router heard it already
                return
            name = nxt
            router.sent(name, model, now)
            got = self.offer(name, r, now)
            if got is None:
                return
            reason = got
        self.drop(r, reason, name)
