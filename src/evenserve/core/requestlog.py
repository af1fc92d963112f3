"""The request log: one JSON line per answered request, in the trace format plus outcomes.

Shared by the gateway and the worker (``--record PATH``). A line is a trace arrival
(``workload.trace``: ``t_s``, ``model``, ``priority`` and ``deadline_ms`` when the request gave
them) followed by what happened to it::

    {"t_s": 1.25, "model": "m", "priority": 1, "seq": 7, "backend": "w0", "status": 200,
     "latency_ms": 4.2, "queue_ms": 1.1, "compute_ms": 2.9, "unix_s": 1767225600.125}

``t_s`` is seconds since the recorder started (its monotonic clock), ``unix_s`` the wall time
of the arrival, ``seq`` the record's number (1, 2, ... in answer order; a pull resumes after
one), ``latency_ms`` receive to answer, ``queue_ms`` / ``compute_ms`` the worker's figures
(the ``x-evenserve-queue-ms`` / ``-compute-ms`` response headers; null when absent), ``backend``
null when no backend answered, ``transport`` (``http`` or ``grpc``) on the worker's lines
only (its two fronts write one log). ``read_trace`` ignores the outcome keys, so a log replays as a
``trace`` workload as it is.

Theory of operation. The request path calls ``Recorder.add``: one clock read, one counter step
and one ``deque.append`` of a plain tuple; nothing is parsed or formatted there. The buffer is
bounded (``buffer``): when the writer falls behind, the oldest records fall out, and since each
took its ``seq`` on the request path, the flush counts them exactly as gaps in the sequence
(``dropped``). A background thread (``start``/``stop``) flushes every ``flush_s``: it encodes
the records (priority and deadline read with ``core.wire``'s parsers; an invalid one is left
out, as the server refused that request anyway), appends them to a ring of the last ``window``
records (``lines``: the admin API's ``GET /admin/log``) and to the file (``RotatingFile``:
past ``max_bytes`` ``PATH`` becomes ``PATH.1``, older ones shift to ``.2`` ..., ``keep`` of
them kept). The ring holds each line without its ``t_s``, so an answer can rebase it.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from evenserve.core.clock import Clock, RealClock
from evenserve.core.wire import parse_deadline_ms, parse_priority

log = logging.getLogger("evenserve.requestlog")

MIB = 1024 * 1024

#: What the request path appends (field order of ``Recorder.add``'s tuple): seq, arrival on
#: the recorder's clock, arrival wall time, model, priority and deadline as the request gave
#: them (text or number, None), backend, status, latency in seconds, queue and compute ms
#: (text from a header, a number, or None), the transport (None: not told).
RawRecord = tuple[
    int, float, float, str, object, object, str | None, int, float, object, object, str | None
]


@dataclass(frozen=True, slots=True)
class RecordSettings:
    """How a recorder runs: ``path`` None keeps only the in-memory window."""

    path: Path | None = None
    max_bytes: int = 64 * MIB
    keep: int = 4
    window: int = 200_000
    flush_s: float = 0.5
    buffer: int = 65_536

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError("max_bytes: must be >= 1")
        if self.keep < 0:
            raise ValueError("keep: must be >= 0")
        if self.window < 0:
            raise ValueError("window: must be >= 0")
        if not self.flush_s > 0:
            raise ValueError("flush_s: must be > 0")
        if self.buffer < 1:
            raise ValueError("buffer: must be >= 1")


def _ms(value: object) -> str:
    """A millisecond figure (header text or a number) as JSON: ``null`` when absent or bad."""
    if value is None:
        return "null"
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "null"
    return f"{x:.3f}" if math.isfinite(x) else "null"


#: The encoder's memo of what it has read (a model name, a priority or a deadline as the
#: request gave it), so a flush parses each distinct value once; bounded.
_MEMO_MAX = 4096


class _Memo:
    def __init__(self) -> None:
        self.model: dict[str, str] = {}
        self.priority: dict[object, str] = {}
        self.deadline: dict[object, str] = {}


def _cached(memo: dict[object, str], key: object, make: Callable[[object], str]) -> str:
    try:
        return memo[key]
    except KeyError:
        pass
    except TypeError:  # not hashable
        return make(key)
    v = make(key)
    if len(memo) < _MEMO_MAX:
        memo[key] = v
    return v


def _priority_field(value: object) -> str:
    try:
        p = parse_priority(value, "priority")
    except ValueError:
        p = None
    return "" if p is None else f',"priority":{p}'


def _deadline_field(value: object) -> str:
    try:
        d = parse_deadline_ms(value, "deadline_ms")
    except ValueError:
        d = None
    return "" if d is None else f',"deadline_ms":{d!r}'


_MEMO = _Memo()


def encode_rest(raw: RawRecord) -> tuple[int, float, float, bytes]:
    """(seq, t on the recorder's clock, unix_s, the line after ``t_s``): the encoded record
    without its ``t_s``, so the line is ``{"t_s":T,`` + rest for any base of T."""
    seq, t, unix_s, model, prio, deadline, backend, status, latency_s, q, c, transport = raw
    m = _MEMO
    model_js = m.model.get(model)
    if model_js is None:
        model_js = json.dumps(model)
        if len(m.model) < _MEMO_MAX:
            m.model[model] = model_js
    p = "" if prio is None else _cached(m.priority, prio, _priority_field)
    d = "" if deadline is None else _cached(m.deadline, deadline, _deadline_field)
    b = "null" if backend is None else _cached(m.model, backend, json.dumps)  # type: ignore[arg-type]
    unix = f"{unix_s:.6f}"
    rest = (
        f'"model":{model_js}{p}{d},"seq":{seq},"backend":{b},"status":{status},'
        f'"latency_ms":{latency_s * 1000.0:.3f},"queue_ms":{_ms(q)},'
        f'"compute_ms":{_ms(c)},"unix_s":{unix}'
        + ("}" if transport is None else f',"transport":"{transport}"}}')
    )
    return seq, t, float(unix), rest.encode()  # the cursor compares what a client reads


def line(t_s: float, rest: bytes) -> bytes:
    """One JSONL line: ``t_s`` then the rest of the record (``encode_rest``)."""
    return f'{{"t_s":{max(t_s, 0.0):.6f},'.encode() + rest + b"\n"


class RotatingFile:
    """Appends lines to ``path``; a line that would take it past ``max_bytes`` first moves
    it to ``path.1`` (``.1`` to ``.2`` ..., at most ``keep`` old files; 0: none kept)."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("ab")
        self.size = self._f.tell()

    def write(self, lines: Iterable[bytes]) -> None:
        """Append ``lines`` (after a ``close``, the file is opened again)."""
        if self._f.closed:
            self._f = self.path.open("ab")
            self.size = self._f.tell()
        chunk: list[bytes] = []
        for ln in lines:
            if self.size > 0 and self.size + len(ln) > self.max_bytes:
                self._f.write(b"".join(chunk))
                chunk.clear()
                self._rotate()
            chunk.append(ln)
            self.size += len(ln)
        self._f.write(b"".join(chunk))
        self._f.flush()

    def _rotate(self) -> None:
        self._f.close()
        p = str(self.path)
        if self.keep == 0:
            os.unlink(p)
        else:
            for i in range(self.keep - 1, 0, -1):
                if os.path.exists(f"{p}.{i}"):
                    os.replace(f"{p}.{i}", f"{p}.{i + 1}")
            os.replace(p, f"{p}.1")
        self.rotations += 1
        self._f = self.path.open("ab")
        self.size = 0

    def close(self) -> None:
        self._f.close()


@dataclass(frozen=True, slots=True)
class LogQuery:
    """``GET /admin/log``'s query: records after ``since_unix_s`` (arrival wall time) and
    after ``since_seq``, at most ``limit`` of them (None: the whole window)."""

    since_unix_s: float | None = None
    since_seq: int | None = None
    limit: int | None = None


#: The largest ``limit`` accepted (the window may be smaller).
MAX_LIMIT = 10_000_000


def parse_log_query(query: str) -> LogQuery:
    """Read ``since_unix_s``, ``since_seq`` and ``limit``; ValueError naming the field."""
    since_unix_s: float | None = None
    since_seq: int | None = None
    limit: int | None = None
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "since_unix_s":
            try:
                since_unix_s = float(value) if len(value) <= 40 else math.nan
            except ValueError:
                since_unix_s = math.nan
            if not math.isfinite(since_unix_s):
                raise ValueError(f"since_unix_s: expected a number of seconds, got {value[:40]!r}")
        elif key in ("since_seq", "limit"):
            n = int(value) if value.isdigit() and len(value) <= 19 else -1
            if key == "since_seq":
                if n < 0:
                    raise ValueError(f"since_seq: expected an integer >= 0, got {value[:40]!r}")
                since_seq = n
            else:
                if not 1 <= n <= MAX_LIMIT:
                    raise ValueError(
                        f"limit: expected an integer in 1..{MAX_LIMIT}, got {value[:40]!r}"
                    )
                limit = n
        else:
            raise ValueError(f"{key[:40]}: unknown parameter (since_unix_s, since_seq, limit)")
    return LogQuery(since_unix_s, since_seq, limit)


class Recorder:
    """The request log of one server (see the module's theory of operation)."""

    def __init__(
        self,
        settings: RecordSettings,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock or RealClock()
        self.wall = wall
        self.t0_s = self.clock.now()
        self._seq = itertools.count(1)
        self._buf: deque[RawRecord] = deque(maxlen=settings.buffer)
        self._ring: deque[tuple[int, float, float, bytes]] = deque(maxlen=settings.window)
        self._ring_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_seq = 0
        #: Records lost because the writer fell behind (counted at flush).
        self.dropped = 0
        self.written = 0
        self.write_errors = 0
        #: Opened by ``start`` (or the first flush), closed by ``stop``.
        self._file: RotatingFile | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the request path ------------------------------------------------------------------
    def add(
        self,
        t_s: float,
        unix_s: float,
        model: str,
        priority: object,
        deadline_ms: object,
        backend: str | None,
        status: int,
        queue_ms: object = None,
        compute_ms: object = None,
        transport: str | None = None,
    ) -> None:
        """One answered request that arrived at ``t_s`` (``clock.now()``) and ``unix_s``;
        ``transport`` (``http``, ``grpc``) where the server has more than one."""
        self._buf.append(
            (
                next(self._seq),
                t_s,
                unix_s,
                model,
                priority,
                deadline_ms,
                backend,
                status,
                self.clock.now() - t_s,
                queue_ms,
                compute_ms,
                transport,
            )
        )

    # -- the flush -------------------------------------------------------------------------
    def flush(self) -> int:
        """Encode what the request path left, into the ring and the file; how many."""
        with self._flush_lock:
            buf = self._buf
            out: list[tuple[int, float, float, bytes]] = []
            while True:
                try:
                    raw = buf.popleft()
                except IndexError:
                    break
                seq = raw[0]
                self.dropped += seq - self._last_seq - 1
                self._last_seq = seq
                out.append(encode_rest(raw))
            if not out:
                return 0
            if self.settings.window:
                with self._ring_lock:
                    self._ring.extend(out)
            if self.settings.path is not None:
                t0 = self.t0_s
                try:
                    if self._file is None:
                        self._file = self._open()
                    self._file.write(line(t - t0, rest) for _, t, _, rest in out)
                except OSError as exc:
                    self.write_errors += 1
                    log.warning("request log %s: %s", self.settings.path, exc)
            self.written += len(out)
            return len(out)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.flush_s):
            self.flush()

    def _open(self) -> RotatingFile:
        s = self.settings
        assert s.path is not None
        return RotatingFile(s.path, s.max_bytes, s.keep)

    def start(self) -> None:
        """Open the file (OSError when it cannot be), restart the clock origin, and flush
        every ``flush_s`` on a thread of its own."""
        if self.settings.path is not None and self._file is None:
            self._file = self._open()
        self.t0_s = self.clock.now()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Flush what is left and close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()
        if self._file is not None:
            self._file.close()

    # -- reading the window ----------------------------------------------------------------
    def lines(self, q: LogQuery) -> tuple[bytes, float | None, int]:
        """The window's records after ``q``'s cursors, in arrival order, ``t_s`` relative to
        the first of them: (JSONL, that record's ``t_s`` on the recorder's clock, the last
        seq returned or 0)."""
        with self._ring_lock:
            ring = list(self._ring)
        if q.since_seq is not None:
            lo, hi = 0, len(ring)  # seq increases along the ring
            while lo < hi:
                mid = (lo + hi) // 2
                if ring[mid][0] <= q.since_seq:
                    lo = mid + 1
                else:
                    hi = mid
            ring = ring[lo:]
        if q.since_unix_s is not None:
            after = q.since_unix_s
            ring = [r for r in ring if r[2] > after]
        if q.limit is not None:
            ring = ring[: q.limit]
        if not ring:
            return b"", None, 0
        last = ring[-1][0]
        ring.sort(key=lambda r: r[1])
        base = ring[0][1]
        return b"".join(line(t - base, rest) for _, t, _, rest in ring), base - self.t0_s, last

    def status(self) -> dict[str, object]:
        """What the admin view shows."""
        f = self._file
        return {
            "path": None if self.settings.path is None else str(self.settings.path),
            "max_bytes": self.settings.max_bytes,
            "keep": self.settings.keep,
            "window": self.settings.window,
            "records": self._last_seq,
            "written": self.written,
            "dropped": self.dropped,
            "buffered": len(self._buf),
            "in_window": len(self._ring),
            "file_bytes": None if f is None else f.size,
            "rotations": 0 if f is None else f.rotations,
            "write_errors": self.write_errors,
        }
