"""The warm pool of one host: models kept in host memory, so a reload skips the disk.

Theory of operation. A pool is a directory (on tmpfs: ``/dev/shm`` where it exists, so its
files are host memory) shared by every worker of the host, with a capacity in bytes. It
follows the placement controller's model of the warm pool (``policy.placement.controller``):

- a cold load (from the repository) passes through host memory: the worker writes the
  model's entry after it (``put``);
- an unload keeps the entry, or writes it again if it was evicted meanwhile (``put`` of an
  entry present only refreshes its place in the LRU order);
- a load that finds the entry (``take``) is warm: the runtime reads the entry instead of the
  repository (emulated: sleeps the warm load time), and the entry becomes the most recently
  used;
- beyond the capacity the least recently used entries are deleted: their memory goes back
  to the host (a tmpfs file's pages are freed when it is unlinked and no reader holds it).

An entry is keyed by the model's name and a digest of its configuration (``digest``): a
model reloaded with a changed config never reads a stale entry. Workers are separate
processes: every change of the index (``index.json``: each entry's bytes and its LRU
sequence number) is made under an exclusive ``fcntl`` lock of ``.lock``. An entry is
written outside the lock (a torch model's weights take a while) to a temporary file, then
renamed into place under it. The write's bytes are reserved in the index before it starts
(``pending``, with the writer's pid: a dead writer's reservation is dropped), so the room
made and the host-memory check count the writes still under way: several workers writing
at once cannot take the pool over its capacity or the host under its reserve. A
worker opening the pool deletes the temporary files of writers that died mid-write.

One safety bound the controller does not have: an entry is not written when the host's
available memory (``MemAvailable``) would fall below ``HOST_MEMORY_RESERVE`` of its total,
so a pool configured larger than the host (a scenario's ``host_memory_gb`` on a small
machine) degrades to fewer warm loads instead of waking the OOM killer. Such a refusal is
logged and counted in ``refused``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evenserve.core.errors import ConfigError

log = logging.getLogger(__name__)

INDEX = "index.json"
LOCK = ".lock"
SUFFIX = ".entry"
#: Keep at least this fraction of the host's memory available when writing an entry.
HOST_MEMORY_RESERVE = 0.10
GIB = 1024.0**3


def reserved(index: dict[str, Any]) -> int:
    """Bytes that writers have reserved in the pool and not written yet."""
    return sum(int(r["bytes"]) for r in index.get("pending", {}).values())


def held(index: dict[str, Any]) -> int:
    """Bytes the pool holds: its entries, and the writes under way."""
    return sum(int(e["bytes"]) for e in index["entries"].values()) + reserved(index)


def digest(*parts: str) -> str:
    """A short stable digest of a model's configuration (its config JSON, runtime tags)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def entry_key(model: str, config_digest: str) -> str:
    """The entry's file stem: the model's name (made file-safe) and its config digest."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    return f"{safe}-{config_digest}"


def available_memory_bytes() -> tuple[float, float] | None:
    """(available, total) bytes of host memory from /proc/meminfo; None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    fields: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = float(parts[0]) * 1024.0
    if "MemAvailable" not in fields or "MemTotal" not in fields:
        return None
    return fields["MemAvailable"], fields["MemTotal"]


def default_pool_parent() -> Path:
    """Where a pool directory goes: /dev/shm (tmpfs: host memory) when it is there and
    writable, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    import tempfile

    return Path(tempfile.gettempdir())


#: Writes one entry's file at the path given (the weights, or their reservation).
WriteEntry = Callable[[Path], None]


@dataclass(frozen=True)
class PoolEntry:
    key: str
    model: str
    size_bytes: int
    #: The LRU sequence number: larger is more recently used.
    used: int


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def allocate_file(path: Path, size_bytes: int) -> None:
    """A file of ``size_bytes`` whose pages are really reserved (``posix_fallocate``; on tmpfs
    that takes the memory without writing it), zero-length where the call is missing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if size_bytes > 0:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size_bytes)
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, size_bytes)
    finally:
        os.close(fd)


