"""``httpio.grpc_h2`` without sockets: a connection fed a client's bytes in every chunking
(one byte at a time, odd sizes, all at once) answers the same; a client that opens and
resets streams at once is sent away; the HPACK and grpc-message encodings."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

hpack = pytest.importorskip("hpack")

from evenserve.httpio.grpc_h2 import frames as h2  # noqa: E402
from evenserve.httpio.grpc_h2.call import RESPONSE_HEADERS, Call, parse_timeout, percent_encode  # noqa: E402
from evenserve.httpio.grpc_h2.reading import FREE_RESETS  # noqa: E402
from evenserve.httpio.grpc_h2.server import GrpcH2Server, H2Connection, Limits  # noqa: E402

PATH = "/test.Echo/Echo"


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return None

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def echo(raw: bytearray, call: Call) -> bytes:
    await asyncio.sleep(0)
    return bytes(raw)


def request(encoder: Any, sid: int, body: bytes, frame: int = 16384) -> bytes:
    block = encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("grpc-timeout", "5S"),
            ("x-meta", "v"),
        ]
    )
    out = h2.frame_head(len(block), h2.HEADERS, h2.END_HEADERS, sid) + block
    data = b"\x00" + len(body).to_bytes(4, "big") + body
    for i in range(0, len(data), frame):
        part = data[i : i + frame]
        last = i + frame >= len(data)
        out += h2.frame_head(len(part), h2.DATA, h2.END_STREAM if last else 0, sid) + part
    return out


def frames(raw: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    i = 0
    while i < len(raw):
        length = int.from_bytes(raw[i : i + 3], "big")
        out.append(
            (raw[i + 3], raw[i + 4], int.from_bytes(raw[i + 5 : i + 9], "big"),
             raw[i + 9 : i + 9 + length])
        )  # fmt: skip
        i += 9 + length
    return out


def new_connection() -> tuple[H2Connection, FakeTransport]:
    server = GrpcH2Server({PATH: echo}, Limits(max_message_bytes=1 << 20))
    server.loop = asyncio.get_running_loop()
    conn = H2Connection(server)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def answers(written: bytes) -> dict[int, tuple[bytes, dict[str, str]]]:
    """Each stream's DATA (without the 5-byte prefix) and trailers."""
    decoder = hpack.Decoder()
    data: dict[int, bytearray] = {}
    out = {}
    for kind, flags, sid, payload in frames(written):
        if kind == h2.DATA:
            data.setdefault(sid, bytearray()).extend(payload)
        elif kind == h2.HEADERS:
            fields = dict(decoder.decode(payload))
            if flags & h2.END_STREAM:
                out[sid] = (bytes(data.get(sid, b""))[5:], fields)
    return out


@pytest.mark.parametrize("chunking", ["bytes", "odd", "random", "whole"])
async def test_any_chunking_gives_the_same_answers(chunking: str) -> None:
    encoder = hpack.Encoder()
    bodies = {1: b"a" * 10, 3: bytes(range(256)) * 300, 5: b""}
    window = h2.S_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + (1 << 20).to_bytes(4, "big")
    wire = h2.PREFACE + h2.frame_head(6, h2.SETTINGS, 0, 0) + window
    wire += H2Connection.window_update(0, 1 << 20)  # (answers over 64 KiB: the windows)
    for sid, body in bodies.items():
        wire += request(encoder, sid, body, frame=5000)
    wire += h2.frame_head(8, h2.PING, 0, 0) + b"pingpong"
    conn, transport = new_connection()
    rng = random.Random(1)
    i = 0
    while i < len(wire):
        n = {"bytes": 1, "odd": 7, "random": rng.randint(1, 9000), "whole": len(wire)}[chunking]
        conn.data_received(wire[i : i + n])
        i += n
        if chunking != "bytes" or i % 97 == 0:
            await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    got = answers(bytes(transport.written))
    assert {sid: body for sid, (body, _t) in got.items()} == bodies
    assert all(t["grpc-status"] == "0" for _b, t in got.values())
    pings = [p for k, f, _s, p in frames(bytes(transport.written)) if k == h2.PING]
    assert pings == [b"pingpong"]
    assert not transport.closed and not conn.calls


async def test_rapid_reset_is_sent_away() -> None:
    encoder = hpack.Encoder()
    conn, transport = new_connection()
    conn.data_received(h2.PREFACE + h2.frame_head(0, h2.SETTINGS, 0, 0))
    sid = 1
    while not transport.closed and sid < 2000:
        rst = h2.frame_head(4, h2.RST_STREAM, 0, sid) + h2.CANCEL.to_bytes(4, "big")
        conn.data_received(request(encoder, sid, b"x") + rst)
        sid += 2
    assert transport.closed
    goaway = [p for k, _f, _s, p in frames(bytes(transport.written)) if k == h2.GOAWAY]
    assert int.from_bytes(goaway[0][4:8], "big") == h2.ENHANCE_YOUR_CALM
    assert sid // 2 == FREE_RESETS + 1
    await asyncio.sleep(0)


def test_encodings() -> None:
    assert h2.hpack_int(10, 5, 0) == b"\x0a"
    assert h2.hpack_int(1337, 5, 0) == b"\x1f\x9a\x0a"  # RFC 7541 C.1.2
    fields = hpack.Decoder().decode(
        RESPONSE_HEADERS + h2.literal(b"grpc-message", percent_encode("ünï 100%")),
        raw=False,
    )
    assert fields == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-message", "%C3%BCn%C3%AF 100%25"),
    ]
    assert parse_timeout(b"5S") == 5.0 and parse_timeout(b"250m") == 0.25
    assert parse_timeout(b"123456789S") is None and parse_timeout(b"5x") is None
