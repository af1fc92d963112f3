"""The router's approximate prefix index: which engine holds which prompt blocks, from its
own history of where it sent what (llm-d's approximate prefix-cache scorer's idea).

Each engine's entry is an LRU of block names with a capacity (its KV blocks: what its cache
could hold at most); a global map from a block name to the engines that hold it answers a
lookup in one walk over the prompt's names: at block i, the engines that hold every block up
to i. A name stands for the whole prefix up to its block's end (``prompt_hashes``), so the
walk stops at the first block no engine holds. Sending a prompt to an engine records its
names there (most recently used); past the capacity the least recently used names go.

It is an approximation: the engine's own cache also evicts under the memory its running
sequences take, and a request that was refused or cancelled before its prefill recorded
names the engine never computed. A stale name costs one prefill the policy did not expect;
the router's first-token accounting then corrects its speed figures.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: Names between two checks of ``PrefixIndex.match``'s walk.
STRIDE = 16


class PrefixIndex:
    """Block names by engine (see the module docstring)."""

    __slots__ = ("_lru", "_where", "max_blocks")

    def __init__(self, max_blocks: int = 1024) -> None:
        #: Only a prompt's first ``max_blocks`` names are looked up and recorded.
        self.max_blocks = max_blocks
        self._lru: dict[int, OrderedDict[int, None]] = {}
        self._where: dict[int, set[int]] = {}

    def add_engine(self, engine: int) -> None:
        self._lru.setdefault(engine, OrderedDict())

    def remove_engine(self, engine: int) -> None:
        lru = self._lru.pop(engine, None)
        if lru is None:
            return
        for h in lru:
            s = self._where.get(h)
            if s is not None:
                s.discard(engine)
                if not s:
                    del self._where[h]

    def match(self, hashes: Sequence[int]) -> dict[int, int]:
        """By engine index, how many leading blocks of ``hashes`` it holds (absent: none).

        An engine's names are prefix-closed (``record`` makes a prompt's head its most
        recently used names, so its tail goes first), so the walk checks every ``STRIDE``-th
        name and looks for an engine's last one by bisection only within the stride where
        it drops out: O(n / STRIDE + log STRIDE) lookups, not n."""
        n = min(len(hashes), self.max_blocks)
        if n == 0:
            return {}
        where = self._where
        first = where.get(hashes[0])
        if not first:
            return {}
        alive = set(first)
        out: dict[int, int] = {}
        lo = 0  # every engine in ``alive`` holds blocks 0..lo
        while lo < n - 1:
            hi = min(lo + STRIDE, n - 1)
            s = where.get(hashes[hi])
            dropped = alive if not s else alive - s
            for e in dropped:
                a, b = lo, hi  # holds a, not b
                while b - a > 1:
                    mid = (a + b) // 2
                    m = where.get(hashes[mid])
                    if m is not None and e in m:
                        a = mid
                    else:
                        b = mid
                out[e] = a + 1
            if not s:
                return out
            alive = alive & s if dropped else alive
            if not alive:
                return out
            lo = hi
        for e in alive:
            out[e] = n
        return out

    def record(self, engine: int, hashes: Sequence[int], capacity: int) -> None:
        """``engine`` now holds ``hashes`` (most recently used, the head most of all: the
        engine's own cache frees a prompt's tail first); keep at most ``capacity``."""
        lru = self._lru.setdefault(engine, OrderedDict())
        where = self._where
        for h in reversed(hashes[: self.max_blocks]):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                s = where.get(h)
                if s is None:
                    where[h] = {engine}
                else:
                    s.add(engine)
        self.trim(engine, capacity)

    def trim(self, engine: int, capacity: int) -> None:
        """Keep at most ``capacity`` names for ``engine`` (the least recently used go)."""
        lru = self._lru.get(engine)
        if lru is None:
            return
        where = self._where
        while len(lru) > capacity:
            h, _ = lru.popitem(last=False)
            s = where.get(h)
            if s is not None:
                s.discard(engine)
                if not s:
                    del where[h]

    def size(self, engine: int) -> int:
        lru = self._lru.get(engine)
        return 0 if lru is None else len(lru)