class HostPool:
    """One host's warm pool in ``directory`` (shared by its workers), ``capacity_bytes``."""

    def __init__(
        self,
        directory: Path,
        capacity_bytes: float,
        *,
        memory: Callable[[], tuple[float, float] | None] = available_memory_bytes,
    ) -> None:
        if capacity_bytes <= 0:
            raise ConfigError("--host-pool-gb: must be > 0")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"--host-pool: {directory} is not a writable directory ({exc.strerror or exc})"
            ) from None
        self.directory = directory
        self.capacity_bytes = float(capacity_bytes)
        self._memory = memory
        #: Entries not written because the host's memory was short (see the module doc).
        self.refused = 0
        self._remove_orphans()

    def _remove_orphans(self) -> None:
        """Delete the temporary files of writers that died mid-write (their memory)."""
        with self._locked():
            for tmp in self.directory.glob("*.tmp"):
                pid = tmp.name.rsplit(".", 2)[-2]
                if pid.isdigit() and not _alive(int(pid)):
                    with contextlib.suppress(OSError):
                        tmp.unlink()

    # -- the index, under the lock ---------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The index, locked against the other workers; written back at the end."""
        with open(self.directory / LOCK, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                index = self._read_index()
                before = json.dumps(index, sort_keys=True)
                yield index
                if json.dumps(index, sort_keys=True) != before:
                    self._write_index(index)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read_index(self) -> dict[str, Any]:
        try:
            raw = json.loads((self.directory / INDEX).read_text())
        except (OSError, ValueError):
            raw = None
        if not isinstance(raw, dict) or not isinstance(raw.get("entries"), dict):
            return {"seq": 0, "entries": {}, "pending": {}}
        # An entry whose file is gone (removed by hand, a crash) is no entry; a reservation
        # of a writer that died is none either.
        raw["entries"] = {k: e for k, e in raw["entries"].items() if self.path(k).is_file()}
        pending = raw.get("pending")
        pending = pending if isinstance(pending, dict) else {}
        raw["pending"] = {k: r for k, r in pending.items() if _alive(int(r.get("pid", 0)))}
        return raw

    def _write_index(self, index: dict[str, Any]) -> None:
        tmp = self.directory / f"{INDEX}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(index, sort_keys=True))
        os.replace(tmp, self.directory / INDEX)

    @staticmethod
    def _bump(index: dict[str, Any]) -> int:
        index["seq"] = int(index.get("seq", 0)) + 1
        return int(index["seq"])

    def _evict(self, index: dict[str, Any], room_for: int, keep: str | None = None) -> list[str]:
        """Delete least recently used entries until ``room_for`` more bytes fit (never
        ``keep``); the keys deleted."""
        entries: dict[str, Any] = index["entries"]
        gone: list[str] = []

        for k in sorted(entries, key=lambda k: int(entries[k]["used"])):
            if held(index) + room_for <= self.capacity_bytes:
                break
            if k == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.path(k).unlink()
            del entries[k]
            gone.append(k)
        if gone:
            log.info("host pool: evicted %s", ", ".join(gone))
        return gone

    # -- what workers call -----------------------------------------------------------------
    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def take(self, model: str, config_digest: str) -> Path | None:
        """The entry of ``model`` at ``config_digest`` (a warm load reads it), now the most
        recently used; None when the pool does not hold it (a cold load)."""
        key = entry_key(model, config_digest)
        with self._locked() as index:
            e = index["entries"].get(key)
            if e is None:
                return None
            e["used"] = self._bump(index)
            return self.path(key)

    def put(
        self,
        model: str,
        config_digest: str,
        size_bytes: float,
        write: WriteEntry,
        *,
        reserves: bool = True,
    ) -> bool:
        """Keep ``model`` in the pool: an entry present is refreshed (most recently used),
        else ``write(path)`` makes it (``size_bytes`` of it) after the least recently used
        entries made room. False when it is not kept: larger than the capacity (then, as
        the controller's pool, nothing older is kept either), the host's memory too short,
        or the write failed. ``reserves=False``: the entry is counted at ``size_bytes`` in
        the pool (room, LRU) but its file takes no host memory (an emulated LLM's, whose
        weights the emulation never holds: design 0022), so the host's memory is not
        checked for it."""
        key = entry_key(model, config_digest)
        size = int(max(0.0, size_bytes))
        with self._locked() as index:
            e = index["entries"].get(key)
            if e is not None:
                e["used"] = self._bump(index)
                return True
            if key in index["pending"]:
                return True  # another worker is writing it now
            self._evict(index, size)
            if size > self.capacity_bytes:
                return False
            if held(index) + size > self.capacity_bytes:
                # What is left are writes under way: no room now, the entry is not kept.
                log.info("host pool: no room for %s while other entries are written", model)
                return False
            # Under the lock: the room and the host's memory are checked against what the
            # other writers have reserved and not written yet, and this write reserves its
            # bytes (several workers writing at once cannot go over either).
            if reserves and not self._memory_allows(size + reserved(index), model):
                return False
            index["pending"][key] = {"bytes": size, "pid": os.getpid()}
        tmp = self.directory / f"{key}.{os.getpid()}.tmp"
        try:
            write(tmp)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._locked() as index:
                index["pending"].pop(key, None)
            log.warning("host pool: cannot keep %s (%s bytes): %s", model, size, exc)
            return False
        with self._locked() as index:
            index["pending"].pop(key, None)
            os.replace(tmp, self.path(key))
            index["entries"][key] = {"model": model, "bytes": size, "used": self._bump(index)}
            self._evict(index, 0, keep=key)
        return True

    def _memory_allows(self, size: int, model: str) -> bool:
        mem = self._memory()
        if mem is None:
            return True
        available, total = mem
        if available - size >= HOST_MEMORY_RESERVE * total:
            return True
        self.refused += 1
        log.warning(
            "host pool: not keeping %s (%.2f GiB): the host has %.2f GiB available of %.2f GiB",
            model,
            size / GIB,
            available / GIB,
            total / GIB,
        )
        return False

    def entries(self) -> list[PoolEntry]:
        """What the pool holds, least recently used first."""
        with self._locked() as index:
            items = [
                PoolEntry(k, str(e["model"]), int(e["bytes"]), int(e["used"]))
                for k, e in index["entries"].items()
            ]
        return sorted(items, key=lambda p: p.used)

    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries())

    def describe(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "capacity_bytes": self.capacity_bytes,
            "used_bytes": self.used_bytes(),
            "entries": [e.model for e in self.entries()],
            "refused": self.refused,
        }
