"""KV-cache blocks: the LLM engine's memory, with a prefix cache (sans I/O).

A device's KV memory is ``num_blocks`` blocks of ``block_tokens`` tokens. A sequence holds
the blocks its context needs (``ceil(tokens / block_tokens)``); a block is shared by every
sequence whose prompt starts with the same tokens up to that block's end (the prefix cache).

Theory of operation.
- Hashes: block i of a prompt is named by ``hash((name of block i-1, its 16 token ids))``, so
  a name stands for the whole prefix up to the block's end (``prompt_hashes``). Only whole
  prompt blocks are named; the partial last block and generated tokens' blocks are private.
- A block is *referenced* (held by one or more sequences: ``ref`` > 0), *cached* (no
  sequence holds it but it keeps its name and contents: it can be reused by a prompt with
  that prefix, or evicted), or *free* (never named, or evicted). ``available`` = free +
  cached: what a new allocation can take, evicting cached blocks least recently released
  first (LRU over unreferenced blocks).
- ``lookup(hashes)`` finds the leading named blocks present and ``acquire`` takes references
  on them; ``count_query`` counts an admitted prompt's query and hits in tokens (vLLM's
  prefix-cache counters are in tokens). ``grow`` gives a sequence more private blocks;
  ``publish`` names a sequence's block once its prompt tokens are all computed (another
  sequence may reuse it from then on; when an equal block is named already, the sequence's
  copy stays private);
  ``release`` drops a sequence's references, its blocks last in the context first into the
  LRU (so a shared head outlives a private tail), unnamed ones straight to the free list.
- Invariant (tested as a property): referenced + cached + free = ``num_blocks`` at every
  point; no block is both free and referenced; a sequence never holds a block twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: The name of "no block before": the first block's parent.
ROOT_HASH = 0


def prompt_hashes(prompt: Sequence[int], block_tokens: int) -> list[int]:
    """The names of ``prompt``'s whole blocks (a partial last block has none)."""
    out: list[int] = []
    parent = ROOT_HASH
    whole = len(prompt) - len(prompt) % block_tokens
    for i in range(0, whole, block_tokens):
        parent = hash((parent, tuple(prompt[i : i + block_tokens])))
        out.append(parent)
    return out


class KvBlocks:
    """One device's KV blocks for one model (see the module docstring)."""

    __slots__ = (
        "block_tokens",
        "by_hash",
        "cached",
        "free",
        "hash_of",
        "hit_tokens",
        "num_blocks",
        "query_tokens",
        "ref",
    )

    def __init__(self, num_blocks: int, block_tokens: int) -> None:
        if num_blocks < 0 or block_tokens < 1:
            raise ValueError("num_blocks must be >= 0 and block_tokens >= 1")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        #: Never-named (or evicted) blocks, taken from the end.
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        #: Unreferenced named blocks, least recently released first: block -> None.
        self.cached: OrderedDict[int, None] = OrderedDict()
        #: References per block (0: cached or free).
        self.ref = [0] * num_blocks
        #: Named blocks: name -> block, and block -> name.
        self.by_hash: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        #: Prefix-cache counters, in tokens (``lookup``'s queries and hits).
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def available(self) -> int:
        """Blocks an allocation can take now (free, and cached ones it would evict)."""
        return len(self.free) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks held by sequences."""
        return self.num_blocks - self.available

    def usage(self) -> float:
        """The fraction of blocks held by sequences (vLLM's ``kv_cache_usage_perc``)."""
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def blocks_for(self, tokens: int) -> int:
        """Blocks a context of ``tokens`` tokens needs."""
        return -(-tokens // self.block_tokens)

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """The blocks of the longest named prefix of ``hashes`` present (at most
        ``max_blocks``)."""
        found: list[int] = []
        by_hash = self.by_hash
        for h in hashes[:max_blocks]:
            b = by_hash.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def count_query(self, query_tokens: int, hit_tokens: int) -> None:
        """Count one prefix-cache query (once per admitted prompt, in tokens)."""
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens

    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference on each of ``blocks`` (named blocks ``lookup`` found)."""
        ref, cached = self.ref, self.cached
        for b in blocks:
            if ref[b] == 0:
                del cached[b]
            ref[b] += 1

    def grow(self, held: list[int], n: int) -> bool:
        """Append ``n`` private blocks to ``held`` (evicting cached ones, LRU first); False
        (and nothing taken) when fewer than ``n`` are available."""
        if n <= 0:
            return True
        if n > len(self.free) + len(self.cached):
            return False
        ref, free, cached = self.ref, self.free, self.cached
        for _ in range(n):
            if free:
                b = free.pop()
            else:
                b, _ = cached.popitem(last=False)
                del self.by_hash[self.hash_of.pop(b)]
            ref[b] = 1
            held.append(b)
        return True

    def publish(self, held: Sequence[int], hashes: Sequence[int], start: int, end: int) -> None:
        """Name ``held[i]`` with ``hashes[i]`` for whole prompt blocks ``start <= i < end``
        (their tokens are computed now), unless a block of that name exists already."""
        by_hash, hash_of = self.by_hash, self.hash_of
        for i in range(start, min(end, len(hashes), len(held))):
            h, b = hashes[i], held[i]
            if h not in by_hash and b not in hash_of:
                by_hash[h] = b
                hash_of[b] = h

    def release(self, held: list[int]) -> None:
        """Drop one reference on each block of ``held`` (a sequence finished, was cancelled
        or preempted) and empty it."""
        ref, cached, free, hash_of = self.ref, self.cached, self.free, self.hash_of
        for b in reversed(held):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if b in hash_of:
                    cached[b] = None
                else:
                    free.append(b)
        held.clear()

    def check(self) -> None:
        """Assert the invariants (tests and properties call it)."""
        referenced = sum(1 for r in self.ref if r > 0)
        assert all(r >= 0 for r in self.ref), "negative reference count"
        assert referenced + len(self.cached) + len(self.free) == self.num_blocks, "lost block"
        assert not any(self.ref[b] for b in self.free), "a free block is referenced"
        assert not any(self.ref[b] for b in self.cached), "a cached block is referenced"
        assert all(b in self.hash_of for b in self.cached), "a cached block has no name"
        assert len(set(self.free)) == len(self.free), "a block is free twice"
        assert all(self.by_hash[h] == b for b, h in self.hash_of.items()), "names disagree"
