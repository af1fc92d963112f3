"""Each candidate's predicted finish, kept in order: least-expected-work and queue-aware
decide in amortized constant time per decision instead of O(backends).

Theory of operation. The Router keeps one FinishIndex per model it was asked to route with
a policy that reads it (``choose_indexed``), over that model's candidate list (positions are
indices into it). For each backend it holds the *settled finish*
(``work.settled_finish_s``): ``predicted_finish_s`` with the sampled busy time aged away, the
same sums in the same order from a backlog of 0.0. That figure changes only when the backend
does (a send, an answer, a load report, staleness, new profiles or batch sizes): the Router
marks the backend's positions ``dirty`` on each such event and the index recomputes only
those at the next decision. The queued work part (``work.backlog_s``, the same for every
model the backend hosts) is computed once per change and shared by the backend's indexes
through its ``cells`` entry, which the Router clears on each change. Between events nothing
moves except the clock, and the clock moves one term only, the aged busy time, which is
exactly 0.0 once it has run out. So:

- ``keys`` and ``at``: the distinct settled finishes in order, and per finish the
  positions that have it, in order, for the backends whose exact finish *is* the settled
  one (fresh signals, no busy time left): the least finish, and its ties in position order
  (a rotation's pick is a bisect away), are at the front;
- ``busy``: fresh backends whose sampled busy time may not have aged away yet. Their settled
  finish is a lower bound of the exact one (floating-point addition is monotone), so a
  policy computes the exact finish (``predicted_finish_s``) only where the bound could tie
  or beat the best; each decision moves those whose busy time ran out into the order, and
  ``quick`` remembers them until their next load report (it stays out: the clock only
  goes forward; a decision at an earlier time than one already made is left to the
  policy's full pass);
- ``stale``: backends with stale signals: their finish is the settled one (own in-flight
  counts, no busy time), kept apart because least-expected-work adds its stale penalty;
- ``bad``: backends whose finish would take the fallback cost (no profile for the model, or
  a queued model without one): that cost is the least any candidate learned, a figure over
  all of them, so while any is bad the index declines and the policy's full pass decides.

Decisions are identical to the full pass (the same floats compared, ties broken by the same
rotation): the index only skips backends that cannot be the answer. ``sig_dirty`` marks the
positions whose utilization, memory or SLO changed (load reports, staleness), for a policy
that keeps figures of its own per backend (queue-aware's score terms).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from typing import Any

from evenserve.core.profile import LatencyProfile, Table
from evenserve.core.types import BackendView
from evenserve.policy.routing.work import aged_busy_s, backlog_s, own_share_s


class FinishIndex:
    __slots__ = (
        "at",
        "bad",
        "busy",
        "cells",
        "dirty",
        "finish",
        "keys",
        "model",
        "now_s",
        "own_of",
        "owner",
        "owner_state",
        "placed",
        "quick",
        "sig_dirty",
        "stale",
        "views",
    )

    def __init__(
        self, model: str, views: Sequence[BackendView], cells: Sequence[list[Any]]
    ) -> None:
        self.model = model
        self.views = views
        #: Per position, its backend's queued work from a backlog of 0.0 (None: not known
        #: since its last change; NaN: it needs the fallback cost), shared by its indexes.
        self.cells = cells
        n = len(views)
        #: Per position, its settled finish (valid unless it is bad or dirty).
        self.finish: list[float] = [0.0] * n
        #: Per position, whether it is in the order (``keys``/``at``).
        self.placed: list[bool] = [False] * n
        self.keys: list[float] = []
        #: Per finish in ``keys``, the positions that have it, in order.
        self.at: dict[float, list[int]] = {}
        self.busy: set[int] = set()
        #: Positions in the order whose busy time had aged away at a decision since their
        #: backend's last load report, profile or batch size change (the Router's ``_touch``
        #: with ``signals`` takes them out), with the own share there by this model's count
        #: (``own_of``, from its profile and batch cap there): a send or an
        #: answer moves them through a short path.
        self.quick: set[int] = set()
        self.own_of: list[Mapping[int, float]] = [{} for _ in range(n)]
        self.stale: set[int] = set()
        self.bad: set[int] = set()
        self.dirty: set[int] = set(range(n))
        self.sig_dirty: set[int] = set(range(n))
        #: The latest clock a decision was made at.
        self.now_s = -math.inf
        #: A policy's own per-backend figures over this index, and which policy keeps them.
        self.owner: object = None
        self.owner_state: object = None

    def _place(self, p: int, f: float) -> None:
        self.finish[p] = f
        self.placed[p] = True
        tied = self.at.get(f)
        if tied is None:
            self.at[f] = [p]
            insort(self.keys, f)
        else:
            insort(tied, p)

    def _unplace(self, p: int) -> None:
        self.placed[p] = False
        f = self.finish[p]
        tied = self.at[f]
        if len(tied) == 1:
            del self.at[f]
            keys = self.keys
            del keys[bisect_left(keys, f)]
        else:
            del tied[bisect_left(tied, p)]

    def _backlog(self, p: int, b: BackendView, counts: Mapping[str, float]) -> float:
        """``work.backlog_s(b, counts, 0.0, None)``, once per change of the backend (its
        ``cells`` entry)."""
        cell = self.cells[p]
        backlog: float | None = cell[0]
        if backlog is None:
            backlog = cell[0] = backlog_s(b, counts, 0.0, None)
        return backlog

    def refresh(self, now_s: float) -> bool:
        """Bring the index to ``now_s``; False when it cannot answer (a backend is bad, or
        the clock went back): the policy's full pass decides."""
        if now_s < self.now_s:
            return False
        self.now_s = now_s
        if self.dirty:
            model = self.model
            views = self.views
            cells = self.cells
            finish = self.finish
            keys, at = self.keys, self.at
            quick, own_of = self.quick, self.own_of
            for p in self.dirty:
                b = views[p]
                if p in quick:  # the common case, kept short (see ``quick``)
                    counts = b.queued_by_model
                    cell = cells[p]
                    backlog = cell[0]
                    if backlog is None:  # work.backlog_s(b, counts, 0.0, None), inlined
                        parts = cell[1]
                        if parts is None:
                            parts = cell[1] = queue_parts_by_model(b)
                        backlog = 0.0
                        for m, q in counts.items():
                            # round(q) is 0 below 0.5, whose parts add 0.0 twice: the sum
                            # is the one that skips them.
                            by_q = parts.get(m)
                            if by_q is None:  # a model without a profile: the slow path
                                backlog = None
                                break
                            full_s, rest_s = by_q[round(q)]
                            backlog += full_s
                            backlog += rest_s
                        else:
                            cell[0] = backlog
                    if backlog is not None and backlog == backlog:
                        # + work.own_share_s, inlined.
                        f = backlog + own_of[p][round(counts.get(model, 0.0))]
                        old = finish[p]
                        if f != old:  # it moves in the order (_unplace, _place inlined)
                            tied = at[old]
                            if len(tied) == 1:
                                del at[old]
                                del keys[bisect_left(keys, old)]
                            else:
                                del tied[bisect_left(tied, p)]
                            finish[p] = f
                            into = at.get(f)
                            if into is None:
                                at[f] = [p]
                                insort(keys, f)
                            else:
                                insort(into, p)
                        continue
                self._recompute(p, b, now_s)
            self.dirty.clear()
        if self.bad:
            return False
        busy = self.busy
        if busy:
            views = self.views
            for p in [p for p in busy if aged_busy_s(views[p], now_s) <= 0.0]:
                busy.discard(p)
                self._settle(p, views[p], self.finish[p])
        return True

    def _settle(self, p: int, b: BackendView, f: float) -> None:
        """``p``'s exact finish is its settled one, ``f``: into the order, and ``quick``."""
        self._place(p, f)
        prof = b.profiles.get(self.model)
        assert prof is not None  # else it is bad
        cap = b.max_batch_size.get(self.model, 1)
        div = cap if cap > 1 else 1
        shares = prof.own_share
        self.own_of[p] = Table(lambda q: shares[q % div])
        self.quick.add(p)

    def _recompute(self, p: int, b: BackendView, now_s: float) -> None:
        """Position ``p`` changed: its settled finish, and where it belongs (order, busy,
        stale or bad)."""
        fresh = b.signals_fresh
        counts = b.queued_by_model if fresh else b.in_flight_by_model
        backlog = self._backlog(p, b, counts)
        prof = b.profiles.get(self.model)
        f = (
            math.nan
            if prof is None or backlog != backlog  # it needs the fallback cost
            else backlog + own_share_s(self.model, prof, b, counts)
        )
        if self.placed[p]:
            self._unplace(p)
        else:
            self.busy.discard(p)
            self.stale.discard(p)
            self.bad.discard(p)
        self.quick.discard(p)
        if f != f:  # the fallback cost (or a NaN figure): the full pass decides
            self.bad.add(p)
        elif fresh and (b.busy_remaining_s <= 0.0 or aged_busy_s(b, now_s) <= 0.0):
            self._settle(p, b, f)
        else:
            self.finish[p] = f
            (self.busy if fresh else self.stale).add(p)

    def first_tied(self, best: float, start: int) -> tuple[int, int]:
        """Among the positions in the order whose finish is ``best``: the first at or after
        ``start`` and the first of all (-1, -1 when none)."""
        tied = self.at.get(best)
        if tied is None:
            return -1, -1
        i = bisect_left(tied, start)
        return (tied[i] if i < len(tied) else -1), tied[0]


def queue_parts_by_model(b: BackendView) -> dict[str, Mapping[int, tuple[float, float]]]:
    """Per model with a profile on ``b``: its ``queue_parts_s`` by queued requests, at its
    batch cap there (as ``work.backlog_s`` reads them)."""
    caps = b.max_batch_size
    return {m: _parts_at(prof, caps.get(m, 1)) for m, prof in b.profiles.items()}


def _parts_at(prof: LatencyProfile, cap: int) -> Mapping[int, tuple[float, float]]:
    parts = prof.queue_parts
    return Table(lambda q: parts[q, cap])


def rotate_ties(
    ge: int, lo: int, extra: Sequence[tuple[float, int]], best: float, start: int
) -> int:
    """``rotating_argmin``'s answer: the first position at or after ``start`` (cyclically)
    among those whose key is ``best``: ``ge``/``lo`` from ``FinishIndex.first_tied`` (or -1),
    ``extra`` the (key, position) pairs computed outside the order."""
    for k, p in extra:
        if k == best:
            if p >= start and (ge < 0 or p < ge):
                ge = p
            if lo < 0 or p < lo:
                lo = p
    return ge if ge >= 0 else lo
