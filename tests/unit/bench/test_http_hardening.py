"""The parts of bench/http_hardening.py that are not the run: the status line read, the
chunks streamed, and its streaming exchange against an in-process server (a head that never
ends is answered 431 while the client still streams; a short request is answered)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from evenserve.httpio.server import Request, Response
from evenserve.httpio.serving import Serving
from tests.unit.bench.bench_module import load

hh = load("http_hardening")


class _App:
    async def __call__(self, request: Request) -> Response:
        return Response(200, b"{}")

    async def startup(self) -> None:
        pass

    def begin_drain(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    serving = Serving(_App(), "127.0.0.1", 0)
    serving.start_thread(30.0)
    try:
        yield serving.port
    finally:
        serving.stop_thread(30.0)


def test_status_of_reads_the_status_line_only() -> None:
    assert hh.status_of(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n") == 431
    assert hh.status_of(b"HTTP/1.1 200 OK") == 200
    assert hh.status_of(b"") is None and hh.status_of(b"garbage 200\r\n") is None


def test_chunks_stream_the_size_then_the_tail() -> None:
    parts = list(hh.chunks(hh.CHUNK * 2 + 5, tail=b"\r\n\r\n"))
    assert [len(p) for p in parts] == [hh.CHUNK, hh.CHUNK, 5, 4] and parts[-1] == b"\r\n\r\n"
    assert b"".join(parts[:-1]) == b"a" * (hh.CHUNK * 2 + 5)


def test_exchange_streams_until_the_server_answers(port: int) -> None:
    ex = hh.exchange(port, hh.START, hh.chunks(16 * hh.MIB))
    assert ex.outcome == "answered" and ex.status == 431, ex.answer[:200]
    assert 64 * 1024 < ex.sent < 16 * hh.MIB  # it stopped streaming once answered
    raw = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    ok = hh.exchange(port, raw)
    assert ok.status == 200 and ok.ms is not None and ok.sent == len(raw)


def test_arguments_are_checked() -> None:
    assert hh.parse_args([]).rounds == 5
    for bad in (["--rounds", "0"], ["--stream-mib", "0"]):
        with pytest.raises(SystemExit):
            hh.parse_args(bad)


def test_rss_of_a_process_that_is_gone_is_zero() -> None:
    assert hh.rss_bytes(2**22 + 12345) == 0
