"""One model's queue on one device: service order, admission, expiry, starvation bound.

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
- Expiry (``expire``): requests that are hopeless (their deadline minus a batch of one's time
  has passed: even alone they would end after it) leave the queue (``deadline-expired``);
  they are never run, so a burst does not spend the device on work that is already late.
- Starvation bound (``promote_starved``): a request of a lower class that has waited longer
  than ``starvation_s`` is promoted to the highest class present, so offline work cannot wait
  forever behind a stream of online work.

``items`` is one list object for the queue's whole life (expiry edits it in place), so a
QueueView may hold it across decisions.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Generic, TypeVar

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import RequestInfo
from evenserve.core.wire import DEADLINE_INFEASIBLE, QUEUE_FULL

R = TypeVar("R", bound=RequestInfo)

Key = tuple[float, float, float, int]


@dataclass(frozen=True, slots=True)
class Offer(Generic[R]):
    admitted: bool
    reason: str | None = None
    evicted: R | None = None
    #: Requests removed because they can no longer meet their deadline (full queue only).
    expired: tuple[R, ...] = ()


ADMITTED: Offer[RequestInfo] = Offer(True)


class RequestQueue(Generic[R]):
    """Requests in service order. While every queued request has one class, no deadline, and
    they arrived in order (the common case), arrival order is service order and no sort keys
    are kept; the first request that breaks this switches the queue to sort keys until it
    empties."""

    __slots__ = (
        "fifo_class",
        "items",
        "max_len",
        "slo_s",
        "sort_keys",
        "starvation_s",
        "with_deadline",
    )

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
        #: Sort keys of ``items``; None while arrival order is service order (then every
        #: queued request is of class ``fifo_class``).
        self.sort_keys: list[Key] | None = None
        self.fifo_class = 0
        #: How many queued requests have a deadline.
        self.with_deadline = 0

    def key(self, r: R) -> Key:
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

    def _emptied(self) -> None:
        if not self.items:
            self.sort_keys = None

    def _insert(self, r: R) -> None:
        items = self.items
        keys = self.sort_keys
        if keys is None:
            if r.deadline_s is None:
                if not items:
                    self.fifo_class = r.priority
                    items.append(r)
                    return
                last = items[-1]
                if r.priority == self.fifo_class and (
                    r.arrival_s > last.arrival_s
                    or (r.arrival_s == last.arrival_s and r.request_id >= last.request_id)
                ):
                    items.append(r)
                    return
            keys = self.sort_keys = [self.key(x) for x in items]
        k = self.key(r)
        if not keys or k >= keys[-1]:
            keys.append(k)
            items.append(r)
        else:
            i = bisect.bisect_right(keys, k)
            keys.insert(i, k)
            items.insert(i, r)
        if r.deadline_s is not None:
            self.with_deadline += 1

    def _remove_at(self, i: int) -> R:
        r = self.items.pop(i)
        if self.sort_keys is not None:
            self.sort_keys.pop(i)
            if r.deadline_s is not None:
                self.with_deadline -= 1
            self._emptied()
        return r

    def offer(
        self,
        r: R,
        now_s: float,
        profile: LatencyProfile | None = None,
        busy_remaining_s: float = 0.0,
    ) -> Offer[R]:
        if (
            r.deadline_s is not None
            and profile is not None
            and now_s + busy_remaining_s + profile.latency_s(1) > r.deadline_s
        ):
            return Offer(False, DEADLINE_INFEASIBLE)
        items = self.items
        if self.max_len is None or len(items) < self.max_len:
            # _insert's first case, inlined: in order, one class, no deadline.
            if (
                self.sort_keys is None
                and r.deadline_s is None
                and items
                and r.priority == self.fifo_class
            ):
                last = items[-1]
                if r.arrival_s > last.arrival_s or (
                    r.arrival_s == last.arrival_s and r.request_id >= last.request_id
                ):
                    items.append(r)
                    return ADMITTED  # type: ignore[return-value]
            self._insert(r)
            return ADMITTED  # type: ignore[return-value]
        evicted: R | None = None
        expired = tuple(self.expire(now_s, profile.latency_s(1) if profile is not None else 0.0))
        if len(self.items) >= self.max_len:
            if self.items and self.items[-1].priority < r.priority:
                evicted = self._remove_at(len(self.items) - 1)
            else:
                return Offer(False, QUEUE_FULL, None, expired)
        self._insert(r)
        return Offer(True, None, evicted, expired)

    def expire(self, now_s: float, lead_s: float = 0.0) -> list[R]:
        """Remove and return the requests that are hopeless at ``now_s``: their deadline minus
        ``lead_s`` (a batch of one's time, from the profile; 0 without one) has passed."""
        if not self.with_deadline:
            return []
        gone = [r for r in self.items if r.deadline_s is not None and r.deadline_s - lead_s < now_s]
        if gone:
            keep = [
                i
                for i, r in enumerate(self.items)
                if r.deadline_s is None or r.deadline_s - lead_s >= now_s
            ]
            keys = self.sort_keys
            assert keys is not None  # a request with a deadline puts the queue on sort keys
            keys[:] = [keys[i] for i in keep]
            self.items[:] = [self.items[i] for i in keep]
            self.with_deadline -= len(gone)
            self._emptied()
        return gone

    def promote_starved(self, now_s: float) -> int:
        """Promote lower-class requests that waited past the bound; return how many."""
        if self.starvation_s is None or self.sort_keys is None:  # one class: nobody is lower
            return 0
        top = self.items[0].priority
        limit = now_s - self.starvation_s
        starved = [i for i, r in enumerate(self.items) if r.priority < top and r.arrival_s <= limit]
        # All out first, then back in: a promoted request goes ahead of the rest, so putting
        # each back at once would shift the positions of those still to take out.
        promoted = [self._remove_at(i) for i in reversed(starved)]
        for r in promoted:
            r.priority = top
            self._insert(r)
        return len(promoted)

    def pop(self, n: int) -> list[R]:
        """Remove and return the ``n`` requests at the head."""
        batch = self.items[:n]
        del self.items[:n]
        if self.sort_keys is not None:
            del self.sort_keys[:n]
            if self.with_deadline:
                self.with_deadline -= sum(1 for r in batch if r.deadline_s is not None)
            self._emptied()
        return batch

    def remove(self, r: R) -> bool:
        """Remove one request (its caller went away, or it expired); False if not queued."""
        for i, x in enumerate(self.items):
            if x is r:
                self._remove_at(i)
                return True
        return False
