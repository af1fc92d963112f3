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
        """By engine index, how many leading blocks of ``hashes`` it holds (absent: none)."""
        out: dict[int, int] = {}
        alive: set[int] | None = None
        where = self._where
        n = 0
        for h in hashes[: self.max_blocks]:
            s = where.get(h)
            if not s:
                break
            if alive is None:
                alive = set(s)
            else:
                dropped = alive - s
                if dropped:
                    for e in dropped:
                        out[e] = n
                    alive -= dropped
                    if not alive:
                        return out
            n += 1
        if alive:
            for e in alive:
                out[e] = n
        return out

    def record(self, engine: int, hashes: Sequence[int], capacity: int) -> None:
        """``engine`` now holds ``hashes`` (most recently used); keep at most ``capacity``."""
        lru = self._lru.setdefault(engine, OrderedDict())
        where = self._where
        for h in hashes[: self.max_blocks]:
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
