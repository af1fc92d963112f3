"""One model's queue on one device: service order, admission, expiry, starvation bound.

Shared by the simulator and the live worker so both order, refuse and shed identically.

- Order: higher priority class first; within a class, earliest deadline first (a request's
  own deadline, else arrival + the model's SLO), then arrival. Batches take the head.
- Admission (``offer``), each refusal with a reason:
  ``deadline-infeasible``: the request has a deadline that the profile says it cannot meet
  even if it ran alone right after the batch now on the device (refuse at once rather than
  time out later);
  queue bound: when full, the requests that can no longer meet their own deadline leave
  first (``Offer.expired``: they hold no useful work; the caller drops them as
  ``deadline-expired``); if it is still full, a request of a higher class evicts the
  lowest-class, latest request (``shed``); otherwise it is refused (``queue-full``). So under
  overload the lowest class is shed first.
- Expiry (``expire``): requests whose own deadline passed while they waited, or that the
  profile says can no longer make it even alone, leave the queue (``deadline-expired``);
  they are never run, so a burst does not spend the device on work that is already late.
- Starvation bound (``promote_starved``): a request of a lower class that has waited longer
  than ``starvation_s`` is promoted to the highest class present, so offline work cannot wait
  forever behind a stream of online work.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import RequestInfo

R = TypeVar("R", bound=RequestInfo)


@dataclass(frozen=True, slots=True)
class Offer(Generic[R]):
    admitted: bool
    reason: str | None = None
    evicted: R | None = None
    #: Requests removed because they can no longer meet their deadline (full queue only).
    expired: tuple[R, ...] = ()


class RequestQueue(Generic[R]):
    def __init__(
        self,
        slo_s: float | None = None,
        max_len: int | None = None,
        starvation_s: float | None = None,
    ) -> None:
        self.slo_s = slo_s
        self.max_len = max_len
        self.starvation_s = starvation_s
        self.items: list[R] = []
        self._keys: list[tuple[float, float, float, int]] = []
        self._with_deadline = 0

    def key(self, r: R) -> tuple[float, float, float, int]:
        if r.deadline_s is not None:
            due = r.deadline_s
        elif self.slo_s is not None:
            due = r.arrival_s + self.slo_s
        else:
            due = math.inf
        return (-float(r.priority), due, r.arrival_s, r.request_id)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[R]:
        return iter(self.items)

    def __getitem__(self, i: int) -> R:
        return self.items[i]

    def _insert(self, r: R) -> None:
        k = self.key(r)
        i = bisect.bisect_right(self._keys, k)
        self._keys.insert(i, k)
        self.items.insert(i, r)
        if r.deadline_s is not None:
            self._with_deadline += 1

    def _remove_at(self, i: int) -> R:
        r = self.items.pop(i)
        self._keys.pop(i)
        if r.deadline_s is not None:
            self._with_deadline -= 1
        return r

    def offer(
        self,
        r: R,
        now_s: float,
        *,
        profile: LatencyProfile | None = None,
        busy_remaining_s: float = 0.0,
    ) -> Offer[R]:
        if (
            r.deadline_s is not None
            and profile is not None
            and now_s + busy_remaining_s + profile.latency_s(1) > r.deadline_s
        ):
            return Offer(False, "deadline-infeasible")
        evicted: R | None = None
        expired: tuple[R, ...] = ()
        if self.max_len is not None and len(self.items) >= self.max_len:
            expired = tuple(self.expire(now_s, profile))
        if self.max_len is not None and len(self.items) >= self.max_len:
            if self.items and self.items[-1].priority < r.priority:
                evicted = self._remove_at(len(self.items) - 1)
            else:
                return Offer(False, "queue-full", None, expired)
        self._insert(r)
        return Offer(True, None, evicted, expired)

    def expire(self, now_s: float, profile: LatencyProfile | None = None) -> list[R]:
        """Remove and return requests that can no longer meet their own deadline: passed, or
        (with a profile) so close that even a batch of one started now would end after it."""
        if not self._with_deadline:
            return []
        cutoff = now_s + (profile.latency_s(1) if profile is not None else 0.0)
        gone = [r for r in self.items if r.deadline_s is not None and r.deadline_s < cutoff]
        if gone:
            keep = [r for r in self.items if r.deadline_s is None or r.deadline_s >= cutoff]
            self.items = []
            self._keys = []
            self._with_deadline = 0
            for r in keep:
                self._insert(r)
        return gone

    def promote_starved(self, now_s: float) -> int:
        """Promote lower-class requests that waited past the bound; return how many."""
        if self.starvation_s is None or not self.items:
            return 0
        top = self.items[0].priority
        limit = now_s - self.starvation_s
        starved = [i for i, r in enumerate(self.items) if r.priority < top and r.arrival_s <= limit]
        for i in reversed(starved):
            r = self._remove_at(i)
            r.priority = top
            self._insert(r)
        return len(starved)

    def pop(self, n: int) -> list[R]:
        """Remove and return the ``n`` requests at the head."""
        batch = self.items[:n]
        del self.items[:n]
        del self._keys[:n]
        self._with_deadline -= sum(1 for r in batch if r.deadline_s is not None)
        return batch

    def remove(self, r: R) -> bool:
        """Remove one request (its caller went away); False if it was not queued."""
        for i, x in enumerate(self.items):
            if x is r:
                self._remove_at(i)
                return True
        return False
