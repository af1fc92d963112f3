"""The host's warm pool: LRU beyond the capacity, entries keyed by config digest, shared by
two workers (two pool objects on one directory), memory released (files removed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.runtime.host_pool import HostPool, allocate_file, digest, entry_key

MB = 1_000_000


def _pool(d: Path, capacity: float = 10 * MB, free: float = 1e12) -> HostPool:
    return HostPool(d, capacity, memory=lambda: (free, 1e12))


def _put(pool: HostPool, model: str, size: int, tag: str = "a") -> bool:
    return pool.put(model, digest(tag), size, lambda p: allocate_file(p, size))


def test_a_put_entry_is_taken_and_its_file_holds_the_bytes(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    assert pool.take("m", digest("a")) is None  # cold: not there
    assert _put(pool, "m", 3 * MB)
    path = pool.take("m", digest("a"))
    assert path is not None and path.stat().st_size == 3 * MB
    # Reserved, not sparse: the blocks are allocated.
    assert path.stat().st_blocks * 512 >= 3 * MB
    assert pool.used_bytes() == 3 * MB
    assert [e.model for e in pool.entries()] == ["m"]


def test_beyond_the_capacity_the_least_recently_used_go_and_their_files_with_them(
    tmp_path: Path,
) -> None:
    pool = _pool(tmp_path, capacity=10 * MB)
    for m in ("a", "b", "c"):
        assert _put(pool, m, 3 * MB)
    assert pool.take("a", digest("a")) is not None  # a is now the most recently used
    b_file = pool.path(entry_key("b", digest("a")))
    assert b_file.is_file()
    assert _put(pool, "d", 3 * MB)  # 12 MB > 10: b (least recently used) goes
    assert [e.model for e in pool.entries()] == ["c", "a", "d"]
    assert not b_file.exists()  # its memory is back
    assert pool.used_bytes() == 9 * MB
    # Refreshing a present entry moves it, writes nothing.
    assert pool.put("c", digest("a"), 3 * MB, lambda p: pytest.fail("rewritten"))
    assert [e.model for e in pool.entries()] == ["a", "d", "c"]


def test_an_entry_larger_than_the_pool_is_not_kept_and_nothing_older_either(
    tmp_path: Path,
) -> None:
    # As the controller's pool: the newcomer goes in, the LRU go out until it fits, itself last.
    pool = _pool(tmp_path, capacity=10 * MB)
    assert _put(pool, "a", 3 * MB)
    assert not _put(pool, "big", 11 * MB)
    assert pool.entries() == []
    assert sorted(os.listdir(tmp_path)) == [".lock", "index.json"]


def test_a_changed_config_does_not_read_the_old_entry(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    assert _put(pool, "m", MB, tag="config v1")
    assert pool.take("m", digest("config v2")) is None
    assert pool.take("m", digest("config v1")) is not None
    assert _put(pool, "m", MB, tag="config v2")
    assert len(pool.entries()) == 2  # both kept, each under its own key


def test_two_workers_share_one_pool(tmp_path: Path) -> None:
    a, b = _pool(tmp_path, 10 * MB), _pool(tmp_path, 10 * MB)
    assert _put(a, "m", 4 * MB)
    assert b.take("m", digest("a")) is not None  # unloaded on A, warm on B
    assert _put(b, "n", 4 * MB)
    assert _put(a, "o", 4 * MB)  # 12 MB > 10: the least recently used of both goes
    # m was put (1), taken by B (2), n put (3), o put (4): m is the least recently used.
    assert [e.model for e in b.entries()] == ["n", "o"]
    assert a.take("m", digest("a")) is None


def test_writes_under_way_count_against_the_capacity_and_the_host_memory(
    tmp_path: Path,
) -> None:
    # While worker A writes m (6 MB), worker B puts n (6 MB): A's write is reserved, so B
    # finds no room (6 + 6 > 10 MB) and does not keep n; the pool never holds more than its
    # capacity, on disk or under way. B putting m itself, while A writes it, is a no-op.
    a, b = _pool(tmp_path, 10 * MB), _pool(tmp_path, 10 * MB)
    seen: dict[str, object] = {}

    def write_a(path: Path) -> None:
        allocate_file(path, 6 * MB)
        seen["b_kept"] = _put(b, "n", 6 * MB)  # B, in the middle of A's write
        seen["b_same"] = b.put("m", digest("a"), 6 * MB, lambda _: None)  # m being written

    assert a.put("m", digest("a"), 6 * MB, write_a)
    assert seen == {"b_kept": False, "b_same": True}
    assert [e.model for e in a.entries()] == ["m"]
    assert not list(tmp_path.glob("*.tmp"))
    assert a.used_bytes() <= 10 * MB

    # The host's memory: a reservation counts as used (15 % available, 10 % reserve).
    c = _pool(tmp_path / "c", capacity=1e12, free=0.15e12)
    inner: dict[str, bool] = {}

    def write_c(path: Path) -> None:
        allocate_file(path, 1)
        inner["second"] = _put(c, "y", int(0.03e12))  # 4 % reserved + 3 % > 5 % left

    assert c.put("x", digest("a"), int(0.04e12), write_c)
    assert inner == {"second": False} and c.refused == 1


def test_the_host_memory_bound_refuses_an_entry_instead_of_filling_the_host(
    tmp_path: Path,
) -> None:
    pool = _pool(tmp_path, capacity=1e12, free=0.15e12)  # 15 % available
    assert not _put(pool, "m", int(0.1e12))  # would leave 5 % < 10 %
    assert pool.refused == 1 and pool.entries() == []


def test_an_entry_that_reserves_nothing_is_counted_but_not_checked_against_the_host(
    tmp_path: Path,
) -> None:
    # An emulated LLM's entry (its weights are never held): counted in the pool's room and
    # LRU order, but its file is empty, so the host's memory does not bound it.
    pool = _pool(tmp_path, capacity=1e12, free=0.15e12)
    empty = lambda p: p.write_bytes(b"")  # noqa: E731
    assert pool.put("llm", digest("a"), int(0.1e12), empty, reserves=False)
    assert pool.refused == 0 and pool.used_bytes() == int(0.1e12)
    assert not _put(pool, "m", int(0.1e12))  # an entry that reserves is checked: refused
    assert pool.refused == 1
    small = _pool(tmp_path, capacity=0.15e12)  # the same directory, a smaller capacity
    assert small.put("llm2", digest("a"), int(0.1e12), empty, reserves=False)
    assert [e.model for e in small.entries()] == ["llm2"]  # the LRU one made room


def test_a_lost_file_is_no_entry(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    assert _put(pool, "m", MB)
    pool.path(entry_key("m", digest("a"))).unlink()
    assert pool.take("m", digest("a")) is None
    assert pool.entries() == []


def test_a_directory_that_cannot_be_written_is_an_error_naming_the_flag(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"--host-pool: .* is not a writable directory"):
        HostPool(f / "pool", MB)
    with pytest.raises(ConfigError, match="--host-pool-gb: must be > 0"):
        HostPool(tmp_path, 0)


def test_a_dead_writer_s_temporary_file_is_removed_when_a_worker_opens_the_pool(
    tmp_path: Path,
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"m-0.{dead.pid}.tmp"
    allocate_file(orphan, MB)
    mine = tmp_path / f"n-0.{os.getpid()}.tmp"  # a live writer's: kept
    mine.write_bytes(b"")
    _pool(tmp_path)
    assert not orphan.exists() and mine.exists()
