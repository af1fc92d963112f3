"""The devices the autoscaler turns on and off, as the live gateway keeps them: what the
launcher is asked to do with each (the scale channel, ``GET``/``POST /admin/scale``), how long
each was on (device-seconds: the cost) and how soon each ScaleUp came.

A ScaleUp is published as ``start`` for the launcher; a ScaleDown is a ``drain`` (the device
held out of routing) until nothing is outstanding there, then published as ``stop`` (the
launcher sends SIGTERM, the worker drains again and exits, and the launcher POSTs
``stopped``). A device counts from its ScaleUp decision (or from the start for an active one)
until it is stopped or lost, as in the simulator.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from evenserve.gateway.placement_counters import PlacementCounters
from evenserve.policy.placement.burst import BurstClock

log = logging.getLogger("evenserve.gateway.placement")


@dataclass
class DeviceBook:
    on: bool
    on_since_s: float | None
    active_s: float = 0.0
    #: What the launcher is asked to do: "start", "drain" (waiting for outstanding), "stop".
    scale: str | None = None

    def turn_on(self, now_s: float) -> None:
        if not self.on:
            self.on, self.on_since_s = True, now_s

    def turn_off(self, now_s: float) -> None:
        if self.on and self.on_since_s is not None:
            self.active_s += now_s - self.on_since_s
        self.on, self.on_since_s = False, None

    def seconds(self, now_s: float) -> float:
        return self.active_s + (now_s - self.on_since_s if self.on_since_s is not None else 0.0)


@dataclass
class DeviceScaling:
    """Every managed device's book, and the ScaleUp timing (into ``counters``)."""

    counters: PlacementCounters
    books: dict[str, DeviceBook] = field(default_factory=dict)
    wall: Callable[[], float] = time.time
    #: The first arrival since the last tick, and the start of the burst in progress.
    burst: BurstClock = field(default_factory=BurstClock)

    def scale_up(self, dev: str, now_s: float) -> None:
        self.counters.scale_decisions["up"] += 1
        book = self.books[dev]
        book.scale = "start"
        book.turn_on(now_s)
        self.counters.scale_up_unix_s.append(self.wall())
        took = self.burst.scale_up(now_s)
        if took is not None:
            self.counters.last_scale_up_s = took
            self.counters.scale_up_log.append(took)
            log.warning(
                "placement: ScaleUp %s %.3f s after the first request of the over-demand", dev, took
            )
        else:
            log.warning("placement: ScaleUp %s", dev)

    def scale_down(self, dev: str) -> None:
        self.counters.scale_decisions["down"] += 1
        self.books[dev].scale = "drain"
        log.warning("placement: ScaleDown %s: draining", dev)

    def check_drained(self, dev: str, busy: bool) -> None:
        """A draining ``dev`` with nothing outstanding or under way (not ``busy``) is to stop."""
        book = self.books[dev]
        if book.scale == "drain" and not busy:
            book.scale = "stop"

    def stopped(self, dev: str, now_s: float) -> None:
        """The launcher stopped ``dev``'s worker; ValueError if it was not asked to."""
        book = self.books[dev]
        if book.scale != "stop":
            raise ValueError(f"{dev} was not asked to stop (state: {book.scale})")
        book.scale = None
        book.turn_off(now_s)

    def requests(self, busy: Callable[[str], bool]) -> list[dict[str, str]]:
        """What the launcher is asked to do now: ``start`` or ``stop`` a device."""
        out = []
        for name, book in self.books.items():
            if book.scale == "drain":
                self.check_drained(name, busy(name))
            if book.scale in ("start", "stop"):
                out.append({"device": name, "action": book.scale})
        return out

    def active_seconds(self, now_s: float) -> dict[str, float]:
        return {n: b.seconds(now_s) for n, b in self.books.items()}


def parse_scale_report(body: bytes) -> tuple[str, str]:
    """``POST /admin/scale`` body ``{"device": D, "event": "started" | "stopped"}``."""
    try:
        doc = json.loads(body or b"null")
    except ValueError:
        raise ValueError("body: not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError('body: expected {"device": NAME, "event": "started" | "stopped"}')
    dev, event = doc.get("device"), doc.get("event")
    if not isinstance(dev, str) or event not in ("started", "stopped"):
        raise ValueError('body: expected {"device": NAME, "event": "started" | "stopped"}')
    return dev, event
