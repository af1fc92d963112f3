"""Busy time of a device with several instance slots: a running total and the exact busy
fraction over a sliding window, O(1) amortized per change and per reading.

Busy time is counted in instance-seconds (two batches running for 1 s count 2 s); the busy
fraction divides by ``instances`` x elapsed time, so a device whose every instance runs all
the time is at 1.0. Every change in the number of running batches leaves a mark
(time, instance-seconds so far, batches running after it); marks older than the window are
let go, keeping the one the window starts in, so the total at the window's start is exact.
Times must not go back: readings and changes come in clock order. The marks are kept in
typed arrays (doubles and ints, from ``_head`` on), not a tuple each: a device changes twice
a batch, and a mark lives the window long. A change lets old marks go only once at least
``_LET_GO`` of them can go (``_due``), so most changes only append their mark; a reading
skips the marks before the window itself, so what it reads does not depend on when marks
were let go.
"""

from __future__ import annotations

from array import array

#: Let-go marks before the arrays are compacted (when they are also half of them).
_COMPACT = 1024
#: Marks a change lets go at once (at least; ``BusyClock._due``).
_LET_GO = 64


class BusyClock:
    __slots__ = (
        "_acc",
        "_due",
        "_head",
        "_mark",
        "_run",
        "_t",
        "_total",
        "instances",
        "origin_s",
        "running",
        "window_s",
    )

    def __init__(self, instances: int = 1, window_s: float = 1.0, origin_s: float = 0.0) -> None:
        if instances < 1:
            raise ValueError("instances must be >= 1")
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.instances = instances
        self.window_s = window_s
        self.origin_s = origin_s
        self.running = 0
        self._acc = 0.0
        self._mark = origin_s
        #: The marks (time, instance-seconds so far, batches running after it); the first
        #: ``_head`` are let go.
        self._t = array("d", [origin_s])
        self._total = array("d", [0.0])
        self._run = array("q", [0])
        self._head = 0
        #: When a change next looks for marks to let go (about when ``_LET_GO`` can go).
        self._due = origin_s + window_s

    def start(self, now_s: float) -> None:
        """A batch started."""
        self.change(now_s, 1)

    def stop(self, now_s: float) -> None:
        """A batch ended."""
        if self.running <= 0:
            raise ValueError("no batch is running")
        self.change(now_s, -1)

    def change(self, now_s: float, delta: int) -> None:
        """``delta`` more batches run from ``now_s`` (``start``, ``stop`` without the check)."""
        running = self.running
        if running:
            self._acc += running * (now_s - self._mark)
        self._mark = now_s
        self.running = running = running + delta
        self._t.append(now_s)
        self._total.append(self._acc)
        self._run.append(running)
        if now_s >= self._due:
            self._let_go_old(now_s)

    def _let_go_old(self, now_s: float) -> None:
        """Let go the marks before the window that ends at ``now_s`` (keeping the last two),
        and say when ``_LET_GO`` more will have left it (or, with fewer marks kept, when the
        newest will have)."""
        t = self._t
        k = self._skip_to(now_s - self.window_s, 2) + _LET_GO
        self._due = (t[k] if k < len(t) else t[-1]) + self.window_s

    def _skip_to(self, lo: float, keep: int) -> int:
        """Let go the marks before the last one at or before ``lo``, keeping at least
        ``keep`` marks; the index of the first mark kept."""
        t = self._t
        h = head = self._head
        n = len(t) - keep
        while n > h and t[h + 1] <= lo:
            h += 1
        if h != head:
            self._let_go(h)
            h = self._head
        return h

    def _let_go(self, h: int) -> None:
        """The marks before ``h`` are let go (compacted once there are many)."""
        if h >= _COMPACT and 2 * h >= len(self._t):
            del self._t[:h], self._total[:h], self._run[:h]
            h = 0
        self._head = h

    def total_s(self, now_s: float) -> float:
        """Instance-seconds busy since the origin."""
        return self._acc + self.running * (now_s - self._mark)

    def fraction(self, now_s: float) -> float:
        """Mean busy fraction of the instances over the last ``window_s`` (or since origin)."""
        lo = now_s - self.window_s
        if lo < self.origin_s:
            lo = self.origin_s
        span = now_s - lo
        if span <= 0:
            return 1.0 if self.running else 0.0
        h = self._skip_to(lo, 1)
        t0, acc0, running0 = self._t[h], self._total[h], self._run[h]
        at_lo = acc0 + running0 * (lo - t0) if lo > t0 else acc0
        busy = (self.total_s(now_s) - at_lo) / (span * self.instances)
        return 0.0 if busy < 0.0 else (1.0 if busy > 1.0 else busy)
