"""Each candidate's predicted finish, kept in order: least-expected-work and queue-aware
decide with work for the backends that changed since the last decision (a bisect each) instead
of a pass over every candidate.

Theory of operation. The Router keeps one FinishIndex per model it was asked to route with
a policy that reads it (``choose_indexed``), over that model's candidate list (positions are
indices into it). For each backend it holds the *settled finish*
(``work.settled_finish_s``): ``predicted_finish_s`` with the sampled busy time aged away, the
same sums in the same order from a backlog of 0.0. That figure changes only when the backend
does (a send, an answer, a load report, staleness, new profiles or batch sizes): the Router
tells the backend's indexes of each such event (``sent``, ``changed``), which mark its
positions ``dirty`` and recompute only those at the next decision (a send moves a ``quick``
one at once: see the last paragraph). The queued work part (``work.backlog_s``, the same for every
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
  policy reads them in order of it (``busy_order``) and computes the exact finish
  (``predicted_finish_s``) only while the bound could tie or beat the best. Each is in
  ``busy_due`` by when its busy time runs out (sample time plus busy time; the exact test,
  ``aged_busy_s`` = 0.0, is made when that comes), so a decision moves those whose busy time
  ran out into the order without looking at the others; ``quick`` then holds them until
  their next load report (it stays out: the clock only goes forward; a decision at an
  earlier time than one already made is left to the policy's full pass);
- ``stale``: backends with stale signals: their finish is the settled one (own in-flight
  counts, no busy time), kept apart (in order too, ``stale_order``) because
  least-expected-work adds its stale penalty;
- ``bad``: backends whose finish would take the fallback cost (no profile for the model, or
  a queued model without one): that cost is the least any candidate learned, a figure over
  all of them, so while any is bad the index declines and the policy's full pass decides.

Decisions are identical to the full pass (the same floats compared, ties broken by the same
rotation): the index only skips backends that cannot be the answer. A backend in ``quick``
changes by its own sends and answers only, which move its queued counts and nothing else its
finish depends on (profiles, batch caps and freshness change with a load report, staleness
or a model change, which take it out of ``quick``); so ``quick`` keeps per backend its
settled finishes by those counts (``queued_by_model``'s values, in its order: between two
such events the router only adds a model at its end or changes a count), and a send or an
answer that brings the counts back to ones seen costs one lookup. The memo outlives the
position's stay in ``quick`` and is shared by every backend whose finishes are the same
function of its counts (``memos``: the same profiles, batch caps and counted models). A memo
entry holds its finish's list in ``at`` (kept while empty, so a move in the order looks
nothing up by float) and, per step of the counts, the entry it leads to: from the same
counts, one more send of a model gives the same counts, and so do k answers of a model
with one gateway and fresh signals (each takes away one from the model's count, down to
zero: ``Router.done``), so ``node``, the entry a position is at, moves along them on each
send and answer without a lookup by counts (any other answer marks the position dirty:
with several gateways its effect depends on the sends since the report, not on the counts
alone). ``sig_dirty`` marks the positions whose utilization, memory or SLO changed (load
reports, staleness), for a policy that keeps figures of its own per backend (queue-aware's
score terms).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from heapq import heappop, heappush
from typing import Any

from evenserve.core.profile import LatencyProfile, Table
from evenserve.core.types import BackendView
from evenserve.policy.routing.work import aged_busy_s, backlog_s, own_share_s

#: Settled finishes a memo keeps by queued counts, at most (then it starts over).
QUICK_MEMO = 1024
#: Memos an index keeps for positions to take on (``FinishIndex.memos``), at most.
MEMOS_MAX = 256
#: Finishes an index keeps a list of positions for, at most (then it drops the empty ones).
BUCKETS_MAX = 4096

#: A memo entry: a settled finish, the list of ``FinishIndex.at`` for it, and per step of the
#: queued counts (a send of a model; answers of a model taken away: ``FinishIndex.sent``) the
#: entry it leads to, filled as steps come.
Memo = tuple[float, list[int], dict[str | tuple[str, int], "Memo"]]


class FinishIndex:
    __slots__ = (
        "at",
        "bad",
        "busy",
        "busy_due",
        "busy_order",
        "cells",
        "dirty",
        "finish",
        "keys",
        "memos",
        "model",
        "node",
        "now_s",
        "owner",
        "owner_state",
        "quick",
        "sig_dirty",
        "stale",
        "stale_order",
        "views",
        "where",
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
        #: Per position in the order (``keys``/``at``), the list of ``at`` it is in; None
        #: for the others.
        self.where: list[list[int] | None] = [None] * n
        #: The distinct finishes of the positions in the order, in order.
        self.keys: list[float] = []
        #: Per finish, the positions in the order that have it, in order: every finish in
        #: ``keys``, and finishes that no position has now (empty lists, which memo entries
        #: hold; ``_bucket``).
        self.at: dict[float, list[int]] = {}
        #: Busy positions: when their busy time runs out (inf: it never ages, no sample time).
        self.busy: dict[int, float] = {}
        #: (settled finish, position) of the busy ones, in order.
        self.busy_order: list[tuple[float, int]] = []
        #: (runs out at, position), a heap; an entry is current while ``busy`` says the same.
        self.busy_due: list[tuple[float, int]] = []
        #: Positions in the order whose busy time had aged away at a decision since their
        #: backend's last load report, profile or batch size change (the Router's ``_touch``
        #: with ``signals`` takes them out), each with its settled finishes by queued counts
        #: and its ``queued_by_model`` (see the module's last paragraph); None for the others.
        #: A finish is kept with its list in ``at`` (a move in the order needs no lookup).
        self.quick: list[tuple[dict[tuple[float, ...], Memo], Mapping[str, float]] | None] = [
            None
        ] * n
        #: The memos of ``quick`` positions, shared by every position whose settled finish is
        #: the same function of its queued counts (``_settle``), with the profiles each was
        #: made for (their ids are in its key: held, so never another object's).
        self.memos: dict[
            tuple[Any, ...], tuple[dict[tuple[float, ...], Memo], tuple[LatencyProfile, ...]]
        ] = {}
        #: Per ``quick`` position, the memo entry of its queued counts now, when known (the
        #: Router's sends move it along the entries' ``sent``); None for the others.
        self.node: list[Memo | None] = [None] * n
        self.stale: set[int] = set()
        #: (settled finish, position) of the stale ones, in order.
        self.stale_order: list[tuple[float, int]] = []
        self.bad: set[int] = set()
        self.dirty: set[int] = set(range(n))
        self.sig_dirty: set[int] = set(range(n))
        #: The latest clock a decision was made at.
        self.now_s = -math.inf
        #: A policy's own per-backend figures over this index, and which policy keeps them.
        self.owner: object = None
        self.owner_state: object = None

    def _bucket(self, f: float) -> list[int]:
        """The positions in the order whose finish is ``f`` (made empty when there is none:
        ``at`` keeps empty ones, which memo entries hold, up to ``BUCKETS_MAX``)."""
        tied = self.at.get(f)
        if tied is None:
            if len(self.at) >= BUCKETS_MAX:
                self._prune()
            tied = self.at[f] = []
        return tied

    def _prune(self) -> None:
        """Drop the empty lists from ``at`` and every memo entry (they may hold them)."""
        self.at = {f: tied for f, tied in self.at.items() if tied}
        for memo, _ in self.memos.values():
            memo.clear()
        self.memos.clear()
        for q in self.quick:  # theirs too (one may have left ``memos``: ``MEMOS_MAX``)
            if q is not None:
                q[0].clear()
        self.node[:] = [None] * len(self.node)  # their entries lead to dropped lists

    def _place(self, p: int, f: float) -> None:
        self.finish[p] = f
        tied = self.where[p] = self._bucket(f)
        if not tied:
            insort(self.keys, f)
        insort(tied, p)

    def _unplace(self, p: int) -> None:
        tied = self.where[p]
        assert tied is not None
        self.where[p] = None
        del tied[bisect_left(tied, p)]
        if not tied:
            keys = self.keys
            del keys[bisect_left(keys, self.finish[p])]

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
        dirty = self.dirty
        if dirty:
            views = self.views
            finish, where, node = self.finish, self.where, self.node
            keys = self.keys
            quick = self.quick
            for p in dirty:
                q = quick[p]
                if q is not None:  # the common case, kept short (see ``quick``)
                    memo, counts = q
                    seen = tuple(counts.values())
                    e = memo.get(seen)
                    if e is None:
                        f = self._quick_finish(p, counts)
                        if f is None:  # a model without a profile: the slow path
                            self._recompute(p, views[p], now_s)
                            continue
                        if len(memo) >= QUICK_MEMO:
                            memo.clear()
                        e = memo[seen] = (f, self._bucket(f), {})
                    node[p] = e
                    f, into, _ = e
                    tied = where[p]
                    if into is not tied:  # it moves in the order (_unplace, _place inlined)
                        del tied[bisect_left(tied, p)]  # type: ignore[union-attr,arg-type]
                        if not tied:
                            del keys[bisect_left(keys, finish[p])]
                        if not into:
                            insort(keys, f)
                        insort(into, p)
                        where[p] = into
                        finish[p] = f
                    continue
                self._recompute(p, views[p], now_s)
            dirty.clear()
        if self.bad:
            return False
        due = self.busy_due
        if due and due[0][0] <= now_s:
            self._expire_busy(now_s)
        return True

    def sent(self, p: int, step: str | tuple[str, int]) -> None:
        """``p``'s backend's queued counts took ``step`` (the Router calls this once its
        counts say so): a request of a model sent there (``step`` is the model), or, with
        one gateway and fresh signals, ``k`` answers of a model taken away (``(model, k)``);
        from the same counts the same step gives the same counts. A position whose entry
        (``node``) is known moves now, to the entry that step leads to (kept in the entry
        after the first time: no look-up by counts); any other is recomputed at the next
        decision."""
        e = self.node[p]
        if e is None:
            self.dirty.add(p)
            return
        to = e[2].get(step)
        if to is None:
            q = self.quick[p]
            assert q is not None  # a position with an entry is quick
            memo, counts = q
            seen = tuple(counts.values())
            to = memo.get(seen)
            if to is None:
                f = self._quick_finish(p, counts)
                if f is None:  # a model without a profile: the slow path
                    self.node[p] = None
                    self.dirty.add(p)
                    return
                if len(memo) >= QUICK_MEMO:
                    memo.clear()
                to = memo[seen] = (f, self._bucket(f), {})
            e[2][step] = to
        self.node[p] = to
        tied, into = e[1], to[1]
        if into is not tied:  # it moves in the order (_unplace, _place inlined)
            keys = self.keys
            del tied[bisect_left(tied, p)]
            if not tied:
                del keys[bisect_left(keys, e[0])]
            f = to[0]
            if not into:
                insort(keys, f)
            insort(into, p)
            self.where[p] = into
            self.finish[p] = f

    def changed(self, p: int) -> None:
        """``p``'s backend changed otherwise than by a send (an answer, a load report,
        staleness, profiles or batch caps): recomputed at the next decision."""
        self.node[p] = None
        self.dirty.add(p)

    def _quick_finish(self, p: int, counts: Mapping[str, float]) -> float | None:
        """A ``quick`` position's settled finish (``work.settled_finish_s``, inlined), or
        None where a counted model has no profile (the slow path decides)."""
        cell = self.cells[p]
        backlog = cell[0]
        if backlog is None:  # work.backlog_s(b, counts, 0.0, None), inlined
            parts = cell[1]
            if parts is None:
                parts = cell[1] = queue_parts_by_model(self.views[p])
            backlog = 0.0
            for m, q in counts.items():
                # round(q) is 0 below 0.5, whose parts add 0.0 twice: the sum is the one
                # that skips them.
                by_q = parts.get(m)
                if by_q is None:
                    return None
                full_s, rest_s = by_q[round(q)]
                backlog += full_s
                backlog += rest_s
            cell[0] = backlog
        elif backlog != backlog:
            return None
        b = self.views[p]
        model = self.model
        prof = b.profiles[model]  # a quick position has one (else it is bad)
        cap = b.max_batch_size.get(model, 1)
        # + work.own_share_s, inlined.
        f: float = backlog + prof.own_share[round(counts.get(model, 0.0)) % (cap if cap > 1 else 1)]
        return f

    def _expire_busy(self, now_s: float) -> None:
        """The busy positions whose busy time may have run out by ``now_s``: those that
        have (``aged_busy_s`` is 0.0) move into the order."""
        due, busy, views = self.busy_due, self.busy, self.views
        while due and due[0][0] <= now_s:
            t, p = heappop(due)
            if busy.get(p) != t:
                continue  # an entry of an earlier stay in ``busy``
            b = views[p]
            if aged_busy_s(b, now_s) <= 0.0:
                del busy[p]
                f = self.finish[p]
                order = self.busy_order
                del order[bisect_left(order, (f, p))]
                self._settle(p, b, f)
            else:  # its figure was a rounding ahead: look again at the next decision
                t = busy[p] = math.nextafter(now_s, math.inf)
                heappush(due, (t, p))

    def _settle(self, p: int, b: BackendView, f: float) -> None:
        """``p``'s exact finish is its settled one, ``f``: into the order, and ``quick``,
        with the memo of every position whose settled finishes are the same function of the
        queued counts: the same profile objects by model, equal batch caps, and the same
        models counted in the same order (a memo's keys are the counts' values in that
        order; a send of a model the counts do not name takes its position out of
        ``quick``: ``Router.sent``). A memo outlives a stay in ``quick``: a load report ends
        the stay, and the next one takes it on while those are the same; the backends of one
        kind share it."""
        self._place(p, f)
        counts = b.queued_by_model
        profiles = b.profiles
        held = tuple(profiles.values())
        key: tuple[Any, ...] = (
            tuple(profiles),
            tuple(map(id, held)),
            tuple(b.max_batch_size.items()),
            tuple(counts),
        )
        got = self.memos.get(key)
        if got is None:
            if len(self.memos) >= MEMOS_MAX:
                self.memos.clear()  # the positions' own references keep theirs
            got = self.memos[key] = ({}, held)
        self.quick[p] = (got[0], counts)

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
        if self.where[p] is not None:
            self._unplace(p)
        elif p in self.busy:
            del self.busy[p]
            order = self.busy_order
            del order[bisect_left(order, (self.finish[p], p))]
        elif p in self.stale:
            self.stale.discard(p)
            order = self.stale_order
            del order[bisect_left(order, (self.finish[p], p))]
        else:
            self.bad.discard(p)
        self.quick[p] = None
        self.node[p] = None
        if f != f:  # the fallback cost (or a NaN figure): the full pass decides
            self.bad.add(p)
        elif fresh and (b.busy_remaining_s <= 0.0 or aged_busy_s(b, now_s) <= 0.0):
            self._settle(p, b, f)
        else:
            self.finish[p] = f
            if fresh:
                at = b.sampled_at_s
                t = math.inf if at is None else at + b.busy_remaining_s
                self.busy[p] = t
                heappush(self.busy_due, (t, p))
                insort(self.busy_order, (f, p))
            else:
                self.stale.add(p)
                insort(self.stale_order, (f, p))

    def first_tied(self, best: float, start: int) -> tuple[int, int]:
        """Among the positions in the order whose finish is ``best``: the first at or after
        ``start`` and the first of all (-1, -1 when none)."""
        tied = self.at.get(best)
        if not tied:
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
