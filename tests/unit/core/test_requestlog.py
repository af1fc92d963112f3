"""The request log: line encoding, the window, rotation and counted drops (FakeClock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evenserve.core.clock import FakeClock
from evenserve.core.requestlog import (
    LogQuery,
    Recorder,
    RecordSettings,
    RotatingFile,
    parse_log_query,
)
from evenserve.workload.trace import read_trace

_made: list[Recorder] = []


@pytest.fixture(autouse=True)
def _stop_recorders() -> object:
    yield
    while _made:
        _made.pop().stop()  # closes the file


def _recorder(tmp_path: Path | None, **kw: object) -> tuple[Recorder, FakeClock, list[float]]:
    clock = FakeClock(100.0)
    wall = [1_700_000_000.0]
    path = None if tmp_path is None else tmp_path / "log.jsonl"
    rec = Recorder(RecordSettings(path=path, **kw), clock, lambda: wall[0])  # type: ignore[arg-type]
    _made.append(rec)
    return rec, clock, wall


def _arrive(rec: Recorder, clock: FakeClock, wall: list[float], dt: float, **kw: object) -> None:
    """A request arriving ``dt`` after the last answer, answered 5 ms later."""
    clock.advance(dt)
    wall[0] += dt
    t, u = clock.now(), wall[0]
    clock.advance(0.005)
    args: dict[str, object] = {
        "model": "m",
        "priority": None,
        "deadline_ms": None,
        "backend": "w0",
        "status": 200,
        "queue_ms": "1.250",
        "compute_ms": "3.000",
    }
    args.update(kw)
    rec.add(t, u, **args)  # type: ignore[arg-type]


def test_a_line_is_a_trace_arrival_plus_outcomes(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path)
    _arrive(rec, clock, wall, 0.5, priority="online", deadline_ms="250")
    _arrive(rec, clock, wall, 0.25, model="n", backend=None, status=503, queue_ms=None)
    _arrive(rec, clock, wall, 0.25, priority="bogus", deadline_ms="-1", compute_ms="x")
    assert rec.flush() == 3
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert lines[0] == {
        "t_s": 0.5,
        "model": "m",
        "priority": 10,
        "deadline_ms": 250.0,
        "seq": 1,
        "backend": "w0",
        "status": 200,
        "latency_ms": 5.0,
        "queue_ms": 1.25,
        "compute_ms": 3.0,
        "unix_s": 1_700_000_000.5,
    }
    assert lines[1]["backend"] is None and lines[1]["status"] == 503
    assert lines[1]["queue_ms"] is None and "priority" not in lines[1]
    # What the server refused to read is left out (the trace stays valid).
    assert "priority" not in lines[2] and "deadline_ms" not in lines[2]
    assert lines[2]["compute_ms"] is None
    assert [x["seq"] for x in lines] == [1, 2, 3]
    arrivals = read_trace(tmp_path / "log.jsonl")  # the outcome keys are ignored
    assert [(a.t_s, a.model, a.priority, a.deadline_ms) for a in arrivals] == [
        (0.5, "m", 10, 250.0),
        (0.755, "n", None, None),
        (1.01, "m", None, None),
    ]


def test_the_request_path_only_appends(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path)
    _arrive(rec, clock, wall, 0.1)
    assert not (tmp_path / "log.jsonl").exists()  # nothing written until a flush
    assert rec.status()["buffered"] == 1
    rec.flush()
    assert rec.status()["buffered"] == 0 and rec.status()["written"] == 1


def test_a_full_buffer_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path, buffer=4)
    for _ in range(10):
        _arrive(rec, clock, wall, 0.1)
    assert rec.flush() == 4
    assert rec.dropped == 6
    seqs = [json.loads(x)["seq"] for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert seqs == [7, 8, 9, 10]  # the newest kept
    for _ in range(3):
        _arrive(rec, clock, wall, 0.1)
    rec.flush()
    assert rec.dropped == 6  # nothing more lost
    assert rec.status()["records"] == 13


def test_rotation_keeps_k_files_and_every_file_is_a_trace(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path, max_bytes=600, keep=2)
    for _ in range(40):
        _arrive(rec, clock, wall, 0.1)
        rec.flush()
    rec.stop()
    p = tmp_path / "log.jsonl"
    names = sorted(x.name for x in tmp_path.iterdir())
    assert names == ["log.jsonl", "log.jsonl.1", "log.jsonl.2"]
    for f in (p, tmp_path / "log.jsonl.1", tmp_path / "log.jsonl.2"):
        assert f.stat().st_size <= 600
        assert read_trace(f)
    # The files hold the newest records, in order: .2 oldest, then .1, then the live one.
    seqs = [
        json.loads(x)["seq"]
        for f in ("log.jsonl.2", "log.jsonl.1", "log.jsonl")
        for x in (tmp_path / f).read_text().splitlines()
    ]
    assert seqs == list(range(seqs[0], 41))
    assert rec.status()["rotations"] > 2


def test_rotation_with_keep_zero_keeps_only_the_live_file(tmp_path: Path) -> None:
    f = RotatingFile(tmp_path / "x.jsonl", max_bytes=12, keep=0)
    f.write([b"0123456\n", b"abcdefg\n", b"zzz\n"])
    f.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["x.jsonl"]
    assert (tmp_path / "x.jsonl").read_bytes() == b"abcdefg\nzzz\n"


def test_an_existing_file_is_appended_to(tmp_path: Path) -> None:
    (tmp_path / "log.jsonl").write_text('{"t_s": 0, "model": "old"}\n')
    rec, clock, wall = _recorder(tmp_path)
    _arrive(rec, clock, wall, 0.1)
    rec.stop()
    assert [a.model for a in read_trace(tmp_path / "log.jsonl")] == ["old", "m"]


def test_the_window_keeps_the_last_n_and_rebases_t_s() -> None:
    rec, clock, wall = _recorder(None, window=5)
    for _ in range(8):
        _arrive(rec, clock, wall, 1.0)
    rec.flush()
    body, origin, last = rec.lines(LogQuery())
    rows = [json.loads(x) for x in body.decode().splitlines()]
    assert [r["seq"] for r in rows] == [4, 5, 6, 7, 8]
    assert rows[0]["t_s"] == 0.0 and rows[-1]["t_s"] == pytest.approx(4 * 1.005)
    assert origin == pytest.approx(4.015) and last == 8
    assert rows[0]["unix_s"] == 1_700_000_004.0
    # Cursors: after a wall time, after a seq, and a limit (the first N after the cursor).
    body, origin, last = rec.lines(LogQuery(since_unix_s=1_700_000_006.5))
    assert [json.loads(x)["seq"] for x in body.decode().splitlines()] == [7, 8]
    assert json.loads(body.decode().splitlines()[0])["t_s"] == 0.0
    body, _, last = rec.lines(LogQuery(since_seq=5, limit=2))
    assert [json.loads(x)["seq"] for x in body.decode().splitlines()] == [6, 7] and last == 7
    assert rec.lines(LogQuery(since_seq=8)) == (b"", None, 0)


def test_window_zero_keeps_nothing_in_memory(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path, window=0)
    _arrive(rec, clock, wall, 1.0)
    rec.flush()
    assert rec.lines(LogQuery()) == (b"", None, 0)


def test_the_flush_thread_writes_and_stop_flushes_the_rest(tmp_path: Path) -> None:
    rec, clock, wall = _recorder(tmp_path, flush_s=0.01)
    rec.start()
    for _ in range(3):
        _arrive(rec, clock, wall, 0.1)
    rec.stop()
    assert len(read_trace(tmp_path / "log.jsonl")) == 3


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since_unix_s=abc", "since_unix_s"),
        ("since_unix_s=nan", "since_unix_s"),
        ("since_unix_s=inf", "since_unix_s"),
        ("limit=0", "limit"),
        ("limit=-3", "limit"),
        ("limit=x", "limit"),
        ("since_seq=-1", "since_seq"),
        ("bogus=1", "bogus"),
    ],
)
def test_a_bad_query_names_its_field(query: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        parse_log_query(query)


def test_a_good_query() -> None:
    assert parse_log_query("") == LogQuery()
    assert parse_log_query("since_unix_s=12.5&limit=3&since_seq=9") == LogQuery(12.5, 9, 3)


def test_settings_are_validated() -> None:
    for bad in ({"max_bytes": 0}, {"keep": -1}, {"window": -1}, {"flush_s": 0}, {"buffer": 0}):
        with pytest.raises(ValueError, match=f"^{next(iter(bad))}: "):
            RecordSettings(**bad)  # type: ignore[arg-type]
